#!/usr/bin/env python3
"""Byte-level model of the FP8 prefill kernel's V^T build (src/cuda/sm90/sparse_prefill/
fp8_kernel.cuh, `produce`): ldmatrix.x4.trans of 16-bit pairs from the K-major codes (128 B
swizzle), four byte permutes, stmatrix.x4 into V^T (64 B swizzle). Checks, on random bytes, that
position 16 g + 4 u + j of every dim row holds key 16 g + 2 u + (j % 2) + 8 (j / 2) (the order
of P's e4m3 register fragment, fed straight from S's accumulator), and that each stmatrix
matrix's 8 rows fall in distinct 16-byte bank groups. --self-test plants two bugs (a wrong byte
permute, the dim rule without its parity swap) and expects each to be caught.
"""
import argparse
import random
import sys


def prmt(a, b, sel):
    bs = [(a >> (8 * i)) & 255 for i in range(4)] + [(b >> (8 * i)) & 255 for i in range(4)]
    return sum(bs[(sel >> (4 * i)) & 15] << (8 * i) for i in range(4))


def build(keys, sel_even=0x6420, sel_odd=0x7531, parity_swap=True):
    sm = bytearray(64 * 512)
    for k in range(64):
        for d in range(512):
            sm[(d // 128) * 8192 + k * 128 + ((((d % 128) // 16) ^ (k % 8)) << 4) + d % 16] = keys[k][d]
    vt = bytearray(512 * 64)
    banks_ok = True
    for g in range(4):  # warp g: keys 16 g .. 16 g + 15
        for cc in range(16):  # 32 dims an iteration
            addr = []
            for lane in range(32):
                m, r8 = lane >> 3, lane & 7
                key = 16 * g + 8 * (m & 1) + r8
                c16 = 2 * cc + (m >> 1)
                addr.append((c16 >> 3) * 8192 + key * 128 + (((c16 & 7) ^ (key & 7)) << 4))
            rows = [[[sm[addr[8 * m + r] + 2 * i] | sm[addr[8 * m + r] + 2 * i + 1] << 8
                      for i in range(8)] for r in range(8)] for m in range(4)]
            regs = []
            for t in range(32):  # ldmatrix.trans: (row 2 (t % 4) [+1], col t / 4) of each matrix
                x = [rows[m][2 * (t % 4)][t // 4] | rows[m][2 * (t % 4) + 1][t // 4] << 16
                     for m in range(4)]
                d0lo, d1lo = prmt(x[0], x[1], sel_even), prmt(x[0], x[1], sel_odd)
                d0hi, d1hi = prmt(x[2], x[3], sel_even), prmt(x[2], x[3], sel_odd)
                up = (t >> 2) >= 4 and parity_swap
                regs.append([d1lo if up else d0lo, d0lo if up else d1lo,
                             d1hi if up else d0hi, d0hi if up else d1hi])
            for m in range(4):
                groups = set()
                for r8 in range(8):
                    swap = ((r8 < 4) if (m & 1) else (r8 >= 4)) if parity_swap else (m & 1)
                    dim = 32 * cc + 16 * (m >> 1) + 2 * r8 + swap
                    dst = (dim >> 3) * 512 + (dim & 7) * 64 + ((g ^ ((dim & 7) >> 1)) << 4)
                    groups.add((dst % 128) // 16)
                    for c in range(8):  # stmatrix: row r8's b16 c from thread 4 r8 + c / 2
                        v = (regs[4 * r8 + c // 2][m] >> (16 * (c % 2))) & 0xFFFF
                        vt[dst + 2 * c], vt[dst + 2 * c + 1] = v & 255, v >> 8
                banks_ok &= len(groups) == 8
    return vt, banks_ok


def check(keys, **bug):
    vt, banks_ok = build(keys, **bug)
    bad = 0
    for dim in range(512):
        for pos in range(64):
            g, u, j = pos // 16, (pos % 16) // 4, pos % 4
            key = 16 * g + 2 * u + (j % 2) + 8 * (j // 2)
            off = (dim >> 3) * 512 + (dim & 7) * 64 + ((g ^ ((dim & 7) >> 1)) << 4) + pos % 16
            bad += vt[off] != keys[key][dim]
    return bad, banks_ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    keys = [[rng.randrange(256) for _ in range(512)] for _ in range(64)]
    if a.self_test:
        caught = 0
        for name, bug in (("byte permute", {"sel_even": 0x6240}), ("parity swap", {"parity_swap": False})):
            bad, banks_ok = check(keys, **bug)
            found = bad > 0 or not banks_ok
            print(f"planted bug '{name}': {'found' if found else 'MISSED'}")
            caught += found
        return 0 if caught == 2 else 1
    bad, banks_ok = check(keys)
    print(f"V^T model: {bad} wrong bytes of {512 * 64}, stmatrix rows "
          f"{'bank-conflict free' if banks_ok else 'IN CONFLICT'}")
    return 0 if bad == 0 and banks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
