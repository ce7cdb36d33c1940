#!/usr/bin/env python3
"""Dense decode (bf16 cache, d_qk 576, page 64), OpenMLA side by side with FlashMLA in one run,
by the method of bench/sparse_decode_vs_flashmla.py (kernel-only time, L2 flushed before every
call, the two libraries interleaved in rounds, median).

  PYTHONPATH=<openmla package>:<FlashMLA package> python3 bench/dense_decode_vs_flashmla.py
"""
from __future__ import annotations

import statistics
import sys

import torch

import openmla.flash_mla as omla
from sparse_decode_vs_flashmla import DEV, ceilings, peer, time_calls

SHAPES = [  # (b, s_q, h_q, seqlen): the dense grid of the FlashMLA anchors
    (128, 1, 16, 1024), (128, 1, 16, 4096), (128, 1, 16, 8192), (128, 1, 16, 32768),
    (128, 1, 64, 1024), (128, 1, 64, 4096),
    (128, 1, 128, 1024), (128, 1, 128, 4096), (128, 1, 128, 8192), (128, 2, 128, 8192),
    (1, 1, 16, 131072), (1, 1, 128, 131072), (8, 1, 16, 131072), (8, 1, 128, 131072),
    (32, 1, 128, 1024), (32, 1, 128, 4096),
]


def main(argv) -> int:
    rounds = int(argv[0]) if argv else 20
    copy_gbs, gemm = ceilings()
    print(f"dense decode side by side, {torch.cuda.get_device_name()}; same-run ceilings: copy "
          f"{copy_gbs:.0f} GB/s, bf16 GEMM {gemm:.0f} TFLOP/s; kernel-only µs, L2 flushed, "
          f"median of {rounds}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
