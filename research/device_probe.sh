#!/usr/bin/env bash
# ncu of the fused V4.1 op next to the plain sparse attention (decode and prefill), and of the
# MHA backward's main kernel, on binaries built here (build/devpack.tar.xz).
#   OUT=/dir bash research/device_probe.sh
set -u
cd "$(dirname "$0")/.."
PKG=${PKG:-build/pypkg}
[[ -d $PKG ]] || tar xJf build/devpack.tar.xz
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/$PKG:/tmp/peer:$PWD/bench"
[[ -n ${SKIP_TESTS:-} ]] || timeout 120 build/tests/openmla_gpu_tests --gtest_brief=1 --gtest_filter='MhaPrefillGpu.*' > "$OUT/tests.txt" 2>&1
echo "mha gtests rc=$?" >> "$OUT/summary.txt"
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
for w in decode prefill; do
  timeout 60 python3 research/fused_probe.py $w trace >> "$OUT/summary.txt" 2>&1
  X=""; [[ $w == decode ]] && X="--section SourceCounters"
  timeout ${NCU_T:-150} ncu $S $X --kernel-name regex:sparse_decode_kernel --launch-skip 2 --launch-count 2 \
    python3 research/fused_probe.py $w > "$OUT/ncu_$w.txt" 2>&1
  echo "$w rc=$?" >> "$OUT/summary.txt"
done
[[ -n ${SKIP_BWD:-} ]] || timeout 150 ncu $S --kernel-name regex:mha_bwd_main_kernel --launch-skip 1 --launch-count 1 \
  python3 research/fused_probe.py bwd > "$OUT/ncu_bwd.txt" 2>&1
echo "bwd rc=$?" >> "$OUT/summary.txt"
true
