#!/usr/bin/env bash
# Diagnostics of the SM90 dense decode kernel on the GPU device, after tools/device_check.sh built
# build-device/: for each b = 128 shape (s_q,h_q,seqlen) it times the kernel on its normal cache
# and on a cache held in L2 (every request reads the same 256 blocks: loads then cost ~nothing),
# then asks ncu (clocks left alone) for the tensor pipe's activity and the warps' stall reasons.
#
# With TRACE=n it also builds build-trace/ (OPENMLA_DENSE_DECODE_TRACE=ON) and prints the clock64
# timeline of one CTA's first n pairs for each shape, normal and L2-resident, and every CTA's span;
# NCU=0 skips ncu.
#
#   OUT=/dir [TRACE=24] research/profile_dense_decode.sh [s_q,h_q,seqlen ...]
#   (default shapes: 1,128,4096 1,16,8192)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="${BUILD_DIR:-$ROOT/build-device}/bench/openmla_bench_dense_decode"
OUT="${OUT:-$ROOT/build-device-out}"
mkdir -p "$OUT"
LOG="$OUT/profile.txt"
shapes=("$@")
[[ ${#shapes[@]} -eq 0 ]] && shapes=(1,128,4096 1,16,8192)
METRICS="sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
METRICS+=",sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum"
METRICS+=",lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum"
METRICS+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"
TRACE_BENCH=""
if [[ -n "${TRACE:-}" ]]; then
  TRACE_DIR="$ROOT/build-trace"
  {
    cmake -S "$ROOT" -B "$TRACE_DIR" -G Ninja -DOPENMLA_CUDA=ON -DOPENMLA_FETCH_CUTLASS=OFF \
      -DCMAKE_BUILD_TYPE=Release -DOPENMLA_DENSE_DECODE_TRACE=ON &&
      cmake --build "$TRACE_DIR" -j "$(nproc)" --target openmla_bench_dense_decode
  } >"$OUT/trace_build.log" 2>&1 && TRACE_BENCH="$TRACE_DIR/bench/openmla_bench_dense_decode"
  [[ -z "$TRACE_BENCH" ]] && echo "trace build failed: $OUT/trace_build.log" >>"$LOG"
fi
for sh in "${shapes[@]}"; do
  {
    echo "===== shape s_q,h_q,seqlen = $sh"
    echo "-- normal cache"
    OPENMLA_BENCH_SHAPE=$sh timeout 120 "$BENCH" | tail -n 2
    echo "-- L2-resident cache (256 blocks)"
    OPENMLA_BENCH_L2_RESIDENT=256 OPENMLA_BENCH_SHAPE=$sh timeout 120 "$BENCH" | tail -n 2
    [[ "${NCU:-1}" != 0 ]] && echo "-- ncu (normal cache, one launch)" &&
    OPENMLA_BENCH_SHAPE=$sh timeout 180 ncu --clock-control none -k regex:dense_decode_kernel -c 1 \
      --metrics "$METRICS" "$BENCH" 2>&1 | grep -E '^\s+(sm__|smsp__|lts__|dram__|gpu__)' |
      awk '$NF != "0" && $NF != "0.00"'
    if [[ -n "$TRACE_BENCH" ]]; then
      echo "-- timeline (normal cache)"
      OPENMLA_BENCH_TRACE=$TRACE OPENMLA_BENCH_SHAPE=$sh timeout 120 "$TRACE_BENCH"
      echo "-- timeline (L2-resident cache)"
      OPENMLA_BENCH_L2_RESIDENT=256 OPENMLA_BENCH_TRACE=$TRACE OPENMLA_BENCH_SHAPE=$sh \
        timeout 120 "$TRACE_BENCH"
    fi
  } >>"$LOG" 2>&1
done
# The timelines' steady-state medians, one row a role (research/timeline_summary.py).
if [[ -n "$TRACE_BENCH" ]]; then
  { echo "-- steady-state medians"; python3 "$ROOT/research/timeline_summary.py" "$LOG"; } >>"$LOG" 2>&1
fi
cat "$LOG"
