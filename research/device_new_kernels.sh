#!/usr/bin/env bash
# One device call on binaries built here (carry build/devpack.tar.xz: build/tests/openmla_gpu_tests,
# build/pypkg; and .peers), no build on the device: the new
# kernels' correctness first (MHA prefill forward and backward, the fused V4 op), then their
# benchmarks, then the sparse family's regression checks, each step only while LIMIT seconds allow.
#   OUT=/dir COMMIT=<hash> LIMIT=400 bash research/device_new_kernels.sh
# The devpack, here: cmake --build build -j 2 --target openmla_gpu_tests _C;
#   tools/layout_pypkg.sh build; copy build/{tests/openmla_gpu_tests,
#   pypkg} into a scratch build/ tree, strip the binaries and the .so, tar | xz into
#   build/devpack.tar.xz (~11 MB).
set -u
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-400}
S="$OUT/summary.txt"; touch "$S"
note() { echo "${SECONDS}s $*" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
echo "commit ${COMMIT:-?}" >> "$S"
[[ -d build/pypkg ]] || tar xJf build/devpack.tar.xz
T=build/tests/openmla_gpu_tests
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/build/pypkg:/tmp/peer:$PWD/bench"
step() {  # step NAME MAX LOG CMD...: CMD for at most MAX seconds (and what LIMIT leaves)
  local name=$1 max=$2 log=$3; shift 3
  local t=$(( LIMIT - SECONDS )); (( t > max )) && t=$max
  if (( t < 15 )); then note "$name: skipped (no time left)"; return; fi
  echo "+ $*" >> "$OUT/$log"
  timeout $t "$@" >> "$OUT/$log" 2>&1
  note "$name rc=$? (limit ${t}s) $(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY|passed|failed|geometric mean' "$OUT/$log" | tail -n 3 | tr '\n' ' ')"
}
export PYTHONUNBUFFERED=1  # rows printed so far survive a step's timeout
OPENMLA_TEST_VERBOSE=1 step "gtests mha+fused" 150 tests.txt $T --gtest_brief=1 \
  --gtest_filter='MhaPrefill*:FusedAttention*'
step "fused bench" 45 bench.txt python3 bench/fused_vs_unfused.py --rounds 10 --json "$OUT/fused.json"
step "memcheck" 80 sanitizer.txt compute-sanitizer --tool memcheck --error-exitcode 99 $T \
  --gtest_brief=1 --gtest_filter='MhaPrefillGpu.Small*:FusedAttentionSmall*'
step "pytest gpu" 70 python.txt python3 -m pytest -q -o addopts="" -p no:cacheprovider \
  tests/python/test_gpu_mha_prefill.py tests/python/test_gpu_fused.py
step "fused ncu" 90 env SKIP_TESTS=1 SKIP_BWD=1 NCU_T=40 OUT="$OUT" bash research/device_probe.sh
step "gtests sparse+dense" 150 tests.txt $T --gtest_brief=1 --gtest_filter='Sparse*:DenseDecode*:Merge*'
step "mha fwd vs torch" 90 bench.txt python3 bench/mha_prefill_vs_torch.py --rounds 5 --json "$OUT/mha.json"
(cd "$OUT" && ls *.json >/dev/null 2>&1 && tar czf json.tgz *.json ncu_*.txt 2>/dev/null; rm -f *.json ncu_*.txt)
true
