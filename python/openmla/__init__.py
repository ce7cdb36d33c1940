"""OpenMLA: Multi-head Latent Attention kernels for the DeepSeek models.

Framework-neutral functions over numpy arrays and torch tensors (CPU or CUDA):

    dense_decode, sparse_decode, sparse_prefill, sparse_prefill_from_cache, mha_prefill,
    mha_prefill_backward, merge_attention_states,
    kv_cache_write, kv_cache_gather, kv_cache_convert, quantize, dequantize, new_kv_cache,
    plan_decode_schedule, no_split_schedule, decode_num_sm_parts, decode_workspace,
    decode_workspace_size, prefill_workspace_size, kv_format_info, kv_layout, describe_kv_cache

FlashMLA's interface: `import openmla.flash_mla as flash_mla`, or, for code that imports
`flash_mla` itself, install_flash_mla_alias() / OPENMLA_FLASH_MLA_ALIAS=1. With torch
installed, the operations are also registered as torch.library custom ops (torch.ops.openmla.*)
so that torch.compile and CUDA graphs work; torch is never required. ml_dtypes (bf16/fp8 numpy
arrays) is imported only when such an array is handled.

Documentation: docs/ in the source tree (architecture, semantics, formats, errors, benchmarking).
"""

from . import _C
from ._api import (
    KV_FORMATS,
    DecodeSchedule,
    cuda_backend_available,
    decode_num_sm_parts,
    decode_workspace,
    decode_workspace_size,
    dense_decode,
    dequantize,
    describe_kv_cache,
    infer_kv_format,
    kv_cache_convert,
    kv_cache_gather,
    kv_cache_write,
    kv_format_info,
    kv_layout,
    merge_attention_states,
    new_kv_cache,
    no_split_schedule,
    plan_decode_schedule,
    prefill_workspace_size,
    quantize,
    sparse_decode,
    sparse_prefill,
    sparse_prefill_from_cache,
)
from ._mha_prefill import mha_prefill, mha_prefill_backward
from . import flash_mla
from ._alias import install_flash_mla_alias

__version__ = _C.__version__

try:  # torch is optional: register the custom ops only where it is importable
    import torch as _torch  # noqa: F401
except ImportError:
    torch_ops_registered = False
else:
    from . import _torch_ops
    from . import _mha_torch_ops

    torch_ops_registered = _torch_ops.registered and _mha_torch_ops.registered
    del _torch

from . import _alias as _alias_module

if _alias_module.requested():
    install_flash_mla_alias()
del _alias_module

__all__ = [
    "KV_FORMATS", "DecodeSchedule", "cuda_backend_available", "decode_num_sm_parts",
    "decode_workspace", "decode_workspace_size", "prefill_workspace_size",
    "install_flash_mla_alias",
    "dense_decode", "mha_prefill", "mha_prefill_backward", "dequantize", "describe_kv_cache", "infer_kv_format", "kv_cache_convert",
    "kv_cache_gather", "kv_cache_write", "kv_format_info", "kv_layout", "merge_attention_states",
    "new_kv_cache", "no_split_schedule", "plan_decode_schedule", "quantize", "sparse_decode",
    "sparse_prefill", "sparse_prefill_from_cache",
    "flash_mla", "torch_ops_registered", "__version__",
]
