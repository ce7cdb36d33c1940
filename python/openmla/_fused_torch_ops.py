"""The fused norm-rope-attention-rope-cast operations as torch.library custom ops
(`torch.ops.openmla.fused_norm_rope_attn_rope_cast_prefill` / `_decode`) with fake
implementations, so torch.compile traces them as opaque nodes. Eager calls never come here:
openmla.fused_norm_rope_attn_rope_cast routes a call here only while torch.compile traces it.
Registered on first use."""

# No `from __future__ import annotations`: custom_op infers its schema from real annotations.
from typing import List, Optional

import torch
from torch import Tensor

from . import _C

_NS = "openmla"
_ops = None


def _fake_outputs(q: Tensor, n_wv_group: int, d_v: int):
    s_q, h_q, _ = q.shape
    group = h_q // n_wv_group
    shape, strides, _ = _C.fused_out_sf_layout(s_q, n_wv_group, group, d_v)
    out_fp8 = q.new_empty((s_q, n_wv_group, group * d_v), dtype=torch.float8_e4m3fn)
    out_sf = torch.empty_strided(shape, strides, dtype=torch.int32, device=q.device)
    return out_fp8, out_sf


def ops():
    """(prefill, decode) custom ops, registered once."""
    global _ops
    if _ops is not None:
        return _ops
    from . import fused_norm_rope_attn_rope_cast as fused

    @torch.library.custom_op(f"{_NS}::fused_norm_rope_attn_rope_cast_prefill", mutates_args=())
    def prefill(enable_q_norm: bool, rms_norm_eps: float, token_positions: Tensor,
                is_rope_neox_style: bool, rope_dim: int, cos_sin_cache: Tensor, n_wv_group: int,
                num_per_channels: int, use_tma_aligned_col_major_sf: bool, round_sf: bool,
                use_packed_ue8m0: bool, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float,
                d_v: int, attn_sink: Optional[Tensor],
                topk_length: Optional[Tensor]) -> List[Tensor]:
        return list(fused._prefill_eager(
            enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
            cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
            use_packed_ue8m0, q, kv, indices, sm_scale, d_v, attn_sink, topk_length))

    @prefill.register_fake
    def _(enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
          cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
          use_packed_ue8m0, q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
        out_fp8, out_sf = _fake_outputs(q, n_wv_group, d_v)
        s_q, h_q, _ = q.shape
        stats = [q.new_empty((s_q, h_q), dtype=torch.float32) for _ in range(2)]
        return [out_fp8, out_sf] + stats

    @torch.library.custom_op(f"{_NS}::fused_norm_rope_attn_rope_cast_decode", mutates_args=())
    def decode(enable_q_norm: bool, rms_norm_eps: float, token_positions: Tensor,
               is_rope_neox_style: bool, rope_dim: int, cos_sin_cache: Tensor, n_wv_group: int,
               num_per_channels: int, use_tma_aligned_col_major_sf: bool, round_sf: bool,
               use_packed_ue8m0: bool, q: Tensor, k_cache: Tensor, indices_in_kvcache: Tensor,
               sm_scale: float, d_v: int, attn_sink: Optional[Tensor],
               topk_length: Optional[Tensor], extra_k_cache: Optional[Tensor],
               extra_indices_in_kvcache: Optional[Tensor],
               extra_topk_length: Optional[Tensor],
               batch_invariant: bool = False) -> List[Tensor]:
        return list(fused._decode_eager(
            enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
            cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
            use_packed_ue8m0, q, k_cache, indices_in_kvcache, sm_scale, d_v, attn_sink,
            topk_length, extra_k_cache, extra_indices_in_kvcache, extra_topk_length,
            batch_invariant))

    @decode.register_fake
    def _(enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
          cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
          use_packed_ue8m0, q, k_cache, indices_in_kvcache, sm_scale, d_v, attn_sink,
          topk_length, extra_k_cache, extra_indices_in_kvcache, extra_topk_length,
          batch_invariant=False):
        out_fp8, out_sf = _fake_outputs(q, n_wv_group, d_v)
        s_q, h_q, _ = q.shape
        return [out_fp8, out_sf, q.new_empty((s_q, h_q), dtype=torch.float32)]

    _ops = (prefill, decode)
    return _ops
