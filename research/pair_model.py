#!/usr/bin/env python3
"""A clock-level model of the SM90 dense decode kernel's steady state at h_q 128 (one CTA, one
64-row block), for ranking pair orders before spending device time on them (dense_decode
NOTES.md, "Where it stands", item 2).

What is modelled:
- the tensor pipe: one FIFO of wgmma groups in issue order;
- each compute warpgroup: a program of steps run in order;
- each stage part (RoPE, V left, V right): refilled a fixed latency after its last reader hands it
  back.

A QK^T is issued part by part as the parts land. A wgmma wait returns a fixed latency after the
group leaves the pipe.

Programs (one per order) are lists of steps per pair k:
  ("qk", tile, part)    issue the part's QK^T group (waits for the part to land)
  ("pv", tile, half)    issue O_half += P(tile) V(tile)_half
  ("wait", name)        wait for a group to leave the pipe
  ("cpu", clocks)       softmax, rescale, P stores: CUDA-core work of this warpgroup
  ("signal", event)     e.g. P(tile) published
  ("await", event)      a named barrier: wait for the other warpgroup's signal
  ("release", tile, part)  hand the part of a tile back (its stage refills it for tile + 2)

Calibration targets (NOTES.md timelines, clocks a pair):
- v10: 6.6k, from DRAM or L2;
- v20 (the kernel since session 11): ~5.5k from DRAM or L2 (model: 5.55k from L2);
- v14 (FlashMLA's order): 5.85k with the KV L2-resident, ~7.2k from DRAM.

Calibration (session 9): with QK^T at the 1152 clocks a tile of peak rate (128 a piece), v10 comes
out at 5.4k, not the measured 6.6k. The timelines say the same thing: from WG1's PV issue to its
S done is 2313 clocks, where the model has ~1.8k. Fitted, a QK^T piece costs 193 clocks
(1.74k a tile). Then:
- v10: 6.6k (by construction);
- v14: 5.5k from L2, 6.3k with a 2.3k refill (measured 5.85k and ~7.2k). Right in direction,
  under in size.

One reading of the fit: a QK^T issued as 9 commit groups, each after a barrier wait and a wgmma
fence, leaves the pipe idle between groups. bench_wgmma_rates at commit a2f68d2 (roles "9 groups")
measures that on the device. The model's pipe-bound floor is then ~5.5k a pair, which v14/v17 reached from
L2. Treat its figures as a ranking aid, not a prediction.

    python3 research/pair_model.py            # every order, L2 and DRAM refills
"""
import argparse

# Unit costs in SM clocks (bench_wgmma_rates and the session 6-8 timelines).
QK_PIECE = 193          # one 64 x 64 x 64 piece of QK^T, fitted: v10 at 6.6k a pair
PV = 512                # 64 x 256 x 64 PV of one warpgroup
SOFTMAX = 420           # mask, row max, exp, P to registers and shared memory
HANDOFF = 480           # named barrier, P and stats from shared memory, O rescale, before the PV
RESCALE = 60            # O *= factor before its own PV
WAIT_LAT = 60           # a wgmma wait returning after the group leaves the pipe
ISSUE = 30              # issuing a wgmma group
PARTS = {"rope": 1, "L": 4, "R": 4}  # pieces of 64 dims in each part


class Model:
    def __init__(self, refill):
        self.refill = refill
        self.pipe_end = 0
        self.done = {}            # group name -> clock it leaves the pipe
        self.events = {}          # event name -> clock
        self.released_tiles = {}  # (tile, part) -> clock that part of the tile went back

    def land(self, tile, part):
        """When `part` of `tile` is in its stage: the refill after the part of tile - 2 went back
        (tiles 0 and 1 are in at clock 0); None while it has not gone back."""
        if tile < 2:
            return 0
        key = (tile - 2, part)
        if key not in self.released_tiles:
            return None
        return self.released_tiles[key] + self.refill


def run(program, pairs, refill):
    """Steady-state clocks a pair of `program` and the tensor pipe's busy share."""
    m = Model(refill)
    t = [0, 0]
    steps = [list(program(k, wg) for k in range(pairs)) for wg in range(2)]
    flat = [[s for pair in steps[wg] for s in pair] for wg in range(2)]
    pos = [0, 0]
    pair_start = [[None] * pairs for _ in range(2)]
    # index of the first step of each pair
    firsts = []
    for wg in range(2):
        idx, f = 0, []
        for pair in steps[wg]:
            f.append(idx)
            idx += len(pair)
        firsts.append(f)

    def ready(wg):
        """Clock at which warpgroup wg's next step can start, or None when it waits on something
        the other warpgroup has not done yet."""
        s = flat[wg][pos[wg]]
        kind = s[0]
        if kind == "qk":
            landed = m.land(s[1], s[2])
            return None if landed is None else max(t[wg], landed)
        if kind == "wait":
            return None if s[1] not in m.done else max(t[wg], m.done[s[1]] + WAIT_LAT)
        if kind == "await":
            return None if s[1] not in m.events else max(t[wg], m.events[s[1]])
        return t[wg]

    while pos[0] < len(flat[0]) or pos[1] < len(flat[1]):
        cands = []
        for wg in range(2):
            if pos[wg] < len(flat[wg]):
                r = ready(wg)
                if r is not None:
                    cands.append((r, wg))
        if not cands:
            raise RuntimeError(f"deadlock at {pos}: {flat[0][pos[0]] if pos[0] < len(flat[0]) else None} / "
                               f"{flat[1][pos[1]] if pos[1] < len(flat[1]) else None}")
        now, wg = min(cands)
        for k in range(pairs):
            if firsts[wg][k] == pos[wg]:
                pair_start[wg][k] = now
        s = flat[wg][pos[wg]]
        kind = s[0]
        if kind in ("qk", "pv"):
            dur = QK_PIECE * PARTS[s[2]] if kind == "qk" else PV
            start = max(m.pipe_end, now)
            m.pipe_end = start + dur
            m.done[f"{kind}{s[1]}{s[2]}"] = m.pipe_end
            t[wg] = now + ISSUE
        elif kind == "wait":
            t[wg] = now
        elif kind == "cpu":
            t[wg] = now + s[1]
        elif kind == "signal":
            m.events[s[1]] = now
            t[wg] = now
        elif kind == "await":
            t[wg] = now
        elif kind == "release":
            m.released_tiles[(s[1], s[2])] = now
            t[wg] = now
        pos[wg] += 1
    starts = pair_start[0]
    periods = [b - a for a, b in zip(starts, starts[1:])]
    steady = periods[len(periods) // 2:]
    period = sum(steady) / len(steady)
    pipe_per_pair = 2 * QK_PIECE * sum(PARTS.values()) + 4 * PV
    return period, pipe_per_pair / period


# --- orders -------------------------------------------------------------------------------------
def v10(k, wg):
    """The kernel (v10 + fixes): WG0 scores even tiles, WG1 odd ones; each takes the other's P,
    issues its PV on it, scores its own tile (that PV under it), softmaxes against the other's
    max, publishes P, runs its own PV and waits for it."""
    a, b = 2 * k, 2 * k + 1
    if wg == 0:
        s = []
        if k > 0:
            s += [("await", f"P{a - 1}"), ("cpu", HANDOFF), ("release", a - 1, "rope"),
                  ("pv", a - 1, "L")]
        s += [("qk", a, "rope"), ("qk", a, "L")]
        if k > 0:
            s += [("wait", f"pv{a - 1}L"), ("release", a - 1, "L")]
        s += [("qk", a, "R"), ("wait", f"qk{a}R"), ("cpu", SOFTMAX), ("signal", f"P{a}"),
              ("cpu", RESCALE), ("pv", a, "L"), ("wait", f"pv{a}L"), ("release", a, "L")]
        return s
    return [("await", f"P{a}"), ("cpu", HANDOFF), ("release", a, "rope"), ("pv", a, "R"),
            ("qk", b, "rope"), ("qk", b, "R"), ("wait", f"pv{a}R"), ("release", a, "R"),
            ("qk", b, "L"), ("wait", f"qk{b}L"), ("cpu", SOFTMAX),
            ("signal", f"P{b}"), ("cpu", RESCALE), ("pv", b, "R"), ("wait", f"pv{b}R"),
            ("release", b, "R")]


def v10_own_max(k, wg):
    """NOTES item 2: WG1 softmaxes tile 2k+1 against its own running max (no wait for WG0's), so
    its QK^T and softmax no longer follow WG0's P; the P each hands over is scaled at the reader
    (a rescale of the reader's O, folded into HANDOFF). Both QK^Ts stay where v10 has them."""
    a, b = 2 * k, 2 * k + 1
    if wg == 0:
        return v10(k, 0)
    s = [("qk", b, "rope"), ("qk", b, "R")]
    if k > 0:
        s += [("wait", f"pv{a - 2}R"), ("release", a - 2, "R")]
    s += [("qk", b, "L"), ("wait", f"qk{b}L"), ("cpu", SOFTMAX), ("signal", f"P{b}"),
          ("cpu", RESCALE), ("pv", b, "R"), ("await", f"P{a}"), ("cpu", HANDOFF),
          ("release", a, "rope"), ("pv", a, "R"), ("wait", f"pv{b}R"), ("release", b, "R")]
    return s


def v14(k, wg):
    """FlashMLA's published order (session 7's v14): both QK^Ts of the next pair come after the
    pair's four PVs; the other warpgroup's P is read from shared memory (SS wgmma). Each stage has
    two parts: V left (+ the RoPE piece when it holds WG0's P... here: L, and R + RoPE) handed back
    by one warpgroup each. S(2k) and S(2k+1) of pair 0 are issued in the prologue (k == 0)."""
    a, b = 2 * k, 2 * k + 1
    if wg == 0:
        s = []
        if k == 0:
            s += [("qk", a, "rope"), ("qk", a, "L"), ("qk", a, "R")]
        s += [("wait", f"qk{a}R"), ("cpu", SOFTMAX), ("signal", f"m{a}"), ("cpu", RESCALE),
              ("pv", a, "L"), ("wait", f"pv{a}L"), ("release", a, "L"),
              ("await", f"m{b}"), ("cpu", 150), ("signal", f"P{a}"),
              ("await", f"pvs{b}"), ("cpu", RESCALE), ("pv", b, "L"),
              ("qk", a + 2, "L"), ("wait", f"pv{b}L"), ("release", b, "L"), ("release", b, "rope"),
              ("qk", a + 2, "R"), ("qk", a + 2, "rope")]
        return s
    s = []
    if k == 0:
        s += [("qk", b, "rope"), ("qk", b, "R"), ("qk", b, "L")]
    s += [("await", f"m{a}"), ("wait", f"qk{b}L"), ("cpu", SOFTMAX), ("signal", f"m{b}"),
          ("cpu", RESCALE), ("pv", b, "R"), ("await", f"P{a}"), ("pv", a, "R"),
          ("signal", f"pvs{b}"), ("wait", f"pv{b}R"), ("release", b, "R"),
          ("wait", f"pv{a}R"), ("release", a, "R"), ("release", a, "rope"),
          ("qk", b + 2, "R"), ("qk", b + 2, "L"), ("qk", b + 2, "rope")]
    return s


def v20(k, wg):
    """The kernel since session 11: v10 for WG0; WG1 issues S(2k+1) first (its stage has usually
    landed), then takes P(2k) and issues its PV behind that QK^T, softmaxes tile 2k+1 once S is
    done (the PV still on the pipe), publishes P(2k+1), and only then waits for the PV on P(2k)
    and hands stage 0's V right back. Measured (session 11 run 6 timeline, h_q 128 L 4096): 5.4-5.8k
    clocks a pair from DRAM and from L2, where the model says 5.55k (L2) and 6.0k (2.3k refill)."""
    a, b = 2 * k, 2 * k + 1
    if wg == 0:
        return v10(k, 0)
    return [("qk", b, "rope"), ("qk", b, "R"), ("qk", b, "L"),
            ("await", f"P{a}"), ("cpu", HANDOFF), ("release", a, "rope"), ("pv", a, "R"),
            ("wait", f"qk{b}L"), ("cpu", SOFTMAX), ("signal", f"P{b}"),
            ("wait", f"pv{a}R"), ("release", a, "R"),
            ("cpu", RESCALE), ("pv", b, "R"), ("wait", f"pv{b}R"), ("release", b, "R")]


ORDERS = {"v10": v10, "v14": v14, "v10_own_max": v10_own_max, "v20": v20}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=24)
    args = ap.parse_args()
    print("| order | refill clocks | period (clocks a pair) | tensor pipe busy |")
    print("|---|---|---|---|")
    for name, order in ORDERS.items():
        for refill in (1500, 2300):
            try:
                period, busy = run(order, args.pairs, refill)
                print(f"| {name} | {refill} | {period:.0f} | {100 * busy:.0f}% |")
            except RuntimeError as e:
                print(f"| {name} | {refill} | {e} | |")


if __name__ == "__main__":
    main()
