#!/usr/bin/env bash
# One device call: tools/device_check.sh (no benchmarks), then as many benchmarks as the call's
# time allows (LIMIT seconds in all), most wanted first.   OUT=/dir COMMIT=<hash> bash research/device_all.sh
set -u
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-585}
SKIP_BENCH=1 SKIP_CPU_TESTS=1 SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-150} bash tools/device_check.sh
S="$OUT/summary.txt"
left() { echo $(( LIMIT - SECONDS )); }
note() { echo "${SECONDS}s $*" | tee -a "$S"; }
mkdir -p /tmp/peer && [[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/build-device/pypkg:/tmp/peer"
run_b() {  # run_b NAME MAXSECONDS CMD...: runs CMD if at least 20 s are left, for at most MAX
  local name=$1 max=$2; shift 2
  local t=$(left); (( t > max )) && t=$max
  if (( t < 20 )); then note "$name skipped (no time)"; return; fi
  timeout $t "$@" >> "$OUT/bench.txt" 2>&1
  note "$name rc=$? (limit ${t}s)"
}
export PYTHONUNBUFFERED=1  # rows printed so far survive a step's timeout
run_b "fused bench" 60 python3 bench/fused_vs_unfused.py --rounds 10 --json "$OUT/fused.json"
run_b "fused ncu" 100 env PKG=build-device/pypkg SKIP_TESTS=1 SKIP_BWD=1 NCU_T=45 OUT="$OUT" bash research/device_probe.sh
run_b "mha fwd vs torch" 90 python3 bench/mha_prefill_vs_torch.py --rounds 5 --json "$OUT/mha.json"
run_b "mha bwd vs torch" 60 python3 bench/mha_prefill_backward_vs_torch.py --quick --json "$OUT/bwd.json"
run_b "sparse bench" 100 python3 bench/sparse_decode_vs_flashmla.py --rounds 8 --rows compared
run_b "latency ab" 90 bash -c 'nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -Isrc -Iinclude -I.deps/cutlass-4.2.0/include \
  -I/usr/local/cuda/include/cccl research/sparse_latency_ab.cu build-device/libopenmla.a \
  build-device/libopenmla_cuda.a build-device/libopenmla.a -lcuda -Xcompiler -fopenmp \
  -o /tmp/latency_ab && /tmp/latency_ab'
grep 'geometric mean' "$OUT/bench.txt" >> "$S"
(cd "$OUT" && ls *.json >/dev/null 2>&1 && tar czf json.tgz *.json ncu_*.txt 2>/dev/null; rm -f *.json ncu_*.txt)
true
