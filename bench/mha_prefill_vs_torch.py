#!/usr/bin/env python3
"""Dense MHA prefill forward (openmla.mha_prefill, FlashMLA's flash_attn_varlen_func): OpenMLA's
SM90 kernel against torch.nn.functional.scaled_dot_product_attention, in one run on the same
tensors.

Rows are issue 51's shapes: seqlen 1k, 2k, 4k, 8k, 16k with batch x seqlen = 16k tokens; h 128
with d_qk 192 and 128 (d_v 128), h 16 and 32 with d_qk 128; causal and not; bf16. OpenMLA gets
the varlen form (cu_seqlens of b equal sequences); torch has no varlen there, so it gets the
padded batch [b, h, s, d] as a strided view of the same memory (no copy). Every SDPA backend torch
has on the device is tried (flash, efficient, cudnn; one that refuses the shape, e.g. flash with
d_qk != d_v, is skipped) and the fastest is reported beside the others.

TFLOP/s = 2 * pairs * h * (d_qk + d_v) / time, pairs the (query, key) pairs a row sees: b * s^2,
or b * s (s + 1) / 2 with causal masking.

Timing: each call captured once in a CUDA graph and replayed between CUDA events; the median of
--rounds replays, the callables interleaved. No L2 flush: at these sizes the work is compute-bound
(every K/V block is read by s / 128 CTAs). Before timing, OpenMLA's output is compared with the
fastest backend's (relative L2 error).

  PYTHONPATH=<dir holding the openmla package> python3 bench/mha_prefill_vs_torch.py [--json PATH]
  [--rounds N] [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import openmla
from sparse_decode_vs_flashmla import ceilings  # the same run's copy and GEMM rates

DEV = torch.device("cuda")
TOKENS = 16384
D_V = 128


def backends():
    from torch.nn.attention import SDPBackend
    out = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        out.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    return out


def capture(step):
    """Warms `step` up on a side stream, then captures it in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def time_calls(calls, rounds: int):
    """Median µs of each callable (graph replays between CUDA events), interleaved in rounds."""
    runs = [capture(c).replay for c in calls]
    torch.cuda.synchronize()
    events = [[] for _ in runs]
    for _ in range(rounds):
        for k, run in enumerate(runs):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            events[k].append((start, stop))
    torch.cuda.synchronize()
    return [statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev) for ev in events]


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def row(s: int, h: int, d_qk: int, causal: bool, rounds: int, gen) -> dict:
    b = TOKENS // s
    total = b * s
    q = torch.randn(total, h, d_qk, device=DEV, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(total, h, d_qk, device=DEV, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(total, h, D_V, device=DEV, dtype=torch.bfloat16, generator=gen)
    cu = torch.arange(0, total + 1, s, device=DEV, dtype=torch.int32)
    out = torch.empty(total, h, D_V, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(h, total, device=DEV, dtype=torch.float32).t()  # FlashMLA's layout
    scale = d_qk ** -0.5

    def ours():
        openmla.mha_prefill(q, k, v, cu, cu, s, s, causal=causal, softmax_scale=scale, out=out,
                            lse=lse)

    # torch's padded batch: [b, h, s, d] views of the same memory.
    qt, kt, vt = (x.view(b, s, h, x.shape[-1]).transpose(1, 2) for x in (q, k, v))
    names, calls, outs = [], [], []
    skipped = {}
    for name, backend in backends():
        from torch.nn.attention import sdpa_kernel
        holder = {}

        def call(backend=backend, holder=holder):
            with sdpa_kernel([backend]):
                holder["o"] = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                             scale=scale)
        try:
            call()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a backend refusing the shape is a row's fact
            skipped[name] = str(e).splitlines()[0][:120]
            continue
        names.append(name)
        calls.append(call)
        outs.append(holder)
    ours()
    torch.cuda.synchronize()
    times = time_calls([ours] + calls, rounds)
    pairs = b * (s * (s + 1) // 2 if causal else s * s)
    flops = 2.0 * pairs * h * (d_qk + D_V)
    tflops = [flops / (t * 1e-6) / 1e12 for t in times]
    r = dict(s=s, b=b, h=h, d_qk=d_qk, d_v=D_V, causal=causal, openmla_us=times[0],
             openmla_tflops=tflops[0], skipped=skipped)
    for name, t, tf in zip(names, times[1:], tflops[1:]):
        r[f"{name}_us"], r[f"{name}_tflops"] = t, tf
    if names:
        best = min(range(len(names)), key=lambda i: times[1 + i])
        r["torch_best"] = names[best]
        r["torch_best_tflops"] = tflops[1 + best]
        r["speedup"] = times[1 + best] / times[0]
        ref = outs[best]["o"].transpose(1, 2).reshape(total, h, D_V)
        r["rel_err_vs_best"] = rel_err(out, ref)
    return r


def print_row(r):
    best = (f"torch {r['torch_best']:9s} {r['torch_best_tflops']:6.1f}  x{r['speedup']:.2f}  "
            f"err {r['rel_err_vs_best']:.1e}" if "torch_best" in r else "no torch backend")
    others = " ".join(f"{k[:-7]} {v:.0f}" for k, v in r.items() if k.endswith("_tflops")
                      and k not in ("openmla_tflops", "torch_best_tflops"))
    print(f"s {r['s']:5d} b {r['b']:2d} h {r['h']:3d} d {r['d_qk']}/{r['d_v']} "
          f"{'causal' if r['causal'] else 'full  '}  openmla {r['openmla_tflops']:6.1f} TFLOP/s  "
          f"{best}  [{others}]", flush=True)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="write the rows (a JSON list) to PATH")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="seqlen 8k only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name()
    copy_gbs, gemm = ceilings()
    print(f"same-run ceilings: copy {copy_gbs:.0f} GB/s, bf16 GEMM (8192^3 torch.matmul) "
          f"{gemm:.0f} TFLOP/s")
    print(f"{name}, torch {torch.__version__}, {args.rounds} rounds")
    gen = torch.Generator(device=DEV).manual_seed(0)
    seqlens = [8192] if args.quick else [1024, 2048, 4096, 8192, 16384]
    rows = []
    for h, d_qk in ((128, 192), (128, 128), (32, 128), (16, 128)):
        for causal in (False, True):
            for s in seqlens:
                rows.append(row(s, h, d_qk, causal, args.rounds, gen))
                print_row(rows[-1])
                torch.cuda.empty_cache()
    bad = [r for r in rows if r.get("rel_err_vs_best", 0.0) > 2e-2]
    for r in bad:
        print(f"MISMATCH: s {r['s']} h {r['h']} d {r['d_qk']} causal {r['causal']}: relative "
              f"error {r['rel_err_vs_best']:.2e} against torch {r['torch_best']}")
    ratios = [r["speedup"] for r in rows if "speedup" in r]
    if ratios:
        print(f"\ngeometric mean speedup over torch's fastest backend ({len(ratios)} rows): "
              f"{statistics.geometric_mean(ratios):.2f}x (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f})")
    if args.json:
        meta = dict(device=name, gemm_tflops=gemm, copy_gbs=copy_gbs, rounds=args.rounds, method="CUDA-graph replay events",
                    torch=torch.__version__)
        with open(args.json, "w") as f:
            json.dump([dict(r, **meta) for r in rows], f, indent=1)
        print(f"\nwrote {len(rows)} rows to {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
