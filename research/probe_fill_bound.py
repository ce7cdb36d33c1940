"""Is dense decode over a quantised cache bound by its loads or by its decode? (GPU diagnostic.)

For memory-bound shapes (b 128, h_q 16, s_q 1) it times openmla.dense_decode over each quantised
format twice: with every request's pages distinct (the keys come from DRAM, as in serving) and
with every request reading the same pages (after the first CTAs touch them the keys come from
L2). If the L2 time is close to the DRAM time, the loads are not what bounds the kernel: the
producer's decode (or the MMA it serialises with) is. The bf16 kernel is timed the same way
(its loads are TMA copies, nothing to decode). Each setting of SETTINGS (environment switches,
e.g. OPENMLA_SPARSE_RING=0) is timed in the same rounds, L2 flushed and instruction caches
evicted before each call (docs/benchmarking.md).

    PYTHONPATH=build-device/pypkg python3 research/probe_fill_bound.py [--seqlen 8192] \
        [--setting OPENMLA_SPARSE_RING=0] ...

With --once FMT it makes one warm-up call and one more over FMT with the L2 table and exits, for
a profiler to take that launch (where the producer's warps stall):
    ncu --set full --import-source yes -k regex:sparse_decode_kernel -s 1 -c 1 -o $OUT/fill \
        python3 research/probe_fill_bound.py --once fp8_v32
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import torch  # noqa: E402

import openmla  # noqa: E402
from dense_decode_vs_flashmla import make_cache  # noqa: E402
from sparse_decode_vs_flashmla import D_QK, DEV, time_calls, with_env  # noqa: E402

FORMATS = ("fp8_v32", "fp8_model1", "fp8_mx", "fp4")


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--h-q", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--setting", action="append", default=[], metavar="VAR=V[,VAR=V]")
    ap.add_argument("--once", choices=FORMATS, help="two calls over this format, no timing")
    args = ap.parse_args(argv)
    settings = [dict(kv.split("=", 1) for kv in s.split(",")) for s in args.setting]
    b, h_q, seqlen = args.b, args.h_q, args.seqlen
    pages = (seqlen + 63) // 64
    gen = torch.Generator(device=DEV).manual_seed(7)
    q = torch.randn(b, 1, h_q, 576, dtype=torch.bfloat16, device=DEV, generator=gen)
    seqlens = torch.full((b,), seqlen, dtype=torch.int32, device=DEV)
    distinct = torch.randperm(b * pages, device=DEV, generator=gen).to(torch.int32).view(b, pages)
    shared = torch.randperm(pages, device=DEV, generator=gen).to(torch.int32).repeat(b, 1)
    sched = openmla.plan_decode_schedule(seqlens, 1, h_q)
    if args.once:
        cache = make_cache(args.once, "default", b * pages, 64, gen)
        qf = q if D_QK[args.once] == 576 else q[..., :512].contiguous()
        for _ in range(2):
            openmla.dense_decode(qf, cache, shared, seqlens, schedule=sched, kv_format=args.once,
                                 kv_layout="default")
        torch.cuda.synchronize()
        return 0
    print(f"{torch.cuda.get_device_name()}: b {b}, h_q {h_q}, s_q 1, seqlen {seqlen}, page 64; "
          f"kernel-only µs, L2 flushed, cold instruction caches, median of {args.rounds}; µs a 64-key tile a CTA = time / "
          f"tiles a request (one CTA a request at this b)")
    print("| keys | tables | default | " + " | ".join(
        f"{','.join(f'{k}={v}' for k, v in s.items())}" for s in settings) + " |")
    print("|---|---|---|" + "---|" * len(settings))
    bf16 = torch.randn(b * pages, 64, 1, 576, dtype=torch.bfloat16, device=DEV, generator=gen)
    for fmt in ("bf16",) + FORMATS:
        if fmt == "bf16":
            cache, kw, qf = bf16, {}, q
        else:
            cache = make_cache(fmt, "default", b * pages, 64, gen)
            kw = {"kv_format": fmt, "kv_layout": "default"}
            qf = q if D_QK[fmt] == 576 else q[..., :512].contiguous()
        for name, table in (("DRAM (distinct pages)", distinct), ("L2 (shared pages)", shared)):
            base = (lambda table=table, cache=cache, qf=qf, kw=kw: openmla.dense_decode(
                qf, cache, table, seqlens, schedule=sched, **kw))
            calls = [base] + [with_env(base, s) for s in settings]
            t = time_calls(calls, args.rounds)
            cells = [f"{t[0]:.1f} ({t[0] / pages:.2f})"]
            cells += [f"{ti:.1f} ({ti / pages:.2f})" for ti in t[1:]]
            print(f"| {fmt} | {name} | " + " | ".join(cells) + " |", flush=True)
        del cache
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
