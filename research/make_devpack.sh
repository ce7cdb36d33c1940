#!/usr/bin/env bash
# Builds build/devpack.tar.xz for research/device_new_kernels.sh from the CUDA build in build/:
# the GPU test binary and the Python package, stripped.
set -eu
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
cmake --build build -j 2 --target openmla_gpu_tests _C
bash tools/layout_pypkg.sh build
S=$(mktemp -d); mkdir -p "$S/build/tests" "$S/build/bench"
cp build/tests/openmla_gpu_tests "$S/build/tests/"
cp -rL build/pypkg "$S/build/"
strip "$S/build/tests/openmla_gpu_tests" \
  "$S"/build/pypkg/openmla/_C*.so
tar cf - -C "$S" build | xz -T2 -6 > build/devpack.tar.xz
rm -rf "$S"; ls -la build/devpack.tar.xz
