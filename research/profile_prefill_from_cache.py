#!/usr/bin/env python3
"""Where a sparse prefill from an FP8 cache spends its time, kernel by kernel (GPU diagnostic;
sparse_prefill/NOTES.md): the benchmark's row (s_q 4096, topk 2048 over 32768 slots of page 64)
run a few times under torch.profiler, each kernel's median time a call, for the default path
(each named slot dequantised once), with --direct for the path that decodes keys where they are
gathered, and with --fp8 for the FP8 tensor-core path (fp8_tensor_cores=True). Needs the laid-out package on PYTHONPATH (tools/layout_pypkg.sh).

  PYTHONPATH=build-device/pypkg python3 research/profile_prefill_from_cache.py [--fmt fp8_model1]
      [--h-q 128] [--direct | --fp8]
"""
import argparse
import collections
import os
import statistics
import sys

import torch

import openmla


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", default="fp8_v32")
    ap.add_argument("--h-q", type=int, default=64)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--direct", action="store_true")
    ap.add_argument("--fp8", action="store_true", help="the FP8 tensor-core path")
    args = ap.parse_args(argv)
    if args.direct:
        os.environ["OPENMLA_PREFILL_DEQUANT_ONCE"] = "0"
    s_q, topk, slots, page = 4096, 2048, 32768, 64
    d = 576 if args.fmt == "fp8_v32" else 512
    gen = torch.Generator(device="cuda").manual_seed(1)
    cache = openmla.new_kv_cache(slots // page, page, args.fmt, like=torch.empty(0, device="cuda"))
    openmla.kv_cache_write(torch.randn(slots, d, device="cuda", generator=gen),
                           torch.arange(slots, dtype=torch.int32, device="cuda"), cache)
    q = torch.randn(s_q, args.h_q, d, device="cuda", generator=gen).to(torch.bfloat16) / 4
    idx = torch.randint(0, slots, (s_q, 1, topk), dtype=torch.int32, device="cuda", generator=gen)
    kw = {"fp8_tensor_cores": True} if args.fp8 else {}
    openmla.sparse_prefill_from_cache(q, cache, idx, **kw)  # warm-up (workspace, modules)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            openmla.sparse_prefill_from_cache(q, cache, idx, **kw)
        torch.cuda.synchronize()
    times = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name].append(e.device_time)  # µs
    print(f"{args.fmt}, h_q {args.h_q}, s_q {s_q}, topk {topk}, {slots} slots, "
          f"{'direct' if args.direct else 'FP8 tensor-core' if args.fp8 else 'default'} path; µs a call (median of {args.calls})")
    total = 0.0
    for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        per_call = statistics.median(ts) * len(ts) / args.calls
        total += per_call
        print(f"{per_call:10.1f}  {name[:110]}")
    print(f"{total:10.1f}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
