#!/usr/bin/env bash
# One device call that does what a tuning session's first run needs (sessions 12-13 wrote it by
# hand each time): build this tree and every exported `.ab/<sha>` tree with their GPU tests (and
# a trace build of this tree), run each experiment tree's decode GPU tests, A/B all trees on the
# given shapes (research/ab_dense_decode.sh), then knob diagnostics on this tree's binary and
# trace-build timelines. Steps run in that order; the later ones are skipped when the call's
# time runs short (log.txt says which ran). At most 5 files in $OUT (the device returns 8).
#
#   OUT=$OUT research/ab_session.sh          (carry [".ab", ".deps"]; run from the repository root)
#
# Settings (environment; defaults in brackets):
#   AB_SHAPES     shapes of the A/B [1,128,4096 2,128,8192 1,16,8192 1,128,1024 1,16,1024
#                 32,1,128,4096]; b,s_q,h_q,seqlen or s_q,h_q,seqlen at b 128
#   AB_L2_SHAPES  shapes timed again with the KV in L2 [1,128,4096]
#   KNOB_RUNS     "shape:knobs|knobs|...;..." each setting once (a flushed median of 15) with
#                 this tree's binary, e.g. "1,16,1024:|output_stores=0|" (empty = defaults) [none]
#   TRACE_SHAPES  shapes of the trace build's CTA spans, request marks and timeline [none]
#   TEST_FILTER   gtest filter of the experiment trees' tests [DenseDecode*]
#   BUDGET        seconds the call may take [560]
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
S="$(mktemp -d)"
t0=$(date +%s)
log() { echo "$* ($(($(date +%s) - t0)) s)" | tee -a "$OUT/log.txt"; }
left() { echo $((${BUDGET:-560} - ($(date +%s) - t0))); }
cutlass="$(ls -d "$ROOT"/.deps/cutlass-*/ 2>/dev/null | head -n 1)"
[[ -n "$cutlass" ]] || { log "no .deps/cutlass-*: carry .deps"; exit 1; }

tpid=""
if [[ -n "${TRACE_SHAPES:-}" ]]; then
  (cmake -S . -B build-trace -G Ninja -DOPENMLA_CUDA=ON -DOPENMLA_FETCH_CUTLASS=OFF \
    -DCUTLASS_DIR="${cutlass%/}" -DCMAKE_BUILD_TYPE=Release -DOPENMLA_DENSE_DECODE_TRACE=ON \
    >"$S/trace_build.log" 2>&1 &&
    cmake --build build-trace -j 6 --target openmla_bench_dense_decode >>"$S/trace_build.log" 2>&1) &
  tpid=$!
fi
OUT="$S" AB_TARGETS=openmla_gpu_tests AB_TREE_TARGETS=openmla_gpu_tests AB_BUILD_ONLY=1 \
  research/ab_dense_decode.sh run >"$S/build.txt" 2>&1
log "builds rc $?"
cat "$S/ab.txt" >>"$OUT/log.txt" 2>/dev/null

for dir in .ab/*/; do
  [[ -d "$dir" ]] || continue
  sha="$(basename "$dir")"
  tests="build-ab-$sha/tests/openmla_gpu_tests"
  [[ -x "$tests" ]] || { log "$sha: no test binary"; continue; }
  timeout 150 "$tests" --gtest_filter="${TEST_FILTER:-DenseDecode*}" >"$OUT/gpu_tests_$sha.txt" 2>&1
  log "$sha tests rc $?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$OUT/gpu_tests_$sha.txt" | head -n 20 >>"$OUT/log.txt"
done

read -r -a shapes <<<"${AB_SHAPES:-1,128,4096 2,128,8192 1,16,8192 1,128,1024 1,16,1024 32,1,128,4096}"
OUT="$S" research/ab_dense_decode.sh run "${shapes[@]}" >"$OUT/ab.txt" 2>&1
log "ab done"
read -r -a l2_shapes <<<"${AB_L2_SHAPES-1,128,4096}"
if [[ ${#l2_shapes[@]} -gt 0 && $(left) -gt 150 ]]; then
  OUT="$S" OPENMLA_BENCH_L2_RESIDENT=256 research/ab_dense_decode.sh run "${l2_shapes[@]}" >>"$OUT/ab.txt" 2>&1
  log "ab with the KV in L2 done"
fi

IFS=';' read -r -a knob_runs <<<"${KNOB_RUNS:-}"
for run in "${knob_runs[@]}"; do
  sh="${run%%:*}"
  IFS='|' read -r -a settings <<<"${run#*:}|"  # (read drops one trailing empty field)
  for k in "${settings[@]}"; do
    [[ $(left) -gt 60 ]] || break 2
    row="$(OPENMLA_BENCH_KNOBS="$k" OPENMLA_BENCH_SHAPE="$sh" timeout 60 \
      build-device/bench/openmla_bench_dense_decode | grep "^| " | tail -n 1)"
    echo "$sh knobs '$k': $row" >>"$OUT/knobs.txt"
  done
done
[[ ${#knob_runs[@]} -gt 0 ]] && log "knobs done"

if [[ -n "$tpid" ]]; then
  wait "$tpid"
  log "trace build rc $?"
  for sh in ${TRACE_SHAPES}; do
    [[ $(left) -gt 40 ]] || break
    echo "== $sh" >>"$OUT/trace.txt"
    OPENMLA_BENCH_TRACE=16 OPENMLA_BENCH_SHAPE="$sh" timeout 60 \
      build-trace/bench/openmla_bench_dense_decode >"$S/tr.txt" 2>&1
    grep "^| " "$S/tr.txt" | tail -n 1 >>"$OUT/trace.txt"
    sed -n '/CTA spans/,$p' "$S/tr.txt" >>"$OUT/trace.txt"
    python3 research/timeline_summary.py "$S/tr.txt" >>"$OUT/trace.txt" 2>&1
  done
fi
log done
grep "^|" "$OUT/ab.txt"
cat "$OUT/knobs.txt" 2>/dev/null || true
