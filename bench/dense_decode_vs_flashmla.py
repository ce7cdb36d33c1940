#!/usr/bin/env python3
"""Dense decode (bf16 cache, d_qk 576, page 64), OpenMLA side by side with FlashMLA in one run,
by the method of bench/sparse_decode_vs_flashmla.py (kernel-only time, L2 flushed before every
call, the two libraries interleaved in rounds, median).

Then, on the same grid (--kv-formats alone, --no-kv-formats to skip): dense decode over quantised
paged caches (fp8_v32, fp8_model1, fp8_mx, fp4; openmla.dense_decode(..., kv_format=...)) timed in
the same rounds as OpenMLA's and FlashMLA's bf16 kernels. Per row: each one's time, its throughput
against OpenMLA's bf16 kernel (bf16 µs / its µs) and its effective bandwidth (b * seqlen * the
format's bytes per token / time), and the targets as pass/miss: where h_q * s_q <= 32 (memory-
bound) fp8_v32 and fp8_model1 >= 1.5x and fp4 >= 3x the bf16 kernel's throughput; where
h_q = 128 (compute-bound) every format >= 0.95x. A format the build has no kernel for prints "not implemented".

  PYTHONPATH=<openmla package>:<FlashMLA package> python3 bench/dense_decode_vs_flashmla.py
      [--rounds N] [--kv-formats | --no-kv-formats] [--kv-layout default|interleaved]
      [--ab VAR=V[,VAR=V]]...   (each quantised format also timed with these environment
                                 settings, in the same rounds: an A/B of a kernel switch)
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import openmla
import openmla.flash_mla as omla
import sparse_decode_vs_flashmla as sparse_bench
from sparse_decode_vs_flashmla import (AB, BPT, D_QK, DEV, ab_note, ceilings, peer, time_calls,
                                       with_env)

SHAPES = [  # (b, s_q, h_q, seqlen): the grid of FlashMLA's published dense figures
    (128, 1, 16, 1024), (128, 1, 16, 4096), (128, 1, 16, 8192), (128, 1, 16, 32768),
    (128, 1, 64, 1024), (128, 1, 64, 4096),
    (128, 1, 128, 1024), (128, 1, 128, 4096), (128, 1, 128, 8192), (128, 2, 128, 8192),
    (1, 1, 16, 131072), (1, 1, 128, 131072), (8, 1, 16, 131072), (8, 1, 128, 131072),
    (32, 1, 128, 1024), (32, 1, 128, 4096),
]


def bf16_rows(rounds: int) -> None:
    """OpenMLA's bf16 dense decode against FlashMLA's, shape by shape."""
    print("| b | s_q | h_q | seqlen | OpenMLA µs | GB/s | TFLOP/s | FlashMLA µs | speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for b, s_q, h_q, seqlen in SHAPES:
        gen = torch.Generator(device=DEV).manual_seed(b * 131 + s_q * 17 + h_q + seqlen)
        pages = (seqlen + 63) // 64
        q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device=DEV, generator=gen)
        cache = torch.randn(b * pages, 64, 1, 576, dtype=torch.bfloat16, device=DEV,
                            generator=gen)
        table = torch.randperm(b * pages, device=DEV, generator=gen).to(torch.int32).view(b, pages)
        seqlens = torch.full((b,), seqlen, dtype=torch.int32, device=DEV)
        meta_o, _ = omla.get_mla_metadata()
        calls = [lambda: omla.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta_o, None)]
        if peer is not None:
            meta_p, _ = peer.get_mla_metadata()
            calls.append(lambda: peer.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta_p,
                                                             None))
            o1, _ = calls[0]()
            o2, _ = calls[1]()
            err = ((o1.float() - o2.float()).norm() / o2.float().norm()).item()
            if not err < 2e-2:
                raise RuntimeError(f"OpenMLA and FlashMLA disagree: relative error {err:.3e}")
        t = time_calls(calls, rounds)
        gbs = b * seqlen * 1152 / t[0] / 1e3
        tflops = 2 * b * s_q * h_q * seqlen * 1088 / t[0] / 1e6
        peer_s = f"{t[1]:.1f}" if len(t) > 1 else ""
        speed = f"{t[1] / t[0]:.2f}x" if len(t) > 1 else ""
        if len(t) > 1:
            ratios.append(t[1] / t[0])
        print(f"| {b} | {s_q} | {h_q} | {seqlen} | {t[0]:.1f} | {gbs:.0f} | {tflops:.0f} | "
              f"{peer_s} | {speed} |", flush=True)
        del cache
        torch.cuda.empty_cache()
    if ratios:
        print(f"\ngeometric mean speedup over FlashMLA ({len(ratios)} shapes): "
              f"{statistics.geometric_mean(ratios):.3f}x (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f})")


# --- dense decode over quantised caches -------------------------------------------------------
KV_FORMATS = ("fp8_v32", "fp8_model1", "fp8_mx", "fp4")


def target(fmt: str, s_q: int, h_q: int):
    """The least throughput against OpenMLA's bf16 kernel this row asks of `fmt`, or None."""
    if h_q * s_q <= 32:  # memory-bound: the bytes per token should show
        return {"fp8_v32": 1.5, "fp8_model1": 1.5, "fp4": 3.0}.get(fmt)
    if h_q == 128:  # compute-bound: dequantising should cost little
        return 0.95
    return None


def make_cache(fmt: str, layout: str, blocks: int, page: int, gen):
    """A paged `fmt` cache of `blocks` pages, every slot written by kv_cache_write from random
    latents (in chunks)."""
    d = D_QK[fmt]
    cache = openmla.new_kv_cache(blocks, page, fmt, layout=layout, d_qk=d,
                                 like=torch.empty(1, device=DEV))
    chunk = 1 << 19
    for s0 in range(0, blocks * page, chunk):
        n = min(chunk, blocks * page - s0)
        kv = torch.randn(n, d, dtype=torch.bfloat16, device=DEV, generator=gen)
        openmla.kv_cache_write(kv, torch.arange(s0, s0 + n, dtype=torch.int32, device=DEV), cache,
                               kv_format=fmt, kv_layout=layout)
    return cache


def probe(fmt: str, layout: str) -> str:
    """'' when this build decodes `fmt` densely on the GPU, else why not (once, on a tiny case, so
    no large cache is built for a format without a kernel)."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    q = torch.randn(1, 1, 16, D_QK[fmt], dtype=torch.bfloat16, device=DEV, generator=gen)
    table = torch.tensor([[1, 0]], dtype=torch.int32, device=DEV)
    seqlens = torch.tensor([100], dtype=torch.int32, device=DEV)
    try:
        cache = make_cache(fmt, layout, 2, 64, gen)
        openmla.dense_decode(q, cache, table, seqlens, kv_format=fmt, kv_layout=layout)
        torch.cuda.synchronize()
    except NotImplementedError:
        return "not implemented"
    except Exception as e:  # a failure of one format must not end the run
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return ""


def check_against_dequantised(fmt, layout, q, cache, table, seqlens) -> float:
    """Relative error of request 0's output against the bf16 kernel over the same keys
    dequantised (kv_cache_gather): a wrong kernel is not timed."""
    pages = int((int(seqlens[0]) + 63) // 64)
    slots = (table[0, :pages].long()[:, None] * 64 + torch.arange(64, device=DEV)).reshape(-1)
    keys = openmla.kv_cache_gather(cache, slots, kv_format=fmt, kv_layout=layout,
                                   out_dtype="bf16")
    plain = keys.view(pages, 64, 1, D_QK[fmt])
    plain_table = torch.arange(pages, dtype=torch.int32, device=DEV).view(1, pages)
    ref, _ = openmla.dense_decode(q[:1], plain, plain_table, seqlens[:1])
    got, _ = openmla.dense_decode(q[:1], cache, table[:1], seqlens[:1], kv_format=fmt,
                                  kv_layout=layout)
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def kv_format_rows(rounds: int, layout: str) -> None:
    """Per shape: OpenMLA bf16, FlashMLA bf16 and every quantised format, one interleaved timing."""
    status = {fmt: probe(fmt, layout) for fmt in KV_FORMATS}
    print(f"\ndense decode over quantised caches ({layout} layout, page 64), same rounds as the "
          f"bf16 kernels; cell: µs, throughput vs OpenMLA bf16, GB/s of b * seqlen * bytes per "
          f"token ({', '.join(f'{f} {BPT[f]} B' for f in ('bf16',) + KV_FORMATS)}), target")
    for fmt, why in status.items():
        if why:
            print(f"  {fmt}: {why}")
    print("| b | s_q | h_q | seqlen | bound | OpenMLA bf16 µs (GB/s) | FlashMLA bf16 µs | "
          + " | ".join(KV_FORMATS) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(KV_FORMATS))
    tally = {"pass": 0, "miss": 0, "not run": 0}
    misses = []
    for b, s_q, h_q, seqlen in SHAPES:
        gen = torch.Generator(device=DEV).manual_seed(b * 131 + s_q * 17 + h_q + seqlen)
        pages = (seqlen + 63) // 64
        q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device=DEV, generator=gen)
        q512 = q[..., :512].contiguous()
        bf16 = torch.randn(b * pages, 64, 1, 576, dtype=torch.bfloat16, device=DEV, generator=gen)
        table = torch.randperm(b * pages, device=DEV, generator=gen).to(torch.int32).view(b, pages)
        seqlens = torch.full((b,), seqlen, dtype=torch.int32, device=DEV)
        # One schedule for every call of the row (as a serving step plans once for its layers).
        sched = openmla.plan_decode_schedule(seqlens, s_q, h_q)
        calls = [lambda: openmla.dense_decode(q, bf16, table, seqlens, schedule=sched)]
        if peer is not None:
            meta_p, _ = peer.get_mla_metadata()
            calls.append(lambda: peer.flash_mla_with_kvcache(q, bf16, table, seqlens, 512, meta_p,
                                                             None))
        cells, timed = {}, []
        caches = {}
        for fmt in KV_FORMATS:
            if status[fmt]:
                cells[fmt] = status[fmt].split(":")[0]
                continue
            caches[fmt] = make_cache(fmt, layout, b * pages, 64, gen)
            qf = q if D_QK[fmt] == 576 else q512
            try:
                err = check_against_dequantised(fmt, layout, qf, caches[fmt], table, seqlens)
            except NotImplementedError:  # e.g. a shape the kernel leaves out
                cells[fmt] = "not implemented"
                continue
            if not err < 2e-2:
                cells[fmt] = f"wrong (rel err {err:.1e})"
                continue
            calls.append(lambda fmt=fmt, qf=qf: openmla.dense_decode(
                qf, caches[fmt], table, seqlens, schedule=sched, kv_format=fmt,
                kv_layout=layout))
            timed.append(fmt)
        # The --ab variants of each timed format, after the defaults (same rounds).
        ab_calls = [with_env(calls[(2 if peer is not None else 1) + k], env)
                    for k in range(len(timed)) for env in AB]
        t = time_calls(calls + ab_calls, rounds)
        t_ab = t[len(calls):]
        t_bf16 = t[0]
        peer_s = f"{t[1]:.1f}" if peer is not None else ""
        first = 2 if peer is not None else 1
        bound = "memory" if h_q * s_q <= 32 else "compute" if h_q == 128 else ""
        tally["not run"] += sum(target(f, s_q, h_q) is not None for f in KV_FORMATS
                                if f not in timed)
        for k, fmt in enumerate(timed):
            us = t[first + k]
            ratio = t_bf16 / us
            gbs = b * seqlen * BPT[fmt] / us / 1e3
            goal = target(fmt, s_q, h_q)
            verdict = ""
            if goal is not None:
                ok = ratio >= goal
                verdict = f" {'pass' if ok else 'miss'} (>= {goal}x)"
                tally["pass" if ok else "miss"] += 1
                if not ok:
                    misses.append(f"{fmt} b {b} s_q {s_q} h_q {h_q} seqlen {seqlen}: "
                                  f"{ratio:.2f}x < {goal}x")
            cells[fmt] = f"{us:.1f} µs {ratio:.2f}x {gbs:.0f} GB/s{verdict}"
            if AB:
                cells[fmt] += f" ({ab_note(us, t_ab[k * len(AB):(k + 1) * len(AB)])})"
        bf16_gbs = b * seqlen * BPT["bf16"] / t_bf16 / 1e3
        print(f"| {b} | {s_q} | {h_q} | {seqlen} | {bound} | {t_bf16:.1f} ({bf16_gbs:.0f}) | "
              f"{peer_s} | " + " | ".join(cells[f] for f in KV_FORMATS) + " |", flush=True)
        del bf16, caches
        torch.cuda.empty_cache()
    print(f"\ntargets: {tally['pass']} pass, {tally['miss']} miss, {tally['not run']} not run "
          f"(no kernel, or a wrong answer)"
          + "".join(f"\n  miss: {m}" for m in misses))


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds_pos", nargs="?", type=int, default=None, metavar="rounds",
                    help="(as --rounds, the old positional form)")
    ap.add_argument("--rounds", type=int, default=20)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--kv-formats", action="store_true",
                       help="only the quantised-cache section (default: both sections)")
    which.add_argument("--no-kv-formats", action="store_true",
                       help="only the bf16 side by side")
    ap.add_argument("--kv-layout", choices=("default", "interleaved"), default="default")
    ap.add_argument("--ab", action="append", default=[], metavar="VAR=V[,VAR=V]",
                    help="also time each quantised format with these environment settings")
    ap.add_argument("--icache", choices=["cold", "mixed"], default="cold",
                    help="cold: instruction caches evicted before every timed call (bench/"
                         "icache.py); mixed: as the previous call left them (the earlier method)")
    args = ap.parse_args(argv)
    for spec in args.ab:
        AB.append(dict(kv.split("=", 1) for kv in spec.split(",")))
    sparse_bench.COLD_ICACHE = args.icache == "cold"
    rounds = args.rounds_pos if args.rounds_pos is not None else args.rounds
    copy_gbs, gemm = ceilings()
    print(f"dense decode side by side, {torch.cuda.get_device_name()}; same-run ceilings: copy "
          f"{copy_gbs:.0f} GB/s, bf16 GEMM {gemm:.0f} TFLOP/s; kernel-only µs, L2 flushed, "
          f"{args.icache} instruction caches, median of {rounds}; FlashMLA {'present' if peer is not None else 'absent'}")
    if not args.kv_formats:
        bf16_rows(rounds)
    if not args.no_kv_formats:
        kv_format_rows(rounds, args.kv_layout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
