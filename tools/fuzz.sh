#!/usr/bin/env bash
# Fuzzes the host side with libFuzzer under ASan + UBSan (tests/fuzz): every validator and the
# host planner on arbitrary argument structs, and the CPU backend's operations on small random
# problems with exactly-sized buffers. Any out-of-bounds access, overflow or crash fails.
#
#   tools/fuzz.sh                  fixed seeds and run counts (what tools/test.sh runs; ~1.5 min)
#   FUZZ_SECONDS=600 tools/fuzz.sh each target for 600 s from fresh seeds, corpora kept in
#                                  build-fuzz/corpus-*/ (a person's longer hunt)
# Needs clang++ with libFuzzer (Debian's clang); without it, says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OPENMLA_FUZZ_DIR:-build-fuzz}
cxx=${FUZZ_CXX:-clang++}
if ! command -v "$cxx" >/dev/null ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     "$cxx" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz: NOT RUN: no $cxx with libFuzzer on this machine"
  exit 0
fi
cuda_include=""
if command -v nvcc >/dev/null; then cuda_include="-isystem $(dirname "$(dirname "$(command -v nvcc)")")/include"; fi
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fopenmp -Wno-pass-failed -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -Iinclude -Isrc -Itests $cuda_include)
sources=(src/core/*.cc src/cpu/*.cc src/api/*.cc)
pids=()
for target in fuzz_validation fuzz_cpu_ops; do
  "$cxx" "${flags[@]}" "tests/fuzz/$target.cc" "${sources[@]}" -o "$out/$target" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done

export OMP_NUM_THREADS=1 UBSAN_OPTIONS=print_stacktrace=1
run() {  # target, libFuzzer options...
  local target=$1; shift
  mkdir -p "$out/corpus-$target"
  echo "== fuzz: $target $*"
  if ! "$out/$target" "$@" -max_len=512 -artifact_prefix="$out/$target-" "$out/corpus-$target" \
       >"$out/$target.log" 2>&1; then
    tail -n 40 "$out/$target.log"
    echo "fuzz: $target FAILED (log $out/$target.log, reproducer $out/$target-*)"
    exit 1
  fi
  grep -E "^Done [0-9]+ runs" "$out/$target.log" || true
}
if [ -n "${FUZZ_SECONDS:-}" ]; then
  for target in fuzz_validation fuzz_cpu_ops; do run "$target" -max_total_time="$FUZZ_SECONDS"; done
else
  # Fresh corpora and fixed seeds: the same inputs every run.
  rm -rf "$out"/corpus-*
  run fuzz_validation -seed=1 -runs=2000000
  run fuzz_cpu_ops -seed=1 -runs=100000
fi
echo "fuzz: passed"
