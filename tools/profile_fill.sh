#!/usr/bin/env bash
# Where the ring fill's time goes (GPU diagnostic; sparse_decode/NOTES.md "next device calls").
# After tools/device_check.sh has built build-device/ in the same warm machine:
#   1. ncu (full set, source correlated) of one dense-mode launch over fp8_v32 with its keys in
#      L2 (tools/probe_fill_bound.py --once) on the ring fill (OPENMLA_SPARSE_RING=1):
#      $OUT/fill_ring1.ncu-rep, its source page per SASS instruction and per CUDA line (the
#      build has -lineinfo) and its details page, as CSV (the device tool returns 8 files);
#   2. tools/probe_fill_bound.py (keys from DRAM vs L2) with the default fill and the ring;
#   3. bench/bench_decode_rate.cu: clocks a 16-code chunk, the bf16 decode against fp16's.
#     OUT=/path tools/profile_fill.sh     (~3-4 min)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
[[ -d build-device/pypkg/openmla ]] || tools/layout_pypkg.sh "$ROOT/build-device" || exit 1
export PYTHONPATH="$ROOT/build-device/pypkg"
for ring in 1; do
  log="$OUT/ncu_ring$ring.log"
  OPENMLA_SPARSE_RING=$ring timeout 240 ncu --set full --import-source yes -f \
    -k regex:sparse_decode_kernel -s 1 -c 1 -o "$OUT/fill_ring$ring" \
    python3 tools/probe_fill_bound.py --once fp8_v32 >"$log" 2>&1
  echo "ncu ring $ring: rc $?" | tee -a "$log"
  rep="$OUT/fill_ring$ring.ncu-rep"
  [[ -f "$rep" ]] || continue
  for view in sass cuda; do
    ncu --import "$rep" --page source --csv --print-source "$view" \
      >"$OUT/fill_ring${ring}_$view.csv" 2>>"$log"
  done
  ncu --import "$rep" --page details --csv >"$OUT/fill_ring${ring}_details.csv" 2>>"$log"
done
timeout 180 python3 tools/probe_fill_bound.py --setting OPENMLA_SPARSE_RING=1 \
  >"$OUT/probe.txt" 2>&1
echo "probe: rc $?" | tee -a "$OUT/probe.txt"
# 3. the decode's own rate: e4m3 -> bf16 today against e4m3 -> fp16 (bench/bench_decode_rate.cu)
timeout 60 build-device/bench/openmla_bench_decode_rate >"$OUT/decode_rate.txt" 2>&1
echo "decode rate: rc $?" | tee -a "$OUT/decode_rate.txt"
