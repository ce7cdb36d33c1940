#!/usr/bin/env python3
"""A model of the ring fill's synchronisation (src/cuda/sm90/sparse_decode/kernel.cuh consume's
ring branches, fill_ring.cuh produce_by_ring), run on the CPU under many random interleavings to
find deadlocks and buffer races before a GPU does: the one-stage ring (two rounds of one 64-key
stage), its three round slots (traits.h kSlots), and the slots in a CTA pair (--pair; traits.h
kPairSlots, the removed produce_by_ring_pair: CTA rank r decodes the rounds n with n % 2 = r
into its slot and bulk-copies it into the peer's, completing bytes on the peer's full barrier;
each CTA's producer arrives on its full barrier for the peer's rounds with expect_tx; the compute
warps walk 32-key tiles, a round each, and release both CTAs' slots; P and the row factors cross
from WG0 to WG1 a round at a time, WG0 writing round n + 1's only after WG1 took round n's). Each
warpgroup is one agent (its four warps act alike); mbarriers count warp arrivals (and, for the
pair, transaction bytes); wgmma groups complete when their warpgroup waits for them, so a
group's reads happen at its wait (the latest the hardware may read); a bulk copy is an agent of
its own that reads its source and lands in the peer whenever it is scheduled.

Checked for tile counts 0..7, both d_qk (d 576: P in the slots' RoPE pieces), many schedules:
  * no deadlock (some agent can always move until all are done);
  * no mbarrier phase over-filled, none left with stray arrivals;
  * every read of a buffer (a round's keys and RoPE, its key mask, P, the row factors) sees the
    version its reader expects: no write lands between the write a read depends on and it.

  python3 tests/models/ring_sync_model.py [--schedules 2000] [--self-test] [--pair]

Keep it in step with kernel.cuh and fill_ring.cuh. Exit status 1 on any finding.
"""
from __future__ import annotations

import argparse
import sys

from sync_model import Finding, check_configurations, run_agents, self_test


class World:
    def __init__(self, n_tiles: int, slots: bool, d576: bool, mutation: str = ""):
        self.mut = mutation
        self.n_tiles = n_tiles
        self.slots = slots
        self.d576 = d576
        self.nb = 3 if slots else 2  # barriers: a slot each, or a round of the one stage each
        # [arrivals, completed phases, transaction units still expected (the pair's copies)]
        self.full = [[0, 0, 0] for _ in range(self.nb)]
        self.empty = [[0, 0] for _ in range(self.nb)]
        self.buf: dict[str, object] = {}
        self.p_gen = [0, 0]  # named barriers' arrivals: P0 (WG0's), P1 (WG1's; the pair's rounds)
        self.p_synced = [0, 0]  # their syncs passed (the pair's rounds: WG1's of P0, WG0's of P1)
        self.peer: World | None = None  # the pair's other CTA
        self.empty_need = 8             # 16 in a pair: both CTAs' compute warps
        self.copies: list = []          # the pair: bulk copies issued, not yet landed

    def where(self, n):
        """Round n's barrier / buffer index and the use of it (the phase parity's source)."""
        return (n % 3, n // 3) if self.slots else (n % 2, n // 2)

    def arrive(self, bars, need, i):
        bars[i][0] += 1
        if bars[i][0] > need:
            raise Finding(f"mbarrier {i}: {bars[i][0]} arrivals for a phase of {need}")
        if bars[i][0] == need:
            bars[i][0] = 0
            bars[i][1] += 1

    def arrive_full(self, i, expect_tx=0):
        """A producer warp's arrival on full[i] (4 a phase), with the transaction units it
        expects (the pair: the peer's copy of the round); the phase completes when every arrival
        is in and every expected unit has landed (units may land before they are expected)."""
        f = self.full[i]
        f[0] += 1
        f[2] += expect_tx
        if f[0] > 4:
            raise Finding(f"mbarrier full {i}: {f[0]} arrivals for a phase of 4")
        self._complete_full(i)

    def complete_tx(self, i, units):
        self.full[i][2] -= units
        self._complete_full(i)

    def _complete_full(self, i):
        f = self.full[i]
        if f[0] == 4 and f[2] == 0:
            f[0] = 0
            f[1] += 1

    @staticmethod
    def ready(bars, i, parity):  # try_wait.parity: passes once the phase of that parity is done
        return (bars[i][1] & 1) != parity

    def write(self, name, tag):
        self.buf[name] = tag

    def read(self, name, expect, who):
        got = self.buf.get(name)
        if got != expect:
            raise Finding(f"{who} read {name}: expected {expect}, found {got}")

    def p_names(self, kk):
        """Where P of tile kk lives: at d 576 over its rounds' RoPE rows (the one stage's RoPE
        piece, both halves; the slots' RoPE pieces, a half each), at d 512 in its own buffer."""
        if not self.d576:
            return ["P"]
        i0, i1 = self.where(2 * kk)[0], self.where(2 * kk + 1)[0]
        if self.mut == "p_in_wrong_slot":
            i1 = (i1 + 1) % self.nb
        return [f"rope{i0}", f"rope{i1}"]


def producer(w: World):
    rounds = 2 * w.n_tiles
    for n in range(rounds):
        i, use = w.where(n)
        yield lambda i=i, use=use: w.ready(w.empty, i, (use & 1) ^ 1)
        w.write(f"keys{i}", ("round", n))
        if w.d576:  # the round's RoPE rows (a slot's RoPE piece; the one stage's piece 8, half)
            w.write(f"rope{i}", ("round", n))
        w.write(f"valid{i}", ("round", n))
        for _ in range(4):
            w.arrive_full(i)


# The slots in a CTA pair (the removed produce_by_ring_pair): this CTA's producer walks every
# round; its own rounds (n % 2 = rank) it decodes into its slot and bulk-copies into the peer's
# (the copy reads its source and lands later, completing 4 units on the peer's full barrier), and
# at d 576 arrives on its own full barrier only once the copy has read its source (bulk
# wait_group.read: this CTA's WG0 writes P over the slot's RoPE piece once its QK^T is done; at
# d 512 it arrives at once); for the peer's rounds it arrives on its own full barrier expecting
# those 4 units (a unit each warp).
# Both wait the slot's empty barrier first: 16 arrivals, both CTAs' compute warps.
def producer_pair(w: World, rank: int):
    rounds = 2 * w.n_tiles
    for n in range(rounds):
        i, use = w.where(n)
        yield lambda i=i, use=use: w.ready(w.empty, i, (use & 1) ^ 1)
        if n % 2 == rank:
            names = [f"keys{i}", f"valid{i}"] + ([f"rope{i}"] if w.d576 else [])
            for name in names:
                w.write(name, ("round", n))
            for _ in range(4):  # each warp copies its own rows (a unit) and arrives
                copy = {"slot": i, "names": names, "read": None}
                w.copies.append(copy)
                if w.d576 and w.mut != "arrive_before_copy_read":
                    yield lambda c=copy: c["read"] is not None  # cp.async.bulk.wait_group.read 0
                w.arrive_full(i)
        else:
            for _ in range(4):
                w.arrive_full(i, 0 if w.mut == "no_expect_tx" else 1)


def copy_engine(w: World):
    """The bulk copies this CTA's producer issues, in issue order: each reads its source at some
    point after its issue, and lands in the peer at some later point."""
    for _ in range(4 * w.n_tiles):  # this CTA's rounds (one of each tile's two), a copy a warp
        yield lambda: bool(w.copies)
        copy = w.copies[0]
        copy["read"] = {name: w.buf.get(name) for name in copy["names"]}
        yield lambda: True  # (anything may run between the read and the landing)
        w.copies.pop(0)
        for name, value in copy["read"].items():
            w.peer.write(name, value)
        w.peer.complete_tx(copy["slot"], 1)


def consumer(w: World, wg: int):
    who = f"WG{wg}"
    n_tiles = w.n_tiles
    groups: list[list] = []  # issued wgmma groups: each a list of reads (name, expect)

    def wait_groups(keep):
        while len(groups) > keep:
            for name, expect in groups.pop(0):
                w.read(name, expect, who)

    def release(n):  # lane 0 of each of the warpgroup's 4 warps (and, paired, on the peer's)
        for _ in range(4):
            w.arrive(w.empty, w.empty_need, w.where(n)[0])
            if w.peer is not None and w.mut != "release_local_only":
                w.peer.arrive(w.peer.empty, w.peer.empty_need, w.where(n)[0])

    def round_reads(n, pv):  # QK^T reads a round's keys and RoPE rows, P V its first 512 dims
        i = w.where(n)[0]
        reads = [(f"keys{i}", ("round", n))]
        if not pv and w.d576:
            reads.append((f"rope{i}", ("round", n)))
        return reads

    for kk in range(n_tiles):
        n0, n1 = 2 * kk, 2 * kk + 1
        if wg == 0:
            for r, n in enumerate((n0, n1)):
                i, use = w.where(n)
                yield lambda i=i, use=use: w.ready(w.full, i, use & 1)
                groups.append(round_reads(n, False))  # QK^T of the round
                if r == 0 and kk > 0:
                    if w.mut == "wg0_releases_before_its_pv":
                        release(n - 1)
                        yield lambda: True  # (the producer may run here)
                        wait_groups(1)
                    else:
                        wait_groups(1)  # the previous tile's P V over round 1 (and older) done
                        release(n - 1)
            wait_groups(0)
            for r, n in enumerate((n0, n1)):
                w.read(f"valid{w.where(n)[0]}", ("round", n), who)
            for name in w.p_names(kk):
                w.write(name, ("P", kk))
            w.write("factors", ("tile", kk))
            w.p_gen[0] += 1  # bar.arrive P0
            groups.append(round_reads(n0, True))  # P V over round 0
            groups.append(round_reads(n1, True))  # P V over round 1
            wait_groups(1)
            release(n0)
        else:
            target = kk + 1
            yield lambda t=target: w.p_gen[0] >= t  # bar.sync P0 (WG0's arrival of tile kk)
            for n in (n0, n1):
                i, use = w.where(n)
                yield lambda i=i, use=use: w.ready(w.full, i, use & 1)
            if w.mut == "wg1_releases_before_loading_p":
                release(n0)
                yield lambda: True
            for name in w.p_names(kk):
                w.read(name, ("P", kk), who)
            w.read("factors", ("tile", kk), who)
            groups.append(round_reads(n0, True))
            groups.append(round_reads(n1, True))
            wait_groups(1)
            if w.mut != "wg1_releases_before_loading_p":
                release(n0)
            wait_groups(0)
            release(n1)
    wait_groups(0)


def consumer_rounds(w: World, wg: int):
    """The pair's compute warpgroups (kernel.cuh consume, kPairSlots): 32-key tiles, round n in
    slot n % 3; P of a round in the slot's RoPE piece (d 576) or the one P buffer (d 512), the
    factors in one buffer; named barrier P0 (WG0 -> WG1: round n's P is written) and P1 (WG1 ->
    WG0: round n's P and factors are taken; not after the last round). Each warpgroup hands a
    round back once its own P V over it is done. The producers' copies go a warp at a time."""
    who = f"WG{wg}"
    rounds = 2 * w.n_tiles
    groups: list[list] = []

    def wait_groups(keep):
        while len(groups) > keep:
            for name, expect in groups.pop(0):
                w.read(name, expect, who)

    def release(n):
        for _ in range(4):
            w.arrive(w.empty, w.empty_need, w.where(n)[0])
            if w.mut != "release_local_only":
                w.peer.arrive(w.peer.empty, w.peer.empty_need, w.where(n)[0])

    def bar_arrive(b):  # a named barrier's phase is one arrive and one sync: never two arrives
        if w.p_gen[b] > w.p_synced[b]:
            raise Finding(f"{who} arrives on named barrier P{b} again before its last sync")
        w.p_gen[b] += 1

    def p_name(n):
        return f"rope{w.where(n)[0]}" if w.d576 else "P"

    for n in range(rounds):
        i, use = w.where(n)
        keys = [(f"keys{i}", ("round", n))]
        if wg == 0:
            yield lambda i=i, use=use: w.ready(w.full, i, use & 1)
            groups.append(keys + ([(f"rope{i}", ("round", n))] if w.d576 else []))  # QK^T
            wait_groups(0)
            w.read(f"valid{i}", ("round", n), who)
            if n > 0 and w.mut != "p_without_handshake":
                yield lambda n=n: w.p_gen[1] >= n  # bar.sync P1: WG1 took round n - 1's
                w.p_synced[1] += 1
            w.write(p_name(n), ("P", n))
            w.write("factors", ("round", n))
            bar_arrive(0)
            groups.append(keys)  # P V over the round (from registers)
            if w.mut == "wg0_releases_before_its_pv":
                release(n)
                yield lambda: True  # (the producers may run here)
                wait_groups(0)
            else:
                wait_groups(0)  # the round's P V done: the round goes back
                release(n)
        else:
            yield lambda n=n: w.p_gen[0] >= n + 1  # bar.sync P0
            w.p_synced[0] += 1
            yield lambda i=i, use=use: w.ready(w.full, i, use & 1)
            w.read(p_name(n), ("P", n), who)
            w.read("factors", ("round", n), who)
            if n + 1 < rounds:
                bar_arrive(1)
            groups.append(keys)
            wait_groups(0)
            release(n)
    wait_groups(0)


def run_pair(n_tiles, d576, rng, mutation=""):
    """The slots in a CTA pair: two CTAs of three warpgroups and a copy engine each."""
    cta = [World(n_tiles, True, d576, mutation) for _ in range(2)]
    for r in range(2):
        cta[r].peer = cta[1 - r]
        cta[r].empty_need = 8 if mutation == "release_local_only" else 16
    agents = {}
    for r in range(2):
        w = cta[r]
        agents[f"producer{r}"] = producer_pair(w, r)
        agents[f"copy{r}"] = copy_engine(w)
        agents[f"WG0.{r}"] = consumer_rounds(w, 0)
        agents[f"WG1.{r}"] = consumer_rounds(w, 1)
    run_agents(agents, rng)
    for r in range(2):
        for i in range(3):
            # every round handed back by both warpgroups of both CTAs
            if cta[r].empty[i][0] != 0:
                raise Finding(f"CTA {r} empty barrier {i} ends with {cta[r].empty[i][0]} arrivals")
            if cta[r].full[i][0] != 0 or cta[r].full[i][2] != 0:
                raise Finding(f"CTA {r} full barrier {i} ends with {cta[r].full[i]}")


def run_one(n_tiles, slots, d576, rng, mutation=""):
    w = World(n_tiles, slots, d576, mutation)
    agents = {"producer": producer(w), "WG0": consumer(w, 0), "WG1": consumer(w, 1)}
    run_agents(agents, rng)
    # Every round is released by both warpgroups but the last, which WG0 never hands back (its
    # release would come with a next tile's first QK^T): 4 arrivals stay on its barrier.
    last = w.where(2 * n_tiles - 1)[0] if n_tiles else -1
    for i in range(w.nb):
        if w.empty[i][0] != (4 if i == last else 0):
            raise Finding(f"empty barrier {i} ends with {w.empty[i][0]} arrivals")


MUTATIONS = ("p_in_wrong_slot", "wg0_releases_before_its_pv", "wg1_releases_before_loading_p")
# The pair's deliberate bugs: consumers releasing only their own CTA's slots (a copy may land in
# a slot the peer still reads), the producer arriving for the peer's round without expecting its
# bytes, the producer handing its own round to its consumers before the copy has read it (at d
# 576 P overwrites the RoPE piece the copy still has to read).
# P written before WG1 took the previous round's (no P1 handshake).
PAIR_MUTATIONS = ("release_local_only", "no_expect_tx", "arrive_before_copy_read",
                  "p_without_handshake", "wg0_releases_before_its_pv")


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--self-test", action="store_true",
                    help="check that each deliberate bug of the round slots is found")
    ap.add_argument("--pair", action="store_true",
                    help="the slots in a CTA pair")
    args = ap.parse_args(argv)
    if args.pair:
        if args.self_test:
            return self_test(PAIR_MUTATIONS, 7, args.schedules,
                             lambda n_tiles, rng, mutation: run_pair(n_tiles, True, rng, mutation))
        return check_configurations(
            [(f"pair {'d576' if d576 else 'd512'} tiles {n_tiles}", 1000 * n_tiles + 7 + d576,
              lambda rng, n_tiles=n_tiles, d576=d576: run_pair(n_tiles, d576, rng))
             for d576 in (False, True) for n_tiles in range(0, 8)], args.schedules)
    if args.self_test:
        return self_test(MUTATIONS, 7, args.schedules,
                         lambda n_tiles, rng, mutation: run_one(n_tiles, True, True, rng, mutation))
    return check_configurations(
        [(f"{('slots' if slots else 'one stage') + (' d576' if d576 else ' d512'):15s} "
          f"tiles {n_tiles}", 1000 * n_tiles + 10 * slots + d576,
          lambda rng, n_tiles=n_tiles, slots=slots, d576=d576: run_one(n_tiles, slots, d576, rng))
         for slots in (False, True) for d576 in (False, True) for n_tiles in range(0, 8)],
        args.schedules)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
