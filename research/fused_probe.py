#!/usr/bin/env python3
"""Launches for ncu (research/device_probe.sh): the plain sparse attention and the fused V4.1
op on the same tensors (bench/fused_vs_unfused.py's rows), each twice (warm-up, then the one to
profile: ncu --launch-skip 2 --launch-count 2), or the MHA backward once after a warm-up.
  python3 research/fused_probe.py decode|prefill|bwd [trace]
"""
import sys

import torch

sys.path.insert(0, "bench")
import fused_vs_unfused as F  # noqa: E402
import openmla  # noqa: E402
import openmla.flash_mla as omla  # noqa: E402
from openmla.flash_mla import fused_norm_rope_attn_rope_cast as fused  # noqa: E402

gen = torch.Generator(device="cuda").manual_seed(1)
cos_sin = F.build_cos_sin_cache(F.NUM_POSITIONS)
what = sys.argv[1]
trace = len(sys.argv) > 2 and sys.argv[2] == "trace"
calls = []
if what == "decode":
    setup = F.DecodeSetup("v4.1", 256, gen)
    h_q, b, s_q = 64, 256, 4
    t = b * s_q
    idx = F.make_indices(b, s_q, F.MAIN_TOPK, F.MAIN_REGION, setup.cache.shape[0] * F.MAIN_PAGE,
                         gen).view(t, F.MAIN_TOPK)
    eidx = F.make_indices(b, s_q, F.EXTRA_TOPK, F.EXTRA_REGION,
                          setup.extra.shape[0] * F.EXTRA_PAGE, gen).view(t, F.EXTRA_TOPK)
    q = torch.randn(t, h_q, F.D, dtype=torch.bfloat16, device="cuda", generator=gen)
    pos = torch.randint(0, F.NUM_POSITIONS, (t,), dtype=torch.int32, device="cuda", generator=gen)
    sink = torch.randn(h_q, dtype=torch.float32, device="cuda", generator=gen)
    qn = F.q_prologue(q, cos_sin, pos, setup.norm)[0]
    meta, _ = omla.get_mla_metadata()
    calls = [("plain", lambda: omla.flash_mla_with_kvcache(
                 qn.view(t, 1, h_q, F.D), setup.cache, None, None, F.D, meta,
                 softmax_scale=F.D**-0.5, is_fp8_kvcache=True,
                 indices=idx.view(t, 1, F.MAIN_TOPK), attn_sink=sink, extra_k_cache=setup.extra,
                 extra_indices_in_kvcache=eidx.view(t, 1, F.EXTRA_TOPK))),
             ("fused", lambda: fused.decode(
                 setup.norm, F.EPS, pos, False, F.ROPE, cos_sin, h_q // F.GROUP, 32, True, True,
                 True, q, setup.cache, idx, F.D**-0.5, F.D, sink, None, setup.extra, eidx, None))]
elif what == "prefill":
    h_q, s_q, s_kv, topk = 128, 4096, 32768, 640
    q = torch.randn(s_q, h_q, F.D, dtype=torch.bfloat16, device="cuda", generator=gen)
    kv = torch.randn(s_kv, 1, F.D, dtype=torch.bfloat16, device="cuda", generator=gen)
    idx = torch.cat([torch.rand(512, s_kv, device="cuda", generator=gen).argsort(dim=-1)[:, :topk]
                     for _ in range(0, s_q, 512)]).to(torch.int32).view(s_q, 1, topk)
    pos = torch.randint(0, F.NUM_POSITIONS, (s_q,), dtype=torch.int32, device="cuda",
                        generator=gen)
    sink = torch.randn(h_q, dtype=torch.float32, device="cuda", generator=gen)
    qn = F.q_prologue(q, cos_sin, pos, False)[0]
    calls = [("plain", lambda: omla.flash_mla_sparse_fwd(qn, kv, idx, F.D**-0.5, F.D,
                                                         attn_sink=sink)),
             ("fused", lambda: fused.prefill(False, F.EPS, pos, False, F.ROPE, cos_sin,
                                             h_q // F.GROUP, 32, True, True, True, q, kv, idx,
                                             sm_scale=F.D**-0.5, attn_sink=sink))]
else:  # the MHA backward, h 16, d 128, 8192 x 2, non-causal
    h, s, b, d = 16, 8192, 2, 128
    q, k, v = (torch.randn(s * b, h, d, dtype=torch.bfloat16, device="cuda", generator=gen)
               for _ in range(3))
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    out, lse = openmla.mha_prefill(q, k, v, cu, cu, s, s)
    dout = torch.randn_like(out)
    for _ in range(2):
        openmla.mha_prefill_backward(dout, q, k, v, out, lse, cu, cu, s, s)
if calls and not trace:
    for _ in range(2):
        for _, c in calls:
            c()
elif calls:  # every kernel each call launches, with its time (torch.profiler)
    for _, c in calls:
        c()
    torch.cuda.synchronize()
    for name, c in calls:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            c()
            torch.cuda.synchronize()
        print(f"== {what} {name}")
        print(prof.key_averages().table(row_limit=12, max_name_column_width=90))
torch.cuda.synchronize()
print(what, "done")
