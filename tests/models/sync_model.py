"""The scheduler of the synchronisation models (tests/models/seesaw_sync_model.py): agents are
generators that yield a predicate they wait for; a random schedule runs any agent whose predicate
holds until all are done, and a state where none can move is a deadlock."""
from __future__ import annotations

import random
from typing import Callable


class Finding(Exception):
    pass


def run_agents(agents: dict, rng: random.Random) -> None:
    """Runs the agents (name -> generator) to completion under one random schedule."""
    waiting = {a: None for a in agents}
    done = set()
    while len(done) < len(agents):
        runnable = [a for a in agents if a not in done and (waiting[a] is None or waiting[a]())]
        if not runnable:
            raise Finding("deadlock: " + ", ".join(a for a in agents if a not in done) +
                          " all waiting")
        a = rng.choice(runnable)
        try:
            waiting[a] = next(agents[a])
        except StopIteration:
            done.add(a)


def self_test(mutations, max_tiles: int, schedules: int,
              run: Callable[[int, random.Random, str], None]) -> int:
    """Each deliberate bug must be found on some tile count 1..max_tiles: exit status 1 if not."""
    missed = 0
    for mutation in mutations:
        found = None
        for n_tiles in range(1, max_tiles + 1):
            rng = random.Random(n_tiles)
            try:
                for _ in range(schedules):
                    run(n_tiles, rng, mutation)
            except Finding as f:
                found = f"tiles {n_tiles}: {f}"
                break
        print(f"mutation {mutation}: {'found, ' + found if found else 'MISSED'}")
        missed += found is None
    return 1 if missed else 0


def check_configurations(configs, schedules: int) -> int:
    """Runs each configuration (label, seed, run(rng)) under `schedules` random schedules,
    printing a line each and a total; exit status 1 if any had a finding."""
    bad = 0
    for label, seed, run in configs:
        rng = random.Random(seed)
        try:
            for _ in range(schedules):
                run(rng)
            print(f"{label}: {schedules} schedules, no finding")
        except Finding as f:
            bad += 1
            print(f"{label}: FINDING: {f}")
    print(f"{len(configs)} configurations x {schedules} schedules: "
          f"{'no finding' if not bad else f'{bad} with findings'}")
    return 1 if bad else 0
