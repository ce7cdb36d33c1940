#!/usr/bin/env python3
"""A clock-level model of sparse prefill's compute orders (src/cuda/sm90/sparse_decode/kernel.cuh,
bf16 tiles by cp.async, d_qk 512, one 64-head CTA on one SM), for ranking orders before spending
device time on them, as research/pair_model.py does for dense decode. A ranking aid, not a forecast.

What is modelled, tick by tick (TICK clocks), over many rounds of two 64-key tiles:
- the tensor pipe, shared by the two compute warpgroups: each warpgroup's wgmma groups run in its
  issue order; a warpgroup alone gets SOLO of the pipe's peak rate (one warpgroup's m64n64 / n256
  groups do not fill it: pair_model.py's fitted 193 clocks a 64^3 piece against 128 at peak),
  two at once share all of it;
- the fill: the producer waits for a half-stage (32 KB, or a whole 64 KB stage in the default
  order) to be handed back, spends ISSUE clocks a half issuing its copies, and the bytes then
  share one L2 -> SM stream of RATE bytes a clock (the SM's share of the L2) and land LAT clocks
  after they stream;
- each compute warpgroup: the kernel's steps in order; named barriers as events.

Orders: "default" (WG0: every QK^T, the softmax and P V_L, the previous tile's P V completing under
the next QK^T; WG1: P V_R), "seesaw" (committed: each warpgroup the QK^T of alternate tiles, both
maxima exchanged at one barrier), "stagger" (OPENMLA_SPARSE_STAGGER=1) and "stagger_r0" (the
stagger with WG1's P V on R0 first and its softmax under it: sparse_prefill/NOTES.md lever 2b) and
"stagger_defer" (the stagger with each warpgroup's second P V completing under its next QK^T:
lever 2).

Calibration (H100 80GB HBM3, 8c69143, d 512, h_q 64, s_kv 8192: 4096 tokens x 16 rounds over 132
SMs, ~496 rounds an SM; clocks at 1.75-1.98 GHz): the seesaw 2594 µs is 9.2k-10.3k clocks a round,
the default order (0.613x against the seesaw's 0.646x in the same job) 9.7k-10.9k, FlashMLA's
1710 µs 6.0k-6.8k. RATE = 22 B/clk is FlashMLA's 5.0-5.4 TB/s shared by 132 SMs. SOLO 0.66 (the
fit of pair_model.py), LAT 1200 and ISSUE 600 put the seesaw at 10.2k and the default order at
10.8k (1.06x; measured 1.054x); --fit prints the grid around them. Model findings (2026-12-05):
the stagger 1.14-1.17x the seesaw over the whole grid; lever 2b 1.07-1.11x (below the stagger);
lever 2 (the second P V completing under the next QK^T) 0.91-1.01x, and in its first form a
deadlock (each warpgroup's deferred release waits, through the refill, on the other's); with a
free fill the stagger would take 4.9k clocks: the fill is the bound. Where the stagger still
waits (instrumented run): the producer waits for L0 53% of the time (L0 goes back only after
WG0's own P V, and its refill, ~3.3k clocks of issue, stream and latency, closes the loop back
to WG0's next QK^T). Finer buffers cut that loop: with --parts 2 (a barrier pair for every 128
dims) the stagger takes 7.6k clocks (1.34x the seesaw), with --parts 4 7.0k (1.47x); with a cost
of 50-100 peak clocks a wgmma group (--group) still 7.3k-8.3k (1.28-1.43x). At d 576 (--d 576:
the RoPE piece rides with R) the seesaw is 1.08x the default order (measured at h_q 64:
1.04-1.06x), the stagger 1.11x the seesaw, the quarters 1.31x.

    python3 research/seesaw_model.py            # every order at the fitted parameters
    python3 research/seesaw_model.py --parts 2  # the seesaw orders with a barrier pair a quarter
    python3 research/seesaw_model.py --d 576    # d_qk 576
    python3 research/seesaw_model.py --fit      # the calibration grid
"""
from __future__ import annotations

import argparse
import itertools

PIECE = 128      # peak clocks of one 64 x 64 x 64 MMA piece
SOFTMAX = 420    # mask, row max, exp, P to registers and shared memory (pair_model.py)
MAX_XCHG = 80    # a row-max exchange through shared memory around a named barrier
LOAD_P = 120     # the other warpgroup's P from shared memory
RESCALE = 60     # O *= factor
ISSUE_MMA = 30   # issuing a wgmma group
WAIT_LAT = 60    # a wgmma wait returning after its group is done
HALF = 32768     # bytes of a half-stage at d 512 (64 keys x 256 dims x 2 B)
ROPE = 0         # --d 576: the RoPE piece (8 KB, one more 64-dim QK^T piece) goes with R
PARTS = 1        # buffers (barrier pairs) a half-stage: --parts
GROUP = 0        # peak clocks a wgmma group costs beyond its work (its fence, commit, drain): --group
TICK = 4


class Sim:
    def __init__(self, solo, lat, issue, rate, order):
        self.solo, self.lat, self.issue, self.rate = solo, lat, issue, rate
        self.order = order
        self.t = 0
        self.queue = {0: [], 1: []}   # per warpgroup: [name, remaining peak clocks]
        self.done = {}                # job name -> time done (+ WAIT_LAT when waited)
        self.stream = []              # [key, remaining bytes]
        self.landing = []             # (time, key)
        self.landed = set()
        self.released = {}            # (stage, half, round) -> releases
        self.events = set()
        self.marks = {}
        self.busy = 0.0
        whole = order == "default"
        self.need = {(0, 0): 2, (1, 0): 2} if whole else {(0, 0): 1, (0, 1): 2, (1, 0): 2, (1, 1): 1}

    def tick(self):
        active = [wg for wg in (0, 1) if self.queue[wg]]
        share = (1.0 if len(active) == 2 else self.solo) / max(len(active), 1)
        for wg in active:
            job = self.queue[wg][0]
            job[1] -= share * TICK
            self.busy += share * TICK
            if job[1] <= 0:
                self.done[job[0]] = self.t + TICK
                self.queue[wg].pop(0)
        budget = self.rate * TICK
        while self.stream and budget > 0:
            take = min(budget, self.stream[0][1])
            self.stream[0][1] -= take
            budget -= take
            if self.stream[0][1] <= 0:
                self.landing.append((self.t + TICK + self.lat, self.stream[0][0]))
                self.stream.pop(0)
        for when, key in list(self.landing):
            if when <= self.t + TICK:
                self.landed.add(key)
                self.landing.remove((when, key))
        self.t += TICK


def agent(sim: Sim, steps):
    """Runs a list of steps; yields while blocked or busy."""
    for step in steps:
        kind = step[0]
        if kind == "cpu":
            end = sim.t + step[1]
            while sim.t < end:
                yield
        elif kind == "mma":
            sim.queue[step[1]].append([step[2], step[3] + GROUP])
            end = sim.t + ISSUE_MMA
            while sim.t < end:
                yield
        elif kind == "wait_job":
            while step[1] not in sim.done or sim.t < sim.done[step[1]] + WAIT_LAT:
                yield
        elif kind == "wait_full":
            while step[1] not in sim.landed:
                yield
        elif kind == "wait_empty":
            s, h, r = step[1]
            if r > 0:
                half = h if sim.order == "default" else h // PARTS
                while sim.released.get((s, h, r - 1), 0) < sim.need[(s, half)]:
                    yield
        elif kind == "fill":
            end = sim.t + sim.issue * step[2] // HALF
            while sim.t < end:
                yield
            sim.stream.append([step[1], step[2]])
        elif kind == "release":
            sim.released[step[1]] = sim.released.get(step[1], 0) + 1
        elif kind == "signal":
            sim.events.add(step[1])
        elif kind == "await":
            while step[1] not in sim.events:
                yield
        elif kind == "mark":
            sim.marks[step[1]] = sim.t
        else:
            raise ValueError(step)


def producer_steps(order, rounds):
    steps = []
    for r in range(rounds):
        if order == "default":
            for s in (0, 1):
                steps += [("wait_empty", (s, 0, r)), ("fill", (s, 0, r), 2 * HALF + ROPE * HALF // 4)]
        else:
            for s, h in ((0, 0), (1, 1), (0, 1), (1, 0)):
                for q in range(PARTS):
                    steps += [("wait_empty", (s, h * PARTS + q, r)),
                              ("fill", (s, h * PARTS + q, r),
                               HALF // PARTS + (ROPE * HALF // 4 if h == 1 and q == PARTS - 1 else 0))]
    return steps


def wg_steps(order, wg, rounds):
    steps = []
    qk_half = 4 * PIECE  # 4 pieces of 64 dims
    pv = 4 * PIECE       # 64 x 256 x 64
    for r in range(rounds):
        if order == "default":
            for s in (0, 1):
                k = 2 * r + s
                if wg == 0:
                    steps += [("wait_full", (s, 0, r)),
                              ("mma", 0, ("qk", k), 2 * qk_half + ROPE * PIECE)]
                    if k > 0:  # the previous tile's P V completes under this QK^T
                        ps, pr = (k - 1) % 2, (k - 1) // 2
                        steps += [("wait_job", ("pvL", k - 1)), ("release", (ps, 0, pr))]
                    steps += [("wait_job", ("qk", k)), ("cpu", SOFTMAX), ("signal", ("P", k)),
                              ("cpu", RESCALE), ("mma", 0, ("pvL", k), pv)]
                else:
                    steps += [("await", ("P", k)), ("cpu", LOAD_P + RESCALE),
                              ("mma", 1, ("pvR", k), pv), ("wait_job", ("pvR", k)),
                              ("release", (s, 0, r))]
            steps.append(("mark", r))
            continue
        own, other = wg, 1 - wg
        first, second = wg, 1 - wg
        pv_half = wg
        t_own, t_other = 2 * r + own, 2 * r + other
        n = PARTS  # buffers a half-stage (each with its own barriers): (stage, half * n + q)
        qk = []
        for i, half in enumerate((first, second)):
            for q in range(n):
                qk += [("wait_full", (own, half * n + q, r)),
                       ("mma", wg, ("qk", t_own, i, q),
                        qk_half // n + (ROPE * PIECE if half == 1 and q == n - 1 else 0))]
        qk += [("wait_job", ("qk", t_own, 1, n - 1))]
        qk += [("release", (own, (pv_half ^ 1) * n + q, r)) for q in range(n)]

        def pv_of(stage, tile):
            steps_pv = [("mma", wg, ("pv", wg, tile, q), pv // n) for q in range(n)]
            for q in range(n):  # each part handed back as its group completes
                steps_pv += [("wait_job", ("pv", wg, tile, q)), ("release", (stage, pv_half * n + q, r))]
            return steps_pv
        pv_own = pv_of(own, t_own)
        pv_other = pv_of(other, t_other)
        if order == "seesaw":
            steps += qk + [("signal", ("max", r, wg)), ("await", ("max", r, other)),
                           ("cpu", MAX_XCHG + SOFTMAX), ("signal", ("P", t_own)),
                           ("cpu", RESCALE)] + pv_own + \
                [("await", ("P", t_other)), ("cpu", LOAD_P)] + pv_other
        elif order == "stagger_defer":
            assert n == 1, "stagger_defer is modelled with whole halves"
            # lever 2: the other tile's P V completes under the next round's QK^T (its wait and
            # its half's release move past that QK^T's issue)
            prev = [("wait_job", ("pv", wg, t_other - 2, 0)), ("release", (other, pv_half, r - 1))] \
                if r > 0 else []
            # (after the first half's QK^T issue: after the second half's, the two warpgroups
            # wait for each other's deferred release through the refill, a deadlock the model
            # found)
            qk_d = qk[:2] + prev + qk[2:]
            tail = [("mma", wg, ("pv", wg, t_other, 0), pv)]
            if wg == 0:
                steps += qk_d + [("signal", ("max", r, 0)), ("cpu", SOFTMAX),
                                 ("signal", ("P", t_own)), ("cpu", RESCALE)] + pv_own + \
                    [("await", ("final", r)), ("cpu", MAX_XCHG), ("await", ("P", t_other)),
                     ("cpu", LOAD_P)] + tail
            else:
                steps += qk_d + [("await", ("max", r, 0)), ("cpu", MAX_XCHG),
                                 ("signal", ("final", r)), ("cpu", SOFTMAX),
                                 ("signal", ("P", t_own)), ("cpu", RESCALE)] + pv_own + \
                    [("await", ("P", t_other)), ("cpu", LOAD_P)] + tail
            if r == rounds - 1:
                steps += [("wait_job", ("pv", wg, t_other, 0)), ("release", (other, pv_half, r))]
        elif order in ("stagger", "stagger_r0") and wg == 0:
            steps += qk + [("signal", ("max", r, 0)), ("cpu", SOFTMAX), ("signal", ("P", t_own)),
                           ("cpu", RESCALE)] + pv_own + \
                [("await", ("final", r)), ("cpu", MAX_XCHG), ("await", ("P", t_other)),
                 ("cpu", LOAD_P)] + pv_other
        elif order == "stagger":
            steps += qk + [("await", ("max", r, 0)), ("cpu", MAX_XCHG), ("signal", ("final", r)),
                           ("cpu", SOFTMAX), ("signal", ("P", t_own)), ("cpu", RESCALE)] + \
                pv_own + [("await", ("P", t_other)), ("cpu", LOAD_P)] + pv_other
        elif order == "stagger_r0":
            steps += qk + [("await", ("max", r, 0)), ("cpu", MAX_XCHG), ("signal", ("final", r)),
                           ("cpu", RESCALE), ("await", ("P", t_other)), ("cpu", LOAD_P),
                           ("mma", 1, ("pv", 1, t_other), pv), ("cpu", SOFTMAX),
                           ("wait_job", ("pv", 1, t_other)), ("release", (other, pv_half, r)),
                           ("signal", ("P", t_own))] + pv_own
        else:
            raise ValueError(order)
        steps.append(("mark", r))
    return steps


def run(order, solo, lat, issue, rate, rounds=24):
    sim = Sim(solo, lat, issue, rate, order)
    agents = [agent(sim, producer_steps(order, rounds)), agent(sim, wg_steps(order, 0, rounds)),
              agent(sim, wg_steps(order, 1, rounds))]
    live = list(agents)
    while live:
        for a in list(live):
            try:
                next(a)
            except StopIteration:
                live.remove(a)
        sim.tick()
        if sim.t > rounds * 100000:
            raise RuntimeError(f"{order}: the model's program does not finish (deadlock)")
    r0, r1 = rounds // 4, 3 * rounds // 4
    return (sim.marks[r1] - sim.marks[r0]) / (r1 - r0), sim.busy / (2 * 8 * PIECE * 2 * rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solo", type=float, default=0.66)
    ap.add_argument("--lat", type=int, default=1200)
    ap.add_argument("--issue", type=int, default=600)
    ap.add_argument("--rate", type=float, default=22.0)
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--group", type=int, default=0)
    ap.add_argument("--d", type=int, default=512, choices=(512, 576),
                    help="576: the RoPE piece rides with R (8 KB more to fill, one more QK^T piece)")
    ap.add_argument("--parts", type=int, default=1, choices=(1, 2, 4),
                    help="barrier pairs a half-stage in the seesaw orders (4: one a 64-dim piece)")
    args = ap.parse_args()
    global PARTS, GROUP, ROPE
    PARTS, GROUP, ROPE = args.parts, args.group, 1 if args.d == 576 else 0
    if args.fit:
        print("| solo | lat | issue | default | seesaw | default / seesaw (measured 9.3k / 8.8k) |")
        print("|---|---|---|---|---|---|")
        for solo, lat, issue in itertools.product((0.5, 0.66, 0.8), (600, 1200, 2000),
                                                  (300, 600, 1200)):
            d, _ = run("default", solo, lat, issue, args.rate)
            s, _ = run("seesaw", solo, lat, issue, args.rate)
            print(f"| {solo} | {lat} | {issue} | {d:.0f} | {s:.0f} | {d / s:.2f} |")
        return
    print(f"solo {args.solo}, fill latency {args.lat} clk, issue {args.issue} clk a half, stream "
          f"{args.rate} B/clk; tensor work a round at peak {2 * 2 * 8 * PIECE} clk")
    print("| order | clocks a round | vs seesaw |")
    print("|---|---|---|")
    base = run("seesaw", args.solo, args.lat, args.issue, args.rate)[0]
    orders = ("default", "seesaw", "stagger", "stagger_r0", "stagger_defer") if PARTS == 1 else \
        ("seesaw", "stagger")
    for order in orders:
        per_round, _ = run(order, args.solo, args.lat, args.issue, args.rate)
        print(f"| {order} | {per_round:.0f} | {base / per_round:.2f}x |")


if __name__ == "__main__":
    main()
