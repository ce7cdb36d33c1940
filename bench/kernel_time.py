#!/usr/bin/env python3
"""Kernel-only GPU time of OpenMLA's dense decode, measured the way FlashMLA's reference figures
were (docs/benchmarking.md): the profiler's kernel records (from the decode kernel's start to the combine kernel's
end, whatever runs between), the L2 flushed by an 8 GiB memset before each of `runs` steps, the
median. `openmla_bench_dense_decode` times the same work between CUDA events, which also counts
the launch latency between the start event and the first kernel; the difference is printed.

  PYTHONPATH=<dir holding the openmla package> python3 bench/kernel_time.py [b,s_q,h_q,seqlen ...]

Needs torch with CUDA (the profiler is kineto/CUPTI); the schedule is planned once, outside the
timed steps, as FlashMLA's get_mla_metadata was.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import openmla.flash_mla as flash_mla

# FlashMLA on the H200, kernel µs (measured 2026-12-02 by the same method).
FLASHMLA_US = {
    (128, 1, 16, 1024): 49.5, (128, 1, 16, 4096): 162.2, (128, 1, 16, 8192): 307.6,
    (128, 1, 64, 1024): 50.5, (128, 1, 64, 4096): 165.0,
    (128, 1, 128, 1024): 72.2, (128, 1, 128, 4096): 229.4, (128, 1, 128, 8192): 448.0,
    (128, 2, 128, 8192): 812.0, (1, 1, 16, 131072): 76.8, (1, 1, 128, 131072): 82.1,
    (8, 1, 16, 131072): 311.6, (8, 1, 128, 131072): 430.3,
    (32, 1, 128, 1024): 36.0, (32, 1, 128, 4096): 72.2,
}
DEFAULT_SHAPES = list(FLASHMLA_US)


def kernel_spans(trace_path: str):
    """(start, end) in µs of every OpenMLA kernel and of every other kernel/memset, in order."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    spans = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memset"):
            continue
        ours = "openmla" in e.get("name", "")
        spans.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), ours))
    spans.sort()
    return spans


def measure(b: int, s_q: int, h_q: int, seqlen: int, runs: int = 10) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(b * 131 + s_q * 17 + h_q + seqlen)
    pages = (seqlen + 63) // 64
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device=dev, generator=gen)
    k_cache = torch.randn(b * pages, 64, 1, 576, dtype=torch.bfloat16, device=dev, generator=gen)
    table = torch.randperm(b * pages, device=dev, generator=gen).to(torch.int32).view(b, pages)
    seqlens = torch.full((b,), seqlen, dtype=torch.int32, device=dev)
    sched, _ = flash_mla.get_mla_metadata()
    flush = torch.empty(8 << 30, dtype=torch.uint8, device=dev)

    def step():
        return flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, sched)

    for _ in range(3):  # plans the schedule, loads the module
        step()
    torch.cuda.synchronize()

    # Events around the same steps, as the C++ benchmark times them.
    event_us = []
    for _ in range(runs):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        event_us.append(start.elapsed_time(stop) * 1e3)

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            flush.zero_()
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        spans = kernel_spans(path)
    # Steps are the runs of consecutive OpenMLA kernels between other work (the flushes).
    steps, current = [], []
    for start, end, ours in spans:
        if ours:
            current.append((start, end))
        elif current:
            steps.append(current)
            current = []
    if current:
        steps.append(current)
    kernel_us = [max(e for _, e in s) - min(st for st, _ in s) for s in steps]
    # From the decode kernel's end (the step's first kernel) to the step's end: the combine's
    # share, or the cost of its launch where every request was whole and its blocks only exit.
    after_us = [max(e for _, e in s) - s[0][1] for s in steps]
    if len(kernel_us) != runs:
        raise RuntimeError(f"expected {runs} steps of OpenMLA kernels in the trace, found "
                           f"{len(kernel_us)}")
    return {"kernel_us": statistics.median(kernel_us), "event_us": statistics.median(event_us),
            "after_us": statistics.median(after_us),
            "kernels_per_step": statistics.median(len(s) for s in steps)}


def main(argv) -> int:
    if not torch.cuda.is_available():
        print("kernel_time.py: no CUDA device")
        return 1
    shapes = [tuple(int(v) for v in a.split(",")) for a in argv] or DEFAULT_SHAPES
    print(f"dense decode, bf16, d_qk 576, page 64, {torch.cuda.get_device_name()}: kernel µs from "
          "the profiler trace (decode start to combine end), L2 flushed, median of 10")
    print("| b | s_q | h_q | seqlen | kernel µs | event µs | kernels a step | after decode µs | "
          "FlashMLA µs · speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        r = measure(*shape)
        ref = FLASHMLA_US.get(shape)
        vs = f"{ref} · {ref / r['kernel_us']:.2f}×" if ref else ""
        print(f"| {' | '.join(str(v) for v in shape)} | {r['kernel_us']:.1f} | "
              f"{r['event_us']:.1f} | {r['kernels_per_step']:.0f} | {r['after_us']:.1f} | {vs} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
