"""FlashMLA's dense MHA prefill functions (flash_attn_varlen_func and the packed forms), as
openmla.flash_mla serves them: FlashMLA's names, arguments, defaults and returns, over OpenMLA's
mha_prefill (docs/semantics.md, dense MHA prefill).

Torch tensors go through an autograd.Function (loss.backward() reaches q, k and v, or the
packed qkv / kv), which torch.compile(fullgraph=True) traces; numpy arrays run the forward only.
CPU backend only: CUDA tensors raise NotImplementedError until the GPU kernel lands.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _api
from . import _frameworks as fw
from . import _mha_prefill

__all__ = ["flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]


def _unsupported(op: str, dropout_p: float, deterministic: bool) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"{op}: dropout_p: dropout is not supported, expected 0.0, got "
                         f"{dropout_p}")
    if deterministic:
        raise ValueError(f"{op}: deterministic: the deterministic backward mode is not "
                         "supported (as in FlashMLA); pass deterministic=False")


def _fixed_lengths(op: str, q, k, cu_seqlens_q) -> Tuple[Any, Any, int, int]:
    """is_varlen=False: b = len(cu_seqlens_q) - 1 sequences of total / b tokens each (FlashMLA's
    fixed-length mode; the values of cu_seqlens are not used)."""
    b = int(cu_seqlens_q.shape[0]) - 1
    total_q, total_kv = int(q.shape[0]), int(k.shape[0])
    if b < 1 or total_q % b or total_kv % b:
        raise ValueError(f"{op}: is_varlen=False: expected b = len(cu_seqlens) - 1 >= 1 "
                         f"dividing the token counts of q ({total_q}) and k ({total_kv}), "
                         f"got b = {b}")
    frame = fw.framework_of(q, op, "q")
    steps = frame.arange(b + 1, q)
    return steps * (total_q // b), steps * (total_kv // b), total_q // b, total_kv // b


def _run(op: str, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
         softmax_scale, causal, is_varlen):
    if not is_varlen:
        cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv = _fixed_lengths(
            op, q, k, cu_seqlens_q)
    if fw.is_torch_tensor(q):
        _mha_prefill._check_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                   max_seqlen_kv)
        # The autograd.Function saves them for the backward: torch tensors, as q is.
        for name, x in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                        ("cu_seqlens_kv", cu_seqlens_kv)):
            if not fw.is_torch_tensor(x):
                raise TypeError(f"{op}: {name}: expected a torch.Tensor (q is one), got "
                                f"{type(x).__name__}")
        _api._scale(op, softmax_scale)
        from ._mha_torch_ops import MhaPrefillFunction
        return MhaPrefillFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                        max_seqlen_kv, bool(causal), softmax_scale)
    return _mha_prefill.mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                    max_seqlen_kv, causal=causal, softmax_scale=softmax_scale)


def flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo: int,
                           max_seqlen_kv: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           deterministic: bool = False, is_varlen: bool = True):
    """Dense MHA attention with variable-length batching. Returns (out, lse).

    q [total_q, h_q, d_qk] bf16|fp16 (d_qk 192 or 128), k [total_kv, h_kv, d_qk], v
    [total_kv, h_kv, 128] (h_q a multiple of h_kv); cu_seqlens_qo / cu_seqlens_kv [b + 1] int32;
    max_seqlen_qo / max_seqlen_kv the longest lengths. causal: bottom-right aligned (query t of
    s_q sees key u of s_kv iff u <= t + s_kv - s_q). softmax_scale defaults to d_qk ** -0.5.
    dropout_p must be 0.0 and deterministic False. is_varlen=False: b = len(cu_seqlens_qo) - 1
    sequences of equal length (total / b), the cu_seqlens values unused.

    Returns out [total_q, h_q, 128] (q's dtype) and lse [total_q, h_q] float32, natural log,
    contiguous along the tokens (stride(0) == 1); a query that sees no key gets out 0 and
    lse -inf. With torch, out is differentiable in q, k and v (lse is not).
    """
    op = "flash_attn_varlen_func"
    _unsupported(op, dropout_p, deterministic)
    return _run(op, q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                softmax_scale, causal, is_varlen)


def _packed_dim(op: str, arg: str, x, head_dim_qk: int, parts: int) -> None:
    _api._check(op, arg, x, ("bf16", "fp16"), 3)
    if isinstance(head_dim_qk, bool) or not isinstance(head_dim_qk, int) or head_dim_qk < 1:
        raise TypeError(f"{op}: head_dim_qk: expected a positive int, got {head_dim_qk!r}")
    last = int(x.shape[2])
    if last <= parts * head_dim_qk:
        raise ValueError(f"{op}: {arg}: expected a last dim of {parts} * head_dim_qk "
                         f"({parts} * {head_dim_qk}) + head_dim_vo, got {last} (shape "
                         f"{list(x.shape)}; the packing is along the last dim)")


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen: int, head_dim_qk: int,
                                     dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None,
                                     causal: bool = False, deterministic: bool = False,
                                     is_varlen: bool = True):
    """flash_attn_varlen_func with q, k and v packed along the last dim (FlashMLA's layout):
    qkv [total, h, 2 * head_dim_qk + head_dim_vo], q = qkv[:, :, :head_dim_qk], k =
    qkv[:, :, head_dim_qk:2 * head_dim_qk], v = qkv[:, :, 2 * head_dim_qk:]; cu_seqlens and
    max_seqlen serve both q and k/v. Not flash-attn's [total, 3, h, d] layout. Returns
    (out, lse); with torch, the gradient reaches qkv."""
    op = "flash_attn_varlen_qkvpacked_func"
    _unsupported(op, dropout_p, deterministic)
    _packed_dim(op, "qkv", qkv, head_dim_qk, 2)
    d = head_dim_qk
    return _run(op, qkv[:, :, :d], qkv[:, :, d:2 * d], qkv[:, :, 2 * d:], cu_seqlens,
                cu_seqlens, max_seqlen, max_seqlen, softmax_scale, causal, is_varlen)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo: int,
                                    max_seqlen_kv: int, head_dim_qk: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    deterministic: bool = False, is_varlen: bool = True):
    """flash_attn_varlen_func with k and v packed along the last dim (FlashMLA's layout):
    kv [total_kv, h_kv, head_dim_qk + head_dim_vo], k = kv[:, :, :head_dim_qk], v =
    kv[:, :, head_dim_qk:]. Not flash-attn's [total_kv, 2, h_kv, d] layout. Returns (out, lse);
    with torch, the gradient reaches q and kv."""
    op = "flash_attn_varlen_kvpacked_func"
    _unsupported(op, dropout_p, deterministic)
    _packed_dim(op, "kv", kv, head_dim_qk, 1)
    d = head_dim_qk
    return _run(op, q, kv[:, :, :d], kv[:, :, d:], cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                max_seqlen_kv, softmax_scale, causal, is_varlen)
