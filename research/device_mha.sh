#!/usr/bin/env bash
# A device call for the MHA prefill kernels on binaries built here (carry build/devpack.tar.xz:
# build/tests/openmla_gpu_tests, build/bench/openmla_bench_mha_prefill, build/pypkg): the GPU
# tests, memcheck of the small cases, the GPU pytest, the benchmarks.
#   OUT=/dir COMMIT=<hash> bash research/device_mha.sh
set -u
cd "$(dirname "$0")/.."
S="$OUT/summary.txt"; touch "$S"
t0=$SECONDS
note() { echo "$(( SECONDS - t0 ))s $*" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
echo "commit ${COMMIT:-?}" >> "$S"
[[ -d build/pypkg ]] || tar xJf build/devpack.tar.xz
T=build/tests/openmla_gpu_tests
F="${MHA_FILTER:-MhaPrefill*}"
OPENMLA_TEST_VERBOSE=1 timeout ${MHA_TEST_TIMEOUT:-150} $T --gtest_brief=0 --gtest_filter="$F" > "$OUT/mha_tests.txt" 2>&1
note "mha gtests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/mha_tests.txt" | tr '\n' ' ')"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 99 $T --gtest_brief=1 \
  --gtest_filter="${MHA_SAN_FILTER:-MhaPrefill*Small*}" > "$OUT/mha_sanitizer.txt" 2>&1
note "mha memcheck rc=$? $(grep -m1 'ERROR SUMMARY' "$OUT/mha_sanitizer.txt")"
export PYTHONPATH="$PWD/build/pypkg"
timeout 90 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/python/test_gpu_mha_prefill.py \
  ${MHA_PYTEST_EXTRA:-} > "$OUT/mha_py.txt" 2>&1
note "mha pytest rc=$? $(tail -n 1 "$OUT/mha_py.txt")"
timeout 60 build/bench/openmla_bench_mha_prefill --quick > "$OUT/mha_bench.txt" 2>&1
note "mha bench (orders) rc=$?"
timeout ${MHA_BENCH_TIMEOUT:-120} python3 bench/mha_prefill_vs_torch.py ${MHA_BENCH_ARGS:---quick --rounds 5} \
  --json "$OUT/mha.json" >> "$OUT/mha_bench.txt" 2>&1
note "mha bench (torch) rc=$?"
