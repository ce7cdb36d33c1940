"""Independent references for the Python tests: a numpy codec of every KV format (docs/formats.md,
written from the table, not from src/core) and float64 attention oracles (docs/semantics.md)."""

import math

import numpy as np

import ml_dtypes  # a test dependency (pip install ml_dtypes): numpy has no bf16/e4m3

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn

# name: (d_qk, quantised dims, group size, rope dims, bytes per token)
FORMATS = {
    "fp8_v32": (576, 512, 128, 64, 656),
    "fp8_model1": (512, 448, 64, 64, 584),
    "fp8_mx": (512, 512, 32, 0, 528),
    "fp4": (512, 512, 16, 0, 288),
}
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def to_bf16(x):
    return np.asarray(x, np.float32).astype(BF16)


def bf16_round(x):
    return to_bf16(x).astype(np.float32)


def _pow2_exponent(amax):
    scale = np.float32(max(np.float32(amax) / np.float32(448.0), np.float32(1e-4)))
    m, e = math.frexp(float(scale))
    return e - 1 if m == 0.5 else e


def _e2m1_code(v):
    """Round-to-nearest-even onto e2m1, saturating at 6; returns the 4-bit code."""
    sign = 8 if v < 0 or (v == 0 and math.copysign(1.0, v) < 0) else 0
    a = min(abs(v), 6.0)
    best = int(np.argmin(np.abs(E2M1_VALUES - a)))
    # ties: the two nearest are equally far; pick the even code
    dist = np.abs(E2M1_VALUES - a)
    ties = np.flatnonzero(dist == dist[best])
    if len(ties) > 1:
        best = int(ties[0] if ties[0] % 2 == 0 else ties[1])
    return sign | best


def quantize_token(x, fmt):
    """Dequantised values (float64) the format stores for one token x (float32 [d_qk])."""
    d_qk, qdims, group, rope, _ = FORMATS[fmt]
    x = np.asarray(x, np.float32)
    assert x.shape == (d_qk,)
    out = np.zeros(d_qk, np.float64)
    for g in range(qdims // group):
        xg = x[g * group:(g + 1) * group]
        finite = xg[np.isfinite(xg)]
        amax = float(np.max(np.abs(finite))) if finite.size else 0.0
        if fmt == "fp4":
            s = np.float32(max(np.float32(amax) / np.float32(6.0), np.float32(1e-4)))
            stored = float(np.float32(min(s, 448.0)).astype(E4M3).astype(np.float32))  # saturating
            stored = max(stored, 2.0 ** -9)
            codes = [_e2m1_code(float(np.float32(v) / np.float32(stored))) for v in xg]
            vals = np.array([(-1 if c & 8 else 1) * E2M1_VALUES[c & 7] for c in codes])
            out[g * group:(g + 1) * group] = vals * stored
        else:
            scale = np.float32(2.0 ** _pow2_exponent(amax))
            elems = np.clip(xg / scale, -448, 448).astype(E4M3).astype(np.float64)
            out[g * group:(g + 1) * group] = elems * float(scale)
    if rope:
        out[qdims:] = bf16_round(x[qdims:])
    return out


def quantize_rows(x, fmt):
    return np.stack([quantize_token(row, fmt) for row in np.asarray(x, np.float32)])


def decode_interleaved(data, fmt):
    """Decodes token-interleaved cache bytes [n, bytes_per_token] (docs/formats.md order per token)."""
    d_qk, qdims, group, rope, bpt = FORMATS[fmt]
    data = np.asarray(data, np.uint8)
    n = data.shape[0]
    out = np.zeros((n, d_qk), np.float64)
    ngroups = qdims // group
    for t in range(n):
        row = data[t]
        if fmt == "fp8_v32":
            elems = row[:512].view(E4M3).astype(np.float64)
            scales = row[512:528].view(np.float32).astype(np.float64)
            rope_vals = row[528:656].view(BF16).astype(np.float64)
        elif fmt == "fp8_model1":
            elems = row[:448].view(E4M3).astype(np.float64)
            rope_vals = row[448:576].view(BF16).astype(np.float64)
            scales = 2.0 ** (row[576:583].astype(np.float64) - 127)
        elif fmt == "fp8_mx":
            elems = row[:512].view(E4M3).astype(np.float64)
            scales = 2.0 ** (row[512:528].astype(np.float64) - 127)
            rope_vals = None
        else:  # fp4
            packed = row[:256]
            codes = np.empty(512, np.uint8)
            codes[0::2] = packed & 0xF
            codes[1::2] = packed >> 4
            elems = np.where(codes & 8, -1.0, 1.0) * E2M1_VALUES[codes & 7]
            scales = row[256:288].view(E4M3).astype(np.float64)
            rope_vals = None
        out[t, :qdims] = elems * np.repeat(scales[:ngroups], group)
        if rope_vals is not None:
            out[t, qdims:] = rope_vals
    return out


# --- attention oracles ----------------------------------------------------------------------

def attend(qrow, keys, scale, d_v, sink=None):
    """One query row (float64 [d_qk]) over keys (float64 [n, d_qk]) → (out [d_v], lse)."""
    if keys.shape[0] == 0:
        return np.zeros(d_v), math.inf
    logits = scale * (keys @ qrow)
    m = logits.max()
    p = np.exp(logits - m)
    lse = m + math.log(p.sum())
    out = (p / p.sum()) @ keys[:, :d_v]
    if sink is not None:
        out = out / (1.0 + math.exp(min(sink - lse, 700.0)))
    return out, lse


def dense_decode(q, k_cache, block_table, cache_seqlens, d_v=512, scale=None, causal=False):
    q = np.asarray(q, np.float64)
    k = np.asarray(k_cache, np.float64)
    b, s_q, h_q, d_qk = q.shape
    page = k.shape[1]
    h_kv = k.shape[2]
    scale = scale or 1.0 / math.sqrt(d_qk)
    out = np.zeros((b, s_q, h_q, d_v))
    lse = np.zeros((b, h_q, s_q))
    for i in range(b):
        length = int(cache_seqlens[i])
        t = np.arange(length)
        keys_all = k[block_table[i, t // page], t % page] if length else np.zeros((0, h_kv, d_qk))
        for j in range(s_q):
            visible = length - s_q + j + 1 if causal else length
            visible = max(0, min(length, visible))
            for h in range(h_q):
                kv_head = h // (h_q // h_kv)
                out[i, j, h], lse[i, h, j] = attend(q[i, j, h], keys_all[:visible, kv_head],
                                                    scale, d_v)
    return out, lse


def sparse_decode(q, keys_flat, indices, topk_length=None, extra_keys_flat=None,
                  extra_indices=None, extra_topk_length=None, attn_sink=None, d_v=512,
                  scale=None):
    """keys_flat: float64 [num_slots, d_qk] (the dequantised cache, slot order)."""
    q = np.asarray(q, np.float64)
    b, s_q, h_q, d_qk = q.shape
    scale = scale or 1.0 / math.sqrt(d_qk)
    out = np.zeros((b, s_q, h_q, d_v))
    lse = np.zeros((b, h_q, s_q))

    def pick(flat, idx, length):
        idx = idx[:length] if length is not None else idx
        idx = [int(v) for v in idx if 0 <= v < flat.shape[0]]
        return flat[idx] if idx else np.zeros((0, flat.shape[1]))

    for i in range(b):
        for j in range(s_q):
            keys = pick(keys_flat, indices[i, j],
                        None if topk_length is None else int(topk_length[i]))
            if extra_keys_flat is not None:
                extra = pick(extra_keys_flat, extra_indices[i, j],
                             None if extra_topk_length is None else int(extra_topk_length[i]))
                keys = np.concatenate([keys, extra])
            for h in range(h_q):
                sink = None if attn_sink is None else float(attn_sink[h])
                out[i, j, h], lse[i, h, j] = attend(q[i, j, h], keys, scale, d_v, sink)
    return out, lse


def sparse_prefill(q, kv, indices, topk_length=None, attn_sink=None, d_v=512, scale=None):
    q = np.asarray(q, np.float64)
    kv = np.asarray(kv, np.float64)
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, _ = kv.shape
    scale = scale or 1.0 / math.sqrt(d_qk)
    out = np.zeros((s_q, h_q, d_v))
    lse = np.zeros((s_q, h_q))
    max_logits = np.zeros((s_q, h_q))
    for t in range(s_q):
        for h in range(h_q):
            g = h // (h_q // h_kv)
            idx = indices[t, g]
            if topk_length is not None:
                idx = idx[:int(topk_length[t])]
            idx = [int(v) for v in idx if 0 <= v < s_kv]
            keys = kv[idx, g] if idx else np.zeros((0, d_qk))
            sink = None if attn_sink is None else float(attn_sink[h])
            out[t, h], lse[t, h] = attend(q[t, h], keys, scale, d_v, sink)
            max_logits[t, h] = (scale * (keys @ q[t, h])).max() if idx else -math.inf
    return out, max_logits, lse


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    denom = np.linalg.norm(b)
    return np.linalg.norm(a - b) / (denom if denom > 0 else 1.0)


def close_lse(a, b, atol=1e-3):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):
        near = np.abs(a - b) <= atol
    return bool(np.all(same_inf | near))
