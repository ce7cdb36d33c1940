#!/usr/bin/env python3
"""Steady-state summary of the dense decode timelines that `openmla_bench_dense_decode` prints in
a trace build (research/profile_dense_decode.sh with TRACE=n): for every "timeline of CTA 0" block,
the median over the steady pairs (the first `--skip` pairs and the last one dropped) of the period
and of each stamp, in clocks after WG0's pair start, with the legend the benchmark printed.
Reading 16 rows of numbers by eye is where past sessions lost time; this prints one row a role.

    python3 research/timeline_summary.py profile.txt [--skip 4]
"""
import argparse
import re
import statistics
import sys

PAIR = re.compile(r"^pair\s+(\d+)\s+period\s+(-?\d+)\s+\|\s*WG0([-\d\s]+)\|\s*WG1([-\d\s]+)\|\s*prod([-\d\s]+)$")


def blocks(lines):
    """(title, legend lines, pair rows) for each timeline block, in order."""
    title, legend, rows, out = None, [], [], []
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("timeline of CTA 0"):
            if title is not None:
                out.append((title, legend, rows))
            title, legend, rows = line, [], []
            continue
        if title is None:
            continue
        m = PAIR.match(line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)),
                         [int(v) for v in m.group(3).split()],
                         [int(v) for v in m.group(4).split()],
                         [int(v) for v in m.group(5).split()]))
        elif not rows and line.strip():
            legend.append(line)
        elif rows:  # the block ended
            out.append((title, legend, rows))
            title, legend, rows = None, [], []
    if title is not None:
        out.append((title, legend, rows))
    return out


def median_columns(rows, index):
    cols = list(zip(*(r[index] for r in rows)))
    return [int(statistics.median(c)) for c in cols]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", default="-")
    ap.add_argument("--skip", type=int, default=4, help="leading pairs left out (the fill)")
    args = ap.parse_args()
    lines = sys.stdin.readlines() if args.file == "-" else open(args.file).readlines()
    found = blocks(lines)
    if not found:
        print("no timeline found (a trace build's output: research/profile_dense_decode.sh TRACE=n)")
        return 1
    for title, legend, rows in found:
        steady = [r for r in rows if r[0] >= args.skip and r[1] > 0]
        print(title)
        for line in legend:
            print("  " + line)
        if not steady:
            print("  (no steady pairs)")
            continue
        periods = [r[1] for r in steady]
        print(f"  pairs {steady[0][0]}-{steady[-1][0]}: period median {int(statistics.median(periods))}"
              f" (min {min(periods)}, max {max(periods)})")
        for name, index in (("WG0 1-4", 2), ("WG1 0-4", 3), ("prod 0-12", 4)):
            print(f"  {name:9s}" + "".join(f"{v:7d}" for v in median_columns(steady, index)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
