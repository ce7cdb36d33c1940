"""Dense MHA prefill for torch: custom ops (torch.ops.openmla.mha_prefill and
mha_prefill_backward, with fake implementations, so torch.compile traces them as opaque nodes)
and the autograd.Function behind openmla.flash_mla.flash_attn_varlen_func.

Imported by `openmla` only when torch is importable. As in _torch_ops.py: eager calls go straight
to the neutral functions (openmla/_mha_prefill.py); while torch.compile traces, those route to
the custom ops.
"""

# No `from __future__ import annotations`: custom_op infers its schema from real annotations.
from typing import Tuple

import torch
from torch import Tensor

from . import _mha_prefill

_NS = "openmla"
registered = False


def _register() -> None:
    global registered
    if registered or not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        return
    custom_op = torch.library.custom_op

    # softmax_scale 0.0: the default 1/sqrt(d_qk).
    @custom_op(f"{_NS}::mha_prefill", mutates_args=())
    def mha_prefill(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_kv: Tensor, max_seqlen_q: int, max_seqlen_kv: int, causal: bool,
                    softmax_scale: float) -> Tuple[Tensor, Tensor]:
        return _mha_prefill.mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                        max_seqlen_kv, causal=causal,
                                        softmax_scale=softmax_scale or None)

    @mha_prefill.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, causal,
          softmax_scale):
        total_q, h_q, _ = q.shape
        return (q.new_empty((total_q, h_q, v.shape[2])),
                q.new_empty((h_q, total_q), dtype=torch.float32).transpose(0, 1))

    @custom_op(f"{_NS}::mha_prefill_backward", mutates_args=())
    def mha_prefill_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                             lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_kv: Tensor,
                             max_seqlen_q: int, max_seqlen_kv: int, causal: bool,
                             softmax_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
        return _mha_prefill.mha_prefill_backward(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
            causal=causal, softmax_scale=softmax_scale or None)

    @mha_prefill_backward.register_fake
    def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
          causal, softmax_scale):
        return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape))

    registered = True


_register()


def ops():
    return getattr(torch.ops, _NS)


class MhaPrefillFunction(torch.autograd.Function):
    """(out, lse) = mha_prefill(q, k, v, ...), differentiable in q, k and v (not in lse, which
    is marked non-differentiable). The backward is mha_prefill_backward with the saved out and
    lse."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, causal,
                softmax_scale):
        out, lse = _mha_prefill.mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                            max_seqlen_kv, causal=causal,
                                            softmax_scale=softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv)
        ctx.max_seqlen_q = max_seqlen_q
        ctx.max_seqlen_kv = max_seqlen_kv
        ctx.causal = causal
        ctx.softmax_scale = softmax_scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        del dlse  # lse is not differentiable
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        if torch.compiler.is_compiling():
            # Traced under dynamo's strict rules for backward: straight to the custom op (the
            # forward checked the arguments).
            dq, dk, dv = ops().mha_prefill_backward(
                dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, ctx.max_seqlen_q,
                ctx.max_seqlen_kv, ctx.causal, float(ctx.softmax_scale or 0.0))
        else:
            dq, dk, dv = _mha_prefill.mha_prefill_backward(
                dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, ctx.max_seqlen_q,
                ctx.max_seqlen_kv, causal=ctx.causal, softmax_scale=ctx.softmax_scale)
        return dq, dk, dv, None, None, None, None, None, None
