#!/usr/bin/env python3
"""Where a sparse decode kernel's warps wait, by warpgroup: an ncu source page (one row per SASS
instruction, `ncu --import REP --page source --csv --print-source sass`, as research/profile_fill.sh
writes it) joined with the same kernel's inlining chains (`nvdisasm -gi` of a cubin built with
-lineinfo). Each instruction goes to the role whose call in sparse_decode_kernel (kernel.cuh)
its chain passes through: the producer's fills, WG1 or WG0 (their consume calls); the rest is the
prologue. Prints each role's share of the samples, the warp instructions it executed, its top stall reasons and the
share spent spinning on mbarriers (try-wait loops) and waiting for wgmmas.

The cubin must hold the profiled kernel's exact SASS (the opcodes are compared): build the
instantiation here with the device build's flags (-O3 -lineinfo, sm_90a) and check with
cuobjdump that it matches, or take it from the device build.

  python3 research/stalls_by_role.py fill_ring1_sass.csv ring_dense_d576.cubin [--kernel 'Li1EE']
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import subprocess
import sys


def chains(cubin: str, kernel: str):
    """(opcode, inlining chain) of every instruction of the first function matching `kernel`."""
    text = subprocess.run(["nvdisasm", "-gi", "-c", cubin], capture_output=True, text=True,
                          check=True).stdout
    out, pending, last, inside = [], [], "", False
    for line in text.splitlines():
        if line.strip().startswith(".text."):
            if inside:
                break
            inside = "sparse_decode_kernel" in line and kernel in line
            continue
        if not inside:
            continue
        if line.startswith("\t//## File"):
            pending.append(line)
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            if pending:
                last, pending = "\n".join(pending), []
            out.append((m.group(2), last))
    return out


def role_lines(instr):
    """The kernel's call lines of its roles, from the chains themselves (the source may have
    moved since the cubin was built): each instruction's outermost kernel.cuh line; the lines
    holding at least 1% of the code are the calls, the last two in source order WG1's and WG0's
    consume, the ones before them the producer's forms."""
    count = collections.Counter()
    for _, chain in instr:
        ks = re.findall(r'kernel\.cuh", line (\d+)', chain)
        if ks:
            count[int(ks[-1])] += 1
    heavy = sorted(l for l, n in count.items() if n >= len(instr) // 100)
    if len(heavy) < 3:
        raise SystemExit("could not find the roles' call lines in the chains")
    return set(heavy[:-2]), heavy[-2], heavy[-1]


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sass_csv")
    ap.add_argument("cubin")
    ap.add_argument("--kernel", default="", help="a substring of the kernel's mangled name")
    args = ap.parse_args(argv)
    instr = chains(args.cubin, args.kernel)
    rows = list(csv.reader(open(args.sass_csv)))
    hdr = rows[1]
    data = rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    if len(data) != len(instr):
        print(f"{len(data)} profiled instructions, {len(instr)} in the cubin: not the same kernel")
        return 1
    bad = sum(a.split()[0].split(".")[0] != r[ix["Source"]].split()[0].split(".")[0]
              for (a, _), r in zip(instr, data))
    if bad > len(data) // 100:
        print(f"{bad} opcodes differ: not the same SASS")
        return 1
    prod, wg1, wg0 = role_lines(instr)

    def role(chain: str) -> str:
        ks = [int(x) for x in re.findall(r'kernel\.cuh", line (\d+)', chain)]
        outer = ks[-1] if ks else -1
        if "producer.cuh" in chain or outer in prod:
            return "producer"
        if outer == wg1:
            return "WG1"
        if outer == wg0:
            return "WG0"
        return "prologue"

    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    agg = collections.defaultdict(collections.Counter)
    samples, spin, wgmma = collections.Counter(), collections.Counter(), collections.Counter()
    issued = collections.Counter()  # warp-level instructions executed, the whole grid
    for (op, chain), r in zip(instr, data):
        who = role(chain)
        n = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        samples[who] += n
        issued[who] += int((r[ix["Instructions Executed"]] or "0").replace(",", ""))
        for s in stalls:
            agg[who][s] += int(r[ix[s]] or 0)
        if "SYNCS" in op or "NANOSLEEP" in op or (" BRA " in f" {op}" and "@" in op and n > 0
                                                  and r[ix["stall_long_sb"]] not in ("", "0")):
            spin[who] += n
        if "WARPGROUP.DEPBAR" in op:
            wgmma[who] += n
    total = sum(samples.values()) or 1
    for who in ("WG0", "WG1", "producer", "prologue"):
        n = samples[who] or 1
        top = ", ".join(f"{s[6:]} {v / max(1, sum(agg[who].values())):.2f}"
                        for s, v in agg[who].most_common(5))
        print(f"{who:9s} {samples[who] / total:5.2f} of the samples, {issued[who] / 1e6:6.2f} M "
              f"instructions; mbarrier spins {spin[who] / n:.2f}, wgmma waits "
              f"{wgmma[who] / n:.2f}; {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
