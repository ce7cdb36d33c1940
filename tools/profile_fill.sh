#!/usr/bin/env bash
# Where the ring fill's time goes (GPU diagnostic; sparse_decode/NOTES.md "where the time goes").
# After tools/device_check.sh has built build-device/ in the same warm machine:
#   1. ncu (full set, source correlated) of one dense-mode launch over fp8_v32 with its keys in
#      L2 (tools/probe_fill_bound.py --once), on the one-stage ring (OPENMLA_SPARSE_RING=1) and
#      on its three round slots (and OPENMLA_SPARSE_SLOTS=1): $OUT/fill_{ring,slots}_sass.csv (the
#      source page, one row per SASS instruction) and _details.csv; logs in $OUT/ncu.log. Split
#      the samples by warpgroup here with tools/stalls_by_role.py and a cubin of the same kernel;
#   2. tools/probe_fill_bound.py (keys from DRAM vs L2) with the default fill, the ring and the
#      slots: $OUT/probe.txt;
#   3. bench/bench_decode_rate.cu: clocks a 16-code chunk, the bf16 decode against fp16's:
#      $OUT/decode_rate.txt.
# (The device tool returns 8 files: these are 6.)
#     OUT=/path tools/profile_fill.sh     (~3-4 min)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
[[ -d build-device/pypkg/openmla ]] || tools/layout_pypkg.sh "$ROOT/build-device" || exit 1
export PYTHONPATH="$ROOT/build-device/pypkg"
log="$OUT/ncu.log"
: >"$log"
rep_dir="$(mktemp -d)"
for form in ring slots; do
  slots=0
  [[ $form == slots ]] && slots=1
  rep="$rep_dir/fill_$form"
  OPENMLA_SPARSE_RING=1 OPENMLA_SPARSE_SLOTS=$slots timeout 240 ncu --set full \
    --import-source yes -f -k regex:sparse_decode_kernel -s 1 -c 1 -o "$rep" \
    python3 tools/probe_fill_bound.py --once fp8_v32 >>"$log" 2>&1
  echo "ncu $form: rc $?" | tee -a "$log"
  [[ -f "$rep.ncu-rep" ]] || continue
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/fill_${form}_sass.csv" 2>>"$log"
  ncu --import "$rep.ncu-rep" --page details --csv >"$OUT/fill_${form}_details.csv" 2>>"$log"
done
timeout 180 python3 tools/probe_fill_bound.py --setting OPENMLA_SPARSE_RING=1 \
  --setting OPENMLA_SPARSE_RING=1,OPENMLA_SPARSE_SLOTS=1 >"$OUT/probe.txt" 2>&1
echo "probe: rc $?" | tee -a "$OUT/probe.txt"
# 3. the decode's own rate: e4m3 -> bf16 today against e4m3 -> fp16 (bench/bench_decode_rate.cu)
timeout 60 build-device/bench/openmla_bench_decode_rate >"$OUT/decode_rate.txt" 2>&1
echo "decode rate: rc $?" | tee -a "$OUT/decode_rate.txt"
