// What fills the sparse decode kernel's shared memory (kernel.cuh): the producer warpgroup walks
// a split's tiles of 64 keys, looks each key up in the index list, loads its bytes and
// dequantises them into a stage's bf16 pieces (the layout wgmma reads), and prefetches the next
// tile's keys into L2 while it does. The fills, one file each (core/sparse_kernel_plan.cc picks
// one a launch):
//   fill_token.cuh         quantised keys, a key quarter a thread, round by round (and in a CTA
//                          pair, each CTA decoding half of every tile: pair.cuh)
//   fill_token_stream.cuh  the same with the rounds streamed across tiles
//   fill_ring.cuh          quantised keys' raw bytes by cp.async into a ring in shared memory,
//                          decoded from there (one stage, or three round slots, bf16 or fp16)
//   fill_rows.cuh          a warp per key (any format; the fallback), and bf16 keys by cp.async
//                          in halves for the seesaw order
#pragma once

#include "cuda/sm90/sparse_decode/fill_ring.cuh"
#include "cuda/sm90/sparse_decode/fill_rows.cuh"
#include "cuda/sm90/sparse_decode/fill_token.cuh"
#include "cuda/sm90/sparse_decode/fill_token_stream.cuh"
