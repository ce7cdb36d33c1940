"""vLLM on OpenMLA: its FlashMLA calls served by openmla.flash_mla (docs/engines.md).

vLLM does not `import flash_mla`, so the alias does not reach it: its MLA backends (FLASHMLA for
V3/V3.1, FLASHMLA_SPARSE for V3.2, the DeepSeek V4 attention) import FlashMLA's functions from
`vllm.v1.attention.ops.flashmla`, which takes them from vLLM's vendored copy
(`vllm.third_party.flashmla.flash_mla_interface`, over `torch.ops._flashmla_C`). This module
replaces get_mla_metadata, flash_mla_with_kvcache, flash_mla_sparse_fwd and FlashMLASchedMeta
there, and in every vLLM module that imported them already, with OpenMLA's:

    import openmla.integrations.vllm
    openmla.integrations.vllm.install()   # in sitecustomize.py: every vLLM process, workers too

vLLM's dense FP8 path (`flash_mla_with_kvcache_fp8` over `torch.ops._flashmla_extension_C`,
per-tensor scaled e4m3 q and cache, no OpenMLA format) and FlashMLA's dense MHA prefill
(`flash_attn_varlen_*`) are left to vLLM's own kernels. Which attention backend runs is still
vLLM's choice (`--attention-backend`, its own checks).
"""

from __future__ import annotations

from typing import List

from .. import flash_mla
from . import _patch

# Where vLLM keeps its FlashMLA entry points: the wrapper module its backends import from (and
# its older path), and the vendored interface behind it.
MODULES = ("vllm.v1.attention.ops.flashmla", "vllm.attention.ops.flashmla",
           "vllm.third_party.flashmla.flash_mla_interface")

REPLACEMENTS = {
    "get_mla_metadata": flash_mla.get_mla_metadata,
    "flash_mla_with_kvcache": flash_mla.flash_mla_with_kvcache,
    "flash_mla_sparse_fwd": flash_mla.flash_mla_sparse_fwd,
    "FlashMLASchedMeta": flash_mla.FlashMLASchedMeta,
}


def patch() -> List[str]:
    """Replaces vLLM's FlashMLA entry points with OpenMLA's in the vLLM modules imported so
    far (those of MODULES, and every `vllm.*` module that imported the functions by name).
    Returns the names of the modules changed (empty when vLLM is not imported yet)."""
    changed: List[str] = []
    for name in MODULES:
        changed += [m for m in _patch.replace(name, REPLACEMENTS, ("vllm",)) if m not in changed]
    return changed


def install() -> None:
    """patch() now for what vLLM has imported, and again right after each of MODULES is first
    imported, before any backend imports from it. Cheap: imports nothing of vLLM."""
    for name in MODULES:
        _patch.after_import(name, patch)
