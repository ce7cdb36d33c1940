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
timeout ${FUSED_TIMEOUT:-170} python3 bench/fused_vs_unfused.py --json "$OUT/fused.json" > "$OUT/fused_bench.txt" 2>&1
note "fused bench rc=$?"
timeout ${SPARSE_TIMEOUT:-110} python3 bench/sparse_decode_vs_flashmla.py --rounds 8 --rows compared > "$OUT/bench.txt" 2>&1
note "sparse bench rc=$? $(grep 'geometric mean' "$OUT/bench.txt" | tr '\n' ' ')"
B=build-device/bench/openmla_bench_mha_prefill
[[ -x $B ]] && timeout 45 $B --quick > "$OUT/mha_bench.txt" 2>&1
note "mha bench (orders) rc=$?"
timeout ${MHA_TIMEOUT:-90} python3 bench/mha_prefill_vs_torch.py ${MHA_ARGS:---quick --rounds 5} \
  --json "$OUT/mha.json" >> "$OUT/mha_bench.txt" 2>&1
note "mha bench (torch) rc=$?"
timeout ${BWD_TIMEOUT:-90} python3 bench/mha_prefill_backward_vs_torch.py ${BWD_ARGS:---quick} \
  --json "$OUT/bwd.json" >> "$OUT/mha_bench.txt" 2>&1
note "mha backward bench (torch) rc=$?"
