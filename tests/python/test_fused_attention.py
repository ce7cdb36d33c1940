"""openmla.flash_mla.fused_norm_rope_attn_rope_cast on the CPU against FlashMLA's own reference
(tests/test-fused-norm-rope-attn-rope-cast.py at deepseek-ai/FlashMLA 9a7d253: the Q norm folded
into the logits, non-neox RoPE of the last 64 dims in fp32, the sparse attention reference, the
conjugate RoPE of the output, and DeepGEMM's per-token cast with per-32 rounded UE8M0 scales),
rewritten here in plain torch; FlashMLA's tolerances. Also: byte-exact outputs where the output
is exactly known, the two weight permutations' properties, the flash_mla alias, and errors."""

import math

import pytest

torch = pytest.importorskip("torch")

import openmla  # noqa: E402
from openmla.flash_mla import fused_norm_rope_attn_rope_cast as fused  # noqa: E402

ROPE = 64
EPS = 1e-4


# --- FlashMLA's reference, in plain torch -------------------------------------------------------

def build_cos_sin_cache(num_positions):
    inv_freq = 1.0 / (100000 ** (torch.arange(0, ROPE, 2, dtype=torch.float) / ROPE))
    freqs = torch.outer(torch.arange(0, num_positions, dtype=torch.float), inv_freq)
    return torch.cat((torch.cos(freqs), torch.sin(freqs)), dim=-1)


def rope_inplace(x, conjugate, cos_sin, positions):
    """x [s, h, d] fp32; the fp32 FMAs of FlashMLA's reference, each computed exactly in float64
    and rounded once to fp32."""
    cos = cos_sin[positions.long(), :ROPE // 2].unsqueeze(1).double()
    sin = cos_sin[positions.long(), ROPE // 2:].unsqueeze(1).double()
    if conjugate:
        sin = -sin
    part = x[..., -ROPE:]
    x0, x1 = part[..., 0::2].double(), part[..., 1::2].double()
    new0 = (x0 * cos - (x1 * sin).float().double()).float()
    new1 = (x0 * sin + (x1 * cos).float().double()).float()
    part[..., 0::2] = new0
    part[..., 1::2] = new1


def unpermute_q(q_perm):
    """permute_q_b_proj layout -> natural [s, h, d]."""
    s, h, d = q_perm.shape
    return q_perm.reshape(s, d // 16, h, 16).permute(0, 2, 1, 3).reshape(s, h, d)


def permute_q(q):
    s, h, d = q.shape
    return q.reshape(s, h, d // 16, 16).permute(0, 2, 1, 3).reshape(s, h, d).contiguous()


def ref_attention(q_bf16, keys, valid, sm_scale, norm_factor, attn_sink, d_v):
    """FlashMLA's ref_sparse_attn_fwd: keys [s, topk, d] fp32, valid [s, topk] bool."""
    p = q_bf16.float() @ keys.transpose(1, 2)
    p *= sm_scale * (norm_factor.unsqueeze(-1) if norm_factor is not None else 1.0)
    p.masked_fill_(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(p, dim=-1)
    max_logits = p.max(dim=-1).values
    lse_for_o = lse.clone()
    if attn_sink is not None:
        lse_for_o = torch.logsumexp(torch.stack([lse, attn_sink.expand_as(lse)]), dim=0)
    lse_for_o[lse_for_o == float("-inf")] = float("+inf")
    out = torch.exp(p - lse_for_o.unsqueeze(-1)) @ keys[..., :d_v]
    lse[lse == float("-inf")] = float("+inf")
    return out, max_logits, lse


def ref_fused(q_perm, keys, valid, sm_scale, norm, cos_sin, positions, attn_sink, d_v):
    q = unpermute_q(q_perm)
    factor = None
    if norm:
        q32 = q.float()
        factor = torch.rsqrt(torch.sum(q32 * q32, dim=-1) / q.shape[-1] + EPS)
    qr = q.float().clone()
    rope_inplace(qr, False, cos_sin, positions)
    out, max_logits, lse = ref_attention(qr.to(torch.bfloat16), keys, valid, sm_scale, factor,
                                         attn_sink, d_v)
    rope_inplace(out, True, cos_sin, positions)
    return out, max_logits, lse


def ref_cast(out, n_wv_group):
    """DeepGEMM's per-token cast (round_sf, per 32) of out [s, h, d_v] in the permuted output
    layout: (e4m3 bytes [s, g, G*d_v], exponents [s, g, G*d_v/32])."""
    s, h, d_v = out.shape
    g = h // n_wv_group
    x = out.reshape(s, n_wv_group, g, d_v // 32, 32).transpose(2, 3)  # [s, g, chunk, head, 32]
    x = x.reshape(s, n_wv_group, -1, 32)
    amax = x.abs().amax(dim=-1).clamp_min(1e-4)
    e = torch.ceil(torch.log2(amax.double() / 448.0)).to(torch.int32)
    fp8 = (x.double() * torch.pow(2.0, -e.double()).unsqueeze(-1)).float().to(torch.float8_e4m3fn)
    return fp8.reshape(s, n_wv_group, -1), e


def unpack_sf(out_sf):
    """out_sf [s, g, K] int32 -> exponents [s, g, 4K] (byte k of an int32 holds chunk 4j+k)."""
    b = out_sf.contiguous().view(torch.uint8).reshape(*out_sf.shape[:2], -1)
    return b.to(torch.int32) - 127


def dequant(out_fp8, out_sf, n_wv_group, d_v):
    s = out_fp8.shape[0]
    e = unpack_sf(out_sf).double()
    x = out_fp8.float().double().reshape(s, n_wv_group, -1, 32) * torch.pow(2.0, e).unsqueeze(-1)
    g = out_fp8.shape[2] // d_v
    return x.reshape(s, n_wv_group, d_v // 32, g, 32).transpose(2, 3).reshape(s, -1, d_v)


def check_close(name, got, want, abs_tol, rel_tol, cos_diff_tol=None):
    got, want = got.double(), want.double()
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{name}: non-finite entries differ"
    assert torch.equal(got[~finite], want[~finite]), f"{name}: infinities differ"
    g, w = got[finite], want[finite]
    bad = (g - w).abs() > abs_tol + rel_tol * w.abs()
    assert not bad.any(), f"{name}: {int(bad.sum())} entries off, worst {(g - w).abs().max()}"
    denom = (g * g).sum() + (w * w).sum()
    if cos_diff_tol is not None and denom > 0:
        assert 1 - 2 * (g * w).sum() / denom <= cos_diff_tol, f"{name}: cosine difference"


# --- cases --------------------------------------------------------------------------------------

def make_prefill(seed, s_q=5, h_q=64, d=512, s_kv=96, topk=64, sink=True, topk_length=True,
                 num_positions=4096):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(s_q, h_q, d, generator=gen) * 2).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d, generator=gen).to(torch.bfloat16)
    indices = torch.stack([torch.randperm(s_kv, generator=gen)[:topk] for _ in range(s_q)])
    indices[torch.rand(s_q, topk, generator=gen) < 0.1] = -1
    indices = indices.to(torch.int32).unsqueeze(1)
    positions = torch.randint(0, num_positions, (s_q,), generator=gen, dtype=torch.int32)
    lengths = torch.randint(0, topk + 1, (s_q,), generator=gen, dtype=torch.int32)
    lengths[0] = 0
    attn_sink = torch.randn(h_q, generator=gen)
    attn_sink[1], attn_sink[2] = float("inf"), float("-inf")
    return dict(q=q, kv=kv, indices=indices, positions=positions,
                cos_sin=build_cos_sin_cache(num_positions),
                topk_length=lengths if topk_length else None, attn_sink=attn_sink if sink else None)


def run_prefill(c, norm, n_wv_group, sm_scale):
    return fused.prefill(norm, EPS, c["positions"], False, ROPE, c["cos_sin"], n_wv_group, 32,
                         True, True, True, c["q"], c["kv"], c["indices"], sm_scale=sm_scale,
                         attn_sink=c["attn_sink"], topk_length=c["topk_length"])


def prefill_keys(c):
    idx = c["indices"][:, 0, :].long()
    s_kv, topk = c["kv"].shape[0], idx.shape[1]
    valid = (idx >= 0) & (idx < s_kv)
    if c["topk_length"] is not None:
        valid &= torch.arange(topk).unsqueeze(0) < c["topk_length"].unsqueeze(1)
    keys = c["kv"][:, 0, :].float()[idx.clamp(0, s_kv - 1)]
    return keys, valid


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("n_wv_group", [8, 4])
def test_prefill_matches_flashmla_reference(norm, n_wv_group):
    c = make_prefill(seed=11 + n_wv_group + norm)
    sm_scale = 1 / math.sqrt(512)
    out_fp8, out_sf, max_logits, lse = run_prefill(c, norm, n_wv_group, sm_scale)
    assert out_fp8.dtype == torch.float8_e4m3fn and out_fp8.shape == (5, n_wv_group, 64 // n_wv_group * 512)
    assert out_sf.dtype == torch.int32 and out_sf.shape == (5, n_wv_group, 64 // n_wv_group * 4)
    keys, valid = prefill_keys(c)
    ref_out, ref_max, ref_lse = ref_fused(c["q"], keys, valid, sm_scale, norm, c["cos_sin"],
                                          c["positions"], c["attn_sink"], 512)
    got = dequant(out_fp8, out_sf, n_wv_group, 512)
    check_close("out", got, ref_out, 1.1e-3, 1.01 / 8, 1e-3)
    check_close("max_logits", max_logits, ref_max, 1e-5, 4.01 / 65536)
    check_close("lse", lse, ref_lse, 1e-5, 4.01 / 65536)
    assert torch.isinf(lse[0]).all() and (lse[0] > 0).all()  # topk_length 0: lonely
    _, ref_e = ref_cast(ref_out, n_wv_group)
    e = unpack_sf(out_sf)
    assert (e - ref_e).abs().max() <= 1 and (e != ref_e).float().mean() < 0.01


def test_scale_factor_layout_and_exact_bytes():
    """topk 1 makes the output the key's V exactly, and quarter-turn cos/sin rotate exactly, so
    the e4m3 bytes and every packed scale are known: they must match bit for bit, in FlashMLA's
    layout (strides (1, K * A, A), A = s_q rounded up to 4)."""
    gen = torch.Generator().manual_seed(5)
    for s_q in (1, 3, 4, 6):
        c = make_prefill(seed=s_q, s_q=s_q, h_q=16, topk=1, sink=False, topk_length=False,
                         num_positions=8)
        c["indices"] = torch.randint(0, 96, (s_q, 1, 1), generator=gen, dtype=torch.int32)
        turns = torch.randint(0, 4, (8, ROPE // 2), generator=gen)
        c["cos_sin"] = torch.cat([torch.tensor([1.0, 0, -1, 0])[turns],
                                  torch.tensor([0.0, 1, 0, -1])[turns]], dim=-1)
        out_fp8, out_sf, _, _ = run_prefill(c, True, 2, 0.05)
        aligned = (s_q + 3) // 4 * 4
        assert out_sf.stride() == (1, 32 * aligned, aligned)
        v = c["kv"][c["indices"][:, 0, 0].long(), 0, :].float().unsqueeze(1).repeat(1, 16, 1)
        rope_inplace(v, True, c["cos_sin"], c["positions"])
        ref_fp8, ref_e = ref_cast(v, 2)
        assert torch.equal(out_fp8.view(torch.uint8), ref_fp8.view(torch.uint8))
        packed = ((ref_e + 127).to(torch.int64).reshape(s_q, 2, -1, 4) *
                  torch.tensor([1, 1 << 8, 1 << 16, 1 << 24])).sum(-1)
        assert torch.equal(out_sf.to(torch.int64) & 0xFFFFFFFF, packed)


def test_decode_matches_flashmla_reference():
    gen = torch.Generator().manual_seed(3)
    s_q, h_q, topk, extra_topk, page = 4, 64, 40, 24, 16
    cache = openmla.new_kv_cache(8, page, "fp8_mx", like=torch.empty(0))
    extra = openmla.new_kv_cache(4, 32, "fp4", like=torch.empty(0))
    for cch, fmt in ((cache, "fp8_mx"), (extra, "fp4")):
        n = cch.shape[0] * cch.shape[1]
        openmla.kv_cache_write(torch.randn(n, 512, generator=gen), torch.arange(n), cch,
                               kv_format=fmt)
    q = torch.randn(s_q, h_q, 512, generator=gen).to(torch.bfloat16)
    idx = torch.randint(-1, 128, (s_q, topk), generator=gen, dtype=torch.int32)
    eidx = torch.randint(0, 128, (s_q, extra_topk), generator=gen, dtype=torch.int32)
    lengths = torch.tensor([0, 7, topk, 33], dtype=torch.int32)
    elengths = torch.tensor([0, 24, 5, 0], dtype=torch.int32)
    positions = torch.tensor([0, 5, 999, 4095], dtype=torch.int32)
    cos_sin = build_cos_sin_cache(4096)
    sink = torch.randn(h_q, generator=gen)
    sink[0] = float("inf")
    sm_scale = 0.04
    out_fp8, out_sf, lse = fused.decode(
        enable_q_norm=True, rms_norm_eps=EPS, token_positions=positions, is_rope_neox_style=False,
        rope_dim=ROPE, cos_sin_cache=cos_sin, n_wv_group=8, num_per_channels=32,
        use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True, q=q,
        k_cache=cache, indices_in_kvcache=idx, sm_scale=sm_scale, attn_sink=sink,
        topk_length=lengths, extra_k_cache=extra, extra_indices_in_kvcache=eidx,
        extra_topk_length=elengths)
    keys = torch.cat([openmla.kv_cache_gather(cache, idx.flatten().clamp_min(0).long(),
                                              kv_format="fp8_mx").view(s_q, topk, 512),
                      openmla.kv_cache_gather(extra, eidx.flatten().long(),
                                              kv_format="fp4").view(s_q, extra_topk, 512)], 1)
    valid = torch.cat([(idx >= 0) & (torch.arange(topk) < lengths.unsqueeze(1)),
                       torch.arange(extra_topk) < elengths.unsqueeze(1)], 1)
    ref_out, _, ref_lse = ref_fused(q, keys, valid, sm_scale, True, cos_sin,
                                    positions, sink, 512)
    check_close("out", dequant(out_fp8, out_sf, 8, 512), ref_out, 1.1e-3, 1.01 / 8, 1e-3)
    check_close("lse", lse, ref_lse, 1e-5, 4.01 / 65536)
    assert (out_fp8[0].view(torch.uint8) == 0).all()  # no key: zeros, lse +inf
    assert torch.isinf(lse[0]).all()


# --- weight permutations ------------------------------------------------------------------------

def quantize_rows(w, gran):
    """Per-row, per-gran e4m3 weights with packed UE8M0 scales [rows, cols / (gran * 4)]."""
    rows, cols = w.shape
    x = w.reshape(rows, cols // gran, gran)
    e = torch.ceil(torch.log2(x.abs().amax(-1).clamp_min(1e-4) / 448)).to(torch.int32)
    fp8 = (x * torch.pow(2.0, -e.float()).unsqueeze(-1)).to(torch.float8_e4m3fn).reshape(rows, cols)
    sf = (e + 127).to(torch.uint8).contiguous().view(torch.int32)
    return fp8, sf


def dequant_rows(fp8, sf, gran):
    rows, cols = fp8.shape
    e = sf.contiguous().view(torch.uint8).to(torch.float64) - 127
    scale = torch.pow(2.0, e).repeat_interleave(gran, dim=1)
    return fp8.double() * scale


@pytest.mark.parametrize("gran", [32, 128])
def test_permute_q_b_proj_gives_the_permuted_q(gran):
    h_q, d_q, rank = 8, 64, 512
    gen = torch.Generator().manual_seed(gran)
    w, sf = quantize_rows(torch.randn(h_q * d_q, rank, generator=gen) / 10, gran)
    sf = sf.t().contiguous().t()  # DeepGEMM's layout: contiguous on the first dim
    pw, psf = fused.permute_q_b_proj((w, sf), h_q, d_q)
    assert pw.dtype == w.dtype and psf.shape == sf.shape and psf.stride(0) == 1
    x = torch.randn(3, rank, generator=gen, dtype=torch.float64)
    q = (x @ dequant_rows(w, sf, gran).t()).view(3, h_q, d_q)
    q_perm = (x @ dequant_rows(pw, psf, gran).t()).view(3, h_q, d_q)
    assert torch.equal(q_perm, permute_q(q))  # the same dot products, reordered
    assert sorted(fused.q_b_row_permutation(h_q, d_q).tolist()) == list(range(h_q * d_q))


def test_permute_wv_proj_matches_the_permuted_output():
    n, m, g, d_o = 2, 48, 4, 128
    gen = torch.Generator().manual_seed(9)
    w, sf = quantize_rows(torch.randn(n * m, g * d_o, generator=gen) / 10, 32)
    w, sf = w.view(n, m, g * d_o), sf.view(n, m, -1)
    sf = sf.transpose(1, 2).contiguous().transpose(1, 2)  # contiguous on the second dim
    pw, psf = fused.permute_wv_proj((w, sf), g, d_o)
    assert psf.shape == sf.shape and psf.stride(1) == 1
    deq = dequant_rows(w.view(n * m, -1), sf.reshape(n * m, -1), 32).view(n, m, -1)
    pdeq = dequant_rows(pw.view(n * m, -1), psf.reshape(n * m, -1), 32).view(n, m, -1)
    o = torch.randn(5, n, g, d_o, generator=gen, dtype=torch.float64)  # natural [b, g, head, d]
    o_perm = o.view(5, n, g, d_o // 32, 32).transpose(2, 3).reshape(5, n, g * d_o)
    natural = torch.einsum("bhr,hdr->bhd", o.reshape(5, n, g * d_o), deq)
    permuted = torch.einsum("bhr,hdr->bhd", o_perm, pdeq)
    torch.testing.assert_close(permuted, natural, rtol=1e-12, atol=1e-12)


def test_torch_compile_fullgraph_traces_the_custom_ops():
    c = make_prefill(seed=31, s_q=3, h_q=16)

    def fn(q, kv, indices, positions, cos_sin, sink, lengths):
        out_fp8, out_sf, max_logits, lse = fused.prefill(
            True, EPS, positions, False, ROPE, cos_sin, 2, 32, True, True, True, q, kv, indices,
            sm_scale=0.05, attn_sink=sink, topk_length=lengths)
        return out_fp8.view(torch.uint8).float().sum(), out_sf, lse

    args = (c["q"], c["kv"], c["indices"], c["positions"], c["cos_sin"], c["attn_sink"],
            c["topk_length"])
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    from openmla import _fused_torch_ops
    op = _fused_torch_ops.ops()[0]
    torch.library.opcheck(op, (True, EPS, c["positions"], False, ROPE, c["cos_sin"], 2, 32, True,
                               True, True, c["q"], c["kv"], c["indices"], 0.05, 512,
                               c["attn_sink"], c["topk_length"]))


def decode_case(seed, s_q=3, h_q=16):
    gen = torch.Generator().manual_seed(seed)
    cache = openmla.new_kv_cache(4, 16, "fp8_mx", like=torch.empty(0))
    openmla.kv_cache_write(torch.randn(64, 512, generator=gen), torch.arange(64), cache,
                           kv_format="fp8_mx")
    return dict(q=torch.randn(s_q, h_q, 512, generator=gen).to(torch.bfloat16), cache=cache,
                idx=torch.randint(-1, 64, (s_q, 24), generator=gen, dtype=torch.int32),
                lengths=torch.tensor([0, 24, 9][:s_q], dtype=torch.int32),
                positions=torch.arange(s_q, dtype=torch.int32) * 7,
                cos_sin=build_cos_sin_cache(64), sink=torch.randn(h_q, generator=gen))


def test_decode_batch_invariant_keyword_and_torch_compile():
    """decode's OpenMLA keyword batch_invariant (the CPU backend always is: the same bytes), and
    torch.compile(fullgraph=True) tracing the decode custom op with it."""
    c = decode_case(seed=41)

    def fn(q, cache, idx, lengths, positions, cos_sin, sink, batch_invariant):
        out_fp8, out_sf, lse = fused.decode(
            False, EPS, positions, False, ROPE, cos_sin, 2, 32, True, True, True, q, cache, idx,
            0.05, 512, sink, lengths, batch_invariant=batch_invariant)
        return out_fp8.view(torch.uint8), out_sf, lse

    args = (c["q"], c["cache"], c["idx"], c["lengths"], c["positions"], c["cos_sin"], c["sink"])
    plain = fn(*args, False)
    invariant = fn(*args, True)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args, True)
    for a, b, d in zip(plain, invariant, compiled):
        assert torch.equal(a, b) and torch.equal(a, d)
    with pytest.raises(TypeError, match="batch_invariant"):
        fn(*args, 1)
    from openmla import _fused_torch_ops
    op = _fused_torch_ops.ops()[1]
    torch.library.opcheck(op, (False, EPS, c["positions"], False, ROPE, c["cos_sin"], 2, 32, True,
                               True, True, c["q"], c["cache"], c["idx"], 0.05, 512, c["sink"],
                               c["lengths"], None, None, None, True))


# --- alias and errors ---------------------------------------------------------------------------

def test_flash_mla_alias_exposes_the_submodule():
    import sys
    saved = {k: sys.modules.get(k) for k in ("flash_mla", "flash_mla.flash_mla_interface",
                                             "flash_mla.fused_norm_rope_attn_rope_cast")}
    try:
        openmla.install_flash_mla_alias()
        import flash_mla
        import flash_mla.fused_norm_rope_attn_rope_cast as sub
        assert sub is fused and flash_mla.fused_norm_rope_attn_rope_cast is fused
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_flash_mla_alias_by_environment_serves_the_submodule():
    """`import flash_mla.fused_norm_rope_attn_rope_cast` first thing in a fresh interpreter, with
    OPENMLA_FLASH_MLA_ALIAS=1 (import openmla honours it; a pip install's .pth does it too)."""
    import os
    import subprocess
    import sys
    code = ("import openmla, flash_mla.fused_norm_rope_attn_rope_cast as f\n"
            "assert f.__name__ == 'openmla.fused_norm_rope_attn_rope_cast', f.__name__\n"
            "from flash_mla import fused_norm_rope_attn_rope_cast as g\n"
            "assert g is f and g.prefill and g.decode and g.permute_q_b_proj\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OPENMLA_FLASH_MLA_ALIAS": "1"})
    assert proc.returncode == 0, proc.stderr


def test_errors_name_the_argument():
    c = make_prefill(seed=1, s_q=3, h_q=16)
    c["positions"] = torch.tensor([0, 4096, 1], dtype=torch.int32)  # past the cos/sin cache
    with pytest.raises(ValueError, match="token_positions"):
        run_prefill(c, False, 2, 0.1)
    c["positions"] = torch.tensor([0, -1, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="token_positions"):
        run_prefill(c, False, 2, 0.1)
    c = make_prefill(seed=2, s_q=3, h_q=16)
    c["q"] = c["q"].float()
    with pytest.raises((TypeError, ValueError), match="q"):
        run_prefill(c, False, 2, 0.1)
    c = make_prefill(seed=3, s_q=3, h_q=16)
    c["positions"] = c["positions"].long()
    with pytest.raises((TypeError, ValueError), match="token_positions"):
        run_prefill(c, False, 2, 0.1)
    with pytest.raises(ValueError, match="n_wv_group"):
        run_prefill(make_prefill(seed=4, s_q=3, h_q=16), False, 3, 0.1)
    with pytest.raises(ValueError, match="sm_scale"):
        run_prefill(make_prefill(seed=5, s_q=3, h_q=16), False, 2, None)
    c = make_prefill(seed=6, s_q=3, h_q=16)
    with pytest.raises(ValueError, match="is_rope_neox_style"):
        fused.prefill(False, EPS, c["positions"], True, ROPE, c["cos_sin"], 2, 32, True, True,
                      True, c["q"], c["kv"], c["indices"], sm_scale=0.1)


def test_workspace_size_is_zero_on_the_cpu():
    """CUDA tensors get a workspace of fused_workspace_size(q) bytes per call (the GPU tests
    cover them: test_gpu_fused.py); the CPU backend needs none."""
    assert fused.fused_workspace_size(torch.empty(7, 64, 512, dtype=torch.bfloat16)) == 0
    assert openmla._C.fused_workspace_size("cpu", 0, 7, 64) == 0
    with pytest.raises(ValueError, match="h_q"):
        openmla._C.fused_workspace_size("cpu", 0, 7, -1)
