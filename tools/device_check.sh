#!/usr/bin/env bash
# The one script run on the GPU device: build with the CUDA backend, run the CPU and GPU test
# tiers, compute-sanitizer memcheck on small shapes, and the benchmark programs.
#
#   OUT=/some/dir tools/device_check.sh   (default OUT: build-device-out/)
#
# The device has no network: the CUTLASS headers must already be in .deps/ (tools/fetch_cutlass.py
# run elsewhere) or CUTLASS_DIR must point at them; nothing is fetched here. transformers (for the
# integration tests) comes from .pydeps/ when present (tools/pack_device_pydeps.sh).
#
# Writes at most 8 files into $OUT (the device tool returns 8):
#   summary.txt    versions, then PASS/FAIL/SKIP per step as each finishes
#   build.log      configure + build output        ptxas.txt   registers/stack/spills per kernel
#   cpu_tests.txt  gpu_tests.txt  sanitizer.txt    bench.txt   (every openmla_bench_* appended)
#   python.txt     pytest on the GPU, the context-parallel example (simulated shards, and one
#                  rank a GPU through NCCL where the machine has 2 or more), the demo (main job),
#                  the C++ serving-step example (examples/cpp) against the installed library
# Exits non-zero when any step failed; later steps still run where they can.
#
# Options (environment):
#   GTEST_FILTER=...       filter for both test binaries (default: all tests)
#   SANITIZER_FILTER=...   filter for the memcheck run (default '*Small*:*Sanitizer*')
#   SKIP_SANITIZER=1  SKIP_BENCH=1  SKIP_PYTHON=1  SKIP_CPU_TESTS=1 (the C++ CPU tier and
#   pytest's non-GPU tier: CI runs both)
#   BUILD_DIR=build-device  JOBS=$(nproc)  CMAKE_ARGS="..." (extra configure arguments)
#   COMMIT=<hash>          the commit the working tree is (the device's .git may be stale)
#   SPARSE_BENCH_ARGS="..."  arguments of bench/sparse_decode_vs_flashmla.py, e.g. "--only
#                          prefill" or "--rows compared"
#   BUILD_TIMEOUT=420 TEST_TIMEOUT=240 SANITIZER_TIMEOUT=300 BENCH_TIMEOUT=240 (seconds per step)
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/build-device-out}"  # /build*/ is git-ignored
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUILD_DIR="${BUILD_DIR:-build-device}"
JOBS="${JOBS:-$(nproc)}"
SANITIZER_FILTER="${SANITIZER_FILTER:-*Small*:*Sanitizer*}"
GTEST_FILTER_ARG=()
if [[ -n "${GTEST_FILTER:-}" ]]; then GTEST_FILTER_ARG=(--gtest_filter="$GTEST_FILTER"); fi

SUMMARY="$OUT/summary.txt"
FAILED=0

# record STEP RESULT SECONDS NOTE: one line of the summary, written as soon as a step ends so a
# run cut short by the device's time limit still reports what it finished.
record() {
  printf '%-12s %-5s %5ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$SUMMARY"
  if [[ "$2" == FAIL ]]; then FAILED=1; fi
}

# run_step LOGFILE TIMEOUT CMD...: runs CMD under a timeout, output appended to LOGFILE;
# sets STEP_RC and STEP_SECONDS.
run_step() {
  local log="$1" limit="$2"
  shift 2
  local start=$SECONDS
  echo "+ $*" >>"$log"
  # stdbuf: line-buffered output, so a step killed by its time limit still leaves what it printed
  # (gtest and pytest buffer a redirected stdout otherwise).
  timeout --kill-after=15 "$limit" stdbuf -oL -eL "$@" >>"$log" 2>&1 </dev/null
  STEP_RC=$?
  STEP_SECONDS=$((SECONDS - start))
  if [[ $STEP_RC -eq 124 || $STEP_RC -eq 137 ]]; then
    echo "!! timed out after ${limit}s" >>"$log"
  fi
}

note_for() {  # note_for RC: a short reason for the summary
  case "$1" in
    0) echo "" ;;
    124 | 137) echo "timed out" ;;
    *) echo "exit $1" ;;
  esac
}

# --- environment -----------------------------------------------------------------------------
{
  echo "OpenMLA device check, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  # The device gets a copy of the working tree; its .git may be older than the tree (seen
  # 2026-12-05), so the caller names the commit: COMMIT=$(git rev-parse --short HEAD) in the command.
  echo "commit: ${COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown) (from the .git of the device: may be stale)}" \
       "$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo '(working tree modified)')"
  echo "host: $(uname -srm), $(nproc) cores"
  echo
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 60 nvidia-smi 2>&1 || echo "nvidia-smi failed (exit $?)"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
      --format=csv 2>&1 || true
  else
    echo "nvidia-smi: not found"
  fi
  echo
  echo "== toolchain"
  if command -v nvcc >/dev/null 2>&1; then nvcc --version | tail -n 2; else echo "nvcc: not on PATH"; fi
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1 || echo 'not found')"
  echo "ninja: $(ninja --version 2>/dev/null || echo 'not found')"
  echo "c++: $(c++ --version 2>/dev/null | head -n 1 || echo 'not found')"
  SANITIZER_BIN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
  echo "compute-sanitizer: ${SANITIZER_BIN:-not found}"
  for dir in "$ROOT"/.deps/cutlass-*/include; do [[ -d "$dir" ]] && echo "cutlass headers: $dir"; done
  echo
  echo "step         result  time  note"
} >"$SUMMARY" 2>&1

GPU_COUNT=0
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU_COUNT=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [[ "$GPU_COUNT" -gt 0 ]]; then record gpu PASS 0 "$GPU_COUNT GPU(s)"; else record gpu FAIL 0 "no GPU visible"; fi

# --- configure and build ---------------------------------------------------------------------
BUILD_LOG="$OUT/build.log"
: >"$BUILD_LOG"
STAMP="$(mktemp)"  # after a failed build, binaries older than this are stale
BUILD_OK=0
if ! ls "$ROOT"/.deps/cutlass-*/include/cute/tensor.hpp >/dev/null 2>&1 && [[ -z "${CUTLASS_DIR:-}" ]]; then
  echo "no CUTLASS headers in .deps/ and CUTLASS_DIR unset; the device cannot fetch them" \
    | tee -a "$BUILD_LOG"
  record configure FAIL 0 "CUTLASS headers missing (.deps/ not carried)"
else
  # A build folder configured from another checkout path cannot be reused.
  if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] &&
     ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$BUILD_DIR/CMakeCache.txt"; then
    echo "removing $BUILD_DIR: configured for another source folder" >>"$BUILD_LOG"
    rm -rf "$BUILD_DIR"
  fi
  CUTLASS_ARG=()
  if [[ -n "${CUTLASS_DIR:-}" ]]; then CUTLASS_ARG=(-DCUTLASS_DIR="$CUTLASS_DIR"); fi
  # The Python extension builds in the same tree when nanobind is importable (it is on the device).
  PYTHON_ARG=()
  if python3 -c 'import nanobind' >/dev/null 2>&1; then
    PYTHON_ARG=(-DOPENMLA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
  fi
  # shellcheck disable=SC2086 # CMAKE_ARGS is a list of words on purpose
  run_step "$BUILD_LOG" 300 cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DOPENMLA_CUDA=ON \
    -DOPENMLA_FETCH_CUTLASS=OFF -DCMAKE_BUILD_TYPE=Release "${CUTLASS_ARG[@]}" "${PYTHON_ARG[@]}" \
    ${CMAKE_ARGS:-}
  if [[ $STEP_RC -eq 0 ]]; then
    record configure PASS "$STEP_SECONDS"
    # -k 0: report every failing translation unit (every spill) in one run.
    run_step "$BUILD_LOG" "${BUILD_TIMEOUT:-420}" cmake --build "$BUILD_DIR" -j "$JOBS" -- -k 0
    if [[ $STEP_RC -eq 0 ]]; then
      record build PASS "$STEP_SECONDS" "$JOBS jobs"
      BUILD_OK=1
    else
      record build FAIL "$STEP_SECONDS" "$(note_for $STEP_RC); first error: $(grep -m1 -E 'ptxas error|error:|CMake Error' "$BUILD_LOG" | cut -c1-160)"
    fi
  else
    record configure FAIL "$STEP_SECONDS" "$(note_for $STEP_RC); see build.log"
  fi
fi

# Per-kernel resources from ptxas -v: one line per kernel, then every ptxas warning/error.
DEMANGLE="cat"
if command -v c++filt >/dev/null 2>&1; then DEMANGLE=c++filt; fi
{
  echo "registers  stack  spill_stores  spill_loads  kernel"
  awk '
    /Compiling entry function/ { match($0, /function \x27[^\x27]+\x27/); name = substr($0, RSTART + 10, RLENGTH - 11) }
    /bytes stack frame/ { stack = $1; spill_st = $5; spill_ld = $9 }
    /ptxas info *: Used [0-9]+ registers/ {
      for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1)
      if (name != "") printf "%9s  %5s  %12s  %11s  %s\n", regs, stack, spill_st, spill_ld, name
      name = ""
    }' "$BUILD_LOG" | $DEMANGLE | cut -c1-400 | sort -u -k5
  echo
  echo "ptxas warnings and errors:"
  grep -E 'ptxas (warning|error)' "$BUILD_LOG" | $DEMANGLE | cut -c1-400 | sort -u || echo "(none)"
  echo "wgmma serialization (ptxas 'Potential Performance Loss: wgmma', C7517; must be none):"
  grep -E 'Potential Performance Loss: wgmma|\(C7517\)' "$BUILD_LOG" | $DEMANGLE | cut -c1-300 | sort -u || echo "(none)"
} >"$OUT/ptxas.txt" 2>&1

# built BINARY: true when BINARY is current. After a clean build every binary is; after a failed
# one only those linked by this run (a stale binary from an earlier build is never run).
built() {
  [[ -x "$1" ]] && { [[ $BUILD_OK -eq 1 ]] || [[ "$1" -nt "$STAMP" ]]; }
}

# --- tests -----------------------------------------------------------------------------------
run_tests() {  # run_tests STEP BINARY LOGFILE ["ENV=VALUE ..." GTEST_FILTER: appended to LOGFILE]
  local step="$1" bin="$2" log="$3"
  local -a env_args=() filter_args=("${GTEST_FILTER_ARG[@]}")
  if [[ $# -ge 5 ]]; then
    read -r -a env_args <<<"$4"
    filter_args=(--gtest_filter="$5")
    echo "=== $4" >>"$log"
  else
    : >"$log"
  fi
  if ! built "$bin"; then
    echo "$bin is missing or stale (the build failed before linking it)" >>"$log"
    record "$step" FAIL 0 "not built"
    return
  fi
  run_step "$log" "${TEST_TIMEOUT:-240}" env "${env_args[@]}" "$bin" --gtest_color=no "${filter_args[@]}"
  local summary
  local from=1  # an appended run: its own lines only
  [[ ${#env_args[@]} -gt 0 ]] && from="$(grep -n -F -x "=== $4" "$log" | tail -n 1 | cut -d: -f1)"
  summary="$(tail -n +"${from:-1}" "$log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' | head -n 3 | tr '\n' ' ')"
  if [[ $STEP_RC -eq 0 ]]; then
    record "$step" PASS "$STEP_SECONDS" "$summary"
  else
    record "$step" FAIL "$STEP_SECONDS" "$(note_for $STEP_RC) $summary"
  fi
}
if [[ "${SKIP_CPU_TESTS:-0}" == 1 ]]; then
  record cpu_tests SKIP 0 "SKIP_CPU_TESTS=1"
else
  run_tests cpu_tests "$BUILD_DIR/tests/openmla_cpu_tests" "$OUT/cpu_tests.txt"
fi
run_tests gpu_tests "$BUILD_DIR/tests/openmla_gpu_tests" "$OUT/gpu_tests.txt"

# --- compute-sanitizer memcheck on small shapes ----------------------------------------------
if [[ "${SKIP_SANITIZER:-0}" == 1 ]]; then
  record sanitizer SKIP 0 "SKIP_SANITIZER=1"
else
  LOG="$OUT/sanitizer.txt"
  : >"$LOG"
  GPU_TESTS="$BUILD_DIR/tests/openmla_gpu_tests"
  if [[ -z "$SANITIZER_BIN" ]]; then
    record sanitizer FAIL 0 "compute-sanitizer not found"
  elif ! built "$GPU_TESTS"; then
    record sanitizer FAIL 0 "openmla_gpu_tests not built"
  else
    # memcheck STEP NOTE [VAR=V ...]: the small cases under memcheck with those settings; its
    # lines of the log start at a "=== NOTE" line.
    memcheck() {
      local step="$1" note="$2"
      shift 2
      echo "=== $note" >>"$LOG"
      run_step "$LOG" "${SANITIZER_TIMEOUT:-300}" env "$@" "$SANITIZER_BIN" --tool memcheck \
        --error-exitcode 99 --print-limit 50 "$GPU_TESTS" --gtest_color=no \
        --gtest_filter="$SANITIZER_FILTER"
      local errors
      errors="$(tail -n +"$(grep -n -F -x "=== $note" "$LOG" | tail -n 1 | cut -d: -f1)" "$LOG" |
        grep -m1 -E 'ERROR SUMMARY' | sed 's/^========= //')"
      if [[ $STEP_RC -eq 0 ]]; then
        record "$step" PASS "$STEP_SECONDS" "$note; $errors"
      else
        record "$step" FAIL "$STEP_SECONDS" "$(note_for $STEP_RC); $note; $errors"
      fi
    }
    memcheck sanitizer "filter '$SANITIZER_FILTER'"
  fi
fi

# --- Python package on the GPU (torch), the context-parallel example, the main job -----------
if [[ "${SKIP_PYTHON:-0}" == 1 ]]; then
  record python SKIP 0 "SKIP_PYTHON=1"
else
  LOG="$OUT/python.txt"
  : >"$LOG"
  shopt -s nullglob
  ext=("$BUILD_DIR"/python/_C*.so)
  shopt -u nullglob
  if [[ ${#ext[@]} -eq 0 ]] || ! built "${ext[0]}"; then
    record python FAIL 0 "extension not built (nanobind missing?)"
  else
    # The package as pip would lay it out: the Python modules plus the extension built above.
    # (absolute: tests start subprocesses in other directories with this PYTHONPATH)
    PKG="$(cd "$BUILD_DIR" && pwd)/pypkg"
    "$ROOT/tools/layout_pypkg.sh" "$BUILD_DIR"
    export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    # transformers for the integration tests, packed by tools/pack_device_pydeps.sh (the image
    # has no transformers; without the archive those tests skip, saying so).
    if [[ -f "$ROOT/.pydeps/tf-site-py312.tar.xz" ]]; then
      rm -rf "$BUILD_DIR/pydeps" && mkdir -p "$BUILD_DIR/pydeps" &&
        tar xJf "$ROOT/.pydeps/tf-site-py312.tar.xz" -C "$BUILD_DIR/pydeps" &&
        export PYTHONPATH="$PYTHONPATH:$(cd "$BUILD_DIR/pydeps/site" && pwd)"
    fi
    # The extension segfaulted here in libstdc++ number formatting (2026-12-02, NOTES of issue 4):
    # record what it links and whether it carries libstdc++ code of its own.
    {
      # Where the compiler finds libstdc++.so: a bare name means it is missing and -lstdc++ falls
      # back to libstdc++.a (the suspected cause of the static libstdc++ of issue 28).
      echo "== c++ -print-file-name=libstdc++.so: $(c++ -print-file-name=libstdc++.so 2>&1)"
      echo "== ${ext[0]}: shared libraries"
      ldd "${ext[0]}" 2>&1 | grep -E "stdc|gcc_s|gomp|python|cudart" || true
      echo "== libstdc++ (std::) symbols defined in it: $(nm -D --defined-only "${ext[0]}" 2>/dev/null |
        grep -c ' _ZNSt' || true); e.g.:"
      nm -D --defined-only "${ext[0]}" 2>/dev/null | grep -E ' _ZNSt(6locale|7codecvt|13basic_ostream)' |
        head -n 5 || true
    } >>"$LOG" 2>&1
    # `import openmla` first in a fresh interpreter (issue 28: it died in ml_dtypes' float4 finfo
    # once), then ml_dtypes and torch after it; and the extension's exported symbols (PyInit__C only).
    run_step "$LOG" 120 python3 -c 'import openmla; import ml_dtypes; str(ml_dtypes.finfo(ml_dtypes.float4_e2m1fn)); import torch; print("import openmla first: OK", openmla.__version__, torch.__version__)'
    exports="$(nm -D --defined-only "${ext[0]}" 2>/dev/null | wc -l)"
    if [[ $STEP_RC -eq 0 ]]; then record import PASS "$STEP_SECONDS" "exported symbols: $exports"; else
      record import FAIL "$STEP_SECONDS" "$(note_for $STEP_RC) (139: SIGSEGV); exported symbols: $exports"; fi
    # Two runs, GPU tests first, so a crash in one cannot hide the other's results.
    # (SKIP_CPU_TESTS=1 skips the non-GPU tier too: CI runs it on every commit.)
    markers=(gpu)
    [[ "${SKIP_CPU_TESTS:-0}" == 1 ]] || markers+=("not gpu")
    for marker in "${markers[@]}"; do
      run_step "$LOG" "${TEST_TIMEOUT:-240}" python3 -m pytest -q -o addopts="" -rs -m "$marker" \
        -p no:cacheprovider "$ROOT/tests/python"
      summary="$(grep -E '[0-9]+ (passed|failed)' "$LOG" | tail -n 1)"
      step="pytest_${marker// /_}"
      if [[ $STEP_RC -eq 0 ]]; then record "$step" PASS "$STEP_SECONDS" "$summary"; else
        record "$step" FAIL "$STEP_SECONDS" "$(note_for $STEP_RC) $summary"; fi
    done
    # The fast path with out-of-range lengths and block ids under memcheck (issue 28): no read
    # outside the cache.
    if [[ -n "$SANITIZER_BIN" && "${SKIP_SANITIZER:-0}" != 1 ]]; then
      run_step "$LOG" 300 "$SANITIZER_BIN" --tool memcheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider \
        -k "fast_path_clamps or checked_mode" "$ROOT/tests/python/test_gpu_ops.py"
      errors="$(grep -E 'ERROR SUMMARY' "$LOG" | tail -n 1 | sed 's/^========= //')"
      if [[ $STEP_RC -eq 0 ]]; then record py_memcheck PASS "$STEP_SECONDS" "$errors"; else
        record py_memcheck FAIL "$STEP_SECONDS" "$(note_for $STEP_RC); $errors"; fi
    fi
    run_step "$LOG" 180 python3 "$ROOT/examples/context_parallel_decode.py" --simulate 4
    if [[ $STEP_RC -eq 0 ]]; then record context_par PASS "$STEP_SECONDS" "$(grep -m1 '^simulated' "$LOG" | cut -c1-150); $(grep '^CUDA graph' "$LOG" | tail -n 1 | cut -c1-150)"; else
      record context_par FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"; fi
    # The same on every GPU of the machine, one rank each, through NCCL (issue 6; NVLink
    # multicast off, as the device notes require).
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    if [[ "${gpus:-0}" -ge 2 ]]; then
      run_step "$LOG" 300 env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
        "$ROOT/examples/context_parallel_decode.py"
      if [[ $STEP_RC -eq 0 ]]; then record context_nccl PASS "$STEP_SECONDS" "$(grep -m1 'ranks (NCCL)' "$LOG" | cut -c1-150); $(grep '^CUDA graph' "$LOG" | tail -n 1 | cut -c1-150)"; else
        record context_nccl FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"; fi
    else
      record context_nccl SKIP 0 "${gpus:-0} GPU: the NCCL run needs a machine with 2 or more (nvidia-h200-x2)"
    fi
  fi
fi
if built "$BUILD_DIR/bench/openmla_demo"; then
  LOG="$OUT/python.txt"
  echo "===== openmla_demo (the main job)" >>"$LOG"
  run_step "$LOG" 180 "$BUILD_DIR/bench/openmla_demo" --iters 10
  if [[ $STEP_RC -eq 0 ]]; then record demo PASS "$STEP_SECONDS"; else record demo FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"; fi
  # The C++ serving-step example against the installed library: kv_cache_write + one schedule +
  # dense_decode per layer, replayed as a CUDA graph, its last output checked against the CPU.
  echo "===== examples/cpp decode_step (installed library, CUDA graph)" >>"$LOG"
  BUILD_ABS="$(cd "$BUILD_DIR" && pwd)"
  run_step "$LOG" 240 bash -c "cmake --install '$BUILD_ABS' --prefix '$BUILD_ABS/install' >/dev/null &&
    cmake -S '$ROOT/examples/cpp' -B '$BUILD_ABS/examples-cpp' -G Ninja \
      -DCMAKE_PREFIX_PATH='$BUILD_ABS/install' -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build '$BUILD_ABS/examples-cpp' >/dev/null &&
    '$BUILD_ABS/examples-cpp/openmla_decode_step' --device cuda"
  if [[ $STEP_RC -eq 0 ]]; then record cpp_example PASS "$STEP_SECONDS" "$(grep -m1 'vs the CPU backend' "$LOG" | cut -c1-120)"; else
    record cpp_example FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"; fi
fi

# --- benchmarks ------------------------------------------------------------------------------
if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  record bench SKIP 0 "SKIP_BENCH=1"
else
  LOG="$OUT/bench.txt"
  : >"$LOG"
  shopt -s nullglob
  benches=("$BUILD_DIR"/bench/openmla_bench_*)
  shopt -u nullglob
  if [[ ${#benches[@]} -eq 0 ]]; then
    record bench SKIP 0 "no openmla_bench_* programs"
  fi
  for bin in "${benches[@]}"; do
    name="$(basename "$bin")"
    echo "===== $name" >>"$LOG"
    if ! built "$bin"; then
      echo "missing or stale (the build failed before linking it)" >>"$LOG"
      record "${name#openmla_}" FAIL 0 "not built"
      continue
    fi
    run_step "$LOG" "${BENCH_TIMEOUT:-240}" "$bin"
    if [[ $STEP_RC -eq 0 ]]; then
      record "${name#openmla_}" PASS "$STEP_SECONDS"
    else
      record "${name#openmla_}" FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"
    fi
  done
  # Kernel-only time from the profiler trace, the method of FlashMLA's figures (needs the Python
  # package laid out above and torch).
  if [[ -n "${PKG:-}" && -d "${PKG:-}/openmla" ]]; then
    echo "===== bench/kernel_time.py" >>"$LOG"
    run_step "$LOG" "${BENCH_TIMEOUT:-240}" python3 "$ROOT/bench/kernel_time.py"
    if [[ $STEP_RC -eq 0 ]]; then record kernel_time PASS "$STEP_SECONDS"; else
      record kernel_time FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"; fi
    # Sparse decode side by side with FlashMLA (the peer archive, when the caller carried
    # .peers/; without it the OpenMLA columns alone).
    PEER_DIR=""
    shopt -s nullglob
    peer_archive=("$ROOT"/.peers/flash_mla-*.tar.xz)
    shopt -u nullglob
    if [[ ${#peer_archive[@]} -gt 0 ]]; then
      PEER_DIR="$(mktemp -d)" && tar xJf "${peer_archive[0]}" -C "$PEER_DIR"
    fi
    echo "===== bench/sparse_decode_vs_flashmla.py" >>"$LOG"
    run_step "$LOG" "${BENCH_TIMEOUT:-240}" env PYTHONPATH="$PKG${PEER_DIR:+:$PEER_DIR}" \
      python3 "$ROOT/bench/sparse_decode_vs_flashmla.py" ${SPARSE_BENCH_ARGS:-}
    if [[ $STEP_RC -eq 0 ]]; then record sparse_bench PASS "$STEP_SECONDS" "$(grep -m1 'geometric mean' "$LOG" | cut -c1-120)"; else
      record sparse_bench FAIL "$STEP_SECONDS" "$(note_for $STEP_RC)"; fi
  fi
fi

rm -f "$STAMP"
if [[ $FAILED -eq 0 ]]; then record overall PASS "$SECONDS"; else record overall FAIL "$SECONDS"; fi
exit "$FAILED"
