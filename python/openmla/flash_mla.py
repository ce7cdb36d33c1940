"""FlashMLA's Python interface, served by OpenMLA: `import openmla.flash_mla as flash_mla`.

An engine that imports `flash_mla` (or `flash_mla.flash_mla_interface`) switches without code
edits through the opt-in alias: `openmla.install_flash_mla_alias()`, or OPENMLA_FLASH_MLA_ALIAS=1
in the environment (see openmla/_alias.py).

The names, signatures and return shapes are FlashMLA's (flash_mla/flash_mla_interface.py):
get_mla_metadata, flash_mla_with_kvcache (dense and sparse decode), flash_mla_sparse_fwd (sparse
prefill) and FlashMLASchedMeta; lse comes back as FlashMLA's: [b, h_q, s_q] with strides
(s_q * h_q, 1, h_q). Differences:
  * tensors may be numpy arrays as well as torch tensors, on the CPU as well as on the GPU;
  * a sparse k_cache may be any KV format of docs/formats.md (inferred from bytes per token:
    656 V3.2, 584 V4, 528 V4.1, 288 V4.1 fp4; or a bf16 cache), in the default or a
    token-interleaved layout (keyword-only kv_format / kv_layout / extra_kv_format /
    extra_kv_layout);
  * flash_mla_with_kvcache takes keyword-only `out=` / `lse=` to write into existing buffers,
    `workspace=` (else the FlashMLASchedMeta keeps one from its first call, so later calls
    allocate nothing but their outputs) and `check_values=` (docs/errors.md);
    flash_mla_sparse_fwd takes keyword-only `out=` (and `max_logits=` / `lse=`), as engines pass
    it (vLLM's DeepSeek V4 prefill writes into a slice of its output buffer);
  * `enable_batch_invariant=True` (FlashMLA's newest argument, fixed per FlashMLASchedMeta)
    decodes without split-KV, so a request's result does not depend on its batch: sparse decode
    and dense decode over a bf16/fp16 cache on the GPU, every decode on the CPU;
  * a schedule an engine builds by hand in FlashMLA's layout (tile_scheduler_metadata counted
    in 64-key blocks, as vLLM's batch-invariant dense path does) is never read as OpenMLA's: a
    one-row schedule (one SM part: no request split) is taken for what it asks, decoding with no
    split-KV; any other raises ValueError saying what to do;
  * errors are ValueError / TypeError / NotImplementedError naming the argument, not asserts.
Dense decode over an FP8 cache (is_fp8_kvcache=True, or a uint8 cache, with a block table and no
indices) runs on both backends: any quantised format of docs/formats.md (FlashMLA's dense decode
never read FP8). The dense MHA prefill functions (flash_attn_varlen_func,
flash_attn_varlen_qkvpacked_func, flash_attn_varlen_kvpacked_func: FlashMLA's arguments, packing
along the last dim and returns, lse [total_q, h_q] contiguous along the tokens) run on the CPU
backend, forward and backward (torch autograd, torch.compile); on CUDA tensors they raise
NotImplementedError until the GPU kernel lands. Beyond FlashMLA, they take fp16 as well as bf16
and GQA in the backward too; a query that sees no key gets out 0 and lse -inf. Not implemented
yet (NotImplementedError): indexer_topk > 0 in flash_mla_sparse_fwd.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional, Tuple

from . import _api
from . import _frameworks as fw
from . import fused_norm_rope_attn_rope_cast  # FlashMLA's fused V4/V4.1 attention submodule
from ._C import __version__

__all__ = ["fused_norm_rope_attn_rope_cast", "FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache",
           "flash_mla_sparse_fwd", "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Split-KV scheduling state, filled by the first flash_mla_with_kvcache call that uses it.

    Reuse one instance across the layers of a decode step (same shapes and the same values of
    cache_seqlens / topk_length / extra_topk_length), as with FlashMLA."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

        enable_batch_invariant: bool

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Any = None  # [num_sm_parts, 8] int32, filled by the first call
    num_splits: Any = None               # [batch + 1] int32, filled by the first call
    workspace: Any = None                # OpenMLA's: the decode workspace, reused by later calls
    # OpenMLA's: the (tile_scheduler_metadata, num_splits) objects it planned itself, to tell
    # them from a schedule an engine assigned by hand in FlashMLA's layout.
    planned: Any = dataclasses.field(default=None, repr=False, compare=False)


def get_mla_metadata(*args: Any, **kwargs: Any) -> Tuple[FlashMLASchedMeta, None]:
    """Returns (FlashMLASchedMeta(), None); the schedule is made by the first decode call.

    Arguments are accepted and ignored, for FlashMLA's older interface
    (cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...)."""
    return FlashMLASchedMeta(), None


def _dim(x: Any, i: int) -> Optional[int]:
    return int(x.shape[i]) if x is not None else None


def _config(q, k_cache, causal, is_fp8_kvcache, indices, extra_k_cache, extra_indices,
            enable_batch_invariant):
    return FlashMLASchedMeta.Config(
        int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k_cache.shape[1]),
        int(k_cache.shape[2]) if len(k_cache.shape) == 4 else 1, bool(causal),
        bool(is_fp8_kvcache), _dim(indices, -1), _dim(extra_k_cache, 1), _dim(extra_indices, -1),
        bool(enable_batch_invariant))


def _check_same_config(saved: FlashMLASchedMeta.Config, now: FlashMLASchedMeta.Config) -> None:
    if saved == now:
        return
    for field in dataclasses.fields(saved):
        a, b = getattr(saved, field.name), getattr(now, field.name)
        if a != b:
            raise ValueError(
                f"flash_mla_with_kvcache: tile_scheduler_metadata: this FlashMLASchedMeta was "
                f"made for {field.name}={a}, but this call has {field.name}={b}; use one "
                "FlashMLASchedMeta per set of shapes and options (get_mla_metadata())")


def _hand_built_schedule(sched: FlashMLASchedMeta, op: str) -> bool:
    """Whether `sched` holds a schedule an engine assigned itself (FlashMLA's layout, which
    OpenMLA never reads). True for a one-row schedule: one SM part walks every request, so
    none is split, which is what such a schedule asks for (vLLM's batch-invariant path builds
    it); the decode then runs without split-KV. Any other raises ValueError."""
    metadata = sched.tile_scheduler_metadata
    if metadata is None:
        return False
    planned = sched.planned
    if planned is not None and metadata is planned[0] and sched.num_splits is planned[1]:
        return False
    if not fw.is_array(metadata) or len(metadata.shape) != 2:
        raise TypeError(f"{op}: tile_scheduler_metadata.tile_scheduler_metadata: expected "
                        "None (OpenMLA plans on the first call) or FlashMLA's [num_sm_parts, 8] "
                        f"int32 array, got {type(metadata).__name__}"
                        + (f" of shape {list(metadata.shape)}" if fw.is_array(metadata) else ""))
    rows = int(metadata.shape[0])
    if rows == 1:
        return True
    raise ValueError(
        f"{op}: tile_scheduler_metadata.tile_scheduler_metadata: this FlashMLASchedMeta holds a "
        f"schedule of {rows} SM parts that OpenMLA did not plan. It is in FlashMLA's layout "
        "(key ranges in 64-key blocks, num_splits FlashMLA's split counts), which OpenMLA's "
        "kernels do not read (OpenMLA's counts keys), and its partition is FlashMLA's. Leave "
        "tile_scheduler_metadata and num_splits None on a fresh get_mla_metadata() (the first "
        "call plans them; the other layers reuse them); for results independent of the batch, "
        "pass enable_batch_invariant=True (a one-row schedule, which asks for no split, is "
        "accepted and decodes that way)")


def flash_mla_with_kvcache(
    q,
    k_cache,
    block_table,
    cache_seqlens,
    head_dim_v: int,
    tile_scheduler_metadata: Optional[FlashMLASchedMeta],
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices=None,
    attn_sink=None,
    extra_k_cache=None,
    extra_indices_in_kvcache=None,
    topk_length=None,
    extra_topk_length=None,
    enable_batch_invariant: bool = False,
    *,
    out=None,
    lse=None,
    workspace=None,
    check_values: Optional[bool] = None,
    kv_format: Optional[str] = None,
    kv_layout: str = "default",
    extra_kv_format: Optional[str] = None,
    extra_kv_layout: str = "default",
):
    """Decode attention over a paged KV cache. Returns (out [b, s_q, h_q, head_dim_v],
    softmax_lse [b, h_q, s_q] float32).

    Dense (indices is None): q [b, s_q, h_q, d_qk] bf16|fp16, k_cache [num_blocks, page_size, h_kv,
    d_qk] of q's dtype, block_table [b, max_blocks] int32, cache_seqlens [b] int32, optional causal.
    Sparse (indices [b, s_q, topk] int32 of slots block * page_size + offset): q bf16, k_cache of
    any format, block_table / cache_seqlens unused, optional topk_length [b], attn_sink [h_q]
    float32, extra_k_cache + extra_indices_in_kvcache [b, s_q, extra_topk] + extra_topk_length.

    enable_batch_invariant=True: no split-KV, so each request's result is independent of the
    batch it is in (FlashMLA's argument; the first call with a FlashMLASchedMeta fixes it, a
    later call with another value raises ValueError). On the GPU: sparse decode and dense decode
    over a bf16/fp16 cache (a quantised dense cache: NotImplementedError); the CPU backend
    always is batch-invariant. No split plan is made then.

    The first call with a FlashMLASchedMeta fills its tile_scheduler_metadata / num_splits (dense:
    planned from cache_seqlens; sparse: from the counted indices, topk_length + extra_topk_length)
    and its workspace; later calls (the other layers of the step) reuse them. A schedule the
    caller assigned to it (FlashMLA's layout) is never read: one row (a single SM part, so no
    split) decodes as enable_batch_invariant=True does, any other raises ValueError. Values
    (cache_seqlens, block_table, topk_length) are checked as openmla.dense_decode /
    sparse_decode do: on the CPU always, on the GPU with check_values=True or
    OPENMLA_CHECK_VALUES=1 (docs/errors.md).
    """
    op = "flash_mla_with_kvcache"
    sched = tile_scheduler_metadata
    if sched is not None and not isinstance(sched, FlashMLASchedMeta):
        raise TypeError(f"{op}: tile_scheduler_metadata: expected a FlashMLASchedMeta (from "
                        f"get_mla_metadata()), got {type(sched).__name__}")
    if num_splits is not None:
        raise ValueError(f"{op}: num_splits: must be None (get_mla_metadata() returns None there)")
    invariant = _api._flag_arg(op, "enable_batch_invariant", enable_batch_invariant)
    for name, value in (("q", q), ("k_cache", k_cache)):
        if not fw.is_array(value):
            raise TypeError(f"{op}: {name}: expected an array (numpy.ndarray or torch.Tensor), "
                            f"got {type(value).__name__}")
    sparse = indices is not None
    if len(q.shape) != 4:
        raise ValueError(f"{op}: q: expected 4 dimensions [b, s_q, h_q, d_qk], got shape "
                         f"{list(q.shape)}")
    if not sparse and len(k_cache.shape) != 4:
        raise ValueError(f"{op}: k_cache: expected 4 dimensions [num_blocks, page_size, h_kv, "
                         f"d_qk], got shape {list(k_cache.shape)}")

    if sched is not None:
        config = _config(q, k_cache, causal, is_fp8_kvcache, indices, extra_k_cache,
                         extra_indices_in_kvcache, invariant)
        if sched.have_initialized:
            _check_same_config(sched.config, config)
        else:
            sched.have_initialized = True
            sched.config = config
        # A caller's one-row schedule in FlashMLA's layout asks for no split: decode that way.
        invariant = _hand_built_schedule(sched, op) or invariant
    # With no split-KV there is no split plan to make, keep or read.
    planning = sched is not None and not invariant

    if sparse:
        if causal:
            raise ValueError(f"{op}: causal: must be False for sparse attention (indices given)")
        cache_is_bytes = fw.dtype_name(k_cache) in fw.BYTE_DTYPES
        if is_fp8_kvcache and not cache_is_bytes:
            raise ValueError(f"{op}: is_fp8_kvcache: True, but k_cache has dtype "
                             f"{fw.dtype_name(k_cache)} (an FP8 cache is uint8/float8 bytes)")
        schedule = None
        if planning:
            if sched.tile_scheduler_metadata is None and _plannable_sparse(q, indices):
                keys = _sparse_keys(q, indices, topk_length, extra_indices_in_kvcache,
                                    extra_topk_length)
                planned = _api.plan_decode_schedule(keys, int(q.shape[1]), int(q.shape[2]), 1)
                _keep_plan(sched, planned)
            if sched.tile_scheduler_metadata is not None:
                schedule = _api.DecodeSchedule(sched.tile_scheduler_metadata, sched.num_splits)
        if sched is not None and workspace is None:
            workspace = _sched_workspace(sched, q, head_dim_v, sparse=True)
        return _api.sparse_decode(
            q, k_cache, indices, topk_length=topk_length, attn_sink=attn_sink,
            extra_k_cache=extra_k_cache, extra_indices=extra_indices_in_kvcache,
            extra_topk_length=extra_topk_length, kv_format=kv_format, kv_layout=kv_layout,
            extra_kv_format=extra_kv_format, extra_kv_layout=extra_kv_layout, d_v=head_dim_v,
            softmax_scale=softmax_scale, schedule=schedule, out=out, lse=lse,
            workspace=workspace, check_values=check_values, batch_invariant=invariant)

    for name, value in (("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("topk_length", topk_length), ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise ValueError(f"{op}: {name}: only for sparse attention (pass indices), got a "
                             "value with dense attention")
    if block_table is None or cache_seqlens is None:
        raise ValueError(f"{op}: block_table and cache_seqlens: required for dense attention")
    schedule = None
    if planning:
        if sched.tile_scheduler_metadata is None:
            # The first call plans the schedule from cache_seqlens; later calls with this
            # FlashMLASchedMeta (the other layers of the step) reuse it. Arguments the planner
            # cannot take are left to dense_decode, whose checks name them.
            h_kv = int(k_cache.shape[2])
            plannable = (h_kv >= 1 and int(q.shape[2]) % h_kv == 0 and fw.is_array(cache_seqlens)
                         and fw.dtype_name(cache_seqlens) == "int32"
                         and len(cache_seqlens.shape) == 1)
            if plannable:
                if (_api.check_values_enabled(check_values) and not _api._tracing(q)
                        and fw.is_array(block_table) and len(block_table.shape) == 2):
                    # The checked mode names cache_seqlens / block_table before planning.
                    _api._check_dense_values(op, k_cache, block_table, cache_seqlens)
                planned = _api.plan_decode_schedule(cache_seqlens, int(q.shape[1]),
                                                    int(q.shape[2]), h_kv, check_values=False)
                _keep_plan(sched, planned)
        if sched.tile_scheduler_metadata is not None:
            schedule = _api.DecodeSchedule(sched.tile_scheduler_metadata, sched.num_splits)
    if sched is not None and workspace is None:
        workspace = _sched_workspace(sched, q, head_dim_v, h_kv=int(k_cache.shape[2]))
    # An FP8 cache (is_fp8_kvcache, or uint8/float8 bytes) is a KVCache of its format.
    as_cache = is_fp8_kvcache or fw.dtype_name(k_cache) in fw.BYTE_DTYPES
    return _api.dense_decode(q, k_cache, block_table, cache_seqlens, d_v=head_dim_v,
                             softmax_scale=softmax_scale, causal=causal, schedule=schedule,
                             out=out, lse=lse, workspace=workspace, check_values=check_values,
                             kv_format=kv_format if as_cache else None,
                             kv_layout=kv_layout if as_cache else "default",
                             batch_invariant=invariant)


def _keep_plan(sched: FlashMLASchedMeta, planned) -> None:
    sched.tile_scheduler_metadata, sched.num_splits = planned
    sched.planned = (sched.tile_scheduler_metadata, sched.num_splits)


def _plannable_sparse(q, indices) -> bool:
    return (fw.is_array(indices) and fw.dtype_name(indices) == "int32"
            and len(indices.shape) == 3 and fw.is_array(q) and len(q.shape) == 4)


def _sparse_keys(q, indices, topk_length, extra_indices, extra_topk_length):
    """Keys per request of a sparse decode (int32 [b]): the counted indices of both caches."""
    b = int(q.shape[0])
    frame = fw.framework_of(indices, "flash_mla_with_kvcache", "indices")
    keys = frame.zeros((b,), "int32", indices)
    topk = int(indices.shape[-1])
    # (Lengths count clamped to [0, topk], as sparse decode counts them.)
    keys += topk_length.clip(0, topk) if _int32_vector(topk_length, b) else topk
    if extra_indices is not None and fw.is_array(extra_indices) and len(extra_indices.shape) == 3:
        extra = int(extra_indices.shape[-1])
        keys += (extra_topk_length.clip(0, extra) if _int32_vector(extra_topk_length, b)
                 else extra)
    return keys


def _int32_vector(x, b: int) -> bool:
    return (x is not None and fw.is_array(x) and fw.dtype_name(x) == "int32"
            and tuple(int(d) for d in x.shape) == (b,))


def _sched_workspace(sched: FlashMLASchedMeta, q, d_v: int, h_kv: int = 1, sparse: bool = False):
    """The FlashMLASchedMeta's workspace, allocated by its first call (None where the shapes are
    wrong: the decode's own checks then name the argument)."""
    if sched.workspace is None:
        if _api._tracing(q):  # under torch.compile the custom op allocates its own
            return None
        try:
            sched.workspace = _api.decode_workspace(q, h_kv=h_kv, d_v=d_v, sparse=sparse)
        except (TypeError, ValueError):
            return None
    return sched.workspace


def flash_mla_sparse_fwd(q, kv, indices, sm_scale: float, d_v: int = 512, attn_sink=None,
                         topk_length=None, indexer_topk: int = 0, *, out=None, max_logits=None,
                         lse=None):
    """Sparse prefill. q [s_q, h_q, d_qk] bf16, kv [s_kv, h_kv, d_qk] bf16, indices
    [s_q, h_kv, topk] int32 (invalid: < 0 or >= s_kv). Returns (out [s_q, h_q, d_v] bf16,
    max_logits [s_q, h_q] float32, lse [s_q, h_q] float32).

    out= (keyword): write the output into this bf16 [s_q, h_q, d_v] array, e.g. a slice of an
    engine's output buffer (any strides with the last dim contiguous); it is the returned out.
    max_logits= / lse= likewise (float32 [s_q, h_q])."""
    if indexer_topk:
        raise NotImplementedError("flash_mla_sparse_fwd: indexer_topk > 0 (the indexer lse) is "
                                  "not implemented in OpenMLA yet; pass indexer_topk=0")
    return _api.sparse_prefill(q, kv, indices, softmax_scale=sm_scale, d_v=d_v,
                               attn_sink=attn_sink, topk_length=topk_length, out=out,
                               max_logits=max_logits, lse=lse)


# Dense MHA prefill (FlashMLA's flash_attn_varlen_* family): openmla/_flash_attn_varlen.py.
from ._flash_attn_varlen import (  # noqa: E402
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

# `import flash_mla.flash_mla_interface` through the alias resolves to this module too.
flash_mla_interface = sys.modules[__name__]
