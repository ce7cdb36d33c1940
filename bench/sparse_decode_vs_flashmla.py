#!/usr/bin/env python3
"""Sparse decode, OpenMLA side by side with FlashMLA in one run (kernel-only time).

Method (the one bench/RESULTS.md and docs/benchmarking.md describe): the same tensors for both
libraries; each library's schedule made once before the timed calls; an 8 GiB memset flushes the
L2 before every call; the calls are recorded with torch.profiler and a call's time is the span
from the start of its first kernel to the end of its last (the flush excluded); the median of
`--rounds` calls, the two libraries interleaved in rounds. Ceilings of the same run: device-to-
device copy bandwidth (bytes read + written) and the bf16 GEMM rate (8192^3 torch.matmul).

  PYTHONPATH=<openmla package>:<FlashMLA package> python3 bench/sparse_decode_vs_flashmla.py

FlashMLA runs only where it can (fp8_v32 and fp8_model1 caches, h_q 64 or 128); for h_q 8-32 its
column is the same tokens with q padded to 64 heads (what an engine does with it today).
TFLOP/s = 2 * b * s_q * h_q * (topk + extra_topk) * (d_qk + 512) / time; bytes = the KV
records attended (their format's bytes per token) + q + indices + out, read or written once.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import openmla
import openmla.flash_mla as omla

import icache

try:
    import flash_mla as peer  # FlashMLA, the benchmark peer
except ImportError:  # pragma: no cover - the peer is only on the benchmark machine
    peer = None

DEV = torch.device("cuda")
BPT = {"fp8_v32": 656, "fp8_model1": 584, "fp8_mx": 528, "fp4": 288, "bf16": 1152}
D_QK = {"fp8_v32": 576, "fp8_model1": 512, "fp8_mx": 512, "fp4": 512, "bf16": 576}


def ceilings():
    src = torch.empty(4 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    copy_gbs = 2 * src.numel() / statistics.median(times[1:]) / 1e9
    del src, dst
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    times = []
    for _ in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.matmul(x, y)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    gemm = 2 * 8192 ** 3 / statistics.median(times[1:]) / 1e12
    return copy_gbs, gemm


def make_cache(fmt: str, tokens: int, page: int, gen):
    """A paged cache of `tokens` slots in `fmt`, every slot written by kv_cache_write from random
    latents (in chunks), as FlashMLA's [num_blocks, page, 1, bytes] view."""
    d = D_QK[fmt]
    blocks = (tokens + page - 1) // page
    cache = openmla.new_kv_cache(blocks, page, fmt, d_qk=d, like=torch.empty(1, device=DEV))
    chunk = 1 << 19
    for s0 in range(0, blocks * page, chunk):
        n = min(chunk, blocks * page - s0)
        kv = torch.randn(n, d, dtype=torch.bfloat16, device=DEV, generator=gen)
        openmla.kv_cache_write(kv, torch.arange(s0, s0 + n, dtype=torch.int32, device=DEV), cache,
                               kv_format=fmt)
    return cache


def make_indices(b: int, s_q: int, topk: int, region: int, page_slots: int, gen):
    """[b, s_q, topk] unique random slots of request i's own region of `region` slots."""
    rows = []
    for i in range(b):
        r = torch.rand(s_q, region, device=DEV, generator=gen).argsort(dim=-1)[:, :topk]
        rows.append(r + i * region)
    idx = torch.stack(rows).to(torch.int32)
    assert int(idx.max()) < page_slots
    return idx


def kernel_groups(prof, expected: int):
    """Kernel spans between the flushes (memsets): one group per library call, in call order."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    # The flush (`zero_()`) shows as a memset or as torch's fill kernel, the instruction-cache
    # eviction by its name: each separates calls.
    # (A library kernel never separates: "sparse_prefill_fp8_kernel" holds "fill".)
    def is_flush(e):
        name = e.get("name", "")
        if icache.NAME in name:
            return True
        if "openmla::" in name:
            return False
        return e.get("cat") == "gpu_memset" or "fill" in name.lower() or "elementwise" in name
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), is_flush(e))
                   for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset"))
    groups, current = [], []
    for start, end, flush in spans:
        if flush:
            if current:
                groups.append(current)
                current = []
        else:
            current.append((start, end))
    if current:
        groups.append(current)
    if len(groups) != expected:
        raise RuntimeError(f"expected {expected} kernel groups, found {len(groups)}")
    return [max(e for _, e in g) - min(s for s, _ in g) for g in groups]


# Every timed call starts with cold instruction caches (bench/icache.py); --icache mixed leaves
# them as the previous call left them (the method before 2026-12-06, for comparison).
COLD_ICACHE = True


def time_calls(calls, rounds: int):
    """Median kernel-only µs of each callable, interleaved in rounds, L2 flushed and instruction
    caches evicted before each."""
    flush = torch.empty(8 << 30, dtype=torch.uint8, device=DEV)
    for c in calls:
        for _ in range(3):
            c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for r in range(rounds):
            for c in calls:
                flush.zero_()
                if COLD_ICACHE:
                    icache.evict()
                c()
        torch.cuda.synchronize()
    spans = kernel_groups(prof, rounds * len(calls))
    del flush
    return [statistics.median(spans[k::len(calls)]) for k in range(len(calls))]


def lengths(b: int, topk: int, gen):
    """[b] random counts in [topk / 2, topk] (int32): a request's, as FlashMLA takes them."""
    return torch.randint(topk // 2, topk + 1, (b,), dtype=torch.int32, device=DEV, generator=gen)


def run_case(fmt, b, s_q, h_q, topk, *, region=32768, page=64, extra=None, rounds=20, seed=0,
             peer_ok=True, copy_gbs=None, extra_len=False):
    """extra: (fmt, topk, page, region) of a second cache; extra_len: extra_topk_length given
    (random counts). Returns a dict of results."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    d = D_QK[fmt]
    cache = make_cache(fmt, b * region, page, gen)
    idx = make_indices(b, s_q, topk, region, cache.shape[0] * page, gen)
    q = torch.randn(b, s_q, h_q, d, dtype=torch.bfloat16, device=DEV, generator=gen) / 4
    kw = {}
    extra_topk = 0
    if extra is not None:
        efmt, extra_topk, epage, eregion = extra
        ecache = make_cache(efmt, b * eregion, epage, gen)
        eidx = make_indices(b, s_q, extra_topk, eregion, ecache.shape[0] * epage, gen)
        kw = dict(extra_k_cache=ecache, extra_indices_in_kvcache=eidx)
        if extra_len:
            kw["extra_topk_length"] = lengths(b, extra_topk, gen)
    meta_o, _ = omla.get_mla_metadata()

    def ours():
        return omla.flash_mla_with_kvcache(q, cache, None, None, 512, meta_o, None,
                                           is_fp8_kvcache=fmt != "bf16", indices=idx, **kw)

    calls = [ours]
    peer_q = None
    if peer is not None and peer_ok and fmt in ("fp8_v32", "fp8_model1") and (
            extra is None or extra[0] in ("fp8_v32", "fp8_model1")):
        peer_h = h_q if h_q in (64, 128) else 64
        peer_q = q if peer_h == h_q else torch.nn.functional.pad(q, (0, 0, 0, peer_h - h_q))
        meta_p, _ = peer.get_mla_metadata()

        def theirs():
            return peer.flash_mla_with_kvcache(peer_q, cache, None, None, 512, meta_p, None,
                                               is_fp8_kvcache=True, indices=idx, **kw)

        calls.append(theirs)
        # Same answer on the heads both compute (a wrong kernel is not timed).
        o1, _ = ours()
        o2, _ = theirs()
        err = ((o1.float() - o2[:, :, :h_q].float()).norm() / o2[:, :, :h_q].float().norm()).item()
        if not err < 2e-2:
            raise RuntimeError(f"OpenMLA and FlashMLA disagree: relative error {err:.3e}")
    times = time_calls(calls, rounds)
    keys = topk + extra_topk
    flops = 2 * b * s_q * h_q * keys * (d + 512)
    kv_bytes = b * s_q * (topk * BPT[fmt] + (extra_topk * BPT[extra[0]] if extra else 0))
    io_bytes = kv_bytes + b * s_q * h_q * (d + 512) * 2 + b * s_q * keys * 4
    res = {"us": times[0], "tflops": flops / times[0] / 1e6, "gbs": io_bytes / times[0] / 1e3,
           "peer_us": times[1] if len(times) > 1 else None,
           "floor_us": io_bytes / (copy_gbs * 1e3) if copy_gbs else None}
    del cache
    torch.cuda.empty_cache()
    return res


def prefill_rows(rounds: int, quick: bool) -> list:
    """Sparse prefill side by side on FlashMLA's prefill grid (bf16 kv, s_q 4096), then prefill
    straight from an FP8 cache against what an engine does without it: convert the cache to
    bf16, then the bf16 prefill. Returns the speedups over FlashMLA."""
    print("\nsparse prefill, s_q 4096: kernel-only µs (TFLOP/s = 2 s_q h_q topk (d_qk + 512))")
    print("| d_qk | h_q | topk | s_kv | OpenMLA µs | TFLOP/s | FlashMLA µs | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    s_q = 4096
    grid = [(d, h, topk, s) for d, h, topk in ((576, 128, 2048), (512, 64, 512), (512, 128, 1024))
            for s in (8192, 32768, 131072)]
    if quick:
        grid = grid[:2]
    ratios = []
    for d, h, topk, s_kv in grid:
        gen = torch.Generator(device=DEV).manual_seed(d + h + topk + s_kv)
        q = torch.randn(s_q, h, d, dtype=torch.bfloat16, device=DEV, generator=gen) / 4
        kv = torch.randn(s_kv, 1, d, dtype=torch.bfloat16, device=DEV, generator=gen)
        idx = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32, device=DEV, generator=gen)
        scale = d ** -0.5
        calls = [lambda: omla.flash_mla_sparse_fwd(q, kv, idx, scale, 512)]
        if peer is not None:
            calls.append(lambda: peer.flash_mla_sparse_fwd(q, kv, idx, scale, 512))
            o1, o2 = calls[0]()[0].float(), calls[1]()[0].float()
            err = ((o1 - o2).norm() / o2.norm()).item()
            if not err < 2e-2:
                raise RuntimeError(f"prefill: OpenMLA and FlashMLA disagree: {err:.3e}")
        t = time_calls(calls, rounds)
        tflops = 2 * s_q * h * topk * (d + 512) / t[0] / 1e6
        peer_s = f"{t[1]:.0f}" if len(t) > 1 else ""
        speed = f"{t[1] / t[0]:.2f}x" if len(t) > 1 else ""
        if len(t) > 1:
            ratios.append(t[1] / t[0])
        print(f"| {d} | {h} | {topk} | {s_kv} | {t[0]:.0f} | {tflops:.0f} | {peer_s} | {speed} |",
              flush=True)
        del kv
    if ratios:
        print(f"\nprefill: geometric mean speedup over FlashMLA ({len(ratios)} rows): "
              f"{statistics.geometric_mean(ratios):.3f}x (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f})")
    print("\nsparse prefill from an FP8 cache (s_q 4096, topk 2048, s_kv 32768): straight from the "
          "cache vs convert-to-bf16 + bf16 prefill (what an engine does without it), and "
          "FlashMLA's bf16 prefill on the converted rows (kernel only)")
    print("| cache | h_q | from cache µs | convert + bf16 prefill µs | speedup | FlashMLA bf16 µs | "
          "from cache vs FlashMLA |")
    print("|---|---|---|---|---|---|---|")
    for fmt in ("fp8_v32", "fp8_model1") if not quick else ("fp8_v32",):
        for h in (64, 128):
            d = D_QK[fmt]
            gen = torch.Generator(device=DEV).manual_seed(h)
            cache = make_cache(fmt, 32768, 64, gen)
            q = torch.randn(s_q, h, d, dtype=torch.bfloat16, device=DEV, generator=gen) / 4
            idx = torch.randint(0, 32768, (s_q, 1, 2048), dtype=torch.int32, device=DEV,
                                generator=gen)
            slots = torch.arange(32768, dtype=torch.int32, device=DEV)
            bf = torch.empty(32768, d, dtype=torch.bfloat16, device=DEV)

            def from_cache():
                return openmla.sparse_prefill_from_cache(q, cache, idx)

            def convert_then_prefill():
                openmla.kv_cache_gather(cache, slots, out=bf)
                return openmla.sparse_prefill(q, bf.view(32768, 1, d), idx)

            calls = [from_cache, convert_then_prefill]
            if peer is not None:
                openmla.kv_cache_gather(cache, slots, out=bf)
                kv_bf = bf.view(32768, 1, d)
                calls.append(lambda: peer.flash_mla_sparse_fwd(q, kv_bf, idx, d ** -0.5, 512))
            t = time_calls(calls, rounds)
            peer_s = f"{t[2]:.0f} | {t[2] / t[0]:.2f}x" if peer is not None else " | "
            print(f"| {fmt} | {h} | {t[0]:.0f} | {t[1]:.0f} | {t[1] / t[0]:.2f}x | {peer_s} |",
                  flush=True)
            del cache
    return ratios


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--only", choices=["decode", "prefill"], default=None)
    ap.add_argument("--rows", choices=["all", "compared", "small-batch"], default="all",
                    help="decode's rows: all, only those with a FlashMLA column (FlashMLA's "
                         "production grid), or the small-batch rows")
    ap.add_argument("--icache", choices=["cold", "mixed"], default="cold",
                    help="cold: instruction caches evicted before every timed call (bench/"
                         "icache.py); mixed: as the previous call left them")
    args = ap.parse_args(argv)
    global COLD_ICACHE
    COLD_ICACHE = args.icache == "cold"
    name = torch.cuda.get_device_name()
    copy_gbs, gemm = ceilings()
    print(f"sparse decode side by side, {name}; same-run ceilings: copy {copy_gbs:.0f} GB/s, "
          f"bf16 GEMM {gemm:.0f} TFLOP/s; kernel-only µs, L2 flushed, {args.icache} instruction "
          f"caches, median of {args.rounds}; "
          f"FlashMLA {'present' if peer is not None else 'absent'}")
    if args.only == "prefill":
        prefill_rows(args.rounds, args.quick)
        return 0
    print("| cache | b | s_q | h_q | topk | OpenMLA µs | TFLOP/s | GB/s | FlashMLA µs | speedup "
          "| note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def row(fmt, b, s_q, h_q, topk, note="", **kw):
        r = run_case(fmt, b, s_q, h_q, topk, rounds=args.rounds, copy_gbs=copy_gbs, **kw)
        peer_s = f"{r['peer_us']:.1f}" if r["peer_us"] else ""
        speed = f"{r['peer_us'] / r['us']:.2f}x" if r["peer_us"] else ""
        if h_q < 64 and r["peer_us"]:
            note = (note + " FlashMLA padded to 64 heads").strip()
        if r["floor_us"] and b <= 8:
            note = (note + f" DRAM floor {r['floor_us']:.1f} µs ({r['us'] / r['floor_us']:.1f}x)").strip()
        print(f"| {fmt} | {b} | {s_q} | {h_q} | {topk} | {r['us']:.1f} | {r['tflops']:.0f} | "
              f"{r['gbs']:.0f} | {peer_s} | {speed} | {note} |", flush=True)
        return r

    # FlashMLA's production grid (its sparse decode test's performance cases): V3.2 (fp8_v32)
    # h_q 128 and 64, s_q 2, topk 2048; V4 (fp8_model1) topk 128 on page 256 (256 keys a request)
    # plus an extra cache; the peak cases (b 148, topk 16384).
    ratios = []
    grid = []
    if args.rows != "small-batch":
        grid += [("fp8_v32", b, 2, h, 2048, "", {}) for h in (128, 64) for b in (2, 64, 128)]
        v4 = [(512, 64, False), (1024, 64, True), (512, 2, True), (1024, 2, False)]
        for etopk, epage, elen in v4:
            for h in (64, 128):
                for b in (2, 74, 148, 256):
                    note = (f"V4: + extra topk {etopk} page {epage}" +
                            (" +extra_topk_length" if elen else ""))
                    grid.append(("fp8_model1", b, 2, h, 128, note,
                                 dict(page=256, region=256, extra=("fp8_model1", etopk, epage, 2048),
                                      extra_len=elen)))
        grid += [(f, 148, 1, 128, 16384, "peak", dict(region=32768))
                 for f in ("fp8_v32", "fp8_model1")]
    if args.quick:
        grid = grid[:1] + grid[6:7]
    for f, b, s, h, topk, note, kw in grid:
        r = row(f, b, s, h, topk, note, **kw)
        if r["peer_us"]:
            ratios.append(r["peer_us"] / r["us"])
    if ratios:
        gm = statistics.geometric_mean(ratios)
        print(f"\ngeometric mean speedup over FlashMLA on its production grid ({len(ratios)} rows): "
              f"{gm:.3f}x (min {min(ratios):.2f}, max {max(ratios):.2f})")
    if args.rows == "compared":
        return 0
    print()
    small = []
    for b in (1, 4, 8):  # the small-batch serving rows (tensor parallelism: 16 heads)
        for f in ("fp8_v32", "fp8_model1"):
            r = row(f, b, 1, 16, 2048)
            if r["peer_us"]:
                small.append(r["peer_us"] / r["us"])
    if small:
        print(f"\nsmall batches (h_q 16) against FlashMLA padded to 64 heads: geometric mean "
              f"{statistics.geometric_mean(small):.3f}x (min {min(small):.2f})")
    if args.rows == "small-batch":
        return 0
    print()
    for fmt in ("fp8_v32", "fp8_model1", "fp8_mx", "fp4", "bf16"):
        for h in (8, 16, 32, 64, 128):
            if (args.quick or fmt not in ("fp8_v32", "fp8_model1")) and h not in (16, 128):
                continue
            row(fmt, 64, 1, h, 2048, peer_ok=fmt in ("fp8_v32", "fp8_model1") and h < 64)
    print("\nbatch-invariant mode (no split-KV) against the default plan, fp8_v32, h_q 16/128, "
          "s_q 1, topk 2048")
    print("| b | h_q | default µs | batch_invariant µs | cost |")
    print("|---|---|---|---|---|")
    for b, h in ((1, 16), (8, 16), (64, 128)):
        gen = torch.Generator(device=DEV).manual_seed(b)
        cache = make_cache("fp8_v32", b * 32768, 64, gen)
        idx = make_indices(b, 1, 2048, 32768, cache.shape[0] * 64, gen)
        q = torch.randn(b, 1, h, 576, dtype=torch.bfloat16, device=DEV, generator=gen) / 4
        t = time_calls([lambda: openmla.sparse_decode(q, cache, idx),
                        lambda: openmla.sparse_decode(q, cache, idx, batch_invariant=True)],
                       args.rounds)
        print(f"| {b} | {h} | {t[0]:.1f} | {t[1]:.1f} | {t[1] / t[0]:.2f}x |", flush=True)
        del cache
    if args.only is None:
        prefill_rows(args.rounds, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
