#!/usr/bin/env python3
"""A model of the SM90 dense MHA prefill forward's index and softmax math (src/cuda/sm90/
mha_prefill/kernel.cuh consume, producer.cuh work_of / produce), in float64 on the CPU, against
the definition (docs/semantics.md, dense MHA prefill). Mirrors, line for line: the grid (m blocks
reversed), the CTA's exit, n_end from the last row, the TMA boxes (64 query rows a warpgroup,
128 keys a block, rows past the tensor zero-filled, rows of the next sequence loaded), the GQA
head map, the mask and its skip condition on lim_first, the online softmax with scale_old = 0
when m was -inf and max_base, the epilogue's row guard, O / l and lse = m * scale + ln l.
Checks every (token, head) row is written once and matches; -inf lse exactly where expected.

  python3 tests/models/mha_fwd_math_model.py [--self-test]

--self-test: each deliberate bug in MUTATIONS must be found. Exit status 1 on any finding.
"""
from __future__ import annotations

import sys

import numpy as np

BM, WG, BN = 128, 64, 128
MUTATIONS = ["mask_skip_last_row", "n_end_first_row", "no_zero_scale_old", "lse_no_scale",
             "kv_head_mod"]
CASES = [([1, 63, 0, 129, 5], [1, 63, 7, 129, 0]), ([5, 17, 100, 130, 3], [300, 17, 129, 7, 0]),
         ([70, 0, 129], [70, 4, 200]), ([300, 0, 129], [500, 64, 129]), ([260], [260]),
         ([1000, 257], [1300, 100])]


def visible(t, s_q, s_kv, causal):
    if not causal:
        return s_kv
    n = t + s_kv - s_q + 1
    return 0 if n < 0 else min(n, s_kv)


def box(x, r0, n):
    """A TMA box of n rows from row r0 (rows past the tensor read as zeros)."""
    idx = np.arange(r0, r0 + n)
    ok = idx < x.shape[0]
    o = np.zeros((n,) + x.shape[1:])
    o[ok] = x[idx[ok]]
    return o


def kernel(q, k, v, cq, ck, max_q, causal, scale, mut):
    tq, hq, _ = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    out = np.full((tq, hq, 128), np.nan)
    lse = np.full((tq, hq), np.nan)
    written = np.zeros((tq, hq), dtype=int)
    sl2 = scale * np.log2(np.e)
    m_blocks = (max_q + BM - 1) // BM
    with np.errstate(invalid="ignore"):
        for b in range(len(cq) - 1):
            for h in range(hq):
                kvh = h % hkv if mut == "kv_head_mod" else h // group
                for x in range(m_blocks):
                    mb = m_blocks - 1 - x
                    q0, kv0 = cq[b], ck[b]
                    s_q, s_kv = max(cq[b + 1] - q0, 0), max(ck[b + 1] - kv0, 0)
                    m0 = mb * BM
                    if m0 >= s_q:
                        continue
                    last = (m0 if mut == "n_end_first_row" else min(m0 + BM, s_q) - 1)
                    n_end = (visible(last, s_q, s_kv, causal) + BN - 1) // BN
                    for wg in range(2):
                        Q = box(q[:, h], q0 + m0 + wg * WG, WG)
                        r = m0 + wg * WG + np.arange(WG)
                        limit = np.array([visible(t, s_q, s_kv, causal) for t in r])
                        first = m0 + wg * WG + (WG - 1 if mut == "mask_skip_last_row" else 0)
                        lim_first = visible(first, s_q, s_kv, causal)
                        m = np.full(WG, -np.inf)
                        l = np.zeros(WG)
                        O = np.zeros((WG, 128))
                        for n in range(n_end):
                            K = box(k[:, kvh], kv0 + n * BN, BN)
                            V = box(v[:, kvh], kv0 + n * BN, BN)
                            S = Q @ K.T
                            if (n + 1) * BN > lim_first:
                                S[(n * BN + np.arange(BN))[None, :] >= limit[:, None]] = -np.inf
                            m_new = np.maximum(m, S.max(1))
                            so = np.exp2((m - m_new) * sl2)
                            if mut != "no_zero_scale_old":
                                so = np.where(m == -np.inf, 0.0, so)
                            base = np.where(m_new == -np.inf, 0.0, m_new * sl2)
                            P = np.exp2(S * sl2 - base[:, None])
                            l = l * so + P.sum(1)
                            O = O * so[:, None] + P @ V
                            m = m_new
                        inv = np.where(l > 0, 1 / np.where(l > 0, l, 1), 0)
                        O = O * inv[:, None]
                        for i in range(WG):
                            if r[i] < s_q:
                                tok = q0 + r[i]
                                written[tok, h] += 1
                                out[tok, h] = O[i]
                                sc = 1.0 if mut == "lse_no_scale" else scale
                                lse[tok, h] = m[i] * sc + np.log(l[i]) if l[i] > 0 else -np.inf
    return out, lse, written


def reference(q, k, v, cq, ck, causal, scale):
    tq, hq, _ = q.shape
    group = hq // k.shape[1]
    out = np.zeros((tq, hq, 128))
    lse = np.zeros((tq, hq))
    for b in range(len(cq) - 1):
        s_q, s_kv = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        for h in range(hq):
            for t in range(s_q):
                n = visible(t, s_q, s_kv, causal)
                if n == 0:
                    lse[cq[b] + t, h] = -np.inf
                    continue
                x = scale * (k[ck[b]:ck[b] + n, h // group] @ q[cq[b] + t, h])
                p = np.exp(x - x.max())
                out[cq[b] + t, h] = p @ v[ck[b]:ck[b] + n, h // group] / p.sum()
                lse[cq[b] + t, h] = x.max() + np.log(p.sum())
    return out, lse


def check(mut="", first_only=False):
    """Findings (strings) over every case, causal and not, GQA 4 -> 2 (first_only: stop at one)."""
    rng = np.random.default_rng(0)
    findings = []
    for seq_q, seq_kv in CASES:
        cq = np.concatenate([[0], np.cumsum(seq_q)]).astype(int)
        ck = np.concatenate([[0], np.cumsum(seq_kv)]).astype(int)
        q = rng.standard_normal((cq[-1], 4, 64))
        k = rng.standard_normal((ck[-1], 2, 64))
        v = rng.standard_normal((ck[-1], 2, 128))
        for causal in (False, True):
            if first_only and findings:
                return findings
            what = f"s_q {seq_q} s_kv {seq_kv} {'causal' if causal else 'full'}"
            out, lse, written = kernel(q, k, v, cq, ck, max(seq_q), causal, 0.125, mut)
            ro, rl = reference(q, k, v, cq, ck, causal, 0.125)
            if (written != 1).any():
                findings.append(f"{what}: rows written {written.min()}..{written.max()} times")
                continue
            fin = np.isfinite(rl)
            if not (np.isfinite(lse) == fin).all() or not (lse[~fin] == rl[~fin]).all():
                findings.append(f"{what}: -inf lse where not expected (or missing)")
                continue
            e_out = np.abs(out - ro).max()
            e_lse = np.abs(lse[fin] - rl[fin]).max() if fin.any() else 0.0
            if not (e_out < 1e-9 and e_lse < 1e-9):
                findings.append(f"{what}: max |out err| {e_out:.2e}, max |lse err| {e_lse:.2e}")
    return findings


def main(argv) -> int:
    if "--self-test" in argv:
        missed = [m for m in MUTATIONS if not check(m, first_only=True)]
        print(f"self-test: {len(MUTATIONS) - len(missed)} of {len(MUTATIONS)} mutations found"
              + (f"; missed {missed}" if missed else ""))
        return 1 if missed else 0
    findings = check()
    for f in findings:
        print("FINDING:", f)
    print(f"{len(CASES) * 2} configurations: " + ("no finding" if not findings else
                                                 f"{len(findings)} findings"))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
