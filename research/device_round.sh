#!/usr/bin/env bash
# One device call that builds, tests the sparse family on the GPU and measures it against FlashMLA,
# most important first (a call is cut at 600 s; summary.txt says how far it got).
#   OUT=/dir COMMIT=<hash> bash research/device_round.sh
set -u
cd "$(dirname "$0")/.."
S="$OUT/summary.txt"; : > "$S"
t0=$SECONDS
note() { echo "$(( SECONDS - t0 ))s $*" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$S"
echo "commit ${COMMIT:-?}" >> "$S"
cmake -S . -B build-device -G Ninja -DOPENMLA_CUDA=ON -DOPENMLA_FETCH_CUTLASS=OFF \
  -DCMAKE_BUILD_TYPE=Release -DOPENMLA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
  > "$OUT/build.log" 2>&1 && timeout 330 cmake --build build-device -j 16 --target openmla_gpu_tests _C -- -k 0 >> "$OUT/build.log" 2>&1
note "build rc=$?"
timeout 120 build-device/tests/openmla_gpu_tests --gtest_brief=1 \
  --gtest_filter="${FILTER:-Sparse*:DenseDecodeKVCache*:*PrefillDequantOnce*}" > "$OUT/gpu_tests.txt" 2>&1
note "gpu tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gpu_tests.txt" | tr '\n' ' ')"
bash tools/layout_pypkg.sh build-device > /dev/null 2>&1
mkdir -p /tmp/peer && tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/build-device/pypkg:/tmp/peer"
B=bench/sparse_decode_vs_flashmla.py
timeout 130 python3 $B --rounds 10 --rows compared > "$OUT/bench.txt" 2>&1
note "sparse bench rc=$? $(grep 'geometric mean' "$OUT/bench.txt" | tr '\n' ' ')"
if [[ -f .pydeps/tf-site-py312.tar.xz ]]; then
  mkdir -p /tmp/pyd && tar xJf .pydeps/tf-site-py312.tar.xz -C /tmp/pyd
  export PYTHONPATH="$PYTHONPATH:/tmp/pyd/site"
fi
timeout 100 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider tests/python > "$OUT/python.txt" 2>&1
note "pytest gpu rc=$? $(tail -n 1 "$OUT/python.txt")"
timeout 100 python3 $B --rounds 10 --only prefill > "$OUT/prefill.txt" 2>&1
note "prefill bench rc=$? $(grep 'geometric mean' "$OUT/prefill.txt" | tr '\n' ' ')"
timeout 60 python3 $B --rounds 10 --rows small-batch > "$OUT/small.txt" 2>&1
note "small-batch bench rc=$? $(grep 'geometric mean' "$OUT/small.txt" | tr '\n' ' ')"
timeout 100 python3 bench/dense_decode_vs_flashmla.py --rounds 10 --kv-formats > "$OUT/dense_kv.txt" 2>&1
note "dense kv bench rc=$?"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 build-device/tests/openmla_gpu_tests \
  --gtest_brief=1 --gtest_filter='Sparse*Small*:*SparsePrefillSmall*' > "$OUT/sanitizer.txt" 2>&1
note "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer.txt")"
