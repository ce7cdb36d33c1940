// The compute warpgroups of the sparse decode kernel (kernel.cuh): their fragments, the order
// (order_standard.cuh or order_seesaw.cuh) and the epilogue (epilogue.cuh).
#pragma once

#include "cuda/sm90/sparse_decode/epilogue.cuh"
#include "cuda/sm90/sparse_decode/order_seesaw.cuh"
#include "cuda/sm90/sparse_decode/order_standard.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// The compute warpgroups (wg 0 or 1).
template <class Traits>
__device__ __forceinline__ void consume(const SparseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int wg, int m_block,
                                        int split, int problem) {
  using namespace cute;
  using KElement = typename Traits::KElement;  // Q, K and P in the MMAs (fp16 with kFp16)
  KElement* const q_op = reinterpret_cast<KElement*>(smem.q);
  KElement* const k_op = reinterpret_cast<KElement*>(smem.k[0]);
  const int t = threadIdx.x - wg * 128;
  const int lane = t % 32;
  constexpr bool kDense = Traits::kDense;
  const Problem keys = problem_of<kDense>(p, problem);
  const int2 range = split_tiles<kDense>(p, keys, split);
  const int n_tiles = range.y - range.x;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(q_op), typename Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA,1,D/16)
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<64>>{});
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (2,16)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<64>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,16) -> (row,key)

  Tensor sP_shape = make_tensor(make_smem_ptr(q_op), typename Traits::SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_A(sP_shape);  // (MMA,1,4)
  Tensor tOrV =
      thr_pv.partition_fragment_B(make_tensor(make_smem_ptr(k_op + wg * 4 * Traits::kPieceElems),
                                              typename Traits::SmemLayoutV{}));  // (MMA,1,4)
  // The ring fill's S = Q K^T by round (traits.h kRing): a round's 64 x 32 block of S is the
  // first (keys 0-31) or second half of the 64 x 64 accumulator's registers (its n8 blocks 0-3
  // and 4-7), so the two rounds' wgmmas write into tSrS itself.
  typename Traits::TiledMmaQKRound mma_qkr;
  auto thr_qkr = mma_qkr.get_thread_slice(t);
  Tensor tSrQr = thr_qkr.partition_fragment_A(sQ);
  Tensor tSrKr = thr_qkr.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op), typename Traits::SmemLayoutKRound{}));
  Tensor tSrSr = partition_fragment_C(mma_qkr, Shape<Int<64>, Int<32>>{});
  static_assert(decltype(size(tSrSr))::value * 2 == decltype(size(tSrS))::value);
  // The round slots (traits.h kSlots): round n of the CTA's list is in slot n % 3, its (n / 3)-th
  // use; a warpgroup's V of a slot is its 4 pieces of 32 keys (MN-major), 2 k-blocks. Each
  // warpgroup releases each round once (WG0 an even round after its tile's P V, an odd one
  // after the next tile's first QK^T; WG1 both after its P V), so the producer's decode of
  // round n waits only for round n - 3, whose releases need rounds up to n - 2: no cycle. P of a
  // tile (d 576: in its two slots' RoPE pieces, dead after the tile's QK^T; d 512: p[0]) and the
  // row factors are overwritten only by the next tile's softmax, after its round 1 was decoded
  // into the slot WG1 released once it had loaded them.
  Tensor tOrVs = thr_pv.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op + wg * 4 * (Traits::kSlotPieceBytes / 2)),
                  typename Traits::SmemLayoutVSlot{}));  // (MMA,1,2)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor O = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (2,128)
  Tensor cO = make_identity_tensor(Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor tOcO = thr_pv.partition_C(cO);
  Tensor cO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));

  int mrow[2];  // the thread's two rows of the m-block
#pragma unroll
  for (int r = 0; r < 2; ++r) mrow[r] = get<0>(cS_rc(r, 0));
  // Causal dense decode: the keys the m-block's first row may see (rows of later query tokens
  // see more: each row's limit waits in shared memory for the tiles that cut one). One register
  // in the loop: WG0 has no more.
  const int first_limit = row_limit<kDense>(p, keys, row_of<kDense>(p, problem, m_block * 64));
  const float sl2 = p.scale_log2;
  clear(tOrO);
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  float m_true[2] = {-INFINITY, -INFINITY};  // the exact row max (m_run is lazy), for max_logits
  // kFp16: O is kept in units of 2^-e_ref, e_ref the largest key exponent seen (P's column j
  // times 2^(e_j - e_ref) <= 1); S's entry (r, j) times 2^(q_exp[r] + e_j) back to the true score.
  // Neither is held in registers (WG0 has none to spare): Q's row exponents stay in
  // smem.row_sum until the epilogue, e_ref in smem.o_exp[warp] (each warp its own: they run
  // apart; every lane writes the same value).

  if constexpr (Traits::kSeesaw) {
    consume_seesaw<Traits>(p, smem, wg, t, lane, problem, m_block, n_tiles, mma_qk, mma_pv, tSrQ,
                           tSrK, tSrS, S, cS_rc, tOrP, tOrV, tOrO, O, mrow, sl2, m_run, l_run,
                           m_true);
  } else if (wg == 0) {
    consume_wg0<Traits>(p, smem, t, lane, problem, m_block, keys, range, n_tiles, first_limit,
                        mma_qkr, tSrQr, tSrKr, tSrSr, tOrVs, mma_qk, mma_pv, tSrQ, tSrK, tSrS, S,
                        cS_rc, tOrP, tOrV, tOrO, O, mrow, sl2, m_run, l_run, m_true);
  } else {
    consume_wg1<Traits>(p, smem, t, lane, n_tiles, mma_pv, tOrP, tOrV, tOrVs, tOrO, O);
  }
  bar_sync(kBarEpi, 256);
  write_output<Traits>(p, smem, wg, lane, problem, split, m_block, O, cO_rc, mrow, m_run, m_true);
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
