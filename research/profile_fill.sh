#!/usr/bin/env bash
# Where the ring fill's time goes (GPU diagnostic; sparse_decode/NOTES.md "where the time goes").
# After tools/device_check.sh has built build-device/ in the same warm machine:
#   1. ncu (full set, source correlated) of one dense-mode launch with its keys in L2
#      (research/probe_fill_bound.py --once) for each entry of PROFILES, "NAME:FORMAT:ARGS:ENV"
#      (ARGS: probe_fill_bound.py's shape arguments, ENV: switches, both comma-separated), by
#      default the slot ring over fp8_model1 at h_q 16 (slots16) and over fp8_v32 at h_q 128
#      on 16-tile splits, unpaired (slots128): $OUT/fill_NAME_sass.csv (the source page, one row
#      per SASS instruction; at most 3 profiles) and fill_NAME_details.csv; logs in $OUT/ncu.log.
#      Split the samples by warpgroup here with research/stalls_by_role.py and a cubin of the same
#      kernel;
#   2. with PROBE=1, research/probe_fill_bound.py (keys from DRAM vs L2) with the default fill, the
#      ring's two forms: $OUT/probe.txt; with RATE=1, bench/bench_decode_rate.cu: clocks a
#      16-code chunk, the bf16 decode against fp16's: $OUT/decode_rate.txt.
# (The device tool returns 8 files.)
#     OUT=/path research/profile_fill.sh     (~1 min a profile)
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
PROFILES="${PROFILES:-slots16:fp8_model1:--h-q,16,--seqlen,8192: slots128:fp8_v32:--h-q,128,--seqlen,1024:}"
for entry in $PROFILES; do
  IFS=: read -r name fmt args envs <<<"$entry"
  read -r -a shape_args <<<"${args//,/ }"
  read -r -a env_args <<<"${envs//,/ }"
  rep="$rep_dir/fill_$name"
  env "${env_args[@]}" timeout 240 ncu --set full \
    --import-source yes -f -k regex:sparse_decode_kernel -s 1 -c 1 -o "$rep" \
    python3 research/probe_fill_bound.py --once "$fmt" "${shape_args[@]}" >>"$log" 2>&1
  echo "ncu $name ($fmt ${shape_args[*]} ${env_args[*]}): rc $?" | tee -a "$log"
  [[ -f "$rep.ncu-rep" ]] || continue
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/fill_${name}_sass.csv" 2>>"$log"
  ncu --import "$rep.ncu-rep" --page details --csv >"$OUT/fill_${name}_details.csv" 2>>"$log"
done
[[ "${PROBE:-0}" == 1 ]] || exit 0
timeout 180 python3 research/probe_fill_bound.py \
  --setting OPENMLA_SPARSE_RING=1,OPENMLA_SPARSE_SLOTS=0 --setting OPENMLA_SPARSE_RING=1 \
  >"$OUT/probe.txt" 2>&1
echo "probe: rc $?" | tee -a "$OUT/probe.txt"
[[ "${RATE:-0}" == 1 ]] || exit 0
# 3. the decode's own rate: e4m3 -> bf16 today against e4m3 -> fp16 (bench/bench_decode_rate.cu)
timeout 60 build-device/bench/openmla_bench_decode_rate >"$OUT/decode_rate.txt" 2>&1
echo "decode rate: rc $?" | tee -a "$OUT/decode_rate.txt"
