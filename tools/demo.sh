#!/usr/bin/env bash
# The main job: builds OpenMLA and runs one DeepSeek-shaped decode and prefill on the default
# shapes (on the GPU when there is one and a kernel exists, else on the CPU backend).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${OPENMLA_BUILD_DIR:-build}
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target openmla_demo
"$build/bench/openmla_demo" "$@"
