"""Cold instruction caches between timed calls.

A kernel's code stays in the SMs' instruction caches across the L2 flush (a memset runs little
code), so a call that follows a call of the same kernel starts with its code at hand and one that
follows any other kernel fetches it from DRAM: measured 4-7% on the sparse kernels (H100,
2026-12-06, bench/RESULTS.md). In serving the attention kernel follows other layers' kernels, so
the benchmarks time every call cold: `evict()` runs a kernel of ~400 KB of straight-line code on
every SM (more than an SM's instruction caches hold) just before each timed call.

The kernel is PTX generated here and loaded through the driver API (ctypes, libcuda), so the
benchmarks need nothing compiled for it; it runs on torch's current stream and context.
"""
from __future__ import annotations

import ctypes
import random

import torch

NAME = "openmla_bench_icache_evict"  # (the timing scripts' trace filters know this name)
_INSTRUCTIONS = 24576  # 16 B a SASS instruction: ~390 KB of code


def _ptx() -> bytes:
    rng = random.Random(1)
    # A dependent chain of multiply-adds with distinct constants: nothing to fold or drop.
    body = "\n".join(f"  mad.lo.u32 r0, r0, r0, {rng.randrange(1, 2**31) | 1};"
                     for _ in range(_INSTRUCTIONS))
    return f""".version 8.0
.target sm_90
.address_size 64
.visible .entry {NAME}(.param .u64 out)
{{
  .reg .u32 r<1>;
  .reg .u64 a;
  .reg .pred p;
  ld.param.u64 a, [out];
  mov.u32 r0, %tid.x;
{body}
  setp.eq.u32 p, r0, 0x7fffffff;
  @p st.global.u32 [a], r0;
  ret;
}}
""".encode() + b"\0"


class _Evictor:
    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        torch.cuda.init()
        torch.empty(1, device="cuda")  # torch's context is current on this thread
        ctx = ctypes.c_void_p()
        self._check(self.cuda.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise RuntimeError("icache: no current CUDA context")
        self.module = ctypes.c_void_p()
        self._check(self.cuda.cuModuleLoadData(ctypes.byref(self.module), _ptx()),
                    "cuModuleLoadData")
        self.fn = ctypes.c_void_p()
        self._check(self.cuda.cuModuleGetFunction(ctypes.byref(self.fn), self.module,
                                                  NAME.encode()), "cuModuleGetFunction")
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.arg = ctypes.c_uint64(self.sink.data_ptr())
        self.args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(self.arg), ctypes.c_void_p))
        # Two CTAs of 4 warps an SM: each of its four schedulers runs the code.
        self.grid = 2 * torch.cuda.get_device_properties(0).multi_processor_count

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"icache: {what} failed with CUresult {rc}")

    def __call__(self) -> None:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.cuda.cuLaunchKernel(self.fn, self.grid, 1, 1, 128, 1, 1, 0, stream,
                                             self.args, None), "cuLaunchKernel")


_evictor: _Evictor | None = None


def evict() -> None:
    """Evict every SM's instruction caches (asynchronous, on torch's current stream)."""
    global _evictor
    if _evictor is None:
        _evictor = _Evictor()
    _evictor()
