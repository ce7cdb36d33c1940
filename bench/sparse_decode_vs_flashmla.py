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


# --ab settings: each is an extra OpenMLA call with those environment switches set (the library
# reads its OPENMLA_SPARSE_* switches at every launch), timed in the same interleaved rounds.
AB: list[dict[str, str]] = []


def with_env(fn, env: dict[str, str]):
    def call():
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return fn()
        finally:
            for k, v in old.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    return call


def ab_label(env: dict[str, str]) -> str:
    return ",".join(f"{k.removeprefix('OPENMLA_SPARSE_')}={v}" for k, v in env.items())


def ab_note(base_us: float, ab_us) -> str:
    """The --ab calls' times and their speedup over the default (time default / time variant)."""
    return "; ".join(f"{ab_label(env)}: {t:.1f} µs ({base_us / t:.3f}x)" for env, t in zip(AB, ab_us))


def run_case(fmt, b, s_q, h_q, topk, *, region=32768, page=64, extra=None, rounds=20, seed=0,
             peer_ok=True, copy_gbs=None):
    """extra: (fmt, topk, page, region) of a second cache. Returns a dict of results."""
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
    calls += [with_env(ours, env) for env in AB]
    times = time_calls(calls, rounds)
    ab_us = times[len(times) - len(AB):]
    times = times[:len(times) - len(AB)]
    keys = topk + extra_topk
    flops = 2 * b * s_q * h_q * keys * (d + 512)
    kv_bytes = b * s_q * (topk * BPT[fmt] + (extra_topk * BPT[extra[0]] if extra else 0))
    io_bytes = kv_bytes + b * s_q * h_q * (d + 512) * 2 + b * s_q * keys * 4
    res = {"us": times[0], "tflops": flops / times[0] / 1e6, "gbs": io_bytes / times[0] / 1e3,
           "peer_us": times[1] if len(times) > 1 else None,
           "floor_us": io_bytes / (copy_gbs * 1e3) if copy_gbs else None, "ab_us": ab_us}
    del cache
    torch.cuda.empty_cache()
    return res


def prefill_rows(rounds: int, copy_gbs: float, quick: bool, cache_only: bool = False) -> None:
    """Sparse prefill side by side (bf16 kv), then prefill straight from an FP8 cache against what
    an engine does today without it: convert the cache to bf16, then the bf16 prefill."""
    print("\nsparse prefill, s_q 4096: kernel-only µs (TFLOP/s = 2 s_q h_q topk (d_qk + 512))")
    print("| d_qk | h_q | topk | s_kv | OpenMLA µs | TFLOP/s | FlashMLA µs | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    s_q = 4096
    grid = [(d, h, 2048, s) for d in (576, 512) for h in (128, 64) for s in (8192, 32768)]
    grid += [(512, 64, 512, 32768), (512, 128, 1024, 32768)]
    if quick:
        grid = grid[:2]
    if cache_only:
        grid = []
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
        for env in AB:  # a variant is timed only if it gives the default's answer
            o_ab, o_def = with_env(calls[0], env)()[0].float(), calls[0]()[0].float()
            err = ((o_ab - o_def).norm() / o_def.norm()).item()
            if not err < 1e-2:
                raise RuntimeError(f"prefill: {ab_label(env)} disagrees with the default: {err:.3e}")
        calls += [with_env(calls[0], env) for env in AB]
        t = time_calls(calls, rounds)
        ab_us = t[len(t) - len(AB):]
        t = t[:len(t) - len(AB)]
        tflops = 2 * s_q * h * topk * (d + 512) / t[0] / 1e6
        peer_s = f"{t[1]:.0f}" if len(t) > 1 else ""
        speed = f"{t[1] / t[0]:.2f}x" if len(t) > 1 else ""
        if len(t) > 1:
            ratios.append(t[1] / t[0])
        ab = f" {ab_note(t[0], ab_us)} |" if AB else ""
        print(f"| {d} | {h} | {topk} | {s_kv} | {t[0]:.0f} | {tflops:.0f} | {peer_s} | {speed} |{ab}",
              flush=True)
        del kv
    if ratios:
        print(f"\nprefill: geometric mean speedup over FlashMLA ({len(ratios)} rows): "
              f"{statistics.geometric_mean(ratios):.3f}x (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f})")
    print("\nsparse prefill from an FP8 cache (s_q 4096, topk 2048, s_kv 32768): straight from the "
          "cache vs convert-to-bf16 + bf16 prefill (what an engine does without it); then the "
          "opt-in FP8 tensor-core path (fp8_tensor_cores=True): its time, its speedup over "
          "convert + bf16 prefill and over FlashMLA's bf16 prefill on the converted rows "
          "(kernel only), and its out's relative L2 error against the bf16 path's")
    print("| cache | h_q | from cache µs | convert + bf16 prefill µs | speedup | FP8 path µs | "
          "FP8 vs convert + bf16 | FlashMLA bf16 µs | FP8 vs FlashMLA | FP8 path error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
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

            def fp8_path():
                return openmla.sparse_prefill_from_cache(q, cache, idx, fp8_tensor_cores=True)

            o_ref = from_cache()[0].float()
            o_fp8 = fp8_path()[0].float()
            fp8_err = ((o_fp8 - o_ref).norm() / o_ref.norm()).item()
            if not fp8_err < 0.2:
                raise RuntimeError(f"prefill: the FP8 path is off the bf16 path: {fp8_err:.3e}")
            calls = [from_cache, convert_then_prefill, fp8_path]
            if peer is not None:
                openmla.kv_cache_gather(cache, slots, out=bf)
                kv_bf = bf.view(32768, 1, d)
                calls.append(lambda: peer.flash_mla_sparse_fwd(q, kv_bf, idx, d ** -0.5, 512))
            t = time_calls(calls + [with_env(from_cache, env) for env in AB], rounds)
            ab = f" {ab_note(t[0], t[len(calls):])} |" if AB else ""
            peer_s = f"{t[3]:.0f} | {t[3] / t[2]:.2f}x" if peer is not None else " | "
            print(f"| {fmt} | {h} | {t[0]:.0f} | {t[1]:.0f} | {t[1] / t[0]:.2f}x | {t[2]:.0f} | "
                  f"{t[1] / t[2]:.2f}x | {peer_s} | {fp8_err:.2e} |{ab}", flush=True)
            del cache


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--only", choices=["decode", "prefill"], default=None)
    ap.add_argument("--rows", choices=["all", "compared", "small-batch"], default="all",
                    help="for A/B runs of a switch: decode's rows with a FlashMLA column (and, "
                         "with --only prefill, only the rows from an FP8 cache), or decode's "
                         "small-batch rows")
    ap.add_argument("--ab", action="append", default=[], metavar="VAR=V[,VAR=V]",
                    help="also time OpenMLA with these environment switches set (e.g. "
                         "OPENMLA_SPARSE_STAGGER=1), in the same rounds; repeatable")
    ap.add_argument("--icache", choices=["cold", "mixed"], default="cold",
                    help="cold: instruction caches evicted before every timed call (bench/"
                         "icache.py); mixed: as the previous call left them (the earlier method)")
    args = ap.parse_args(argv)
    for spec in args.ab:
        AB.append(dict(kv.split("=", 1) for kv in spec.split(",")))
    global COLD_ICACHE
    COLD_ICACHE = args.icache == "cold"
    name = torch.cuda.get_device_name()
    copy_gbs, gemm = ceilings()
    print(f"sparse decode side by side, {name}; same-run ceilings: copy {copy_gbs:.0f} GB/s, "
          f"bf16 GEMM {gemm:.0f} TFLOP/s; kernel-only µs, L2 flushed, {args.icache} instruction "
          f"caches, median of {args.rounds}; "
          f"FlashMLA {'present' if peer is not None else 'absent'}")
    if args.only == "prefill":
        prefill_rows(args.rounds, copy_gbs, args.quick, args.rows == "compared")
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
        if AB:
            note = (note + " " + ab_note(r["us"], r["ab_us"])).strip()
        print(f"| {fmt} | {b} | {s_q} | {h_q} | {topk} | {r['us']:.1f} | {r['tflops']:.0f} | "
              f"{r['gbs']:.0f} | {peer_s} | {speed} | {note} |", flush=True)
        return r

    ratios = []
    grid = [(f, b, h, s) for f in ("fp8_v32", "fp8_model1") for b in (64, 128) for h in (64, 128)
            for s in (1, 2)]
    if args.rows == "small-batch":
        grid = []
    if args.quick:
        grid = [("fp8_v32", 128, 128, 1), ("fp8_model1", 64, 64, 2)]
    for f, b, h, s in grid:
        r = row(f, b, s, h, 2048)
        if r["peer_us"]:
            ratios.append(r["peer_us"] / r["us"])
    for h in (64, 128) if args.rows != "small-batch" else ():
        # FlashMLA's V4 case: topk 128 on page 256 + extra topk 1024 on page 64
        r = row("fp8_model1", 128, 2, h, 128, "V4: + extra fp8_model1 topk 1024 page 64",
                page=256, region=16384, extra=("fp8_model1", 1024, 64, 16384))
        if r["peer_us"]:
            ratios.append(r["peer_us"] / r["us"])
    if ratios:
        gm = statistics.geometric_mean(ratios)
        print(f"\ngeometric mean speedup over FlashMLA on the {len(ratios)} compared rows: "
              f"{gm:.3f}x (min {min(ratios):.2f}, max {max(ratios):.2f})")
    if args.rows == "compared":
        return 0
    print()
    for fmt in ("fp8_v32", "fp8_model1", "fp8_mx", "fp4", "bf16") if args.rows == "all" else ():
        for h in (8, 16, 32, 64, 128):
            if args.quick and h not in (16, 128):
                continue
            row(fmt, 64, 1, h, 2048, peer_ok=fmt in ("fp8_v32", "fp8_model1") and h < 64)
    print()
    for b in (1, 4, 8):  # the small-batch serving rows (tensor parallelism: 16 heads)
        row("fp8_v32", b, 1, 16, 2048)
        row("fp8_model1", b, 1, 16, 2048)
    if args.rows == "small-batch":
        return 0
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
        prefill_rows(args.rounds, copy_gbs, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
