#!/usr/bin/env bash
# ncu of OpenMLA's sparse decode and FlashMLA's on the same tensors (research/ncu_sparse_pair.py),
# for the family's design record: per kernel the time, instructions, issue and tensor-pipe use,
# memory throughput and the warp stall split ($OUT/ncu_<name>_details.csv), and OpenMLA's main
# kernel source-correlated ($OUT/ncu_<name>_sass.csv: split by role here with
# research/stalls_by_role.py and the cubin of the same build). Binaries built here: carry
# build/pypkg and .peers.      OUT=/dir SHAPES="v32_h128:fp8_v32:64:2:128:2048 ..." bash $0
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:?set OUT}"
mkdir -p "$OUT" /tmp/peer
[[ -d /tmp/peer/flash_mla ]] || tar xJf .peers/flash_mla-*.tar.xz -C /tmp/peer
export PYTHONPATH="$PWD/build/pypkg:/tmp/peer"
SHAPES="${SHAPES:-v32_h128:fp8_v32:64:2:128:2048 v32_h64:fp8_v32:64:2:64:2048}"
for entry in $SHAPES; do
  IFS=: read -r name fmt b s_q h_q topk <<<"$entry"
  rep="/tmp/ncu_$name"
  timeout 150 ncu --set full --import-source yes -f --nvtx --nvtx-include "openmla/" \
    --nvtx-include "flashmla/" -o "$rep" \
    python3 research/ncu_sparse_pair.py "$fmt" "$b" "$s_q" "$h_q" "$topk" >"$OUT/ncu_$name.log" 2>&1
  echo "ncu $name: rc $?" | tee -a "$OUT/ncu.log"
  [[ -f "$rep.ncu-rep" ]] || continue
  ncu --import "$rep.ncu-rep" --page details --csv >"$OUT/ncu_${name}_details.csv" 2>>"$OUT/ncu.log"
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass -k regex:sparse_decode_kernel \
    >"$OUT/ncu_${name}_sass.csv" 2>>"$OUT/ncu.log"
done
# OpenMLA's main kernel by role (research/stalls_by_role.py): the cubin of that kernel from the
# same build (the device has cuobjdump and nvdisasm).
mkdir -p /tmp/cubins
(cd /tmp/cubins && cuobjdump -xelf all "$OLDPWD"/build/pypkg/openmla/_C*.so >/dev/null 2>&1)
for entry in $SHAPES; do
  IFS=: read -r name fmt b s_q h_q topk <<<"$entry"
  [[ -s "$OUT/ncu_${name}_sass.csv" ]] || continue
  for key in "${KERNEL_KEYS:-ILi576ELb0ELb0ELb0ELi2E}"; do
    c="$(grep -l "SparseDecodeTraits$key" /tmp/cubins/*.cubin 2>/dev/null | head -n 1)"
    [[ -n "$c" ]] || continue
    python3 research/stalls_by_role.py "$OUT/ncu_${name}_sass.csv" "$c" --kernel "$key" \
      >"$OUT/roles_$name.txt" 2>&1
  done
done
