"""Dense MHA prefill, framework-neutral (docs/semantics.md, dense MHA prefill).

MLA in its non-absorbed form: multi-head attention over variable-length sequences packed along
the token dim, d_qk 192 or 128, d_v 128, bf16 or fp16, optional causal mask (bottom-right
aligned), GQA. Forward and backward take numpy arrays or torch tensors; torch autograd goes
through openmla.flash_mla.flash_attn_varlen_func (an autograd.Function). The backward runs on
SM90 GPUs too (its workspace allocated per call on the tensors' device); the forward on CUDA
tensors raises NotImplementedError until its GPU kernel lands.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Tuple

from . import _C
from . import _api
from . import _frameworks as fw

__all__ = ["mha_prefill", "mha_prefill_backward"]

_HALF = ("bf16", "fp16")


def _int_arg(op: str, arg: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{op}: {arg}: expected an int, got {type(value).__name__}")
    return operator.index(value)


def _check_inputs(op: str, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
    """Types and ranks (the C++ validator checks the rest and names the argument); returns q's
    framework and the two max lengths as ints."""
    _api._check(op, "q", q, _HALF, 3)
    frame = fw.framework_of(q, op, "q")
    _api._check(op, "k", k, _HALF, 3)
    _api._check(op, "v", v, _HALF, 3)
    _api._check(op, "cu_seqlens_q", cu_seqlens_q, ("int32",), 1)
    _api._check(op, "cu_seqlens_kv", cu_seqlens_kv, ("int32",), 1)
    return (frame, _int_arg(op, "max_seqlen_q", max_seqlen_q),
            _int_arg(op, "max_seqlen_kv", max_seqlen_kv))


def new_lse(frame, like: Any, total_q: int, h_q: int, op: str = "mha_prefill"):
    """lse [total_q, h_q] float32 in FlashMLA's layout: contiguous along the tokens (strides
    (1, total_q)), a row-major [h_q, total_q] buffer seen transposed."""
    return frame.empty((h_q, total_q), "fp32", like, op, "lse").swapaxes(0, 1)


def _torch_ops():
    from . import _mha_torch_ops
    return _mha_torch_ops


def mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int, max_seqlen_kv: int, *,
                causal: bool = False, softmax_scale: Optional[float] = None, out=None, lse=None,
                stream: Optional[int] = None) -> Tuple[Any, Any]:
    """Dense MHA prefill forward. Returns (out [total_q, h_q, d_v] in q's dtype, lse
    [total_q, h_q] float32, natural log, contiguous along the tokens).

    q [total_q, h_q, d_qk] bf16|fp16 (d_qk 192 or 128), k [total_kv, h_kv, d_qk] and
    v [total_kv, h_kv, 128] of q's dtype (last dims contiguous, other strides free);
    cu_seqlens_q / cu_seqlens_kv [b + 1] int32 (0 first, non-decreasing, last = the total);
    every length <= max_seqlen_q / max_seqlen_kv. causal: query t of s_q sees key u of s_kv iff
    u <= t + s_kv - s_q. A query that sees no key gets out 0, lse -inf. out= / lse= write into
    given arrays (any strides, out's last dim contiguous). No gradient: see
    openmla.flash_mla.flash_attn_varlen_func for autograd.
    """
    op = "mha_prefill"
    frame, max_q, max_kv = _check_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                         max_seqlen_kv)
    causal = _api._flag_arg(op, "causal", causal)
    scale = _api._scale(op, softmax_scale)
    if _api._tracing(q):
        results = _torch_ops().ops().mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_q,
                                                 max_kv, causal, scale)
        return _api._copy_into(results, (out, lse))
    total_q, h_q, _ = _api._shape(q)
    d_v = _api._shape(v)[2]
    if out is None:
        out = frame.empty((total_q, h_q, d_v), fw.dtype_name(q), q, op, "out")
    else:
        _api._check_out(op, "out", out, (fw.dtype_name(q),), (total_q, h_q, d_v))
    if lse is None:
        lse = new_lse(frame, q, total_q, h_q, op)
    else:
        _api._check_out(op, "lse", lse, ("fp32",), (total_q, h_q))
    _api._device(frame, q, op, "q")
    with frame.guard(q):
        _C.mha_prefill(fw.to_c(q), fw.to_c(k), fw.to_c(v), fw.to_c(cu_seqlens_q),
                       fw.to_c(cu_seqlens_kv), fw.to_c(out), fw.to_c(lse), max_seqlen_q=max_q,
                       max_seqlen_kv=max_kv, causal=causal, softmax_scale=scale,
                       stream=_api._stream(frame, q, stream))
    return out, lse


def mha_prefill_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv,
                         max_seqlen_q: int, max_seqlen_kv: int, *, causal: bool = False,
                         softmax_scale: Optional[float] = None, dq=None, dk=None, dv=None,
                         stream: Optional[int] = None) -> Tuple[Any, Any, Any]:
    """Dense MHA prefill backward: the gradients of out with respect to q, k and v, given dout
    [total_q, h_q, d_v] (q's dtype) and the forward's out and lse. Returns (dq, dk, dv), shaped
    as q, k, v, in q's dtype unless given (dq= / dk= / dv= may also be float32). With GQA, dk and
    dv sum over the query heads of each kv head; keys no query sees get 0.
    """
    op = "mha_prefill_backward"
    frame, max_q, max_kv = _check_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                         max_seqlen_kv)
    _api._check(op, "dout", dout, _HALF, 3)
    _api._check(op, "out", out, _HALF, 3)
    _api._check(op, "lse", lse, ("fp32",), 2)
    causal = _api._flag_arg(op, "causal", causal)
    scale = _api._scale(op, softmax_scale)
    if _api._tracing(q):
        results = _torch_ops().ops().mha_prefill_backward(dout, q, k, v, out, lse, cu_seqlens_q,
                                                          cu_seqlens_kv, max_q, max_kv, causal,
                                                          scale)
        return _api._copy_into(results, (dq, dk, dv))
    grads = []
    for name, given, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        shape = _api._shape(like)
        if given is None:
            given = frame.empty(shape, fw.dtype_name(q), q, op, name)
        else:
            _api._check_out(op, name, given, (fw.dtype_name(q), "fp32"), shape)
        grads.append(given)
    device = _api._device(frame, q, op, "q")
    # CUDA: the fp32 dq accumulator and D = rowsum(dout * out), allocated for this call on q's
    # device (none on the CPU).
    total_q, h_q, d_qk = _api._shape(q)
    total_kv, h_kv, _ = _api._shape(k)
    ws = _C.mha_prefill_backward_workspace_size(device[0], device[1], total_q, total_kv, h_q,
                                                h_kv, d_qk, _api._shape(v)[2])
    workspace = _api._workspace(frame, q, ws, None, op, device, stream=stream)
    with frame.guard(q):
        _C.mha_prefill_backward(
            fw.to_c(dout), fw.to_c(q), fw.to_c(k), fw.to_c(v), fw.to_c(out), fw.to_c(lse),
            fw.to_c(cu_seqlens_q), fw.to_c(cu_seqlens_kv), *(fw.to_c(g) for g in grads),
            max_seqlen_q=max_q, max_seqlen_kv=max_kv, causal=causal, softmax_scale=scale,
            workspace=fw.to_c(workspace), stream=_api._stream(frame, q, stream))
    return tuple(grads)
