"""What OpenMLA needs from an array framework: dtype names, allocation, devices and streams.

Two frameworks are known: numpy (CPU; bf16 and float8 through ml_dtypes, when installed) and
torch (CPU and CUDA; imported only if the caller already uses it). Every array is handed to the
extension through DLPack; `to_c` makes the few dtypes DLPack (or numpy's export of it) cannot
carry travel as same-sized integers.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import _C

# Canonical dtype names (the C++ API's, plus the byte dtypes a cache may arrive as).
_NUMPY_NAMES = {
    np.dtype(np.float16): "fp16",
    np.dtype(np.float32): "fp32",
    np.dtype(np.float64): "fp64",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.int8): "int8",
    np.dtype(np.int16): "int16",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.bool_): "bool",
}

# numpy has no bfloat16/float8 of its own: ml_dtypes provides them. It is optional and imported
# only when it is needed (never by `import openmla`): a numpy array of one of its dtypes can only
# exist once the caller has imported it, and a bf16 numpy output is allocated with it.
_ML_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz",
              "float8_e5m2fnuz", "float8_e4m3")
_ml_dtypes: Any = None


def _load_ml_dtypes(import_it: bool) -> Any:
    """ml_dtypes, once the process has imported it (or, with import_it, after importing it
    here); None when it is not there. Its dtypes join _NUMPY_NAMES the first time."""
    global _ml_dtypes
    if _ml_dtypes is not None:
        return _ml_dtypes
    module = sys.modules.get("ml_dtypes")
    if module is None and import_it:
        try:
            import ml_dtypes as module
        except ImportError:
            return None
    if module is None:
        return None
    _NUMPY_NAMES[np.dtype(module.bfloat16)] = "bf16"
    for name in _ML_FLOAT8:
        if hasattr(module, name):
            _NUMPY_NAMES[np.dtype(getattr(module, name))] = name.replace("float8", "fp8")
    _ml_dtypes = module
    return module


# Dtypes a KV cache's bytes may come as.
BYTE_DTYPES = ("uint8", "int8", "fp8_e4m3fn", "fp8_e5m2", "fp8_e8m0fnu", "fp8_e4m3fnuz",
               "fp8_e5m2fnuz", "fp8_e4m3")


def _torch():
    """The torch module if the process has imported it (never imports it here)."""
    return sys.modules.get("torch")


def is_torch_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or is_torch_tensor(x) or hasattr(x, "__dlpack__")


class _Reinterpreted:
    """A DLPack producer that re-labels an array's items (a uint16 view of ml_dtypes.bfloat16
    data as DLPack bf16). Each __dlpack__ call hands out a fresh capsule, so it can be reused."""

    __slots__ = ("base", "dtype")

    def __init__(self, base: Any, dtype: str):
        self.base = base
        self.dtype = dtype

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return _C.reinterpret(self.base, self.dtype)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (1, 0)


class Numpy:
    name = "numpy"

    @staticmethod
    def dtype_name(x: np.ndarray) -> str:
        # (Not .get(dtype, str(dtype)): that formats the dtype on every call, ~40% of a small
        # merge's Python time.)
        name = _NUMPY_NAMES.get(x.dtype)
        if name is None and _ml_dtypes is None and _load_ml_dtypes(False) is not None:
            name = _NUMPY_NAMES.get(x.dtype)
        return name if name is not None else str(x.dtype)

    @staticmethod
    def np_dtype(name: str, op: str, arg: str) -> np.dtype:
        if name == "bf16":
            ml_dtypes = _load_ml_dtypes(True)
            if ml_dtypes is None:
                raise TypeError(f"{op}: {arg}: numpy has no bfloat16; install ml_dtypes "
                                "(pip install ml_dtypes) or use torch tensors")
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype({"fp16": np.float16, "fp32": np.float32, "int32": np.int32,
                         "int64": np.int64, "uint8": np.uint8}[name])

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: str, like: Any, op: str = "", arg: str = "out"):
        return np.empty(tuple(shape), cls.np_dtype(dtype, op, arg))

    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: str, like: Any, op: str = "", arg: str = "out"):
        return np.zeros(tuple(shape), cls.np_dtype(dtype, op, arg))

    @staticmethod
    def arange(n: int, like: Any):
        return np.arange(n, dtype=np.int32)

    @staticmethod
    def device(x: Any) -> Tuple[str, int]:
        return ("cpu", 0)

    @staticmethod
    def stream(x: Any) -> int:
        return 0

    @staticmethod
    def keep_for_stream(x: Any, stream: int) -> None:
        """Nothing to keep: a numpy array lives on the CPU."""

    @staticmethod
    def writable(x: np.ndarray) -> bool:
        return bool(x.flags.writeable)

    @staticmethod
    def as_strided(buffer: np.ndarray, shape, strides_elems):
        item = buffer.dtype.itemsize
        return np.lib.stride_tricks.as_strided(
            buffer, shape=tuple(shape), strides=tuple(s * item for s in strides_elems),
            writeable=True)

    @staticmethod
    def guard(x: Any):
        return contextlib.nullcontext()

    @classmethod
    def to_c(cls, x: np.ndarray) -> Any:
        name = cls.dtype_name(x)
        if name == "bf16":
            return _Reinterpreted(x.view(np.uint16), "bf16")
        if name.startswith("fp8"):
            return x.view(np.uint8)
        return x


class Torch:
    name = "torch"

    _names: dict = {}

    @classmethod
    def dtype_name(cls, x: Any) -> str:
        name = cls._names.get(x.dtype)
        if name is None:
            text = str(x.dtype).replace("torch.", "")
            name = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"
                    }.get(text, text.replace("float8", "fp8"))
            cls._names[x.dtype] = name
        return name

    @staticmethod
    def t_dtype(name: str):
        torch = _torch()
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}[name]

    @classmethod
    def empty(cls, shape, dtype: str, like: Any, op: str = "", arg: str = "out"):
        return _torch().empty(tuple(shape), dtype=cls.t_dtype(dtype), device=like.device)

    @classmethod
    def zeros(cls, shape, dtype: str, like: Any, op: str = "", arg: str = "out"):
        return _torch().zeros(tuple(shape), dtype=cls.t_dtype(dtype), device=like.device)

    @staticmethod
    def arange(n: int, like: Any):
        torch = _torch()
        return torch.arange(n, dtype=torch.int32, device=like.device)

    @staticmethod
    def device(x: Any) -> Tuple[str, int]:
        dev = x.device
        if dev.type == "cuda":
            return ("cuda", dev.index if dev.index is not None else _torch().cuda.current_device())
        return (dev.type, 0)

    @staticmethod
    def stream(x: Any) -> int:
        if x.device.type == "cuda":
            return _torch().cuda.current_stream(x.device).cuda_stream
        return 0

    @staticmethod
    def keep_for_stream(x: Any, stream: int) -> None:
        """A buffer allocated on torch's current stream but used by kernels on `stream` (the
        caller's) is not handed out again by torch's allocator before `stream`'s work is done."""
        if x.device.type == "cuda" and stream != _torch().cuda.current_stream(x.device).cuda_stream:
            x.record_stream(_torch().cuda.ExternalStream(stream, device=x.device))

    @staticmethod
    def writable(x: Any) -> bool:
        return True

    @staticmethod
    def as_strided(buffer: Any, shape, strides_elems):
        return buffer.as_strided(tuple(shape), tuple(strides_elems))

    @staticmethod
    def guard(x: Any):
        """Makes x's CUDA device current (torch exports a CUDA tensor only from its device)."""
        if x.device.type == "cuda" and x.device.index is not None:
            cuda = _torch().cuda
            if x.device.index != cuda.current_device():
                return cuda.device(x.device)
        return contextlib.nullcontext()

    @classmethod
    def to_c(cls, x: Any) -> Any:
        if x.requires_grad:
            x = x.detach()
        if x.dtype.is_floating_point and x.element_size() == 1:  # float8: travel as bytes
            x = x.view(_torch().uint8)
        if x.device.type == "cuda":
            # stream=-1: no cross-stream synchronisation (the operation runs on the stream the
            # caller gives, the current one by default), so nothing is recorded during a CUDA
            # graph capture. The capsule is used once, by the call it is made for.
            return x.__dlpack__(stream=-1)
        return x


def framework_of(x: Any, op: str, arg: str):
    """numpy or torch, by the type of `x` (TypeError for anything else)."""
    if isinstance(x, np.ndarray):
        return Numpy
    if is_torch_tensor(x):
        return Torch
    if hasattr(x, "__dlpack__"):
        raise TypeError(f"{op}: {arg}: OpenMLA allocates outputs with numpy or torch; got "
                        f"{type(x).__module__}.{type(x).__name__} (convert it with "
                        "np.from_dlpack / torch.from_dlpack, or call openmla._C directly with "
                        "your own outputs)")
    raise TypeError(f"{op}: {arg}: expected an array (numpy.ndarray or torch.Tensor), got "
                    f"{type(x).__name__}")


def dtype_name(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return Numpy.dtype_name(x)
    if is_torch_tensor(x):
        return Torch.dtype_name(x)
    return str(getattr(x, "dtype", type(x).__name__))


def to_c(x: Optional[Any]) -> Optional[Any]:
    """What the extension receives for `x` (None stays None)."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return Numpy.to_c(x)
    if is_torch_tensor(x):
        return Torch.to_c(x)
    return x
