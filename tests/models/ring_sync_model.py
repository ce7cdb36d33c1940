#!/usr/bin/env python3
"""A model of the ring fill's synchronisation (src/cuda/sm90/sparse_decode/kernel.cuh consume's
ring branches, fill_ring.cuh produce_by_ring), run on the CPU under many random interleavings to
find deadlocks and buffer races before a GPU does: the one-stage ring (two rounds of one 64-key
stage) and its three round slots (traits.h kSlots). Each
warpgroup is one agent (its four warps act alike); mbarriers count warp arrivals; wgmma groups
complete when their warpgroup waits for them, so a group's reads happen at its wait (the latest
the hardware may read).

Checked for tile counts 0..7, both d_qk (d 576: P in the slots' RoPE pieces), many schedules:
  * no deadlock (some agent can always move until all are done);
  * no mbarrier phase over-filled, none left with stray arrivals;
  * every read of a buffer (a round's keys and RoPE, its key mask, P, the row factors) sees the
    version its reader expects: no write lands between the write a read depends on and it.

  python3 tests/models/ring_sync_model.py [--schedules 2000] [--self-test]

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


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--self-test", action="store_true",
                    help="check that each deliberate bug of the round slots is found")
    args = ap.parse_args(argv)
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
