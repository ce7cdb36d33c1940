#!/usr/bin/env bash
# A device call on binaries built here (carry build/tests/openmla_gpu_tests and build/pypkg, made
# by tools/layout_pypkg.sh build, and .peers): no build on the device. The sparse family's GPU
# tests, FlashMLA's production grid side by side, the GPU pytest, prefill, small batches,
# memcheck; most important first.   OUT=/dir COMMIT=<hash> bash research/device_prebuilt.sh
set -u
cd "$(dirname "$0")/.."
S="$OUT/summary.txt"; touch "$S"
t0=$SECONDS
note() { echo "$(( SECONDS - t0 ))s $*" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
echo "commit ${COMMIT:-?}" >> "$S"
BUILD="${BUILD:-build}"
T=$BUILD/tests/openmla_gpu_tests
timeout 200 $T --gtest_brief=1 --gtest_filter="${FILTER:-Sparse*:DenseDecodeKVCache*:*PrefillDequantOnce*}" \
  > "$OUT/gpu_tests.txt" 2>&1
note "gpu tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gpu_tests.txt" | tr '\n' ' ')"
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/$BUILD/pypkg:/tmp/peer"
B=bench/sparse_decode_vs_flashmla.py
timeout 100 python3 $B --rounds 8 --rows compared > "$OUT/bench.txt" 2>&1
note "sparse bench rc=$? $(grep 'geometric mean' "$OUT/bench.txt" | tr '\n' ' ')"
if [[ -z "${QUICK:-}" ]]; then  # QUICK=1: the tests, the decode grid and memcheck only
timeout 60 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider tests/python > "$OUT/python.txt" 2>&1
note "pytest gpu rc=$? $(tail -n 1 "$OUT/python.txt")"
timeout 50 python3 $B --rounds 5 --only prefill > "$OUT/prefill.txt" 2>&1
note "prefill bench rc=$? $(grep 'geometric mean' "$OUT/prefill.txt" | tr '\n' ' ')"
timeout 30 python3 $B --rounds 10 --rows small-batch > "$OUT/small.txt" 2>&1
note "small-batch bench rc=$? $(grep 'geometric mean' "$OUT/small.txt" | tr '\n' ' ')"
fi
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 $T --gtest_brief=1 \
  --gtest_filter='SparseDecodeSmall*:SparsePrefillSmall*' > "$OUT/sanitizer.txt" 2>&1
note "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer.txt")"
