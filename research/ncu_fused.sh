#!/usr/bin/env bash
# ncu of the fused prefill kernel next to the plain one on the same tensors (the first prefill row
# of bench/fused_vs_unfused.py, h_q 64): duration, issue, warp states, launch. On the tree
# tools/device_check.sh built.   OUT=/dir bash research/ncu_fused.sh
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/${PKG:-build-device/pypkg}:/tmp/peer"
timeout ${NCU_TIMEOUT:-150} ncu -k regex:sparse_decode_kernel --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section SchedulerStats \
  --section Occupancy python3 bench/fused_vs_unfused.py --only prefill --h-q 64 --quick \
  --rounds 1 --eager > "$OUT/ncu_fused.txt" 2>&1
echo "ncu rc=$?" >> "$OUT/summary.txt"
