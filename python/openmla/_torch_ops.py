"""OpenMLA's operations as torch.library custom ops (namespace `openmla`), with fake (meta)
implementations, so that torch.compile traces them as opaque nodes and CUDA graphs capture them.

Imported by `openmla` only when torch is importable. Eager calls go straight to openmla._api
(no dispatcher overhead); while torch.compile traces, the _api functions route here
(`compiling()`). Every real implementation below runs the _api function on real tensors.
"""

# No `from __future__ import annotations`: custom_op infers its schema from real annotations.
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from . import _api

_NS = "openmla"
registered = False


def compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def _schedule(metadata: Optional[Tensor], num_splits: Optional[Tensor]):
    if metadata is None and num_splits is None:
        return None
    return _api.DecodeSchedule(metadata, num_splits)


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _new_lse(q: Tensor, b: int, s_q: int, h_q: int) -> Tensor:
    """lse [b, h_q, s_q] with FlashMLA's strides, as _api allocates it."""
    return q.new_empty((b, s_q, h_q), dtype=torch.float32).transpose(1, 2)


def num_sm_parts_for(seqlens: Tensor, s_q: int, h_q: int, h_kv: int) -> int:
    """decode_num_sm_parts on seqlens' device (also for fake tensors: a device and shapes)."""
    device = seqlens.device
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _C.decode_num_sm_parts(device.type, index or 0, s_q, h_q, h_kv)


def _register() -> None:
    global registered
    if registered or not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        return
    custom_op = torch.library.custom_op

    # --- dense decode ---------------------------------------------------------------------
    # (check_values: 0 off, 1 on, -1 the environment's OPENMLA_CHECK_VALUES at run time.)
    @custom_op(f"{_NS}::dense_decode", mutates_args=("workspace",))
    def dense_decode(q: Tensor, k_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                     d_v: int, softmax_scale: float, causal: bool,
                     sched_metadata: Optional[Tensor], sched_num_splits: Optional[Tensor],
                     workspace: Optional[Tensor], check_values: int,
                     batch_invariant: bool = False) -> Tuple[Tensor, Tensor]:
        return _api.dense_decode(q, k_cache, block_table, cache_seqlens, d_v=d_v,
                                 softmax_scale=softmax_scale or None, causal=causal,
                                 schedule=_schedule(sched_metadata, sched_num_splits),
                                 workspace=workspace, check_values=_checked(check_values),
                                 batch_invariant=batch_invariant)

    @dense_decode.register_fake
    def _(q, k_cache, block_table, cache_seqlens, d_v, softmax_scale, causal, sched_metadata,
          sched_num_splits, workspace, check_values, batch_invariant=False):
        b, s_q, h_q, _ = q.shape
        return q.new_empty((b, s_q, h_q, d_v)), _new_lse(q, b, s_q, h_q)

    @custom_op(f"{_NS}::dense_decode_out", mutates_args=("out", "lse", "workspace"))
    def dense_decode_out(q: Tensor, k_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                         d_v: int, softmax_scale: float, causal: bool,
                         sched_metadata: Optional[Tensor], sched_num_splits: Optional[Tensor],
                         out: Tensor, lse: Tensor, workspace: Optional[Tensor],
                         check_values: int, batch_invariant: bool = False) -> None:
        _api.dense_decode(q, k_cache, block_table, cache_seqlens, d_v=d_v,
                          softmax_scale=softmax_scale or None, causal=causal,
                          schedule=_schedule(sched_metadata, sched_num_splits), out=out, lse=lse,
                          workspace=workspace, check_values=_checked(check_values),
                          batch_invariant=batch_invariant)

    @dense_decode_out.register_fake
    def _(*args):
        return None

    # --- sparse decode --------------------------------------------------------------------
    @custom_op(f"{_NS}::sparse_decode", mutates_args=("workspace",))
    def sparse_decode(q: Tensor, k_cache: Tensor, indices: Tensor, topk_length: Optional[Tensor],
                      attn_sink: Optional[Tensor], extra_k_cache: Optional[Tensor],
                      extra_indices: Optional[Tensor], extra_topk_length: Optional[Tensor],
                      kv_format: Optional[str], kv_layout: str, extra_kv_format: Optional[str],
                      extra_kv_layout: str, d_v: int, softmax_scale: float,
                      sched_metadata: Optional[Tensor], sched_num_splits: Optional[Tensor],
                      workspace: Optional[Tensor], check_values: int,
                      batch_invariant: bool = False) -> Tuple[Tensor, Tensor]:
        return _api.sparse_decode(
            q, k_cache, indices, topk_length=topk_length, attn_sink=attn_sink,
            extra_k_cache=extra_k_cache, extra_indices=extra_indices,
            extra_topk_length=extra_topk_length, kv_format=kv_format, kv_layout=kv_layout,
            extra_kv_format=extra_kv_format, extra_kv_layout=extra_kv_layout, d_v=d_v,
            softmax_scale=softmax_scale or None,
            schedule=_schedule(sched_metadata, sched_num_splits), workspace=workspace,
            check_values=_checked(check_values), batch_invariant=batch_invariant)

    @sparse_decode.register_fake
    def _(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
          extra_topk_length, kv_format, kv_layout, extra_kv_format, extra_kv_layout, d_v,
          softmax_scale, sched_metadata, sched_num_splits, workspace, check_values,
          batch_invariant=False):
        b, s_q, h_q, _ = q.shape
        return (q.new_empty((b, s_q, h_q, d_v), dtype=torch.bfloat16), _new_lse(q, b, s_q, h_q))

    @custom_op(f"{_NS}::sparse_decode_out", mutates_args=("out", "lse", "workspace"))
    def sparse_decode_out(q: Tensor, k_cache: Tensor, indices: Tensor,
                          topk_length: Optional[Tensor], attn_sink: Optional[Tensor],
                          extra_k_cache: Optional[Tensor], extra_indices: Optional[Tensor],
                          extra_topk_length: Optional[Tensor], kv_format: Optional[str],
                          kv_layout: str, extra_kv_format: Optional[str], extra_kv_layout: str,
                          d_v: int, softmax_scale: float, sched_metadata: Optional[Tensor],
                          sched_num_splits: Optional[Tensor], out: Tensor, lse: Tensor,
                          workspace: Optional[Tensor], check_values: int,
                          batch_invariant: bool = False) -> None:
        _api.sparse_decode(
            q, k_cache, indices, topk_length=topk_length, attn_sink=attn_sink,
            extra_k_cache=extra_k_cache, extra_indices=extra_indices,
            extra_topk_length=extra_topk_length, kv_format=kv_format, kv_layout=kv_layout,
            extra_kv_format=extra_kv_format, extra_kv_layout=extra_kv_layout, d_v=d_v,
            softmax_scale=softmax_scale or None,
            schedule=_schedule(sched_metadata, sched_num_splits), out=out, lse=lse,
            workspace=workspace, check_values=_checked(check_values),
            batch_invariant=batch_invariant)

    @sparse_decode_out.register_fake
    def _(*args):
        return None

    # --- sparse prefill -------------------------------------------------------------------
    @custom_op(f"{_NS}::sparse_prefill", mutates_args=())
    def sparse_prefill(q: Tensor, kv: Tensor, indices: Tensor, softmax_scale: float, d_v: int,
                       attn_sink: Optional[Tensor],
                       topk_length: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        return _api.sparse_prefill(q, kv, indices, softmax_scale=softmax_scale or None, d_v=d_v,
                                   attn_sink=attn_sink, topk_length=topk_length)

    @sparse_prefill.register_fake
    def _(q, kv, indices, softmax_scale, d_v, attn_sink, topk_length):
        s_q, h_q, _ = q.shape
        return (q.new_empty((s_q, h_q, d_v), dtype=torch.bfloat16),
                q.new_empty((s_q, h_q), dtype=torch.float32),
                q.new_empty((s_q, h_q), dtype=torch.float32))

    # Writes into the caller's buffers (flash_mla_sparse_fwd(..., out=): an engine's prefill
    # writing into a slice of its output buffer).
    @custom_op(f"{_NS}::sparse_prefill_out", mutates_args=("out", "max_logits", "lse"))
    def sparse_prefill_out(q: Tensor, kv: Tensor, indices: Tensor, softmax_scale: float,
                           d_v: int, attn_sink: Optional[Tensor], topk_length: Optional[Tensor],
                           out: Tensor, max_logits: Tensor, lse: Tensor) -> None:
        _api.sparse_prefill(q, kv, indices, softmax_scale=softmax_scale or None, d_v=d_v,
                            attn_sink=attn_sink, topk_length=topk_length, out=out,
                            max_logits=max_logits, lse=lse)

    @sparse_prefill_out.register_fake
    def _(*args):
        return None

    # --- merge ----------------------------------------------------------------------------
    @custom_op(f"{_NS}::merge_attention_states", mutates_args=())
    def merge_attention_states(part_out: Tensor, part_lse: Tensor,
                               out_dtype: Optional[str]) -> Tuple[Tensor, Tensor]:
        return _api.merge_attention_states(part_out, part_lse, out_dtype=out_dtype)

    @merge_attention_states.register_fake
    def _(part_out, part_lse, out_dtype):
        _, tokens, heads, d_v = part_out.shape
        dtype = _DTYPES[out_dtype] if out_dtype else part_out.dtype
        return (part_out.new_empty((tokens, heads, d_v), dtype=dtype),
                part_out.new_empty((tokens, heads), dtype=torch.float32))

    # --- KV cache -------------------------------------------------------------------------
    @custom_op(f"{_NS}::kv_cache_write", mutates_args=("cache",))
    def kv_cache_write(kv: Tensor, slot_mapping: Tensor, cache: Tensor, kv_format: Optional[str],
                       kv_layout: str) -> None:
        _api.kv_cache_write(kv, slot_mapping, cache, kv_format=kv_format, kv_layout=kv_layout)

    @kv_cache_write.register_fake
    def _(*args):
        return None

    @custom_op(f"{_NS}::kv_cache_gather", mutates_args=())
    def kv_cache_gather(cache: Tensor, slots: Tensor, kv_format: Optional[str], kv_layout: str,
                        out_dtype: str) -> Tensor:
        return _api.kv_cache_gather(cache, slots, kv_format=kv_format, kv_layout=kv_layout,
                                    out_dtype=out_dtype)

    @kv_cache_gather.register_fake
    def _(cache, slots, kv_format, kv_layout, out_dtype):
        return cache.new_empty((slots.shape[0], _api.cache_d_qk(cache, kv_format)),
                               dtype=_DTYPES[out_dtype])

    @custom_op(f"{_NS}::kv_cache_convert", mutates_args=("dst",))
    def kv_cache_convert(src: Tensor, dst: Tensor, src_format: Optional[str], src_layout: str,
                         dst_format: Optional[str], dst_layout: str, src_blocks: Optional[Tensor],
                         dst_blocks: Optional[Tensor]) -> None:
        _api.kv_cache_convert(src, dst, src_format=src_format, src_layout=src_layout,
                              dst_format=dst_format, dst_layout=dst_layout,
                              src_blocks=src_blocks, dst_blocks=dst_blocks)

    @kv_cache_convert.register_fake
    def _(*args):
        return None

    # --- schedule -------------------------------------------------------------------------
    # num_sm_parts 0: decode_num_sm_parts for seqlens' device, resolved here (outside the trace).
    @custom_op(f"{_NS}::plan_decode_schedule", mutates_args=())
    def plan_decode_schedule(seqlens: Tensor, s_q: int, h_q: int, h_kv: int, num_sm_parts: int,
                             block_tokens: int) -> Tuple[Tensor, Tensor]:
        schedule = _api.plan_decode_schedule(seqlens, s_q, h_q, h_kv,
                                             num_sm_parts=num_sm_parts or None,
                                             block_tokens=block_tokens)
        return schedule.metadata, schedule.num_splits

    @plan_decode_schedule.register_fake
    def _(seqlens, s_q, h_q, h_kv, num_sm_parts, block_tokens):
        parts = num_sm_parts or num_sm_parts_for(seqlens, s_q, h_q, h_kv)
        return (seqlens.new_empty((parts, _C.SCHEDULE_METADATA_INTS), dtype=torch.int32),
                seqlens.new_empty((seqlens.shape[0] + 1,), dtype=torch.int32))

    @custom_op(f"{_NS}::plan_decode_schedule_out", mutates_args=("metadata", "num_splits"))
    def plan_decode_schedule_out(seqlens: Tensor, s_q: int, h_q: int, h_kv: int,
                                 num_sm_parts: int, block_tokens: int, metadata: Tensor,
                                 num_splits: Tensor) -> None:
        _api.plan_decode_schedule(seqlens, s_q, h_q, h_kv, num_sm_parts=num_sm_parts or None,
                                  block_tokens=block_tokens,
                                  out=_api.DecodeSchedule(metadata, num_splits))

    @plan_decode_schedule_out.register_fake
    def _(*args):
        return None

    registered = True


_register()


def _ops():
    return getattr(torch.ops, _NS)


# --- wrappers the _api functions call while torch.compile traces ------------------------------

def _checked(flag: int) -> Optional[bool]:
    return None if flag < 0 else bool(flag)


def _flag(check_values: Optional[bool]) -> int:
    return -1 if check_values is None else int(bool(check_values))


def dense_decode(q, k_cache, block_table, cache_seqlens, d_v, softmax_scale, causal, schedule,
                 out, lse, workspace=None, check_values=None, batch_invariant=False):
    md, ns = schedule if schedule is not None else (None, None)
    flag = _flag(check_values)
    if out is None and lse is None:
        return _ops().dense_decode(q, k_cache, block_table, cache_seqlens, d_v, softmax_scale,
                                   causal, md, ns, workspace, flag, bool(batch_invariant))
    b, s_q, h_q, _ = q.shape
    out = q.new_empty((b, s_q, h_q, d_v)) if out is None else out
    lse = _new_lse(q, b, s_q, h_q) if lse is None else lse
    _ops().dense_decode_out(q, k_cache, block_table, cache_seqlens, d_v, softmax_scale, causal,
                            md, ns, out, lse, workspace, flag, bool(batch_invariant))
    return out, lse


def sparse_decode(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
                  extra_topk_length, kv_format, kv_layout, extra_kv_format, extra_kv_layout, d_v,
                  softmax_scale, schedule, out, lse, workspace=None, check_values=None,
                  batch_invariant=False):
    md, ns = schedule if schedule is not None else (None, None)
    args = (q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
            extra_topk_length, kv_format, kv_layout, extra_kv_format, extra_kv_layout, d_v,
            softmax_scale, md, ns)
    flag = _flag(check_values)
    if out is None and lse is None:
        return _ops().sparse_decode(*args, workspace, flag, bool(batch_invariant))
    b, s_q, h_q, _ = q.shape
    out = q.new_empty((b, s_q, h_q, d_v), dtype=torch.bfloat16) if out is None else out
    lse = _new_lse(q, b, s_q, h_q) if lse is None else lse
    _ops().sparse_decode_out(*args, out, lse, workspace, flag, bool(batch_invariant))
    return out, lse


def sparse_prefill(q, kv, indices, softmax_scale, d_v, attn_sink, topk_length, out=None,
                   max_logits=None, lse=None):
    if out is None and max_logits is None and lse is None:
        return _ops().sparse_prefill(q, kv, indices, softmax_scale, d_v, attn_sink, topk_length)
    s_q, h_q, _ = q.shape
    out = q.new_empty((s_q, h_q, d_v), dtype=torch.bfloat16) if out is None else out
    max_logits = (q.new_empty((s_q, h_q), dtype=torch.float32) if max_logits is None
                  else max_logits)
    lse = q.new_empty((s_q, h_q), dtype=torch.float32) if lse is None else lse
    _ops().sparse_prefill_out(q, kv, indices, softmax_scale, d_v, attn_sink, topk_length, out,
                              max_logits, lse)
    return out, max_logits, lse


def merge_attention_states(part_out, part_lse, out_dtype):
    return _ops().merge_attention_states(part_out, part_lse, out_dtype)


def kv_cache_write(kv, slot_mapping, cache, kv_format, kv_layout):
    _ops().kv_cache_write(kv, slot_mapping, cache, kv_format, kv_layout)


def kv_cache_gather(cache, slots, kv_format, kv_layout, out_dtype):
    return _ops().kv_cache_gather(cache, slots, kv_format, kv_layout, out_dtype)


def kv_cache_convert(src, dst, src_format, src_layout, dst_format, dst_layout, src_blocks,
                     dst_blocks):
    _ops().kv_cache_convert(src, dst, src_format, src_layout, dst_format, dst_layout, src_blocks,
                            dst_blocks)


def plan_decode_schedule(seqlens, s_q, h_q, h_kv, num_sm_parts, block_tokens, out=None):
    if out is not None:
        _ops().plan_decode_schedule_out(seqlens, s_q, h_q, h_kv, num_sm_parts, block_tokens,
                                        out[0], out[1])
        return out
    return _api.DecodeSchedule(*_ops().plan_decode_schedule(seqlens, s_q, h_q, h_kv,
                                                            num_sm_parts, block_tokens))
