#!/usr/bin/env python3
"""DeepSeek V4/V4.1's fused attention (openmla.flash_mla.fused_norm_rope_attn_rope_cast) against
the same work unfused, in one run on identical tensors.

Each row times three things:
  fused    the fused operation (Q norm, Q RoPE, sparse attention, O RoPE, e4m3 cast): q in the
           permute_q_b_proj layout in, out_fp8 + out_sf (permute_wv_proj layout) out;
  unfused  what an engine does without it: q un-permuted to the natural layout, torch RMS norm
           (no weight; V4 only: V4.1 has no Q norm), torch interleaved RoPE of the last 64 dims,
           OpenMLA's plain sparse attention (flash_mla_with_kvcache's sparse path for decode,
           flash_mla_sparse_fwd for prefill; bf16 out), then torch inverse RoPE of the output's
           last 64 dims and the torch e4m3 cast with per-32 UE8M0 scales into the permuted layout
           and DeepGEMM's packed, TMA-aligned column-major scale layout;
  plain    the plain sparse attention alone (the unfused chain's attention call).
Before timing, the fused and unfused outputs (dequantised) are compared (relative L2 error).

Timing: each of the three is captured once in a CUDA graph (so the torch chain pays no Python or
launch overhead, as in a graph-captured decode step) and replayed between CUDA events; before every
replay an 8 GiB memset flushes the L2 and, by default, bench/icache.py evicts the instruction
caches (as bench/sparse_decode_vs_flashmla.py does); the median of --rounds replays, the three
interleaved. (The profiler method of sparse_decode_vs_flashmla.py / kernel_time.py cannot be used
here: it separates calls at torch's fill/elementwise kernels, which the unfused chain is made of.)
Event time includes the graph's launch latency (a few µs, the same for the three).

Rows follow the performance cases of FlashMLA's fused test
(tests/test-fused-norm-rope-attn-rope-cast.py):
V4.1 decode, h_q 64 and 128, b requests of s_q 4 tokens (b 64, 128, 256), the main cache fp8_mx
(the window: topk 128 of 128 slots a request, page 64) plus the extra cache fp4 (topk 512 of 32768
slots a request, page 128), attn_sink, n_wv_group = h_q / 8; plus small batches (1, 8, 64
requests of one token). Prefill: s_q 4096, s_kv 32768, topk 640 (FlashMLA's 512 + 128) and 1024,
h_q 64 and 128, attn_sink. --version v4 runs the decode rows on V4's fp8_model1 caches with the
Q norm on (prefill: the Q norm on).

  PYTHONPATH=<dir holding the openmla package> python3 bench/fused_vs_unfused.py [--json PATH]

Sized to finish in about a minute on an H100 (--quick: six rows; --only decode|prefill).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import openmla.flash_mla as omla
from openmla.flash_mla import fused_norm_rope_attn_rope_cast as fused

import icache
from sparse_decode_vs_flashmla import make_cache, make_indices

DEV = torch.device("cuda")
D = 512                     # d_qk = d_v
ROPE = 64
EPS = 1e-4                  # FlashMLA's test's rms_norm_eps
NUM_POSITIONS = 131072      # FlashMLA's test's max_token_position
GROUP = 8                   # wv_group_size (FlashMLA's)
FLUSH_BYTES = 8 << 30
COLD_ICACHE = True

# version: (main format, extra format, Q norm)
VERSIONS = {"v4.1": ("fp8_mx", "fp4", False), "v4": ("fp8_model1", "fp8_model1", True)}
MAIN_TOPK, MAIN_PAGE, MAIN_REGION = 128, 64, 128          # the window: every slot of it
EXTRA_TOPK, EXTRA_PAGE, EXTRA_REGION = 512, 128, 32768    # the compressed cache
DECODE_BATCHES = [(1, 1), (8, 1), (64, 1), (64, 4), (128, 4), (256, 4)]  # (requests, s_q)
PREFILL = [(4096, 32768, 640), (4096, 32768, 1024)]                  # (s_q, s_kv, topk)


def build_cos_sin_cache(num_positions: int):
    """[num_positions, 64] fp32, cos then sin (FlashMLA's test's, base 100000)."""
    inv_freq = 1.0 / (100000 ** (torch.arange(0, ROPE, 2, dtype=torch.float, device=DEV) / ROPE))
    freqs = torch.outer(torch.arange(num_positions, dtype=torch.float, device=DEV), inv_freq)
    return torch.cat((torch.cos(freqs), torch.sin(freqs)), dim=-1)


# --- the unfused chain, in torch -------------------------------------------------------------

def unpermute_q(q_perm):
    """permute_q_b_proj layout -> natural [T, h, d] (a copy)."""
    t, h, d = q_perm.shape
    return q_perm.view(t, d // 16, h, 16).transpose(1, 2).reshape(t, h, d)


def rotate(x, cos, sin):
    """The last 64 dims of x [T, h, d] rotated in interleaved pairs (fp32): [T, h, 64]."""
    r = x[..., -ROPE:].float()
    x0, x1 = r[..., 0::2], r[..., 1::2]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def q_prologue(q_perm, cos_sin, positions, norm: bool):
    """Un-permute, RMS norm (no weight), RoPE: natural bf16 q, and the tokens' cos / sin."""
    q = unpermute_q(q_perm)
    if norm:
        q = torch.nn.functional.rms_norm(q.float(), (q.shape[-1],), eps=EPS).to(torch.bfloat16)
    cs = cos_sin[positions.long()]
    cos, sin = cs[:, :ROPE // 2], cs[:, ROPE // 2:]
    q = torch.cat((q[..., :-ROPE], rotate(q, cos, sin).to(torch.bfloat16)), dim=-1)
    return q, cos, sin


def o_epilogue(o, cos, sin, n_wv_group: int):
    """Inverse RoPE of o [T, h, d_v] (fp32), then the e4m3 cast with one UE8M0 scale per 32
    values in the permute_wv_proj layout: (out_fp8 [T, g, G d_v], out_sf int32 [T, g, G d_v /
    128] with strides (1, K A, A), A = T rounded up to 4)."""
    t, h, d = o.shape
    x = o.float()
    x[..., -ROPE:] = rotate(x, cos, -sin)
    g = h // n_wv_group
    chunks = x.view(t, n_wv_group, g, d // 32, 32).transpose(2, 3)   # [T, g, chunk, head, 32]
    amax = chunks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4)
    e = torch.ceil(torch.log2(amax / 448.0))
    out_fp8 = (chunks * torch.exp2(-e)).to(torch.float8_e4m3fn).reshape(t, n_wv_group, g * d)
    sf = (e + 127).to(torch.uint8).reshape(t, n_wv_group, g * d // 32).contiguous()
    k, a = g * d // 128, (t + 3) // 4 * 4
    out_sf = torch.zeros(n_wv_group * k * a, dtype=torch.int32, device=o.device).as_strided(
        (t, n_wv_group, k), (1, k * a, a))
    out_sf.copy_(sf.view(torch.int32))
    return out_fp8, out_sf


def dequant(out_fp8, out_sf, n_wv_group: int):
    """[T, h, d_v] float32 from the permuted e4m3 output and its packed scales."""
    t = out_fp8.shape[0]
    e = out_sf.contiguous().view(torch.uint8).reshape(t, n_wv_group, -1).float() - 127
    x = out_fp8.float().reshape(t, n_wv_group, -1, 32) * torch.exp2(e).unsqueeze(-1)
    g = out_fp8.shape[2] // D
    return x.reshape(t, n_wv_group, D // 32, g, 32).transpose(2, 3).reshape(t, -1, D)


def rel_err(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# --- timing ----------------------------------------------------------------------------------

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


def time_calls(calls, rounds: int, flush, eager: bool = False):
    """Median µs of each callable between CUDA events (graph replays unless eager), the calls
    interleaved in rounds, the L2 flushed (and instruction caches evicted) before each."""
    runs = calls if eager else [capture(c).replay for c in calls]
    if eager:
        for c in calls:
            c()
    torch.cuda.synchronize()
    events = [[] for _ in runs]
    for _ in range(rounds):
        for k, run in enumerate(runs):
            flush.zero_()
            if COLD_ICACHE:
                icache.evict()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            events[k].append((start, stop))
    torch.cuda.synchronize()
    return [statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev) for ev in events]


# --- rows ------------------------------------------------------------------------------------

class DecodeSetup:
    """The caches of up to `max_b` requests (built once, shared by the rows)."""

    def __init__(self, version: str, max_b: int, gen):
        self.main_fmt, self.extra_fmt, self.norm = VERSIONS[version]
        self.cache = make_cache(self.main_fmt, max_b * MAIN_REGION, MAIN_PAGE, gen)
        self.extra = make_cache(self.extra_fmt, max_b * EXTRA_REGION, EXTRA_PAGE, gen)


def decode_row(setup: DecodeSetup, h_q: int, b: int, s_q: int, cos_sin, rounds, flush, eager,
               gen):
    t = b * s_q
    n_wv_group = h_q // GROUP
    scale = D ** -0.5
    idx = make_indices(b, s_q, MAIN_TOPK, MAIN_REGION, setup.cache.shape[0] * MAIN_PAGE,
                       gen).view(t, MAIN_TOPK)
    eidx = make_indices(b, s_q, EXTRA_TOPK, EXTRA_REGION, setup.extra.shape[0] * EXTRA_PAGE,
                        gen).view(t, EXTRA_TOPK)
    q = torch.randn(t, h_q, D, dtype=torch.bfloat16, device=DEV, generator=gen)
    positions = torch.randint(0, NUM_POSITIONS, (t,), dtype=torch.int32, device=DEV,
                              generator=gen)
    sink = torch.randn(h_q, dtype=torch.float32, device=DEV, generator=gen)
    meta_u, _ = omla.get_mla_metadata()
    meta_p, _ = omla.get_mla_metadata()

    def attention(qn, meta):
        out, _ = omla.flash_mla_with_kvcache(
            qn.view(t, 1, h_q, D), setup.cache, None, None, D, meta, softmax_scale=scale,
            is_fp8_kvcache=True, indices=idx.view(t, 1, MAIN_TOPK), attn_sink=sink,
            extra_k_cache=setup.extra, extra_indices_in_kvcache=eidx.view(t, 1, EXTRA_TOPK))
        return out.view(t, h_q, D)

    def run_fused():
        return fused.decode(setup.norm, EPS, positions, False, ROPE, cos_sin, n_wv_group, 32,
                            True, True, True, q, setup.cache, idx, scale, D, sink, None,
                            setup.extra, eidx, None)[:2]

    def run_unfused():
        qn, cos, sin = q_prologue(q, cos_sin, positions, setup.norm)
        return o_epilogue(attention(qn, meta_u), cos, sin, n_wv_group)

    q_ready = q_prologue(q, cos_sin, positions, setup.norm)[0]

    def run_plain():
        return attention(q_ready, meta_p)

    return measure("decode", dict(h_q=h_q, b=b, s_q=s_q, tokens=t, topk=MAIN_TOPK,
                                  extra_topk=EXTRA_TOPK, main=setup.main_fmt,
                                  extra=setup.extra_fmt, q_norm=setup.norm),
                   run_fused, run_unfused, run_plain, n_wv_group, rounds, flush, eager)


def prefill_row(h_q: int, s_q: int, s_kv: int, topk: int, norm: bool, cos_sin, rounds, flush,
                eager, gen):
    n_wv_group = h_q // GROUP
    scale = D ** -0.5
    q = torch.randn(s_q, h_q, D, dtype=torch.bfloat16, device=DEV, generator=gen)
    kv = torch.randn(s_kv, 1, D, dtype=torch.bfloat16, device=DEV, generator=gen)
    rows = [torch.rand(min(512, s_q - i), s_kv, device=DEV, generator=gen).argsort(dim=-1)[:, :topk]
            for i in range(0, s_q, 512)]  # distinct keys per token
    idx = torch.cat(rows).to(torch.int32).view(s_q, 1, topk)
    positions = torch.randint(0, NUM_POSITIONS, (s_q,), dtype=torch.int32, device=DEV,
                              generator=gen)
    sink = torch.randn(h_q, dtype=torch.float32, device=DEV, generator=gen)

    def run_fused():
        return fused.prefill(norm, EPS, positions, False, ROPE, cos_sin, n_wv_group, 32, True,
                             True, True, q, kv, idx, sm_scale=scale, attn_sink=sink)[:2]

    def run_unfused():
        qn, cos, sin = q_prologue(q, cos_sin, positions, norm)
        out = omla.flash_mla_sparse_fwd(qn, kv, idx, scale, D, attn_sink=sink)[0]
        return o_epilogue(out, cos, sin, n_wv_group)

    q_ready = q_prologue(q, cos_sin, positions, norm)[0]

    def run_plain():
        return omla.flash_mla_sparse_fwd(q_ready, kv, idx, scale, D, attn_sink=sink)[0]

    return measure("prefill", dict(h_q=h_q, b=1, s_q=s_q, tokens=s_q, s_kv=s_kv, topk=topk,
                                   extra_topk=0, q_norm=norm),
                   run_fused, run_unfused, run_plain, n_wv_group, rounds, flush, eager)


def measure(kind, row, run_fused, run_unfused, run_plain, n_wv_group, rounds, flush, eager):
    a = dequant(*run_fused(), n_wv_group)
    b = dequant(*run_unfused(), n_wv_group)
    err = rel_err(a, b)
    if not err < 5e-2:
        raise RuntimeError(f"{kind} {row}: the fused and unfused outputs disagree: relative "
                           f"error {err:.3e}")
    del a, b
    fused_us, unfused_us, plain_us = time_calls([run_fused, run_unfused, run_plain], rounds,
                                                flush, eager)
    row = dict(kind=kind, **row, fused_us=fused_us, unfused_us=unfused_us, plain_us=plain_us,
               speedup=unfused_us / fused_us, fused_vs_plain=fused_us / plain_us, rel_err=err)
    torch.cuda.empty_cache()
    return row


def print_row(r):
    shape = (f"{r['b']}x{r['s_q']}" if r["kind"] == "decode" else f"{r['s_q']} / {r['s_kv']}")
    topk = (f"{r['topk']} + {r['extra_topk']}" if r["kind"] == "decode" else f"{r['topk']}")
    print(f"| {r['kind']} | {r['h_q']} | {shape} | {r['tokens']} | {topk} | {r['fused_us']:.1f} | "
          f"{r['unfused_us']:.1f} | {r['plain_us']:.1f} | {r['speedup']:.2f}x | "
          f"{r['fused_vs_plain']:.2f} | {r['rel_err']:.1e} |", flush=True)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--only", choices=["decode", "prefill"], default=None)
    ap.add_argument("--version", choices=["v4.1", "v4"], default="v4.1",
                    help="decode caches and Q norm: v4.1 (fp8_mx + fp4, no Q norm) or v4 "
                         "(fp8_model1 + fp8_model1, Q norm); prefill: the Q norm")
    ap.add_argument("--h-q", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--eager", action="store_true",
                    help="time eager calls between events instead of CUDA-graph replays")
    ap.add_argument("--icache", choices=["cold", "mixed"], default="cold",
                    help="cold: instruction caches evicted before every timed call")
    ap.add_argument("--json", metavar="PATH", help="write the rows (a JSON list) to PATH")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_vs_unfused.py: no CUDA device")
        return 1
    global COLD_ICACHE
    COLD_ICACHE = args.icache == "cold"
    name = torch.cuda.get_device_name()
    print(f"fused norm-rope-attention-rope-cast vs unfused (torch + sparse attention), {name}, "
          f"{args.version}; µs between CUDA events around "
          f"{'eager calls' if args.eager else 'CUDA-graph replays'}, L2 flushed, {args.icache} "
          f"instruction caches, median of {args.rounds}")
    print("speedup = unfused / fused; fused/plain = fused / the plain sparse attention alone")
    print("| op | h_q | b x s_q / s_q, s_kv | tokens | topk | fused µs | unfused µs | "
          "plain µs | speedup | fused/plain | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gen = torch.Generator(device=DEV).manual_seed(0)
    cos_sin = build_cos_sin_cache(NUM_POSITIONS)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEV)
    rows = []
    if args.only != "prefill":
        batches = DECODE_BATCHES if not args.quick else [(1, 1), (64, 4)]
        setup = DecodeSetup(args.version, max(b for b, _ in batches), gen)
        for h in args.h_q:
            for b, s_q in batches:
                rows.append(decode_row(setup, h, b, s_q, cos_sin, args.rounds, flush,
                                       args.eager, gen))
                print_row(rows[-1])
        del setup
        torch.cuda.empty_cache()
    if args.only != "decode":
        norm = VERSIONS[args.version][2]
        grid = PREFILL if not args.quick else PREFILL[:1]
        for h in args.h_q:
            for s_q, s_kv, topk in grid:
                rows.append(prefill_row(h, s_q, s_kv, topk, norm, cos_sin, args.rounds, flush,
                                        args.eager, gen))
                print_row(rows[-1])
    for kind in ("decode", "prefill"):
        ratios = [r["speedup"] for r in rows if r["kind"] == kind]
        overhead = [r["fused_vs_plain"] for r in rows if r["kind"] == kind]
        if ratios:
            print(f"\n{kind}: geometric mean speedup of fused over unfused ({len(ratios)} rows): "
                  f"{statistics.geometric_mean(ratios):.2f}x (min {min(ratios):.2f}, max "
                  f"{max(ratios):.2f}); fused / plain: geometric mean "
                  f"{statistics.geometric_mean(overhead):.2f}")
    if args.json:
        meta = dict(device=name, version=args.version, rounds=args.rounds,
                    method="eager events" if args.eager else "CUDA-graph replay events",
                    icache=args.icache, torch=torch.__version__)
        with open(args.json, "w") as f:
            json.dump([dict(r, **meta) for r in rows], f, indent=1)
        print(f"\nwrote {len(rows)} rows to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
