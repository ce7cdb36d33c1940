#!/usr/bin/env bash
# A/B of the dense decode kernel: this tree against another commit, timed in one device run.
# Lent H200s differ by up to ~20% on this kernel with equal copy/GEMM ceilings (dense_decode
# NOTES.md, "Variance between lent machines"), so two versions compare only on one machine.
#
# Here (has git):   research/ab_dense_decode.sh prepare REV
#                   exports REV into .ab/<short sha>/ (git-ignored); carry ".ab" and ".deps".
# On the device:    OUT=... research/ab_dense_decode.sh run [s_q,h_q,seqlen ...]
#                   builds openmla_bench_dense_decode of this tree (build-device/) and of every
#                   exported tree (build-ab-<sha>/), then times each b = 128 shape alternately
#                   (A B A B A B: each a flushed median of 15) and prints the median of the three.
# Default shapes: 1,16,8192 1,64,4096 1,128,4096 2,128,8192 1,16,1024. AB_TARGETS="..." builds
# more targets of this tree in the same pass (e.g. openmla_gpu_tests), AB_TREE_TARGETS="..." of
# every exported tree (an experiment's own GPU tests: build-ab-<sha>/tests/openmla_gpu_tests);
# AB_BUILD_ONLY=1 stops after the builds; AB_NO_TREES=1 leaves the exported trees out.
# Knob settings of one binary instead of trees (or besides them): VARIANTS="name:knobs;..." with
# knobs as OPENMLA_BENCH_KNOBS takes them, e.g.
#   VARIANTS="base:;first:evict_first=1;normal:evict_first=0" research/ab_dense_decode.sh run
# AB_KNOBS="page=16" applies knobs to every binary, trees and variants alike (before theirs).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

case "${1:-}" in
  prepare)
    rev="${2:?usage: research/ab_dense_decode.sh prepare REV}"
    sha="$(git rev-parse --short "$rev")" || exit 1
    rm -rf ".ab/$sha" && mkdir -p ".ab/$sha"
    git archive "$sha" | tar -x -C ".ab/$sha" || exit 1
    echo "exported $rev ($sha) into .ab/$sha; carry [\".ab\", \".deps\"]"
    ;;
  run)
    shift
    shapes=("$@")
    [[ ${#shapes[@]} -eq 0 ]] && shapes=(1,16,8192 1,64,4096 1,128,4096 2,128,8192 1,16,1024)
    OUT="${OUT:-$ROOT/build-device-out}"
    mkdir -p "$OUT"
    LOG="$OUT/ab.txt"
    : >"$LOG"
    cutlass="$(ls -d "$ROOT"/.deps/cutlass-*/ 2>/dev/null | head -n 1)"
    [[ -n "$cutlass" ]] || { echo "no .deps/cutlass-*: carry .deps" | tee -a "$LOG"; exit 1; }
    build() {  # build SRC DIR [TARGET...]: configure, build the dense decode benchmark (+ targets)
      local src="$1" dir="$2" log="$OUT/ab_build_$(basename "$2").log"
      shift 2
      cmake -S "$src" -B "$dir" -G Ninja -DOPENMLA_CUDA=ON -DOPENMLA_FETCH_CUTLASS=OFF \
        -DCUTLASS_DIR="${cutlass%/}" -DCMAKE_BUILD_TYPE=Release >"$log" 2>&1 &&
        cmake --build "$dir" -j "$(nproc)" --target openmla_bench_dense_decode "$@" >>"$log" 2>&1
    }
    this_bench="$ROOT/build-device/bench/openmla_bench_dense_decode"
    names=()
    benches=()
    knobs=()
    if [[ -n "${VARIANTS:-}" ]]; then
      IFS=';' read -r -a variants <<<"$VARIANTS"
      for v in "${variants[@]}"; do
        names+=("${v%%:*}")
        benches+=("$this_bench")
        knobs+=("${v#*:}")
      done
    else
      names=(this)
      benches=("$this_bench")
      knobs=("")
    fi
    # All trees build at once (each TU is one core for ~30 s; a tree alone leaves most idle).
    # AB_TARGETS: more targets of this tree, e.g. openmla_gpu_tests.
    # shellcheck disable=SC2086 # AB_TARGETS is a list of words on purpose
    build "$ROOT" "$ROOT/build-device" ${AB_TARGETS:-} &
    this_pid=$!
    declare -A pids=()
    for dir in "$ROOT"/.ab/*/; do
      [[ -d "$dir" && "${AB_NO_TREES:-0}" != 1 ]] || continue
      sha="$(basename "$dir")"
      # shellcheck disable=SC2086 # a list of words on purpose
      build "$dir" "$ROOT/build-ab-$sha" ${AB_TREE_TARGETS:-} &
      pids[$sha]=$!
    done
    wait "$this_pid" || { echo "build of this tree failed (ab_build_build-device.log)" | tee -a "$LOG"; exit 1; }
    for sha in $(printf '%s\n' "${!pids[@]}" | sort); do
      if wait "${pids[$sha]}"; then
        names+=("$sha")
        benches+=("$ROOT/build-ab-$sha/bench/openmla_bench_dense_decode")
        knobs+=("")
      else
        echo "build of $sha failed (see ab_build_build-ab-$sha.log)" | tee -a "$LOG"
      fi
    done
    [[ "${AB_BUILD_ONLY:-0}" == 1 ]] && exit 0  # builds only (tests may run before timing)
    {
      printf '| s_q,h_q,seqlen |'
      for n in "${names[@]}"; do printf ' %s µs (3 rounds) |' "$n"; done
      printf '\n|---|'
      for _ in "${names[@]}"; do printf -- '---|'; done
      printf '\n'
      for sh in "${shapes[@]}"; do
        declare -A times=()
        for round in 1 2 3; do
          for i in "${!benches[@]}"; do
            # the µs column of the single-shape row: | b | s_q | h_q | seqlen | µs | ...
            k="${AB_KNOBS:-}"
            [[ -n "$k" && -n "${knobs[$i]}" ]] && k+=","
            k+="${knobs[$i]}"
            us="$(OPENMLA_BENCH_KNOBS="$k" OPENMLA_BENCH_SHAPE=$sh timeout 120 "${benches[$i]}" | grep "^| " | tail -n 1 |
              awk -F'|' '{gsub(/ /, "", $6); print $6}')"
            times[$i]="${times[$i]:-} ${us:-nan}"
          done
        done
        printf '| %s |' "$sh"
        for i in "${!benches[@]}"; do
          # median of the three rounds, then the rounds themselves
          med="$(echo ${times[$i]} | tr ' ' '\n' | sort -g | sed -n 2p)"
          printf ' %s (%s) |' "$med" "$(echo ${times[$i]} | tr ' ' ',')"
        done
        printf '\n'
        unset times
      done
    } | tee -a "$LOG"
    ;;
  *)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
