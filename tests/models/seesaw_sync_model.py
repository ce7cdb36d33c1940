#!/usr/bin/env python3
"""A model of the sparse kernel's seesaw synchronisation (src/cuda/sm90/sparse_decode/kernel.cuh
consume, fill_rows.cuh produce_halves), run on the CPU under many random
interleavings to find deadlocks and buffer races before a GPU does. It mirrors the order of every
barrier operation and every shared-memory buffer access of the three warpgroups, for the seesaw
order with staggered maxima (the kernel's) and the plain seesaw order; each warpgroup is one agent
(its four warps act alike), each named barrier counts warpgroups (128 threads each), each
mbarrier counts warp arrivals.

Checked, for tile counts 0..8 and many schedules each:
  * no deadlock (some agent can always move until all are done);
  * a named barrier's generation never takes two arrivals from one warpgroup (a bar.arrive run
    twice before the other side's bar.sync would complete it early);
  * every read of a buffer (a stage half, P of stage s, the row-max slots) sees the version its
    reader expects, i.e. no write lands between the write a read depends on and that read.

  python3 tests/models/seesaw_sync_model.py [--schedules 2000] [--order all|seesaw|stagger]
  python3 tests/models/seesaw_sync_model.py --self-test [--schedules 300]

Keep it in step with kernel.cuh and produce_halves: a change to the order of barriers or
buffer accesses there is a change here. Exit status 1 on any finding.
"""
from __future__ import annotations

import argparse
import random
import sys

from sync_model import Finding, check_configurations, run_agents, self_test


class World:
    def __init__(self, n_tiles: int, stagger: bool, d576: bool, mutation: str = ""):
        self.mut = mutation  # a deliberate bug (--self-test: each must be found)
        self.n_tiles = n_tiles
        self.stagger = stagger
        self.n = 1  # parts a half (kParts / 2; the quarter-stage barriers had 2, since removed)
        # d 576: stage 0's P lives in its RoPE piece (R half), written by the producer's R0 fill
        self.p0 = "rope0" if d576 else "P0"
        # mbarriers (kParts stage + part, part = half n + q): arrivals needed per phase, and
        # [arrivals so far, completed phases]
        n = self.n
        self.full_need = [4] * (4 * n)
        # L0: WG0 only, R0 and L1: both, R1: WG1 only
        self.empty_need = [4 if (i // (2 * n)) == (i % (2 * n)) // n else 8 for i in range(4 * n)]
        self.full = [[0, 0] for _ in range(4 * n)]
        self.empty = [[0, 0] for _ in range(4 * n)]
        # named barriers: id -> (arrivals this generation by wg, generation)
        self.named: dict[int, list] = {}
        # buffer versions: name -> (value tag)
        self.buf: dict[str, object] = {}

    # --- mbarriers -------------------------------------------------------------------------
    def mb_arrive(self, bars, need, i, n=1):
        bars[i][0] += n
        if bars[i][0] > need[i]:
            raise Finding(f"mbarrier {i}: {bars[i][0]} arrivals for a phase of {need[i]}")
        if bars[i][0] == need[i]:
            bars[i][0] = 0
            bars[i][1] += 1

    @staticmethod
    def mb_ready(bars, i, parity):
        # try_wait.parity(P): true once the phase with parity P has completed, i.e. the number
        # of completed phases has parity != P ... as for a barrier whose current phase is
        # `completed` (phase k is current, phases < k completed): wait(P) passes iff
        # (completed & 1) != P.
        return (bars[i][1] & 1) != parity

    def nb_state(self, bid):
        return self.named.setdefault(bid, [set(), 0])

    # --- buffers ---------------------------------------------------------------------------
    def write(self, name, tag):
        self.buf[name] = tag

    def read(self, name, expect, who):
        got = self.buf.get(name)
        if got != expect:
            raise Finding(f"{who} read {name}: expected {expect}, found {got}")


# Each agent is a generator yielding a predicate (callable -> bool) it waits for; the scheduler
# runs an agent until it yields a predicate that is false.

def producer(w: World):
    n = w.n_tiles
    it = 0
    while 2 * it < n:
        odd = (w.stagger and w.mut != "no_zero_tile") or 2 * it + 1 < n

        def fill(s, h, it=it):
            for q in range(w.n):
                b = 2 * w.n * s + w.n * h + q
                yield lambda b=b: w.mb_ready(w.empty, b, (it & 1) ^ 1)
                tile = 2 * it + s
                w.write(f"part{s}{w.n * h + q}", ("tile", tile))
                if s == 0 and h == 1 and q == w.n - 1 and w.p0 == "rope0":
                    w.write("rope0", ("tile", tile))  # the RoPE piece goes with R's last part
                w.mb_arrive(w.full, w.full_need, b, 4)

        yield from fill(0, 0)
        if odd:
            yield from fill(1, 1)
        yield from fill(0, 1)
        if odd:
            yield from fill(1, 0)
        it += 1


class Named:
    """bar.sync / bar.arrive with generation tracking per warpgroup."""

    def __init__(self, w: World):
        self.w = w

    def arrive(self, bid, wg):
        st = self.w.nb_state(bid)
        if wg in st[0]:
            raise Finding(f"named barrier {bid}: warpgroup {wg} arrived twice in one generation")
        gen = st[1]
        st[0].add(wg)
        if len(st[0]) == 2:
            st[0] = set()
            st[1] += 1
        return gen

    def sync(self, bid, wg):
        gen = self.arrive(bid, wg)
        st = self.w.nb_state(bid)
        yield lambda: st[1] > gen


def consumer(w: World, wg: int, nb: Named):
    n = w.n_tiles
    n_iter = (n + 1) // 2
    own, other = wg, wg ^ 1
    first_half, second_half = wg, wg ^ 1
    pv_half = wg
    who = f"WG{wg}"

    parts = w.n  # parts a half

    def own_qk(it):
        phase = it & 1
        tile = 2 * it + own
        for half in (first_half, second_half):
            for q in range(parts):
                b = 2 * parts * own + parts * half + q
                yield lambda b=b: w.mb_ready(w.full, b, phase)
                w.read(f"part{own}{parts * half + q}", ("tile", tile), who)
        if own == 0 and w.p0 == "rope0":
            w.read("rope0", ("tile", tile), who)  # the RoPE piece, read by QK^T
        for q in range(parts):
            w.mb_arrive(w.empty, w.empty_need, 2 * parts * own + parts * (pv_half ^ 1) + q, 4)

    def pv(stage, it):
        if w.mut == "pv_hands_back_before_reading":  # every part back before the group reads it
            for q in range(parts):
                w.mb_arrive(w.empty, w.empty_need, 2 * parts * stage + parts * pv_half + q, 4)
            yield lambda: True
            for q in range(parts):
                w.read(f"part{stage}{parts * pv_half + q}", ("tile", 2 * it + stage), who)
            return
        for q in range(parts):  # each part handed back as its group completes
            w.read(f"part{stage}{parts * pv_half + q}", ("tile", 2 * it + stage), who)
            w.mb_arrive(w.empty, w.empty_need, 2 * parts * stage + parts * pv_half + q, 4)

    if not w.stagger:
        for it in range(n_iter):
            mine = 2 * it + wg < n
            theirs = 2 * it + other < n
            if mine:
                yield from own_qk(it)
            w.write(f"xmax{wg}", ("max", it))
            yield from nb.sync(6, wg)
            w.read(f"xmax{other}", ("max", it), who)
            if mine:
                w.write(w.p0 if own == 0 else "P1", ("P", 2 * it + own))
                nb.arrive(1 + own, wg)
            if mine:
                yield from pv(own, it)
            if theirs:
                yield from nb.sync(1 + other, wg)
                w.read(w.p0 if other == 0 else "P1", ("P", 2 * it + other), who)
                yield from pv(other, it)
    else:
        for it in range(n_iter):
            yield from own_qk(it)
            if wg == 0:
                w.write("xmax0", ("first", it))
                nb.arrive(6, 0)
                w.write(w.p0, ("P", 2 * it))
                nb.arrive(1, 0)
                yield from pv(0, it)
                if w.mut == "wg0_no_final_wait":
                    nb.arrive(7, 0)
                else:
                    yield from nb.sync(7, 0)
                w.read("xmax1", ("final", it), who)
                yield from nb.sync(2, 0)
                w.read("P1", ("P", 2 * it + 1), who)
                yield from pv(1, it)
            else:
                if w.mut == "wg1_no_max_wait":
                    nb.arrive(6, 1)
                else:
                    yield from nb.sync(6, 1)
                w.read("xmax0", ("first", it), who)
                w.write("xmax1", ("final", it))
                nb.arrive(7, 1)
                w.write("P1", ("P", 2 * it + 1))
                nb.arrive(2, 1)
                yield from pv(1, it)
                yield from nb.sync(1, 1)
                if w.mut == "wg1_releases_r0_early":  # R0 handed back before P0 and V_R are read
                    for q in range(parts):
                        w.mb_arrive(w.empty, w.empty_need, parts + q, 4)
                    yield lambda: True  # (the producer may run here)
                    w.read(w.p0, ("P", 2 * it), who)
                    w.read(f"part0{parts}", ("tile", 2 * it), who)
                else:
                    w.read(w.p0, ("P", 2 * it), who)
                    yield from pv(0, it)
    # the row sums (and the stagger's maxima) through the xmax buffer, one barrier
    if wg == 1:
        w.write("sums", ("sums",))
        if w.stagger:
            w.write("xmax0", ("mtrue",))
    yield from nb.sync(6, wg)
    if wg == 0:
        w.read("sums", ("sums",), who)
        if w.stagger:
            w.read("xmax0", ("mtrue",), who)


def run_one(n_tiles: int, stagger: bool, d576: bool, rng: random.Random,
            mutation: str = "") -> None:
    w = World(n_tiles, stagger, d576, mutation)
    nb = Named(w)
    agents = {"producer": producer(w), "WG0": consumer(w, 0, nb), "WG1": consumer(w, 1, nb)}
    run_agents(agents, rng)
    # every stage half the producer filled was released (the barriers end balanced)
    for i in range(len(w.empty)):
        if w.empty[i][0] != 0:
            raise Finding(f"empty barrier {i} ends with {w.empty[i][0]} stray arrivals")


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--order", choices=("all", "seesaw", "stagger"), default="all")
    ap.add_argument("--self-test", action="store_true",
                    help="check that each deliberate bug of the stagger is found")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(("no_zero_tile", "wg1_no_max_wait", "wg0_no_final_wait",
                         "wg1_releases_r0_early", "pv_hands_back_before_reading"), 8, args.schedules,
                         lambda n_tiles, rng, mutation: run_one(n_tiles, True, True, rng, mutation))
    orders = {"all": (False, True), "seesaw": (False,), "stagger": (True,)}[args.order]
    return check_configurations(
        [(f"{('stagger' if stagger else 'seesaw') + (' d576' if d576 else ' d512'):13s} "
          f"tiles {n_tiles}", 1000 * n_tiles + 10 * stagger + d576,
          lambda rng, n_tiles=n_tiles, stagger=stagger, d576=d576:
              run_one(n_tiles, stagger, d576, rng))
         for stagger in orders for d576 in (False, True) for n_tiles in range(0, 9)],
        args.schedules)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
