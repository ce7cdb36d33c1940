#!/usr/bin/env bash
# A device call for the fused V4 attention on binaries built here (carry build/devpack.tar.xz:
# build/tests/openmla_gpu_tests and build/pypkg; and .peers): the fused GPU tests, memcheck, the
# GPU pytest of the fused op, its benchmark against the unfused chain, then the sparse family's
# tests and FlashMLA's grid as a regression check.   OUT=/dir COMMIT=<hash> bash research/device_fused.sh
set -u
cd "$(dirname "$0")/.."
S="$OUT/summary.txt"; touch "$S"
t0=$SECONDS
note() { echo "$(( SECONDS - t0 ))s $*" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
echo "commit ${COMMIT:-?}" >> "$S"
[[ -f build/devpack.tar.xz ]] && tar xJf build/devpack.tar.xz
T=build/tests/openmla_gpu_tests
OPENMLA_TEST_VERBOSE=1 timeout 150 $T --gtest_brief=0 --gtest_filter='Fused*' > "$OUT/fused_tests.txt" 2>&1
note "fused gtests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/fused_tests.txt" | tr '\n' ' ')"
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/build/pypkg:/tmp/peer"
timeout 120 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/python/test_gpu_fused.py > "$OUT/py_fused.txt" 2>&1
note "pytest fused rc=$? $(tail -n 1 "$OUT/py_fused.txt")"
timeout 150 python3 bench/fused_vs_unfused.py --json "$OUT/fused.json" > "$OUT/fused_bench.txt" 2>&1
note "fused bench rc=$?"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 99 $T --gtest_brief=1 \
  --gtest_filter='FusedAttentionSmall*' > "$OUT/sanitizer.txt" 2>&1
note "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer.txt")"
timeout 90 python3 bench/sparse_decode_vs_flashmla.py --rounds 8 --rows compared > "$OUT/bench.txt" 2>&1
note "sparse bench rc=$? $(grep 'geometric mean' "$OUT/bench.txt" | tr '\n' ' ')"
if [[ -n "${SPARSE_TESTS:-}" ]]; then
timeout 150 $T --gtest_brief=1 --gtest_filter='Sparse*:DenseDecodeKVCache*:*PrefillDequantOnce*' > "$OUT/sparse_tests.txt" 2>&1
  note "sparse gtests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/sparse_tests.txt" | tr '\n' ' ')"
fi
cd "$OUT" && tar czf all.tgz *.txt *.json 2>/dev/null; true
