#!/usr/bin/env python3
"""One sparse decode call of OpenMLA and one of FlashMLA on the same tensors, for ncu side by side:

  ncu --section SpeedOfLight --section WarpStateStats --section InstructionStats \
      --section MemoryWorkloadAnalysis --section Occupancy -k regex:'sparse|splitkv' \
      python3 research/ncu_sparse_pair.py fp8_v32 64 2 128 2048

Arguments: format (fp8_v32 | fp8_model1), b, s_q, h_q, topk. Each library is warmed up first
(its schedule made), then called once more: profile with --launch-skip / -c as needed, or
filter with NVTX (ranges "openmla" and "flashmla")."""
import sys

import torch

import openmla
import openmla.flash_mla as omla
import flash_mla as peer

fmt, b, s_q, h_q, topk = sys.argv[1], *map(int, sys.argv[2:6])
d = 576 if fmt == "fp8_v32" else 512
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
region = 32768
cache = openmla.new_kv_cache(b * region // 64, 64, fmt, d_qk=d, like=torch.empty(1, device=dev))
kv = torch.randn(b * region, d, dtype=torch.bfloat16, device=dev, generator=gen)
openmla.kv_cache_write(kv, torch.arange(b * region, dtype=torch.int32, device=dev), cache,
                       kv_format=fmt)
del kv
idx = torch.stack([torch.rand(s_q, region, device=dev, generator=gen).argsort(-1)[:, :topk] + i * region
                   for i in range(b)]).to(torch.int32)
q = torch.randn(b, s_q, h_q, d, dtype=torch.bfloat16, device=dev, generator=gen) / 4
mo, _ = omla.get_mla_metadata()
mp, _ = peer.get_mla_metadata()
ours = lambda: omla.flash_mla_with_kvcache(q, cache, None, None, 512, mo, None, is_fp8_kvcache=True,
                                           indices=idx)
theirs = lambda: peer.flash_mla_with_kvcache(q, cache, None, None, 512, mp, None,
                                             is_fp8_kvcache=True, indices=idx)
for _ in range(2):
    ours()
    theirs()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("openmla")
ours()
torch.cuda.nvtx.range_pop()
torch.cuda.nvtx.range_push("flashmla")
theirs()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("done")
