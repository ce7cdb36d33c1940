#!/usr/bin/env bash
# The dense decode kernel's pair loop as ptxas scheduled it, without a GPU: compiles the bf16
# d 576 instantiation of this tree (or of REV) to a cubin, disassembles it and prints the
# instructions between the first and the last HGMMA with registers, predicates, labels and
# immediates normalised, so two versions compare by `diff` (session 10: any edit of the
# epilogue reshuffled ~10-20% of these 2146 lines and cost the unsplit h_q 128 rows ~1%).
#
#   research/pair_loop_sass.sh [REV] > ops.txt      (also prints spills and the line count to stderr)
#   diff <(research/pair_loop_sass.sh 0401501) <(research/pair_loop_sass.sh) | grep -c '^[<>]'
#
# Needs nvcc (CUDA 13), the CUTLASS headers in .deps/ (tools/fetch_cutlass.py) and nvdisasm
# (NVDISASM=..., default: the toolkit's; `pip download --no-deps nvidia-cuda-nvdisasm` has one).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVDISASM="${NVDISASM:-$CUDA_HOME/bin/nvdisasm}"
cutlass="$(ls -d "$ROOT"/.deps/cutlass-*/include 2>/dev/null | head -n 1)"
[[ -n "$cutlass" ]] || { echo "no .deps/cutlass-*: run tools/fetch_cutlass.py" >&2; exit 1; }
[[ -x "$NVDISASM" ]] || { echo "no nvdisasm at $NVDISASM (set NVDISASM)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
src="$ROOT"
if [[ $# -ge 1 ]]; then  # another revision's sources
  git -C "$ROOT" archive "$1" include src | tar -x -C "$work"
  src="$work"
fi
# The flags of the library's build (cmake/cuda_kernels.cmake), spill warnings not fatal here.
"$CUDA_HOME/bin/nvcc" -DOPENMLA_WITH_CUDA=1 -I"$src/include" -I"$src/src" -isystem "$cutlass" \
  -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  --expt-extended-lambda -Xptxas=-v,-warn-spills -std=c++20 -x cu -cubin \
  "$src/src/cuda/sm90/dense_decode/instantiations/dense_decode_bf16_d576_sm90.cu" \
  -o "$work/k.cubin" 2>"$work/ptxas.txt"
grep -m 1 -E "spill stores" "$work/ptxas.txt" >&2 || true
"$NVDISASM" -c "$work/k.cubin" >"$work/k.sass"
awk '/HGMMA/ { if (!s) s = NR; e = NR } { l[NR] = $0 } END { for (i = s; i <= e; i++) print l[i] }' \
  "$work/k.sass" |
  sed -E 's#^\s*/\*[0-9a-f]+\*/\s*##; s/ ;.*$//; s/\(\*[^)]*\*\)//g; s/\bU?R[0-9]+\b/R/g;
          s/\bU?P[0-9T]\b/P/g; s/\.L_x_[0-9]+/L/g; s/0x[0-9a-f]+/IMM/g' |
  grep -v '^\s*$\|^L:' | tee "$work/ops.txt"
echo "$(wc -l <"$work/ops.txt") pair-loop instructions" >&2
