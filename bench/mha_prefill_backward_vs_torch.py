#!/usr/bin/env python3
"""Dense MHA prefill backward: OpenMLA's SM90 kernel (openmla.mha_prefill_backward) against torch's
scaled_dot_product_attention backward on the same tensors, in one run.

Shapes (issue 51): seqlen 1k-16k with batch x seqlen = 16k tokens, h 128 at d_qk 192 and 128, and
h 16, 32 at d_qk 128 (d_v 128, MHA), causal and not, bf16. Every sequence of a row has the same
length, so torch runs the padded-batch form [b, h, s, d] as strided views of OpenMLA's varlen
[tokens, h, d] tensors (no copy). torch's backend is the fastest of those available for the
shape (flash, cuDNN, memory-efficient; flash needs d_qk = d_v), each timed, the best reported.

out and lse (the backward's inputs) come from torch: out by SDPA, lse = logsumexp of the scaled
logits per head in float32 (chunked). Before timing, OpenMLA's dq, dk, dv are compared with
torch's (relative L2 error, the last column).

Timing: eager calls between CUDA events, the L2 flushed (a 1 GiB memset) before each, the median
of --rounds; OpenMLA's time includes its preprocess (D), postprocess (dq) and the workspace
allocation from torch's caching allocator; torch's, autograd's backward of SDPA alone.
TFLOP/s: backward FLOPs = 2.5 x forward's, forward = 2 (d_qk + d_v) h x visible (query, key)
pairs (all s^2 of a sequence, or s (s + 1) / 2 with causal).

  PYTHONPATH=<dir holding the openmla package> python3 bench/mha_prefill_backward_vs_torch.py \\
      [--json PATH] [--quick] [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F

import openmla
from sparse_decode_vs_flashmla import ceilings  # the same run's copy and GEMM rates

DEV = torch.device("cuda")
TOKENS = 16384
D_V = 128
SEQLENS = [1024, 2048, 4096, 8192, 16384]
CONFIGS = [(128, 192), (128, 128), (16, 128), (32, 128)]  # (h, d_qk)
FLUSH_BYTES = 1 << 30


def backends():
    """torch's SDPA backends by name (those this torch has)."""
    from torch.nn.attention import SDPBackend
    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION"}
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


def lse_of(q, k, scale, causal):
    """[b, h, s] float32 logsumexp of the scaled logits, a few heads at a time."""
    b, h, s, _ = q.shape
    lse = torch.empty(b, h, s, dtype=torch.float32, device=DEV)
    step = max(1, (1 << 28) // (s * s))  # ~1 GiB of float32 logits a chunk
    mask = torch.ones(s, s, dtype=torch.bool, device=DEV).tril() if causal else None
    for bi in range(b):
        for h0 in range(0, h, step):
            logits = (q[bi, h0:h0 + step].float()
                      @ k[bi, h0:h0 + step].float().transpose(-1, -2)) * scale
            if mask is not None:
                logits.masked_fill_(~mask, -math.inf)
            lse[bi, h0:h0 + step] = logits.logsumexp(-1)
    return lse


def time_us(call, rounds, flush):
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def row(h, d_qk, s, causal, rounds, flush, gen):
    b = TOKENS // s
    scale = d_qk ** -0.5
    q = torch.randn(b * s, h, d_qk, device=DEV, generator=gen, dtype=torch.bfloat16)
    k = torch.randn(b * s, h, d_qk, device=DEV, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(b * s, h, D_V, device=DEV, generator=gen, dtype=torch.bfloat16)
    dout = torch.randn(b * s, h, D_V, device=DEV, generator=gen, dtype=torch.bfloat16)
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=DEV)

    def bhsd(t):  # [b, h, s, d] views of the same memory, for torch
        return t.view(b, s, h, t.shape[-1]).transpose(1, 2)
    qt, kt, vt, dot = (bhsd(t) for t in (q, k, v, dout))
    with torch.no_grad():
        out_t = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        out = out_t.transpose(1, 2).reshape(b * s, h, D_V).contiguous()
        lse_bhs = lse_of(qt, kt, scale, causal)
    lse = lse_bhs.permute(1, 0, 2).reshape(h, b * s).t()  # [tokens, h], strides (1, tokens)

    def run_openmla():
        return openmla.mha_prefill_backward(dout, q, k, v, out, lse, cu, cu, s, s, causal=causal,
                                            softmax_scale=scale)

    grads = run_openmla()
    t_omla = time_us(run_openmla, rounds, flush)

    best = None
    for name, backend in backends().items():
        if name == "flash" and d_qk != D_V:
            continue
        try:
            from torch.nn.attention import sdpa_kernel
            leaves = [x.detach().requires_grad_() for x in (qt, kt, vt)]
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
            tg = torch.autograd.grad(o, leaves, dot, retain_graph=True)
            t = time_us(lambda: torch.autograd.grad(o, leaves, dot, retain_graph=True), rounds,
                        flush)
        except RuntimeError as e:  # the backend refuses the shape
            print(f"  (torch {name}: {str(e).splitlines()[0][:80]})", file=sys.stderr)
            continue
        if best is None or t < best[1]:
            best = (name, t, tg)
        del o, leaves
    pairs = b * (s * (s + 1) // 2 if causal else s * s)
    flops = 2.5 * 2 * (d_qk + D_V) * h * pairs
    r = dict(h=h, d_qk=d_qk, d_v=D_V, seqlen=s, batch=b, causal=causal,
             openmla_us=t_omla, openmla_tflops=flops / t_omla / 1e6)
    if best is not None:
        name, t, tg = best
        r.update(torch_backend=name, torch_us=t, torch_tflops=flops / t / 1e6,
                 speedup=t / t_omla,
                 rel_err=max(rel_err(g, x_t.transpose(1, 2).reshape(g.shape))
                             for g, x_t in zip(grads, tg)))
    return r


def print_row(r):
    torch_part = "- | - | - | - | -"
    if "torch_us" in r:
        torch_part = (f"{r['torch_backend']} | {r['torch_us']:.0f} | {r['torch_tflops']:.0f} | "
                      f"{r['speedup']:.2f} | {r['rel_err']:.1e}")
    print(f"| {r['h']} | {r['d_qk']} | {r['seqlen']} x {r['batch']} | "
          f"{'yes' if r['causal'] else 'no'} | {r['openmla_us']:.0f} | {r['openmla_tflops']:.0f} | "
          f"{torch_part} |", flush=True)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="seqlen 1k and 8k, h 128 and 16 only")
    ap.add_argument("--json", metavar="PATH", help="write the rows (a JSON list) to PATH")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mha_prefill_backward_vs_torch.py: no CUDA device")
        return 1
    name = torch.cuda.get_device_name()
    print(f"dense MHA prefill backward, bf16, {TOKENS} tokens a row, {name}, torch "
          f"{torch.__version__}; µs between CUDA events, L2 flushed, median of {args.rounds}")
    copy_gbs, gemm = ceilings()
    print(f"same-run ceilings: copy {copy_gbs:.0f} GB/s, bf16 GEMM (8192^3 torch.matmul) "
          f"{gemm:.0f} TFLOP/s")
    print("| h | d_qk | seqlen x batch | causal | OpenMLA µs | OpenMLA TFLOP/s | torch backend | "
          "torch µs | torch TFLOP/s | speedup | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEV)
    gen = torch.Generator(device=DEV).manual_seed(0)
    seqlens = SEQLENS if not args.quick else [1024, 8192]
    configs = CONFIGS if not args.quick else [(128, 192), (16, 128)]
    rows = []
    for h, d_qk in configs:
        for s in seqlens:
            for causal in (False, True):
                rows.append(row(h, d_qk, s, causal, args.rounds, flush, gen))
                print_row(rows[-1])
                torch.cuda.empty_cache()
    ratios = [r["speedup"] for r in rows if "speedup" in r]
    if ratios:
        print(f"\ngeometric mean speedup over torch's best backend ({len(ratios)} rows): "
              f"{statistics.geometric_mean(ratios):.2f}x (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f})")
    if args.json:
        meta = dict(device=name, gemm_tflops=gemm, copy_gbs=copy_gbs, rounds=args.rounds, torch=torch.__version__,
                    method="eager events, L2 flushed")
        with open(args.json, "w") as f:
            json.dump([dict(r, **meta) for r in rows], f, indent=1)
        print(f"\nwrote {len(rows)} rows to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
