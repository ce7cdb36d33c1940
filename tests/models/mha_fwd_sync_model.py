#!/usr/bin/env python3
"""A model of the SM90 dense MHA prefill forward's synchronisation (src/cuda/sm90/mha_prefill/
kernel.cuh consume, producer.cuh produce; NOTES.md "Barrier protocol"), run on the CPU under many
random interleavings to find deadlocks and buffer races before a GPU does. Agents: the producer
thread, the two compute warpgroups (each one agent: its four warps act alike, so an empty barrier
gets 4 arrivals at once), and the TMA engine, which lands issued loads in any order. mbarriers
have try_wait.parity semantics (a wait for parity P passes while the completed-phase count is
odd for P = 0, even for P = 1: it cannot tell phase P from P + 2, which is the hazard); the
ping-pong's named barriers count warpgroups.

Checked, for block counts 0..8, many schedules each:
  * no deadlock;
  * a named barrier generation never takes two arrivals from one warpgroup, and none is left
    part-way at exit;
  * every read of Q, K(n) or V(n) from its stage sees block n's load, landed, and no load lands
    in that stage while the read (the wgmma) runs.

  python3 tests/models/mha_fwd_sync_model.py [--schedules 300]
  python3 tests/models/mha_fwd_sync_model.py --self-test [--schedules 300]

Keep it in step with kernel.cuh and producer.cuh. Exit status 1 on any finding.
"""
from __future__ import annotations

import argparse
import random
import sys

from sync_model import Finding, check_configurations, run_agents, self_test

STAGES = 2
MUTATIONS = ["wg1_last_pass", "no_first_pass", "producer_parity", "early_k_release",
             "consumer_parity", "one_stage_v"]


class World:
    def __init__(self, n_blocks: int, mutation: str = ""):
        self.mut = mutation
        self.n = n_blocks
        self.done = {}  # mbarrier name -> completed phases
        self.arrivals = {}  # mbarrier name -> arrivals in the current phase
        self.need = {}
        for s in range(STAGES):
            for b in ("k_full", "v_full"):
                self.need[f"{b}{s}"] = 1
            for b in ("k_empty", "v_empty"):
                self.need[f"{b}{s}"] = 8
        self.need["q_full"] = 1
        for b in self.need:
            self.done[b], self.arrivals[b] = 0, 0
        self.version = {}  # buffer -> block index its last landed load holds
        self.reading = {}  # buffer -> number of running reads
        self.pending = []  # issued, not landed loads: (buffer, block, barrier)
        self.named = {1: [], 2: []}  # id -> warpgroups arrived this generation
        self.gen = {1: 0, 2: 0}

    # mbarriers
    def arrive(self, bar: str, count: int = 1):
        self.arrivals[bar] += count
        if self.arrivals[bar] > self.need[bar]:
            raise Finding(f"{bar}: {self.arrivals[bar]} arrivals in one phase")
        if self.arrivals[bar] == self.need[bar]:
            self.arrivals[bar] = 0
            self.done[bar] += 1

    def passed(self, bar: str, parity: int) -> bool:
        return self.done[bar] % 2 != parity

    # loads and reads
    def issue(self, buf: str, block: int, bar: str):
        self.pending.append((buf, block, bar))

    def land(self, rng: random.Random):
        buf, block, bar = self.pending.pop(rng.randrange(len(self.pending)))
        if self.reading.get(buf, 0):
            raise Finding(f"a load of block {block} landed in {buf} while a wgmma read it")
        self.version[buf] = block
        self.arrive(bar)

    def read_begin(self, buf: str, block: int, who: str):
        if self.version.get(buf) != block:
            raise Finding(f"{who} read {buf} expecting block {block}, found "
                          f"{self.version.get(buf)}")
        self.reading[buf] = self.reading.get(buf, 0) + 1

    def read_end(self, buf: str):
        self.reading[buf] -= 1

    # named barriers (bar.sync by one warpgroup, bar.arrive by the other)
    def bar_arrive(self, bid: int, wg: int):
        if wg in self.named[bid]:
            raise Finding(f"named barrier {bid}: two arrivals of WG{wg} in one generation")
        self.named[bid].append(wg)
        if len(self.named[bid]) == 2:
            self.named[bid] = []
            self.gen[bid] += 1


def producer(w: World):
    if w.n == 0:
        return
    w.issue("q", 0, "q_full")
    for n in range(w.n):
        s, ph = n % STAGES, (n // STAGES) & 1
        want = ph if w.mut == "producer_parity" else ph ^ 1
        yield lambda b=f"k_empty{s}", p=want: w.passed(b, p)
        w.issue(f"k{s}", n, f"k_full{s}")
        vs = 0 if w.mut == "one_stage_v" else s
        yield lambda b=f"v_empty{vs}", p=want: w.passed(b, p)
        w.issue(f"v{vs}", n, f"v_full{vs}")


def tma(w: World, rng: random.Random):
    while True:
        yield lambda: bool(w.pending) or w.finished
        if w.finished and not w.pending:
            return
        w.land(rng)


def consumer(w: World, wg: int):
    who = f"WG{wg}"
    n_end = w.n
    if n_end == 0:
        return
    yield lambda: w.passed("q_full", 0)
    w.read_begin("q", 0, who)  # Q is read by every S: held to the end
    ph = lambda n: ((n // STAGES) & 1) ^ (1 if w.mut == "consumer_parity" and n >= STAGES else 0)
    vst = lambda n: 0 if w.mut == "one_stage_v" else n % STAGES
    me, other = 1 + wg, 1 + (1 - wg)

    def turn_wait():
        start = w.gen[me]
        w.bar_arrive(me, wg)
        yield lambda: w.gen[me] > start

    def turn_pass():
        w.bar_arrive(other, wg)

    if wg == 1 and w.mut != "no_first_pass":
        turn_pass()
    yield lambda: w.passed("k_full0", 0)
    yield from turn_wait()
    w.read_begin("k0", 0, who)
    turn_pass()
    if w.mut == "early_k_release":
        w.arrive("k_empty0", 4)
    yield None
    w.read_end("k0")
    if w.mut != "early_k_release":
        w.arrive("k_empty0", 4)
    for n in range(1, n_end):
        s, sp = n % STAGES, vst(n - 1)
        yield lambda b=f"k_full{s}", p=ph(n): w.passed(b, p)
        yield from turn_wait()
        w.read_begin(f"k{s}", n, who)
        yield lambda b=f"v_full{sp}", p=ph(n - 1): w.passed(b, p)
        w.read_begin(f"v{sp}", n - 1, who)
        turn_pass()
        yield None  # wgmma.wait_group 1: S(n) done
        w.read_end(f"k{s}")
        w.arrive(f"k_empty{s}", 4)
        yield None  # softmax, then wait_group 0: P V(n-1) done
        w.read_end(f"v{sp}")
        w.arrive(f"v_empty{sp}", 4)
    sl = vst(n_end - 1)
    yield lambda b=f"v_full{sl}", p=ph(n_end - 1): w.passed(b, p)
    yield from turn_wait()
    w.read_begin(f"v{sl}", n_end - 1, who)
    if wg == 0 or w.mut == "wg1_last_pass":
        turn_pass()
    yield None
    w.read_end(f"v{sl}")
    w.arrive(f"v_empty{sl}", 4)
    w.read_end("q")


def run(n_blocks: int, rng: random.Random, mutation: str = "") -> None:
    w = World(n_blocks, mutation)
    w.finished = False  # the three agents are done: the TMA engine may stop once idle
    done = set()

    def tracked(name, gen):
        yield from gen
        done.add(name)

    def watcher():
        yield lambda: len(done) == 3
        w.finished = True

    agents = {"producer": tracked("producer", producer(w)),
              "wg0": tracked("wg0", consumer(w, 0)),
              "wg1": tracked("wg1", consumer(w, 1)),
              "tma": tma(w, rng), "watcher": watcher()}
    run_agents(agents, rng)
    for bid, arrived in w.named.items():
        if arrived:
            raise Finding(f"named barrier {bid} left part-way at exit (arrived: WG{arrived})")
    if w.pending:
        raise Finding(f"loads never landed: {w.pending}")


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=300)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(MUTATIONS, 8, args.schedules,
                         lambda n, rng, mut: run(n, rng, mut))
    configs = [(f"blocks {n}", n, lambda rng, n=n: run(n, rng)) for n in range(0, 9)]
    return check_configurations(configs, args.schedules)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
