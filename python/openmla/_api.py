"""Framework-neutral OpenMLA functions.

Every function takes numpy arrays or torch tensors (CPU or CUDA), allocates its outputs with the
caller's framework on the caller's device (unless they are passed in), runs the C++ operation on
the framework's current stream (torch) and returns the outputs. Wrong dtypes raise TypeError,
wrong shapes, devices or formats ValueError, each naming the argument, before anything runs; an
operation without a kernel on the tensors' device raises NotImplementedError.

numpy has no bfloat16: use ml_dtypes.bfloat16 arrays (pip install ml_dtypes) for bf16 data, or
float32 where the operation accepts it (kv_cache_write's input, merge_attention_states,
kv_cache_gather's output, quantize/dequantize).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional, Sequence, Tuple

from . import _C
from . import _frameworks as fw

__all__ = [
    "DecodeSchedule", "dense_decode", "sparse_decode", "sparse_prefill",
    "sparse_prefill_from_cache", "merge_attention_states",
    "kv_cache_write", "kv_cache_gather", "kv_cache_convert", "quantize", "dequantize",
    "new_kv_cache", "plan_decode_schedule", "decode_num_sm_parts", "kv_format_info", "kv_layout",
    "describe_kv_cache", "cache_d_qk", "infer_kv_format", "KV_FORMATS", "cuda_backend_available",
    "decode_workspace", "decode_workspace_size", "prefill_workspace_size", "no_split_schedule",
]

KV_FORMATS = tuple(_C.kv_format_names())
_LAYOUTS = ("default", "interleaved")


class DecodeSchedule(NamedTuple):
    """A split-KV schedule (see plan_decode_schedule); reusable across the layers of a step."""
    metadata: Any    # [num_sm_parts, 8] int32
    num_splits: Any  # [batch + 1] int32


# --- argument checks ------------------------------------------------------------------------

def _shape(x: Any) -> Tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _shape_str(x: Any) -> str:
    return "[" + ", ".join(str(s) for s in _shape(x)) + "]"


def _require_array(op: str, arg: str, x: Any) -> None:
    if not fw.is_array(x):
        raise TypeError(f"{op}: {arg}: expected an array (numpy.ndarray or torch.Tensor), got "
                        f"{type(x).__name__}")
    if fw.is_torch_tensor(x) and (x.is_nested or x.layout != fw._torch().strided):
        kind = "a nested tensor" if x.is_nested else f"layout {x.layout}"
        raise TypeError(f"{op}: {arg}: expected a dense (strided) tensor, got {kind}")


def _check(op: str, arg: str, x: Any, dtypes: Sequence[str], rank: Optional[int] = None,
           optional: bool = False) -> None:
    """TypeError unless `x` is an array of one of `dtypes`; ValueError unless it has `rank` dims."""
    if x is None:
        if optional:
            return
        raise TypeError(f"{op}: {arg}: required, got None")
    _require_array(op, arg, x)
    name = fw.dtype_name(x)
    if name not in dtypes:
        raise TypeError(f"{op}: {arg}: expected dtype {' or '.join(dtypes)}, got {name}")
    if rank is not None and len(x.shape) != rank:
        raise ValueError(f"{op}: {arg}: expected {rank} dimensions, got {len(x.shape)} "
                         f"(shape {_shape_str(x)})")


def _check_out(op: str, arg: str, x: Any, dtypes: Sequence[str], shape: Sequence[int]) -> None:
    _check(op, arg, x, dtypes, len(shape))
    if _shape(x) != tuple(shape):
        raise ValueError(f"{op}: {arg}: expected shape {list(shape)}, got {_shape_str(x)}")
    if isinstance(x, fw.np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{op}: {arg}: the output array is read-only")


def _check_cache(op: str, arg: str, x: Any, optional: bool = False) -> None:
    _check(op, arg, x, fw.BYTE_DTYPES + ("bf16", "fp16"), optional=optional)
    if x is not None and len(x.shape) not in (3, 4):
        raise ValueError(f"{op}: {arg}: expected shape [num_blocks, page_size, 1, bytes_per_token] "
                         f"(or [num_blocks, page_size, bytes_per_token]), got {_shape_str(x)}")


def _check_format(op: str, arg: str, kv_format: Optional[str], layout: str) -> None:
    if kv_format is not None and kv_format not in KV_FORMATS:
        raise ValueError(f"{op}: {arg}: unknown KV format {kv_format!r} (expected one of "
                         f"{', '.join(KV_FORMATS)})")
    if layout not in _LAYOUTS:
        raise ValueError(f"{op}: {arg}: unknown KV layout {layout!r} (expected 'default' or "
                         "'interleaved')")


def _scale(op: str, softmax_scale: Optional[float]) -> float:
    # The C++ API reads a scale <= 0 as "the default 1/sqrt(d_qk)"; None is that default here.
    if softmax_scale is None:
        return 0.0
    scale = float(softmax_scale)
    if not (0.0 < scale < float("inf")):
        raise ValueError(f"{op}: softmax_scale: expected a finite number > 0 (or None for "
                         f"1/sqrt(d_qk)), got {softmax_scale}")
    return scale


def _flag_arg(op: str, arg: str, value: Any) -> bool:
    """A boolean argument: True/False (numpy's bool_ too), else TypeError naming it."""
    if isinstance(value, (bool, fw.np.bool_)):
        return bool(value)
    raise TypeError(f"{op}: {arg}: expected a bool, got {type(value).__name__}")


def _stream(frame, like: Any, stream: Optional[int]) -> int:
    return frame.stream(like) if stream is None else int(stream)


def _workspace(frame, like: Any, size: int, given: Any = None, op: str = "", device=None,
               size_fn: str = "decode_workspace_size", stream: Optional[int] = None):
    """The workspace of one call: `given` (the caller's, reused across calls: nothing is
    allocated) after its checks, else a fresh buffer (None when the operation needs none), kept
    from reuse until the caller's `stream` (when one is named) has finished with it."""
    if given is None:
        if size <= 0:
            return None
        buffer = frame.empty((size,), "uint8", like)
        if stream is not None:
            frame.keep_for_stream(buffer, int(stream))
        return buffer
    _check(op, "workspace", given, ("uint8",), 1)
    if fw.framework_of(given, op, "workspace") is not frame or (
            device is not None and frame.device(given) != device):
        raise ValueError(f"{op}: workspace: expected a uint8 array of q's framework and device")
    if int(given.shape[0]) < size:
        raise ValueError(f"{op}: workspace: expected at least {size} bytes "
                         f"({size_fn}), got {int(given.shape[0])}")
    return given if size > 0 else None


def _lse_buffer(frame, like: Any, b: int, s_q: int, h_q: int, op: str):
    """lse [b, h_q, s_q] as FlashMLA returns it: a [b, s_q, h_q] buffer seen through
    transpose(1, 2) (strides (s_q * h_q, 1, h_q)), so `lse.transpose(1, 2)` is contiguous."""
    return frame.empty((b, s_q, h_q), "fp32", like, op, "lse").swapaxes(1, 2)


def check_values_enabled(check_values: Optional[bool]) -> bool:
    """The checked mode: `check_values`, or when None the environment's OPENMLA_CHECK_VALUES."""
    if check_values is not None:
        return bool(check_values)
    return os.environ.get("OPENMLA_CHECK_VALUES", "0").strip().lower() not in (
        "", "0", "false", "no", "off")


def _host(x: Any):
    """A numpy copy of x's values (a device-to-host copy and a sync for a CUDA tensor)."""
    if fw.is_torch_tensor(x):
        return x.detach().to("cpu").numpy()
    return fw.np.asarray(x)


def _check_lengths(op: str, arg: str, lengths: Any, upper: int, what: str) -> Any:
    values = _host(lengths).astype(fw.np.int64)
    bad = fw.np.nonzero((values < 0) | (values > upper))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{op}: {arg}[{i}]: expected 0 <= value <= {upper} ({what}), got "
                         f"{int(values[i])} ({bad.size} bad value(s); checked mode)")
    return values


def _check_dense_values(op: str, k_cache, block_table, cache_seqlens) -> None:
    """Checked mode of dense decode: every length within the block table's capacity and every
    block id a request uses within the cache, else ValueError naming the entry."""
    num_blocks, page_size = int(k_cache.shape[0]), int(k_cache.shape[1])
    max_blocks = int(block_table.shape[1])
    capacity = max_blocks * page_size
    lengths = _check_lengths(op, "cache_seqlens", cache_seqlens, capacity,
                             f"block_table holds {max_blocks} blocks of {page_size} tokens")
    table = _host(block_table).astype(fw.np.int64)
    used = (lengths + page_size - 1) // page_size
    in_use = fw.np.arange(max_blocks)[None, :] < used[:, None]
    bad = fw.np.argwhere(in_use & ((table < 0) | (table >= num_blocks)))
    if bad.size:
        i, j = (int(v) for v in bad[0])
        raise ValueError(f"{op}: block_table[{i}, {j}]: expected a block in [0, {num_blocks}) "
                         f"(request {i} uses its first {int(used[i])} entries), got "
                         f"{int(table[i, j])} (checked mode)")


def _check_sparse_values(op: str, indices, topk_length, extra_indices, extra_topk_length) -> None:
    """Checked mode of sparse decode: topk_length / extra_topk_length within [0, topk]. (Index
    values are not errors: an index outside the cache is ignored, never read.)"""
    if topk_length is not None:
        topk = int(indices.shape[-1])
        _check_lengths(op, "topk_length", topk_length, topk, f"indices hold {topk} per query")
    if extra_topk_length is not None and extra_indices is not None:
        extra = int(extra_indices.shape[-1])
        _check_lengths(op, "extra_topk_length", extra_topk_length, extra,
                       f"extra_indices hold {extra} per query")


def _device(frame, like: Any, op: str, arg: str) -> Tuple[str, int]:
    device = frame.device(like)
    if device[0] not in ("cpu", "cuda"):
        raise ValueError(f"{op}: {arg}: expected a CPU or CUDA tensor, got device {device[0]}")
    return device


def _tracing(x: Any) -> bool:
    """True while torch.compile traces a call on torch tensors: route it to the custom ops."""
    torch = fw._torch()
    if torch is None or not isinstance(x, torch.Tensor):
        return False
    compiler = getattr(torch, "compiler", None)
    if compiler is None or not getattr(compiler, "is_compiling", lambda: False)():
        return False
    from . import _torch_ops
    return _torch_ops.registered


def _custom_ops():
    from . import _torch_ops
    return _torch_ops


def _copy_into(results, outs):
    """Under torch.compile: the functional op's results, copied into the given outputs."""
    merged = []
    for result, given in zip(results, outs):
        if given is None:
            merged.append(result)
        else:
            given.copy_(result)
            merged.append(given)
    return tuple(merged)


def _schedule_args(schedule: Optional[DecodeSchedule]) -> dict:
    if schedule is None:
        return {}
    metadata, num_splits = schedule
    return {"sched_metadata": fw.to_c(metadata), "sched_num_splits": fw.to_c(num_splits)}


# --- decode ---------------------------------------------------------------------------------

def dense_decode(q, k_cache, block_table, cache_seqlens, *, d_v: int = 512,
                 softmax_scale: Optional[float] = None, causal: bool = False,
                 schedule: Optional[DecodeSchedule] = None, out=None, lse=None, workspace=None,
                 check_values: Optional[bool] = None, stream: Optional[int] = None,
                 kv_format: Optional[str] = None, kv_layout: str = "default",
                 batch_invariant: bool = False):
    """Dense decode (V3/V3.1 MLA, absorbed form): (out [b, s_q, h_q, d_v], lse [b, h_q, s_q]).

    q [b, s_q, h_q, d_qk] bf16|fp16; k_cache [num_blocks, page_size, h_kv, d_qk] (q's dtype), or a
    quantised paged cache [num_blocks, page_size, 1, bytes_per_token] uint8 of any format (format
    from bytes per token, or `kv_format`; q bf16; d_v 512 on the GPU, where `schedule` is not
    used); block_table [b, max_blocks] int32; cache_seqlens [b] int32. lse has
    FlashMLA's strides (a [b, s_q, h_q] buffer seen as [b, h_q, s_q]).

    Values: on the CPU, a length outside [0, max_blocks * page_size] or a used block id outside
    [0, num_blocks) raises ValueError. On the GPU nothing is checked by default (no host sync):
    a negative length counts as 0 keys, a length above the capacity as the capacity, and a used
    block id outside the cache reads zero keys (over a quantised cache: names no key, skipped);
    nothing outside the cache is ever read.
    check_values=True (or OPENMLA_CHECK_VALUES=1) checks them on every device first and raises
    ValueError naming the entry (it copies cache_seqlens and block_table to the host: a sync).

    workspace: a uint8 [n] buffer of at least decode_workspace_size(...) bytes, reused across
    calls (with out= and lse=, the call allocates nothing: CUDA-graph friendly).

    batch_invariant=True: each request's result is independent of the batch it is in. On the
    GPU no request is split over workers (the call makes a schedule that keeps every request
    whole, no_split_schedule; `schedule` must then be None), so a batch smaller than the SM
    count uses fewer SMs. The CPU backend always is batch-invariant. Over a quantised cache the
    GPU has no such mode yet (NotImplementedError).
    """
    op = "dense_decode"
    _check(op, "q", q, ("bf16", "fp16"), 4)
    frame = fw.framework_of(q, op, "q")
    as_cache = kv_format is not None or (fw.is_array(k_cache) and
                                         fw.dtype_name(k_cache) in fw.BYTE_DTYPES)
    if as_cache:
        _check_cache(op, "k_cache", k_cache)
        _check_format(op, "kv_format", kv_format, kv_layout)
    else:
        _check(op, "k_cache", k_cache, (fw.dtype_name(q),), 4)
    _check(op, "block_table", block_table, ("int32",), 2)
    _check(op, "cache_seqlens", cache_seqlens, ("int32",), 1)
    scale = _scale(op, softmax_scale)
    batch_invariant = _flag_arg(op, "batch_invariant", batch_invariant)
    if batch_invariant and schedule is not None:
        raise ValueError(f"{op}: schedule: must be None with batch_invariant=True (a "
                         "batch-invariant decode splits no request and makes its own schedule)")
    if _tracing(q):
        return _custom_ops().dense_decode(q, k_cache, block_table, cache_seqlens, d_v, scale,
                                          bool(causal), schedule, out, lse, workspace,
                                          check_values, batch_invariant)
    b, s_q, h_q, _ = _shape(q)
    h_kv = int(k_cache.shape[2])
    qdt = fw.dtype_name(q)
    if out is None:
        out = frame.empty((b, s_q, h_q, d_v), qdt, q, op, "out")
    else:
        _check_out(op, "out", out, (qdt,), (b, s_q, h_q, d_v))
    if lse is None:
        lse = _lse_buffer(frame, q, b, s_q, h_q, op)
    else:
        _check_out(op, "lse", lse, ("fp32",), (b, h_q, s_q))
    device = _device(frame, q, op, "q")
    ws = 0
    if h_kv >= 1 and h_q % h_kv == 0:
        ws = _C.dense_decode_workspace_size(device[0], device[1], b, s_q, h_q, h_kv, d_v)
    ws_array = _workspace(frame, q, ws, workspace, op, device, stream=stream)
    if check_values_enabled(check_values) and len(k_cache.shape) == 4:
        _check_dense_values(op, k_cache, block_table, cache_seqlens)
    if batch_invariant:
        if as_cache and device[0] == "cuda":
            raise NotImplementedError(
                f"{op}: batch_invariant: dense decode over a quantised cache has no "
                "batch-invariant mode on the GPU yet (a bf16/fp16 cache has; so does sparse "
                "decode, and every decode on the CPU)")
        if not as_cache and h_kv >= 1 and h_q % h_kv == 0:
            parts = _C.decode_num_sm_parts(device[0], device[1], s_q, h_q, h_kv)
            schedule = no_split_schedule(q, b, parts)
    with frame.guard(q):
        _C.dense_decode(fw.to_c(q), fw.to_c(k_cache), fw.to_c(block_table),
                        fw.to_c(cache_seqlens), fw.to_c(out), fw.to_c(lse), d_v=d_v,
                        softmax_scale=scale, causal=bool(causal), workspace=fw.to_c(ws_array),
                        stream=_stream(frame, q, stream), as_kv_cache=as_cache,
                        k_cache_format=kv_format, k_cache_layout=kv_layout,
                        **_schedule_args(schedule))
    return out, lse


def sparse_decode(q, k_cache, indices, *, topk_length=None, attn_sink=None, extra_k_cache=None,
                  extra_indices=None, extra_topk_length=None, kv_format: Optional[str] = None,
                  kv_layout: str = "default", extra_kv_format: Optional[str] = None,
                  extra_kv_layout: str = "default", d_v: int = 512,
                  softmax_scale: Optional[float] = None,
                  schedule: Optional[DecodeSchedule] = None, out=None, lse=None,
                  workspace=None, check_values: Optional[bool] = None,
                  stream: Optional[int] = None, batch_invariant: bool = False):
    """Sparse decode (V3.2 DSA, V4, V4.1). Returns (out [b, s_q, h_q, d_v] bf16, lse [b, h_q, s_q]).

    batch_invariant=True: each query token's result is independent of the batch it is in (on the
    GPU no split-KV: fewer SMs busy at small batches); the CPU backend always is.

    q [b, s_q, h_q, d_qk] bf16; k_cache: cache bytes [num_blocks, page_size, 1, bytes_per_token]
    (format from bytes per token, or `kv_format`) or a bf16 cache [num_blocks, page_size, 1, d_qk];
    indices [b, s_q, topk] int32 of slots block * page_size + offset (out of range: ignored,
    never read). lse has FlashMLA's strides (a [b, s_q, h_q] buffer seen as [b, h_q, s_q]).
    topk_length[i] counts the first entries of request i, clamped to [0, topk];
    check_values=True (or OPENMLA_CHECK_VALUES=1) raises ValueError for a length outside
    [0, topk] instead (a host copy: a sync). workspace: as for dense_decode.
    """
    op = "sparse_decode"
    _check(op, "q", q, ("bf16",), 4)
    frame = fw.framework_of(q, op, "q")
    _check_cache(op, "k_cache", k_cache)
    _check_format(op, "kv_format", kv_format, kv_layout)
    _check(op, "indices", indices, ("int32",), 3)
    _check(op, "topk_length", topk_length, ("int32",), 1, optional=True)
    _check(op, "attn_sink", attn_sink, ("fp32",), 1, optional=True)
    _check_cache(op, "extra_k_cache", extra_k_cache, optional=True)
    _check_format(op, "extra_kv_format", extra_kv_format, extra_kv_layout)
    _check(op, "extra_indices", extra_indices, ("int32",), 3, optional=True)
    _check(op, "extra_topk_length", extra_topk_length, ("int32",), 1, optional=True)
    scale = _scale(op, softmax_scale)
    batch_invariant = _flag_arg(op, "batch_invariant", batch_invariant)
    if _tracing(q):
        return _custom_ops().sparse_decode(
            q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
            extra_topk_length, kv_format, kv_layout, extra_kv_format, extra_kv_layout, d_v,
            scale, schedule, out, lse, workspace, check_values, batch_invariant)
    b, s_q, h_q, _ = _shape(q)
    if out is None:
        out = frame.empty((b, s_q, h_q, d_v), "bf16", q, op, "out")
    else:
        _check_out(op, "out", out, ("bf16",), (b, s_q, h_q, d_v))
    if lse is None:
        lse = _lse_buffer(frame, q, b, s_q, h_q, op)
    else:
        _check_out(op, "lse", lse, ("fp32",), (b, h_q, s_q))
    device = _device(frame, q, op, "q")
    ws = _C.sparse_decode_workspace_size(device[0], device[1], b, s_q, h_q, d_v)
    ws_array = _workspace(frame, q, ws, workspace, op, device, stream=stream)
    if check_values_enabled(check_values):
        _check_sparse_values(op, indices, topk_length, extra_indices, extra_topk_length)
    with frame.guard(q):
        _C.sparse_decode(
            fw.to_c(q), fw.to_c(k_cache), fw.to_c(indices), fw.to_c(out), fw.to_c(lse),
            k_cache_format=kv_format, k_cache_layout=kv_layout, topk_length=fw.to_c(topk_length),
            extra_k_cache=fw.to_c(extra_k_cache), extra_k_cache_format=extra_kv_format,
            extra_k_cache_layout=extra_kv_layout, extra_indices=fw.to_c(extra_indices),
            extra_topk_length=fw.to_c(extra_topk_length), attn_sink=fw.to_c(attn_sink), d_v=d_v,
            softmax_scale=scale, workspace=fw.to_c(ws_array),
            stream=_stream(frame, q, stream), batch_invariant=bool(batch_invariant),
            **_schedule_args(schedule))
    return out, lse


def sparse_prefill(q, kv, indices, *, softmax_scale: Optional[float] = None, d_v: int = 512,
                   attn_sink=None, topk_length=None, out=None, max_logits=None, lse=None,
                   stream: Optional[int] = None, workspace=None):
    """Sparse prefill. Returns (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q], lse [s_q, h_q]).

    q [s_q, h_q, d_qk] bf16; kv [s_kv, h_kv, d_qk] bf16; indices [s_q, h_kv, topk] int32
    (invalid: < 0 or >= s_kv). workspace: a uint8 [n] buffer of at least
    prefill_workspace_size(q, s_q, h_q, d_v) bytes, reused across calls (else one is allocated).
    """
    op = "sparse_prefill"
    _check(op, "q", q, ("bf16",), 3)
    frame = fw.framework_of(q, op, "q")
    _check(op, "kv", kv, ("bf16",), 3)
    _check(op, "indices", indices, ("int32",), 3)
    _check(op, "attn_sink", attn_sink, ("fp32",), 1, optional=True)
    _check(op, "topk_length", topk_length, ("int32",), 1, optional=True)
    scale = _scale(op, softmax_scale)
    if _tracing(q):
        return _custom_ops().sparse_prefill(q, kv, indices, scale, d_v, attn_sink, topk_length,
                                            out, max_logits, lse)
    return _run_prefill(frame, op, q, kv, indices, scale, d_v, attn_sink, topk_length, out,
                        max_logits, lse, stream, workspace=workspace)


def _run_prefill(frame, op, q, keys, indices, scale, d_v, attn_sink, topk_length, out,
                 max_logits, lse, stream, cache_format=None, cache_layout=None,
                 dequantize_once=None, workspace=None, fp8_tensor_cores=False):
    """Outputs allocated or checked, then the extension's sparse_prefill: keys are kv rows, or a
    paged cache when cache_layout is given (then the workspace as dequantize_once asks, or with
    fp8_tensor_cores the size with topk and k_cache, which that path needs)."""
    s_q, h_q, _ = _shape(q)
    if out is None:
        out = frame.empty((s_q, h_q, d_v), "bf16", q, op, "out")
    else:
        _check_out(op, "out", out, ("bf16",), (s_q, h_q, d_v))
    if max_logits is None:
        max_logits = frame.empty((s_q, h_q), "fp32", q, op, "max_logits")
    else:
        _check_out(op, "max_logits", max_logits, ("fp32",), (s_q, h_q))
    if lse is None:
        lse = frame.empty((s_q, h_q), "fp32", q, op, "lse")
    else:
        _check_out(op, "lse", lse, ("fp32",), (s_q, h_q))
    device = _device(frame, q, op, "q")
    ws = _C.sparse_prefill_workspace_size(device[0], device[1], s_q, h_q, d_v)
    size_fn = "prefill_workspace_size"
    # A caller's workspace needs the direct path's size (the call dequantises once where it holds
    # more: prefill_workspace_size with k_cache); one allocated here, as dequantize_once asks.
    # The FP8 path always needs the size with topk and k_cache, a caller's workspace included.
    if cache_layout is not None and (fp8_tensor_cores or
                                     (workspace is None and dequantize_once is not False)):
        once = _C.sparse_prefill_cache_workspace_size(fw.to_c(keys), s_q, h_q,
                                                       int(_shape(indices)[2]), cache_format,
                                                       cache_layout, d_v)
        if fp8_tensor_cores or dequantize_once or once <= _DEQUANT_ONCE_DEFAULT_MAX_BYTES:
            ws = once
        if fp8_tensor_cores:
            size_fn = "prefill_workspace_size with topk and k_cache"
    ws_array = _workspace(frame, q, ws, workspace, op, device, size_fn, stream=stream)
    with frame.guard(q):
        _C.sparse_prefill(fw.to_c(q), fw.to_c(keys), fw.to_c(indices), fw.to_c(out),
                          fw.to_c(max_logits), fw.to_c(lse), topk_length=fw.to_c(topk_length),
                          attn_sink=fw.to_c(attn_sink), d_v=d_v, softmax_scale=scale,
                          workspace=fw.to_c(ws_array),
                          stream=_stream(frame, q, stream), as_kv_cache=cache_layout is not None,
                          k_cache_format=cache_format, k_cache_layout=cache_layout or "default",
                          fp8_tensor_cores=bool(fp8_tensor_cores))
    return out, max_logits, lse


# sparse_prefill_from_cache's default: the workspace that dequantises each named slot once, up to
# this size (beyond it the call decodes keys where they are gathered unless asked).
_DEQUANT_ONCE_DEFAULT_MAX_BYTES = 2 << 30


def sparse_prefill_from_cache(q, k_cache, indices, *, kv_format: Optional[str] = None,
                              kv_layout: str = "default", softmax_scale: Optional[float] = None,
                              d_v: int = 512, attn_sink=None, topk_length=None, out=None,
                              max_logits=None, lse=None, stream: Optional[int] = None,
                              dequantize_once: Optional[bool] = None, workspace=None,
                              fp8_tensor_cores: bool = False):
    """Sparse prefill with the keys read straight from a paged KV cache of any format (fp8_v32,
    fp8_model1, fp8_mx, fp4 or bf16; dequantised as they are loaded, no bf16 copy of the cache).

    q [s_q, h_q, d_qk] bf16; k_cache as for sparse_decode ([num_blocks, page_size, 1, bytes] with
    the format from bytes per token, or `kv_format`); indices [s_q, 1, topk] int32 of cache slots
    block * page_size + offset (invalid: < 0 or >= num_blocks * page_size). Returns (out
    [s_q, h_q, d_v] bf16, max_logits [s_q, h_q], lse [s_q, h_q]), as sparse_prefill. Eager only
    (no torch.compile custom op yet).

    On the GPU, a quantised cache's keys are either decoded in every block that gathers them, or
    (where keys repeat across query tokens: on average 8 decodes of a slot saved or more) each
    slot the indices name is dequantised once into bf16 rows in the call's workspace, then the
    bf16 prefill runs on them: the same operation, results agree to rounding. That workspace
    holds min(cache slots, s_q * topk) rows of d_qk bf16 plus s_q * topk int32;
    dequantize_once=None allocates it when it is at most 2 GiB, True always, False never.
    workspace: a uint8 [n] buffer of the caller's instead (reused across calls): at least
    prefill_workspace_size(q, s_q, h_q, d_v); with prefill_workspace_size(..., topk=, k_cache=)
    bytes the call may dequantise once.

    fp8_tensor_cores=True (opt-in; a quantised cache, d_qk 576 or 512, d_v 512) runs both
    products on FP8 tensor cores: q, each key (re-quantised to one power-of-two scale, its 64
    RoPE dims kept bf16) and the softmax weights P are rounded to e4m3. Its error is about
    10-40x the default path's, and on an H100 it is not yet faster than the default
    (bench/RESULTS.md); the CPU backend computes the same roundings (docs/semantics.md). It
    always needs the workspace with topk and k_cache (allocated here, or a caller's of that
    size); dequantize_once does not apply to it."""
    op = "sparse_prefill"
    _check(op, "q", q, ("bf16",), 3)
    frame = fw.framework_of(q, op, "q")
    _check_cache(op, "k_cache", k_cache)
    _check_format(op, "kv_format", kv_format, kv_layout)
    _check(op, "indices", indices, ("int32",), 3)
    _check(op, "attn_sink", attn_sink, ("fp32",), 1, optional=True)
    _check(op, "topk_length", topk_length, ("int32",), 1, optional=True)
    scale = _scale(op, softmax_scale)
    return _run_prefill(frame, op, q, k_cache, indices, scale, d_v, attn_sink, topk_length, out,
                        max_logits, lse, stream, cache_format=kv_format, cache_layout=kv_layout,
                        dequantize_once=dequantize_once, workspace=workspace,
                        fp8_tensor_cores=fp8_tensor_cores)


# --- merge ----------------------------------------------------------------------------------

def merge_attention_states(part_out, part_lse, *, out=None, lse=None,
                           out_dtype: Optional[str] = None, return_lse: bool = True,
                           stream: Optional[int] = None):
    """Merges partial attention states: lse = log Σ exp(lse_i), out = Σ exp(lse_i - lse) · out_i.

    part_out [n, tokens, heads, d_v] fp32|bf16|fp16; part_lse [n, tokens, heads] fp32 (any strides:
    a [n, b, h, s] decode lse transposed to [n, b, s, h] fits as a view). Returns (out, lse) with
    out [tokens, heads, d_v] in `out_dtype` (default part_out's dtype) and lse [tokens, heads]
    fp32, or just out when return_lse is False.
    """
    op = "merge_attention_states"
    floats = ("fp32", "bf16", "fp16")
    _check(op, "part_out", part_out, floats, 4)
    frame = fw.framework_of(part_out, op, "part_out")
    _check(op, "part_lse", part_lse, ("fp32",), 3)
    _, tokens, heads, d_v = _shape(part_out)
    odt = out_dtype or fw.dtype_name(part_out)
    if odt not in floats:
        raise TypeError(f"{op}: out_dtype: expected fp32, bf16 or fp16, got {odt}")
    if _tracing(part_out):
        merged, merged_lse = _copy_into(
            _custom_ops().merge_attention_states(part_out, part_lse, out_dtype), (out, lse))
        return (merged, merged_lse) if return_lse else merged
    if out is None:
        out = frame.empty((tokens, heads, d_v), odt, part_out, op, "out")
    else:
        _check_out(op, "out", out, floats, (tokens, heads, d_v))
    if lse is None and return_lse:
        lse = frame.empty((tokens, heads), "fp32", part_out, op, "lse")
    elif lse is not None:
        _check_out(op, "lse", lse, ("fp32",), (tokens, heads))
    with frame.guard(part_out):
        _C.merge_attention_states(fw.to_c(part_out), fw.to_c(part_lse), fw.to_c(out),
                                  fw.to_c(lse), stream=_stream(frame, part_out, stream))
    return (out, lse) if return_lse else out


# --- KV cache -------------------------------------------------------------------------------

def kv_cache_write(kv, slot_mapping, cache, *, kv_format: Optional[str] = None,
                   kv_layout: str = "default", stream: Optional[int] = None) -> None:
    """Quantises kv [n, d_qk] (bf16 or fp32) into `cache` at slot_mapping [n] (int32|int64,
    block * page_size + offset; -1 or out of range: skipped). `cache` is modified in place."""
    op = "kv_cache_write"
    _check(op, "kv", kv, ("bf16", "fp32"), 2)
    frame = fw.framework_of(kv, op, "kv")
    _check(op, "slot_mapping", slot_mapping, ("int32", "int64"), 1)
    _check_cache(op, "cache", cache)
    _check_format(op, "kv_format", kv_format, kv_layout)
    if isinstance(cache, fw.np.ndarray) and not cache.flags.writeable:
        raise ValueError(f"{op}: cache: the cache array is read-only")
    if _tracing(kv):
        return _custom_ops().kv_cache_write(kv, slot_mapping, cache, kv_format, kv_layout)
    with frame.guard(kv):
        _C.kv_cache_write(fw.to_c(kv), fw.to_c(slot_mapping), fw.to_c(cache),
                          cache_format=kv_format, cache_layout=kv_layout,
                          stream=_stream(frame, kv, stream))


def describe_kv_cache(cache, *, kv_format: Optional[str] = None,
                      kv_layout: str = "default") -> dict:
    """The format, page layout and block count OpenMLA reads from `cache` (a dict)."""
    op = "describe_kv_cache"
    _check_cache(op, "cache", cache)
    _check_format(op, "kv_format", kv_format, kv_layout)
    with fw.framework_of(cache, op, "cache").guard(cache):
        return _C.describe_kv_cache(fw.to_c(cache), kv_format, kv_layout)


def cache_d_qk(cache, kv_format: Optional[str] = None) -> int:
    """Dims per token of a cache array, from its dtype and last dim (and `kv_format`)."""
    last = int(cache.shape[-1])
    if fw.dtype_name(cache) in ("bf16", "fp16"):
        return last
    fmt = kv_format or _C.kv_format_from_bytes_per_token(last)
    if fmt is None:
        raise ValueError(f"cache: cannot infer the KV format from {last} bytes per token (known: "
                         "656 fp8_v32, 584 fp8_model1, 528 fp8_mx, 288 fp4)")
    if fmt in ("bf16", "fp16"):
        return last // 2
    return _C.kv_format_info(fmt)["d_qk"]


def kv_cache_gather(cache, slots, *, kv_format: Optional[str] = None, kv_layout: str = "default",
                    out=None, out_dtype: str = "fp32", stream: Optional[int] = None):
    """Dequantises the tokens at slots [n] (int32|int64) into out [n, d_qk] (fp32 or bf16); an
    invalid slot gives a row of zeros."""
    op = "kv_cache_gather"
    _check_cache(op, "cache", cache)
    frame = fw.framework_of(cache, op, "cache")
    _check_format(op, "kv_format", kv_format, kv_layout)
    _check(op, "slots", slots, ("int32", "int64"), 1)
    if _tracing(cache):
        gathered = _custom_ops().kv_cache_gather(cache, slots, kv_format, kv_layout,
                                                 fw.dtype_name(out) if out is not None
                                                 else out_dtype)
        return _copy_into((gathered,), (out,))[0]
    try:
        d_qk = cache_d_qk(cache, kv_format)
    except ValueError as error:
        raise ValueError(f"{op}: {error}") from None
    n = int(slots.shape[0])
    if out is None:
        if out_dtype not in ("fp32", "bf16"):
            raise TypeError(f"{op}: out_dtype: expected fp32 or bf16, got {out_dtype}")
        out = frame.empty((n, d_qk), out_dtype, cache, op, "out")
    else:
        _check_out(op, "out", out, ("fp32", "bf16"), (n, d_qk))
    with frame.guard(cache):
        _C.kv_cache_gather(fw.to_c(cache), fw.to_c(slots), fw.to_c(out), cache_format=kv_format,
                           cache_layout=kv_layout, stream=_stream(frame, cache, stream))
    return out


def kv_cache_convert(src, dst, *, src_format: Optional[str] = None, src_layout: str = "default",
                     dst_format: Optional[str] = None, dst_layout: str = "default",
                     src_blocks=None, dst_blocks=None, stream: Optional[int] = None) -> None:
    """Converts the tokens of cache `src` into cache `dst` (another format and/or layout, same
    page size and d_qk): every block b, or dst block dst_blocks[i] from src block src_blocks[i]
    (int32|int64, -1 skips). `dst` is modified in place."""
    op = "kv_cache_convert"
    if not hasattr(_C, "kv_cache_convert"):
        raise NotImplementedError(f"{op}: this build of openmla has no kv_cache_convert")
    _check_cache(op, "src", src)
    frame = fw.framework_of(src, op, "src")
    _check_cache(op, "dst", dst)
    _check_format(op, "src_format", src_format, src_layout)
    _check_format(op, "dst_format", dst_format, dst_layout)
    _check(op, "src_blocks", src_blocks, ("int32", "int64"), 1, optional=True)
    _check(op, "dst_blocks", dst_blocks, ("int32", "int64"), 1, optional=True)
    if isinstance(dst, fw.np.ndarray) and not dst.flags.writeable:
        raise ValueError(f"{op}: dst: the cache array is read-only")
    if _tracing(src):
        return _custom_ops().kv_cache_convert(src, dst, src_format, src_layout, dst_format,
                                              dst_layout, src_blocks, dst_blocks)
    with frame.guard(src):
        _C.kv_cache_convert(fw.to_c(src), fw.to_c(dst), src_format=src_format,
                            src_layout=src_layout, dst_format=dst_format, dst_layout=dst_layout,
                            src_blocks=fw.to_c(src_blocks), dst_blocks=fw.to_c(dst_blocks),
                            stream=_stream(frame, src, stream))


def _token_format(op: str, kv_format: str, d_qk: int) -> dict:
    if kv_format not in KV_FORMATS:
        raise ValueError(f"{op}: kv_format: unknown KV format {kv_format!r} (expected one of "
                         f"{', '.join(KV_FORMATS)})")
    return _C.kv_format_info(kv_format, d_qk)


def quantize(x, kv_format: str, *, layout: str = "interleaved", stream: Optional[int] = None):
    """Encodes x [n, d_qk] (bf16 or fp32) into the cache bytes of `kv_format`: uint8
    [n, bytes_per_token], one token per row, as a page_size=1 cache of `layout` holds them."""
    op = "quantize"
    _check(op, "x", x, ("bf16", "fp32"), 2)
    frame = fw.framework_of(x, op, "x")
    _check_format(op, "layout", None, layout)
    n, d_qk = _shape(x)
    info = _token_format(op, kv_format, d_qk if d_qk in (512, 576) else 576)
    if d_qk != info["d_qk"]:
        raise ValueError(f"{op}: x: format {kv_format} holds {info['d_qk']} dims per token, "
                         f"got {d_qk} (shape {_shape_str(x)})")
    bpt = info["bytes_per_token"]
    cache = frame.zeros((n, 1, 1, bpt), "uint8", x, op, "cache")
    if n > 0:
        kv_cache_write(x, frame.arange(n, x), cache, kv_format=kv_format, kv_layout=layout,
                       stream=stream)
    return cache.reshape(n, bpt)


def dequantize(data, kv_format: Optional[str] = None, *, layout: str = "interleaved",
               out_dtype: str = "fp32", stream: Optional[int] = None):
    """Decodes cache bytes uint8 [n, bytes_per_token] (the format inferred from bytes per token
    unless given) into [n, d_qk] of `out_dtype` (fp32 or bf16)."""
    op = "dequantize"
    _check(op, "data", data, fw.BYTE_DTYPES, 2)
    frame = fw.framework_of(data, op, "data")
    _check_format(op, "kv_format", kv_format, layout)
    n, bpt = _shape(data)
    cache = data.reshape(n, 1, 1, bpt)
    if n == 0:
        fmt = kv_format or _C.kv_format_from_bytes_per_token(bpt)
        if fmt is None:
            raise ValueError(f"{op}: data: cannot infer the KV format from {bpt} bytes per token")
        d_qk = _C.kv_format_info(fmt, bpt // 2 if fmt in ("bf16", "fp16") else 576)["d_qk"]
        return frame.empty((0, d_qk), out_dtype, data, op, "out")
    return kv_cache_gather(cache, frame.arange(n, data), kv_format=kv_format, kv_layout=layout,
                           out_dtype=out_dtype, stream=stream)


def new_kv_cache(num_blocks: int, page_size: int, kv_format: str, *, layout: str = "default",
                 d_qk: int = 576, like=None):
    """A zero-filled paged cache [num_blocks, page_size, 1, bytes_per_token] uint8 (bf16/fp16
    [num_blocks, page_size, 1, d_qk] for the plain formats) whose block stride is the layout's
    (fp8_model1's default blocks are padded to a multiple of 576 B). Allocated with `like`'s
    framework and device (numpy when None)."""
    op = "new_kv_cache"
    _check_format(op, "kv_format", kv_format, layout)
    if kv_format is None:
        raise ValueError(f"{op}: kv_format: required")
    if num_blocks < 0 or page_size < 1:
        raise ValueError(f"{op}: expected num_blocks >= 0 and page_size >= 1, got "
                         f"{num_blocks} and {page_size}")
    frame = fw.Numpy if like is None else fw.framework_of(like, op, "like")
    info = _C.kv_format_info(kv_format, d_qk)
    desc = _C.kv_layout(kv_format, page_size, layout, d_qk)
    block_stride = desc["block_stride"]
    plain = not info["quantized"]
    item = 2 if plain else 1
    dtype = kv_format if plain else "uint8"
    row = info["bytes_per_token"] // item
    buffer = frame.zeros((max(num_blocks, 1) * block_stride // item,), dtype, like, op, "cache")
    return frame.as_strided(buffer, (num_blocks, page_size, 1, row),
                            (block_stride // item, row, row, 1))


# --- schedule and facts ---------------------------------------------------------------------

def _like_device(like, op: str):
    """(type, index) of `like`: a tensor's device, or "cpu" / "cuda[:N]"."""
    if isinstance(like, str):
        kind, _, index = like.partition(":")
        return (kind, int(index) if index else 0)
    return _device(fw.framework_of(like, op, "like"), like, op, "like")


def decode_num_sm_parts(like, s_q: int, h_q: int, h_kv: int = 1) -> int:
    """Workers of a decode schedule on `like`'s device (a tensor) or on "cpu" / "cuda[:N]"."""
    device = _like_device(like, "decode_num_sm_parts")
    return _C.decode_num_sm_parts(device[0], device[1], s_q, h_q, h_kv)


def decode_workspace_size(like, batch: int, s_q: int, h_q: int, h_kv: int = 1, d_v: int = 512,
                          *, sparse: bool = False) -> int:
    """Bytes of workspace a dense (or, with sparse=True, sparse) decode of these shapes needs on
    `like`'s device (a tensor) or on "cpu" / "cuda[:N]"; 0 when it needs none."""
    device = _like_device(like, "decode_workspace_size")
    if sparse:
        return _C.sparse_decode_workspace_size(device[0], device[1], batch, s_q, h_q, d_v)
    return _C.dense_decode_workspace_size(device[0], device[1], batch, s_q, h_q, h_kv, d_v)


def prefill_workspace_size(like, s_q: int, h_q: int, d_v: int = 512, *,
                           topk: Optional[int] = None, k_cache=None,
                           kv_format: Optional[str] = None, kv_layout: str = "default") -> int:
    """Bytes of workspace a sparse prefill of these shapes needs on `like`'s device (a tensor) or
    on "cpu" / "cuda[:N]"; 0 when it needs none. With `k_cache` (a paged cache, as for
    sparse_prefill_from_cache) and `topk`, the size that lets a call from an fp8/fp4 cache
    dequantise each named slot once (min(cache slots, s_q * topk) bf16 rows and more), and the
    size a call with fp8_tensor_cores=True needs."""
    op = "prefill_workspace_size"
    if k_cache is not None:
        if topk is None:
            raise ValueError(f"{op}: topk: required with k_cache")
        _check_cache(op, "k_cache", k_cache)
        _check_format(op, "kv_format", kv_format, kv_layout)
        return _C.sparse_prefill_cache_workspace_size(fw.to_c(k_cache), s_q, h_q, int(topk),
                                                      kv_format, kv_layout, d_v)
    device = _like_device(like, op)
    return _C.sparse_prefill_workspace_size(device[0], device[1], s_q, h_q, d_v)


def decode_workspace(q, *, h_kv: int = 1, d_v: int = 512, sparse: bool = False):
    """A workspace buffer (uint8 [bytes], at least 1 byte) for decodes of q's shapes, allocated
    once with q's framework on q's device, to pass as workspace= to every call of a step."""
    op = "decode_workspace"
    _require_array(op, "q", q)
    frame = fw.framework_of(q, op, "q")
    b, s_q, h_q = (int(x) for x in q.shape[:3])
    size = decode_workspace_size(q, b, s_q, h_q, h_kv, d_v, sparse=sparse)
    return frame.empty((max(size, 1),), "uint8", q, op, "workspace")


def plan_decode_schedule(seqlens, s_q: int, h_q: int, h_kv: int = 1, *,
                         num_sm_parts: Optional[int] = None, block_tokens: int = 64,
                         out: Optional[DecodeSchedule] = None,
                         check_values: Optional[bool] = None,
                         stream: Optional[int] = None) -> DecodeSchedule:
    """Plans a split-KV schedule from seqlens [b] int32 (keys per request) on seqlens' device.

    num_sm_parts: workers (default decode_num_sm_parts on seqlens' device). out: a schedule
    planned earlier for the same batch size and workers, refilled in place (no allocation).
    A negative length raises ValueError on the CPU; on the GPU it counts as 0 keys unless
    check_values=True (or OPENMLA_CHECK_VALUES=1), which raises (a host copy: a sync)."""
    op = "plan_decode_schedule"
    _check(op, "seqlens", seqlens, ("int32",), 1)
    frame = fw.framework_of(seqlens, op, "seqlens")
    if num_sm_parts is not None and num_sm_parts < 1:
        raise ValueError(f"{op}: num_sm_parts: expected >= 1, got {num_sm_parts}")
    if _tracing(seqlens):
        # num_sm_parts None: the custom op resolves it (0) for the device, outside the trace.
        return _custom_ops().plan_decode_schedule(seqlens, s_q, h_q, h_kv, num_sm_parts or 0,
                                                  block_tokens, out)
    if num_sm_parts is None:
        num_sm_parts = (int(out[0].shape[0]) if out is not None else
                        decode_num_sm_parts(seqlens, s_q, h_q, h_kv))
    if check_values_enabled(check_values):
        _check_lengths(op, "seqlens", seqlens, 2**31 - 1, "keys per request")
    if out is not None:
        metadata, num_splits = out
        _check_out(op, "out.metadata", metadata, ("int32",),
                   (num_sm_parts, _C.SCHEDULE_METADATA_INTS))
        _check_out(op, "out.num_splits", num_splits, ("int32",), (int(seqlens.shape[0]) + 1,))
    else:
        metadata = frame.empty((num_sm_parts, _C.SCHEDULE_METADATA_INTS), "int32", seqlens)
        num_splits = frame.empty((int(seqlens.shape[0]) + 1,), "int32", seqlens)
    with frame.guard(seqlens):
        _C.plan_decode_schedule(fw.to_c(seqlens), fw.to_c(metadata), fw.to_c(num_splits), s_q, h_q,
                                h_kv, num_sm_parts=num_sm_parts, block_tokens=block_tokens,
                                stream=_stream(frame, seqlens, stream))
    return DecodeSchedule(metadata, num_splits)


_TOKENS_TO_THE_END = 2**31 - 1  # an end_token past any request's keys (clamped to its length)


def no_split_schedule(like, batch: int, num_sm_parts: int) -> DecodeSchedule:
    """A schedule (plan_decode_schedule's layout) that splits no request: `batch` requests dealt
    in order over min(batch, num_sm_parts) workers (at least one), each request walked whole by
    one worker (its keys [0, seqlen), whatever seqlen is: no lengths are read), one split a
    request (num_splits = 0, 1, ..., batch). It depends on shapes alone, so it is made on
    `like`'s framework and device without a host copy (CUDA-graph safe). The schedule of
    batch-invariant dense decode."""
    op = "no_split_schedule"
    _require_array(op, "like", like)
    if batch < 0 or num_sm_parts < 1:
        raise ValueError(f"{op}: expected batch >= 0 and num_sm_parts >= 1, got {batch} and "
                         f"{num_sm_parts}")
    parts = max(1, min(batch, num_sm_parts))
    fields = _C.SCHEDULE_METADATA_INTS
    if fw.is_torch_tensor(like):
        torch = fw._torch()
        worker = torch.arange(parts, dtype=torch.int32, device=like.device)
        begin = worker * batch // parts
        last = (worker + 1) * batch // parts - 1
        metadata = torch.zeros((parts, fields), dtype=torch.int32, device=like.device)
        num_splits = torch.arange(batch + 1, dtype=torch.int32, device=like.device)
    else:
        worker = fw.np.arange(parts, dtype=fw.np.int64)
        begin = worker * batch // parts
        last = (worker + 1) * batch // parts - 1
        metadata = fw.np.zeros((parts, fields), fw.np.int32)
        num_splits = fw.np.arange(batch + 1, dtype=fw.np.int32)
    metadata[:, 0] = begin          # begin_request
    metadata[:, 2] = last           # end_request (inclusive; < begin: an idle worker)
    metadata[:, 3] = _TOKENS_TO_THE_END  # end_token: the last request whole
    metadata[:, 4] = begin          # begin_split: one split a request, in request order
    return DecodeSchedule(metadata, num_splits)


def kv_format_info(kv_format: str, d_qk: int = 576) -> dict:
    """Static facts of a KV format: d_qk, bytes_per_token, group_size, ... (a dict)."""
    return _token_format("kv_format_info", kv_format, d_qk)


def kv_layout(kv_format: str, page_size: int, layout: str = "default", d_qk: int = 576) -> dict:
    """The byte layout of one page block: offsets and strides of data, scales and rope."""
    _check_format("kv_layout", "layout", kv_format, layout)
    return _C.kv_layout(kv_format, page_size, layout, d_qk)


def infer_kv_format(bytes_per_token: int) -> Optional[str]:
    """The quantised format with this many bytes per token (656, 584, 528, 288), else None."""
    return _C.kv_format_from_bytes_per_token(int(bytes_per_token))


def cuda_backend_available() -> bool:
    """Whether this build has the CUDA backend."""
    return _C.cuda_backend_available()
