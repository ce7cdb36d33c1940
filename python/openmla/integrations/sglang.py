"""SGLang on OpenMLA: `sgl_kernel.flash_mla` served by OpenMLA (docs/engines.md).

SGLang does not `import flash_mla`: its DeepSeek V3.2 (DSA) backend and its FlashMLA backend call
`sgl_kernel.flash_mla`, whose interface is FlashMLA's older one: get_mla_metadata(cache_seqlens,
num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk) returns tensors
(tile_scheduler_metadata, num_splits) that flash_mla_with_kvcache takes back. This module gives
that interface on OpenMLA (get_mla_metadata, flash_mla_with_kvcache, flash_mla_sparse_fwd below)
and puts it into `sgl_kernel.flash_mla`, and into every SGLang module that imported it by name:

    import openmla.integrations.sglang
    openmla.integrations.sglang.install()   # in sitecustomize.py: every SGLang process

flash_mla_with_kvcache also takes a FlashMLASchedMeta (FlashMLA's newest interface, which newer
sgl_kernel builds export too): then it is openmla.flash_mla.flash_mla_with_kvcache.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from .. import _api
from .. import _frameworks as fw
from .. import flash_mla
from . import _patch

MODULE = "sgl_kernel.flash_mla"


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k: Optional[int] = None,
                     num_heads_k: Optional[int] = None, num_heads_q: Optional[int] = None,
                     is_fp8_kvcache: bool = False, topk: Optional[int] = None, *args, **kwargs):
    """FlashMLA's older get_mla_metadata: a split-KV schedule (tile_scheduler_metadata
    [num_sm_parts, 8] int32, num_splits [batch + 1] int32) on cache_seqlens' device, planned by
    OpenMLA (its own layout: flash_mla_with_kvcache below plans inside the call and reads
    neither, so a schedule of another origin is never misread). Keys per request: cache_seqlens
    (dense), or topk (sparse). Shapes depend on the batch size alone, as FlashMLA's do, so an
    engine may copy_ a later step's schedule into buffers a CUDA graph captured.

    Called without cache_seqlens (FlashMLA's newest interface): (FlashMLASchedMeta(), None)."""
    op = "get_mla_metadata"
    if cache_seqlens is None:
        return flash_mla.get_mla_metadata()
    if num_q_tokens_per_head_k is None or num_heads_k is None:
        raise TypeError(f"{op}: num_q_tokens_per_head_k and num_heads_k: required with "
                        "cache_seqlens")
    _api._check(op, "cache_seqlens", cache_seqlens, ("int32",), 1)
    h_kv = int(num_heads_k)
    if num_heads_q:
        h_q = int(num_heads_q)
        s_q = max(1, int(num_q_tokens_per_head_k) * h_kv // h_q)
    else:  # the parts depend on the rows per kv head, s_q * h_q / h_kv, alone
        h_q, s_q = int(num_q_tokens_per_head_k) * h_kv, 1
    keys = cache_seqlens
    if topk is not None:
        if fw.is_torch_tensor(cache_seqlens):
            keys = fw._torch().full_like(cache_seqlens, int(topk))
        else:
            keys = fw.np.full_like(cache_seqlens, int(topk))
    return tuple(_api.plan_decode_schedule(keys, s_q, h_q, h_kv))


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v: int,
                           tile_scheduler_metadata, num_splits=None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           descale_q=None, descale_k=None, is_fp8_kvcache: bool = False,
                           indices=None, **kwargs):
    """sgl_kernel's flash_mla_with_kvcache (FlashMLA's older interface): dense decode over a
    paged cache (block_table, cache_seqlens), or sparse decode (indices [b, s_q, topk] of cache
    slots; block_table and cache_seqlens unused) over a cache of any OpenMLA format (656 B
    fp8_v32 as SGLang's V3.2 stores it, or bf16). Returns (out, lse) as FlashMLA does.

    tile_scheduler_metadata / num_splits (from get_mla_metadata) are accepted and not read:
    OpenMLA plans the split-KV schedule inside the call (sparse decode always does; dense
    decode then runs a small planner kernel first). A FlashMLASchedMeta instead (FlashMLA's
    newest interface, num_splits None): openmla.flash_mla.flash_mla_with_kvcache, every keyword
    of it included. descale_q / descale_k (per-tensor FP8 q and cache) have no OpenMLA format:
    NotImplementedError."""
    op = "flash_mla_with_kvcache"
    if isinstance(tile_scheduler_metadata, flash_mla.FlashMLASchedMeta):
        return flash_mla.flash_mla_with_kvcache(
            q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
            num_splits, softmax_scale, causal, is_fp8_kvcache, indices, **kwargs)
    if kwargs:
        raise TypeError(f"{op}: unexpected keyword argument(s) {sorted(kwargs)} with a "
                        "tensor tile_scheduler_metadata (FlashMLA's older interface)")
    if descale_q is not None or descale_k is not None:
        raise NotImplementedError(
            f"{op}: descale_q / descale_k: a per-tensor scaled FP8 q and cache is not an OpenMLA "
            "format; keep q bf16 and the cache in one of docs/formats.md (fp8_v32, ...)")
    for name, value in (("tile_scheduler_metadata", tile_scheduler_metadata),
                        ("num_splits", num_splits)):
        if value is not None and not fw.is_array(value):
            raise TypeError(f"{op}: {name}: expected an array from get_mla_metadata() or None, "
                            f"got {type(value).__name__}")
    if is_fp8_kvcache and fw.is_array(k_cache) and fw.dtype_name(k_cache) not in fw.BYTE_DTYPES:
        raise ValueError(f"{op}: is_fp8_kvcache: True, but k_cache has dtype "
                         f"{fw.dtype_name(k_cache)} (an FP8 cache is uint8/float8 bytes; a bf16 "
                         "cache is read with is_fp8_kvcache=False)")
    if indices is not None:
        if causal:
            raise ValueError(f"{op}: causal: must be False for sparse attention (indices given)")
        return _api.sparse_decode(q, k_cache, indices, d_v=head_dim_v,
                                  softmax_scale=softmax_scale)
    # A byte cache is read in the format its bytes per token name (dense decode over it).
    return _api.dense_decode(q, k_cache, block_table, cache_seqlens, d_v=head_dim_v,
                             softmax_scale=softmax_scale, causal=causal)


# The newest interface's prefill takes everything the older one does (and attn_sink,
# topk_length, out=).
flash_mla_sparse_fwd = flash_mla.flash_mla_sparse_fwd

REPLACEMENTS = {
    "get_mla_metadata": get_mla_metadata,
    "flash_mla_with_kvcache": flash_mla_with_kvcache,
    "flash_mla_sparse_fwd": flash_mla_sparse_fwd,
}


def patch() -> List[str]:
    """Puts OpenMLA's functions into sgl_kernel.flash_mla (and its FlashMLASchedMeta, where the
    module has one) and wherever a loaded `sglang.*` / `sgl_kernel.*` module imported them by
    name. Returns the names of the modules changed (empty when sgl_kernel.flash_mla is not
    imported yet)."""
    replacements = dict(REPLACEMENTS)
    module = sys.modules.get(MODULE)
    if module is not None and hasattr(module, "FlashMLASchedMeta"):
        replacements["FlashMLASchedMeta"] = flash_mla.FlashMLASchedMeta
    return _patch.replace(MODULE, replacements, ("sglang", "sgl_kernel"))


def install() -> None:
    """patch() now if sgl_kernel.flash_mla is imported, else right after its first import
    (SGLang imports it inside its backends' methods). Imports nothing of SGLang."""
    _patch.after_import(MODULE, patch)
