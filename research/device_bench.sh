#!/usr/bin/env bash
# Benchmarks on the tree tools/device_check.sh just built on the device (build-device/):
# the fused op against the unfused chain and the plain attention, and FlashMLA's sparse grid.
#   OUT=/dir COMMIT=<hash> bash research/device_bench.sh
set -u
cd "$(dirname "$0")/.."
S="$OUT/summary.txt"; touch "$S"
t0=$SECONDS
note() { echo "$(( SECONDS - t0 ))s $*" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
echo "commit ${COMMIT:-?}" >> "$S"
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/build-device/pypkg:/tmp/peer"
timeout ${FUSED_TIMEOUT:-200} python3 bench/fused_vs_unfused.py --json "$OUT/fused.json" > "$OUT/fused_bench.txt" 2>&1
note "fused bench rc=$?"
timeout ${SPARSE_TIMEOUT:-150} python3 bench/sparse_decode_vs_flashmla.py --rounds 8 --rows compared > "$OUT/bench.txt" 2>&1
note "sparse bench rc=$? $(grep 'geometric mean' "$OUT/bench.txt" | tr '\n' ' ')"
