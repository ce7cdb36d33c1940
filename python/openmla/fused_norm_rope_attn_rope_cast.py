"""FlashMLA's fused DeepSeek V4/V4.1 attention, served by OpenMLA:
`openmla.flash_mla.fused_norm_rope_attn_rope_cast` (and `flash_mla.fused_norm_rope_attn_rope_cast`
through the opt-in alias).

One operation from the q_b projection's output to the grouped output projection's input (Q norm,
Q RoPE, sparse attention, inverse O RoPE, cast to e4m3 with per-32 UE8M0 scales); the definition
is docs/semantics.md (fused norm-rope-attention-rope-cast). The names, argument names, argument
order and returns are FlashMLA's (flash_mla/fused_norm_rope_attn_rope_cast.py):
  prefill(...) -> (out_fp8, out_sf, max_logits, lse)
  decode(...)  -> (out_fp8, out_sf, lse)
  permute_q_b_proj((q_b_proj, q_b_sf), h_q, d_q) -> (q_b_proj_permuted, q_b_sf_permuted)
  permute_wv_proj((wv_proj, wv_sf), wv_group_size, d_o) -> (wv_proj_permuted, wv_sf_permuted)
Tensors are torch tensors. CPU tensors run on OpenMLA's CPU backend; CUDA tensors on the SM90
sparse attention kernel with the norm, RoPE and cast fused in (d_qk = d_v = 512 only, as
FlashMLA's kernel; other sizes raise NotImplementedError), on torch's current stream, with a
workspace of fused_workspace_size(...) bytes allocated per call (torch's caching allocator; a
CUDA-graph capture takes it from the graph's pool). Differences from FlashMLA:
  * the CPU backend takes more sizes than FlashMLA's kernels (any h_q divisible by n_wv_group,
    d_qk a multiple of 16 and >= d_v, d_v a multiple of 32 and >= rope_dim); decode's caches are
    V4's fp8_model1 (584 B) or V4.1's fp8_mx (528 B), the extra cache of the same format or fp4
    (288 B, with fp8_mx only), as FlashMLA's V4/V4.1 kernels;
  * a position outside [0, cos_sin_cache.size(0)) raises ValueError (CPU); on CUDA tensors
    positions are not read on the host, and such a token's out_fp8 is NaN (0x7F bytes);
  * decode takes an extra keyword, batch_invariant=False: True makes each token's result
    independent of the other tokens of the call (on the GPU one CTA walks each token's keys,
    no split; the CPU backend always is);
  * errors are ValueError / TypeError / NotImplementedError naming the argument, not asserts;
  * under torch.compile the calls are custom ops (torch.ops.openmla.fused_norm_rope_attn_rope_cast_*)
    with fake implementations.
"""

from __future__ import annotations

from typing import Optional, Tuple

from . import _C
from . import _frameworks as fw

__all__ = ["prefill", "decode", "permute_q_b_proj", "permute_wv_proj"]


def _torch():
    return fw._torch()


def _require_tensor(op: str, arg: str, x, optional: bool = False) -> None:
    if x is None and optional:
        return
    if not fw.is_torch_tensor(x):
        raise TypeError(f"{op}: {arg}: expected a torch.Tensor, got {type(x).__name__}")


def _outputs(op: str, q, n_wv_group: int, d_v: int):
    """out_fp8 [s_q, n_wv_group, wv_group_size * d_v] e4m3 and out_sf in FlashMLA's layout:
    int32 [s_q, n_wv_group, wv_group_size * d_v / 128] with strides (1, K * A, A), A = s_q
    rounded up to 4 (DeepGEMM's TMA-aligned column-major packed UE8M0)."""
    torch = _torch()
    if q.dim() != 3:
        raise ValueError(f"{op}: q: expected 3 dimensions [s_q, h_q, d_qk], got shape "
                         f"{tuple(q.shape)}")
    s_q, h_q, _ = q.shape
    if not isinstance(n_wv_group, int) or n_wv_group < 1 or h_q % n_wv_group != 0:
        raise ValueError(f"{op}: n_wv_group: expected a divisor of h_q = {h_q}, got {n_wv_group}")
    group_size = h_q // n_wv_group
    try:
        shape, strides, storage = _C.fused_out_sf_layout(s_q, n_wv_group, group_size, d_v)
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None
    out_fp8 = torch.empty((s_q, n_wv_group, group_size * d_v), dtype=torch.float8_e4m3fn,
                          device=q.device)
    out_sf = torch.zeros(max(storage, 1), dtype=torch.int32, device=q.device).as_strided(
        shape, strides)
    return out_fp8, out_sf


def fused_workspace_size(q) -> int:
    """Bytes of workspace prefill or decode needs for q [s_q, h_q, d_qk] on q's device (0 on
    the CPU): the fp32 partials of split key lists."""
    if q.dim() != 3:
        raise ValueError(f"fused_workspace_size: q: expected 3 dimensions [s_q, h_q, d_qk], got "
                         f"shape {tuple(q.shape)}")
    device = fw.Torch.device(q)
    return int(_C.fused_workspace_size(device[0], device[1], int(q.shape[0]), int(q.shape[1])))


def _workspace(q):
    """The call's workspace: a uint8 buffer of fused_workspace_size(q) bytes on q's CUDA device;
    None on the CPU (its backend needs none) or when the size is 0."""
    if q.device.type != "cuda":
        return None
    size = fused_workspace_size(q)
    return _torch().empty(size, dtype=_torch().uint8, device=q.device) if size > 0 else None


def _compiling(q) -> bool:
    """True while torch.compile traces the call: it goes through the custom ops then."""
    torch = _torch()
    compiler = getattr(torch, "compiler", None)
    return (fw.is_torch_tensor(q) and compiler is not None
            and getattr(compiler, "is_compiling", lambda: False)())


def _flags(op: str, values) -> None:
    for name, value in values:
        if not isinstance(value, bool):
            raise TypeError(f"{op}: {name}: expected a bool, got {type(value).__name__}")


def _positions(op: str, token_positions):
    _require_tensor(op, "token_positions", token_positions)
    return token_positions


def prefill(
    enable_q_norm: bool,
    rms_norm_eps: float,
    token_positions,
    is_rope_neox_style: bool,
    rope_dim: int,
    cos_sin_cache,
    n_wv_group: int,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool,
    round_sf: bool,
    use_packed_ue8m0: bool,
    q,
    kv,
    indices,
    sm_scale: float,
    d_v: int = 512,
    attn_sink=None,
    topk_length=None,
) -> Tuple:
    """Fused Q norm + Q RoPE + sparse attention + O RoPE + O cast to e4m3, prefill.

    q [s_q, h_q, d_qk] bf16 in the permute_q_b_proj layout (each token's h_q * d_qk values
    contiguous); kv [s_kv, 1, d_qk] bf16; indices [s_q, 1, topk] int32 (invalid: < 0 or >= s_kv);
    token_positions [s_q] int32; cos_sin_cache [num_positions, rope_dim] fp32 (cos, then sin);
    attn_sink [h_q] fp32; topk_length [s_q] int32.
    Returns out_fp8 [s_q, n_wv_group, wv_group_size * d_v] float8_e4m3fn (permute_wv_proj
    layout), out_sf int32 [s_q, n_wv_group, wv_group_size * d_v / 128] (packed UE8M0, token dim
    contiguous), max_logits [s_q, h_q] and lse [s_q, h_q] fp32 (a query with no valid key:
    max_logits -inf, lse +inf, out zero)."""
    args = (enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
            cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
            use_packed_ue8m0, q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    if _compiling(q):
        from . import _fused_torch_ops
        return tuple(_fused_torch_ops.ops()[0](*args))
    return _prefill_eager(*args)


def _prefill_eager(enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
                   cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf,
                   round_sf, use_packed_ue8m0, q, kv, indices, sm_scale, d_v, attn_sink,
                   topk_length):
    op = "fused_norm_rope_attn_rope_cast.prefill"
    torch = _torch()
    for name, x in (("q", q), ("kv", kv), ("indices", indices), ("cos_sin_cache", cos_sin_cache)):
        _require_tensor(op, name, x)
    _require_tensor(op, "attn_sink", attn_sink, optional=True)
    _require_tensor(op, "topk_length", topk_length, optional=True)
    _flags(op, (("enable_q_norm", enable_q_norm), ("is_rope_neox_style", is_rope_neox_style),
                ("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
                ("round_sf", round_sf), ("use_packed_ue8m0", use_packed_ue8m0)))
    out_fp8, out_sf = _outputs(op, q, n_wv_group, d_v)
    s_q, h_q, _ = q.shape
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    workspace = _workspace(q)
    with fw.Torch.guard(q):
        _C.fused_prefill(
            fw.to_c(q), fw.to_c(kv), fw.to_c(indices), fw.to_c(out_fp8), fw.to_c(out_sf),
            fw.to_c(max_logits), fw.to_c(lse), enable_q_norm=enable_q_norm,
            rms_norm_eps=float(rms_norm_eps),
            token_positions=fw.to_c(_positions(op, token_positions)),
            is_rope_neox_style=is_rope_neox_style, rope_dim=int(rope_dim),
            cos_sin_cache=fw.to_c(cos_sin_cache), n_wv_group=int(n_wv_group),
            num_per_channels=int(num_per_channels),
            use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, round_sf=round_sf,
            use_packed_ue8m0=use_packed_ue8m0, topk_length=fw.to_c(topk_length),
            attn_sink=fw.to_c(attn_sink), d_v=int(d_v), softmax_scale=_scale(op, sm_scale),
            workspace=fw.to_c(workspace), stream=fw.Torch.stream(q))
    return out_fp8, out_sf, max_logits, lse


def decode(
    enable_q_norm: bool,
    rms_norm_eps: float,
    token_positions,
    is_rope_neox_style: bool,
    rope_dim: int,
    cos_sin_cache,
    n_wv_group: int,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool,
    round_sf: bool,
    use_packed_ue8m0: bool,
    q,
    k_cache,
    indices_in_kvcache,
    sm_scale: float,
    d_v: int = 512,
    attn_sink=None,
    topk_length=None,
    extra_k_cache=None,
    extra_indices_in_kvcache=None,
    extra_topk_length=None,
    *,
    batch_invariant: bool = False,
) -> Tuple:
    """Fused Q norm + Q RoPE + sparse decode over paged quantised caches + O RoPE + O cast.

    Batch 1, as FlashMLA's: q [s_q, h_q, d_qk] bf16 (permute_q_b_proj layout); k_cache
    [num_blocks, page_block_size, 1, bytes_per_token] bytes (584: V4 fp8_model1, 528: V4.1
    fp8_mx); indices_in_kvcache [s_q, topk] int32 slots block * page_block_size + offset (-1 or
    out of range: ignored); topk_length [s_q]; extra_k_cache of k_cache's format or 288 B fp4
    (with 528 B only), extra_indices_in_kvcache [s_q, extra_topk], extra_topk_length [s_q].
    batch_invariant (OpenMLA's keyword): each token's result independent of the call's other
    tokens (GPU: no split of a token's key list; the CPU backend always is).
    Returns out_fp8, out_sf (as prefill's) and lse [s_q, h_q] fp32 (without the sink)."""
    args = (enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
            cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
            use_packed_ue8m0, q, k_cache, indices_in_kvcache, sm_scale, d_v, attn_sink,
            topk_length, extra_k_cache, extra_indices_in_kvcache, extra_topk_length,
            batch_invariant)
    if _compiling(q):
        from . import _fused_torch_ops
        return tuple(_fused_torch_ops.ops()[1](*args))
    return _decode_eager(*args)


def _decode_eager(enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
                  cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf,
                  round_sf, use_packed_ue8m0, q, k_cache, indices_in_kvcache, sm_scale, d_v,
                  attn_sink, topk_length, extra_k_cache, extra_indices_in_kvcache,
                  extra_topk_length, batch_invariant=False):
    op = "fused_norm_rope_attn_rope_cast.decode"
    torch = _torch()
    for name, x in (("q", q), ("k_cache", k_cache), ("indices_in_kvcache", indices_in_kvcache),
                    ("cos_sin_cache", cos_sin_cache)):
        _require_tensor(op, name, x)
    for name, x in (("attn_sink", attn_sink), ("topk_length", topk_length),
                    ("extra_k_cache", extra_k_cache),
                    ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                    ("extra_topk_length", extra_topk_length)):
        _require_tensor(op, name, x, optional=True)
    _flags(op, (("enable_q_norm", enable_q_norm), ("is_rope_neox_style", is_rope_neox_style),
                ("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
                ("round_sf", round_sf), ("use_packed_ue8m0", use_packed_ue8m0),
                ("batch_invariant", batch_invariant)))
    out_fp8, out_sf = _outputs(op, q, n_wv_group, d_v)
    s_q, h_q, _ = q.shape
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    workspace = _workspace(q)
    with fw.Torch.guard(q):
        _C.fused_decode(
            fw.to_c(q), fw.to_c(k_cache), fw.to_c(indices_in_kvcache), fw.to_c(out_fp8),
            fw.to_c(out_sf), fw.to_c(lse), enable_q_norm=enable_q_norm,
            rms_norm_eps=float(rms_norm_eps),
            token_positions=fw.to_c(_positions(op, token_positions)),
            is_rope_neox_style=is_rope_neox_style, rope_dim=int(rope_dim),
            cos_sin_cache=fw.to_c(cos_sin_cache), n_wv_group=int(n_wv_group),
            num_per_channels=int(num_per_channels),
            use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, round_sf=round_sf,
            use_packed_ue8m0=use_packed_ue8m0, topk_length=fw.to_c(topk_length),
            extra_k_cache=fw.to_c(extra_k_cache),
            extra_indices=fw.to_c(extra_indices_in_kvcache),
            extra_topk_length=fw.to_c(extra_topk_length), attn_sink=fw.to_c(attn_sink),
            d_v=int(d_v), softmax_scale=_scale(op, sm_scale), workspace=fw.to_c(workspace),
            stream=fw.Torch.stream(q), batch_invariant=batch_invariant)
    return out_fp8, out_sf, lse


def _scale(op: str, sm_scale) -> float:
    if sm_scale is None or not float(sm_scale) > 0.0:
        raise ValueError(f"{op}: sm_scale: expected a positive float, got {sm_scale!r}")
    return float(sm_scale)


# --- weight permutations (plain torch; any device) ---------------------------------------------

def q_b_row_permutation(h_q: int, d_q: int, device=None):
    """src[i] = the row of the original q_b_proj that row i of the permuted one holds: natural
    row h * d_q + d moves to (d // 16) * (h_q * 16) + h * 16 + d % 16."""
    torch = _torch()
    h = torch.arange(h_q, device=device).view(h_q, 1)
    d = torch.arange(d_q, device=device).view(1, d_q)
    new = (d // 16) * (h_q * 16) + h * 16 + d % 16
    src = torch.empty(h_q * d_q, dtype=torch.long, device=device)
    src[new.flatten()] = torch.arange(h_q * d_q, device=device)
    return src


def wv_chunk_permutation(wv_group_size: int, d_o: int, device=None):
    """src[p] = the 32-column chunk of a group's original columns that chunk p of the permuted
    ones holds: head h's chunk c (columns h * d_o + 32 c ..) moves to position c * wv_group_size
    + h."""
    torch = _torch()
    chunks = d_o // 32
    h = torch.arange(wv_group_size, device=device).view(wv_group_size, 1)
    c = torch.arange(chunks, device=device).view(1, chunks)
    new = c * wv_group_size + h
    src = torch.empty(wv_group_size * chunks, dtype=torch.long, device=device)
    src[new.flatten()] = (h * chunks + c).flatten()
    return src


def _mn_major(t):
    """t's values with the first dim of each matrix contiguous (DeepGEMM's scale layout)."""
    if t.dim() == 2:
        return t.t().contiguous().t()
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def permute_q_b_proj(weight_and_sf, h_q: int, d_q: int):
    """The q_b_proj weight [h_q * d_q, q_lora_rank] (1-byte e4m3) and its scales [h_q * d_q,
    q_lora_rank / (gran * 4)] int32 (packed UE8M0, gran 32 or 128), rows permuted into the layout
    the fused operation reads q in. The scales come back contiguous on the first dim."""
    op = "permute_q_b_proj"
    weight, sf = weight_and_sf
    _require_tensor(op, "q_b_proj", weight)
    _require_tensor(op, "q_b_sf", sf)
    if d_q % 16 != 0 or h_q < 1:
        raise ValueError(f"{op}: d_q: expected a multiple of 16 (and h_q >= 1), got d_q={d_q}, "
                         f"h_q={h_q}")
    if weight.dim() != 2 or weight.shape[0] != h_q * d_q or weight.element_size() != 1:
        raise ValueError(f"{op}: q_b_proj: expected a 1-byte [h_q * d_q = {h_q * d_q}, "
                         f"q_lora_rank] tensor, got {weight.dtype} {tuple(weight.shape)}")
    if sf.dim() != 2 or sf.shape[0] != h_q * d_q or sf.dtype != _torch().int32:
        raise ValueError(f"{op}: q_b_sf: expected int32 [h_q * d_q = {h_q * d_q}, "
                         f"q_lora_rank / (gran * 4)], got {sf.dtype} {tuple(sf.shape)}")
    rank = weight.shape[1]
    if sf.shape[1] == 0 or rank % (4 * sf.shape[1]) != 0 or rank // (4 * sf.shape[1]) not in (32, 128):
        raise ValueError(f"{op}: q_b_sf: q_lora_rank / (4 * q_b_sf.size(1)) must be 32 or 128; "
                         f"got q_lora_rank {rank}, q_b_sf.size(1) {sf.shape[1]}")
    src = q_b_row_permutation(h_q, d_q, weight.device)
    return weight[src].contiguous(), _mn_major(sf[src])


def permute_wv_proj(weight_and_sf, wv_group_size: int, d_o: int):
    """The grouped output projection's weight [n_wv_group, d_proj_out, wv_group_size * d_o]
    (1-byte e4m3) and its per-32 scales [n_wv_group, d_proj_out, wv_group_size * d_o / 128]
    int32 (packed UE8M0), columns permuted by 32-chunks into the layout of out_fp8. The scales
    come back contiguous on the second dim (DeepGEMM's layout)."""
    op = "permute_wv_proj"
    torch = _torch()
    weight, sf = weight_and_sf
    _require_tensor(op, "wv_proj", weight)
    _require_tensor(op, "wv_sf", sf)
    if wv_group_size < 1 or d_o % 32 != 0:
        raise ValueError(f"{op}: d_o: expected a multiple of 32 (and wv_group_size >= 1), got "
                         f"d_o={d_o}, wv_group_size={wv_group_size}")
    cols = wv_group_size * d_o
    if weight.dim() != 3 or weight.shape[2] != cols or weight.element_size() != 1:
        raise ValueError(f"{op}: wv_proj: expected a 1-byte [n_wv_group, d_proj_out, "
                         f"wv_group_size * d_o = {cols}] tensor, got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    if (sf.dim() != 3 or tuple(sf.shape[:2]) != tuple(weight.shape[:2]) or sf.dtype != torch.int32
            or sf.shape[2] * 128 != cols):
        raise ValueError(f"{op}: wv_sf: expected int32 [{weight.shape[0]}, {weight.shape[1]}, "
                         f"{cols // 128}] (per-32 scales, 4 per int32), got {sf.dtype} "
                         f"{tuple(sf.shape)}")
    src = wv_chunk_permutation(wv_group_size, d_o, weight.device)
    n, m = weight.shape[:2]
    w = weight.reshape(n, m, cols // 32, 32)[:, :, src].reshape(n, m, cols)
    scale_bytes = sf.contiguous().view(torch.uint8).view(n, m, cols // 32)  # little-endian
    scale_bytes = scale_bytes[:, :, src].contiguous()
    return w.contiguous(), _mn_major(scale_bytes.view(torch.int32))


def _register_custom_ops() -> None:
    """The custom ops torch.compile traces (registered now: registration cannot be traced).
    torch is optional, as for the package's other custom ops."""
    try:
        import torch
    except ImportError:
        return
    if hasattr(getattr(torch, "library", None), "custom_op"):
        from . import _fused_torch_ops
        _fused_torch_ops.ops()


_register_custom_ops()
