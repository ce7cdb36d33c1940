// Compile-time choices of the SM90 dense MHA prefill forward (docs/semantics.md, dense MHA
// prefill; design record: NOTES.md beside this).
//
// A CTA serves 128 query rows (tokens [128 m, 128 m + 128) of one sequence, one query head) and
// walks the keys its rows see in 128-key blocks. Three warpgroups: WG0 and WG1 compute (64 rows
// each: S = Q K^T from shared memory, online softmax in registers, O += P V with P as the
// register A operand), WG2 is the producer (one thread issues every TMA load: Q once, then K and
// V of each block into a two-stage ring).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"

namespace openmla::cuda::sm90 {

// The tiles are the shared MLA tiles (attention/mla_tiles.h) at M 64 (one warpgroup's rows),
// N 128 (keys a block), D d_qk, V dims 128: Q (64, d) and K (128, d) K-major with the 128 B
// swizzle in 64-dim pieces; V (128 dims, 128 keys) MN-major over pieces of 128 keys x 64 dims
// (the bytes TMA writes for V's rows, read transposed); P (64, 128) as the A fragment.
template <typename Element_, int kHeadDimQK_>
struct MhaFwdTraits : attention::MlaTiles<Element_, 64, 128, kHeadDimQK_, 128> {
  using Element = Element_;  // cute::bfloat16_t or cute::half_t
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = 128;
  static_assert(kHeadDimQK == 192 || kHeadDimQK == 128);

  static constexpr int kBlockM = 128;   // query rows per CTA (2 compute warpgroups x 64)
  static constexpr int kWgRows = 64;    // rows per compute warpgroup (one wgmma M)
  static constexpr int kBlockN = 128;   // keys per block (one ring stage)
  static constexpr int kPieceDims = 64;  // one TMA box a 64-dim piece (128 B rows, 128 B swizzle)
  static constexpr int kQPieces = kHeadDimQK / kPieceDims;  // 3 (d 192) or 2 (d 128)
  static constexpr int kVPieces = kHeadDimV / kPieceDims;   // 2
  static constexpr int kStages = 2;

  static constexpr int kQWgElems = kWgRows * kHeadDimQK;     // one warpgroup's Q
  static constexpr int kKElems = kBlockN * kHeadDimQK;       // a K block
  static constexpr int kVElems = kBlockN * kHeadDimV;        // a V block
  static constexpr int kQBytes = kBlockM * kHeadDimQK * 2;   // Q's transaction bytes
  static constexpr int kKBytes = kKElems * 2;
  static constexpr int kVBytes = kVElems * 2;

  static constexpr int kNumMmaThreads = 256;  // WG0 + WG1
  static constexpr int kNumThreads = 384;     // + producer WG2
  // setmaxnreg: 2 x 240 + 24 = 504 = 3 x 168, the registers the CTA launches with.
  static constexpr int kMmaRegisters = 240;
  static constexpr int kProducerRegisters = 24;

  struct SharedStorage {
    // 128 B swizzling repeats every 1024 B: every operand starts on a 1024 B boundary.
    alignas(1024) Element q[2][kQWgElems];   // [wg][piece][64 rows][64 dims]
    alignas(1024) Element k[kStages][kKElems];  // [stage][piece][128 keys][64 dims]
    alignas(1024) Element v[kStages][kVElems];  // [stage][piece][128 keys][64 dims]
    alignas(8) uint64_t q_full;                 // Q landed (transaction barrier)
    uint64_t k_full[kStages], v_full[kStages];  // a block's K / V landed
    uint64_t k_empty[kStages], v_empty[kStages];  // both compute WGs done with K / V (8 warps)
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + align
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of shared memory a block may use");
};

}  // namespace openmla::cuda::sm90
