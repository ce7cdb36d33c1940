#!/usr/bin/env bash
# The sparse kernels' A/B runs of their environment switches, in one device call after
# tools/device_check.sh has built this tree (its build-device/pypkg): each switch timed beside the
# default in the same interleaved rounds (bench/sparse_decode_vs_flashmla.py --ab), FlashMLA in
# the same run when .peers/ was carried. Writes ab_prefill.txt, ab_decode.txt and
# dense_kv.txt into $OUT.
#
#   s=$(date +%s); SKIP_BENCH=1 OUT=$OUT tools/device_check.sh;
#   BUDGET=$((585 - $(date +%s) + s)) OUT=$OUT research/sparse_ab.sh
#                                  (carry [".deps", ".peers", ".pydeps"]; from the repository root;
#                                  one device call: the machine is released 30 s after a call)
#
# Settings (environment; defaults in brackets: the A/Bs waiting for a device, session 32):
#   PREFILL_AB   --ab settings of the prefill rows [OPENMLA_PREFILL_MARK=writeback
#                OPENMLA_PREFILL_DEQUANT_ONCE=0 (the FP8-cache rows' write-back marking, and their
#                direct path, against the default that dequantises each named slot once after
#                marking the slots through a read-only filter; the bf16 rows ignore both)]
#   PREFILL_ROWS --rows of the prefill A/B [all]: all, or compared (the rows from an FP8 cache
#                only, with the FP8 tensor-core path's columns)
#   DECODE=0     skips the decode rows
#   DECODE_ROWS  --rows of the decode A/B [all]: all, compared or small-batch
#   DECODE_AB    --ab settings of the decode rows [none: the default alone]
#   PREFILL=0    skips the prefill rows
#   DENSE_KV=0   skips the dense decode over quantised caches (bench/dense_decode_vs_flashmla.py
#                --kv-formats)
#   DENSE_KV_AB  --ab settings of the dense decode over quantised caches [none]
#   ICACHE [cold] --icache of the benchmarks: cold (instruction caches evicted before every timed
#                call, bench/icache.py) or mixed (as the previous call left them)
#   ROUNDS [10]  BUDGET [540] seconds: steps that would start past it are skipped
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
: >"$OUT/ab_prefill.txt"
PKG="$ROOT/build-device/pypkg"
# (device_check lays it out in its Python step; with SKIP_PYTHON=1 it is laid out here)
[[ -d "$PKG/openmla" ]] || "$ROOT/tools/layout_pypkg.sh" "$ROOT/build-device" ||
  { echo "no $PKG: run tools/device_check.sh first" | tee "$OUT/ab_prefill.txt"; exit 1; }
t0=$(date +%s)
left() { echo $((${BUDGET:-540} - ($(date +%s) - t0))); }
PEER_DIR=""
shopt -s nullglob
peer_archive=("$ROOT"/.peers/flash_mla-*.tar.xz)
shopt -u nullglob
if [[ ${#peer_archive[@]} -gt 0 ]]; then
  PEER_DIR="$(mktemp -d)" && tar xJf "${peer_archive[0]}" -C "$PEER_DIR"
fi
export PYTHONPATH="$PKG${PEER_DIR:+:$PEER_DIR}" PYTHONUNBUFFERED=1
bench="$ROOT/bench/sparse_decode_vs_flashmla.py"

# A switch whose GPU tests failed in device_check's summary (a hang, a wrong result) is left out,
# so a deadlock costs no benchmark step its whole time limit.
failed_switches=""
if [[ -f "$OUT/summary.txt" ]]; then
  # (each entry is the start of the settings it rules out: a whole variable name and its "=")
  grep -q "^gpu_tests_stagger *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_STAGGER="
  grep -q "^gpu_tests_stream *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_STREAM="
  grep -q "^gpu_tests_groups *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_GROUPS="
  grep -q "^gpu_tests_ring *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_RING=1"
  grep -q "^gpu_tests_one_stage.* *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_SLOTS="
  grep -q "^gpu_tests_paired *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_PAIR=1"
  grep -q "^gpu_tests_fp16 *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_FP16="
  grep -q "^gpu_tests_wide.* *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_WIDE="
  grep -q "^gpu_tests_pair_slots *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_SPARSE_PAIRSLOTS="
  grep -q "^gpu_tests_mark_writeback *FAIL" "$OUT/summary.txt" && failed_switches+=" OPENMLA_PREFILL_MARK="
fi
ab_args() {
  local a f
  for a in $1; do
    for f in $failed_switches; do [[ "$a" == *"$f"* ]] && continue 2; done
    printf -- '--ab %s ' "$a"
  done
}
[[ -n "$failed_switches" ]] && echo "left out (their GPU tests failed):$failed_switches" | tee "$OUT/ab_prefill.txt"

if [[ "${PREFILL:-1}" != 0 ]]; then
  read -r -a prefill_ab <<<"$(ab_args "${PREFILL_AB-OPENMLA_PREFILL_MARK=writeback OPENMLA_PREFILL_DEQUANT_ONCE=0}")"
  lim=$(left); [[ $lim -gt 240 ]] && lim=240
  timeout "$lim" python3 "$bench" --only prefill --rows "${PREFILL_ROWS:-all}" --rounds "${ROUNDS:-10}" \
    --icache "${ICACHE:-cold}" "${prefill_ab[@]}" \
    >>"$OUT/ab_prefill.txt" 2>&1
  echo "prefill A/B rc $? ($(($(date +%s) - t0)) s)" | tee -a "$OUT/ab_prefill.txt"
fi

if [[ "${DECODE:-1}" != 0 && $(left) -gt 120 ]]; then
  read -r -a decode_ab <<<"$(ab_args "${DECODE_AB-}")"
  timeout $(($(left) - 60)) python3 "$bench" --only decode --rows "${DECODE_ROWS:-all}" --rounds "${ROUNDS:-10}" \
    --icache "${ICACHE:-cold}" "${decode_ab[@]}" >"$OUT/ab_decode.txt" 2>&1
  echo "decode A/B rc $? ($(($(date +%s) - t0)) s)" | tee -a "$OUT/ab_decode.txt"
fi

if [[ "${DENSE_KV:-1}" != 0 && $(left) -gt 60 ]]; then
  read -r -a dense_ab <<<"$(ab_args "${DENSE_KV_AB-}")"
  timeout $(($(left) - 10)) python3 "$ROOT/bench/dense_decode_vs_flashmla.py" --kv-formats \
    --rounds "${ROUNDS:-10}" --icache "${ICACHE:-cold}" "${dense_ab[@]}" >"$OUT/dense_kv.txt" 2>&1
  echo "dense kv rc $? ($(($(date +%s) - t0)) s)" | tee -a "$OUT/dense_kv.txt"
fi
