"""GPU tier of test_fused_attention.py (run on a Hopper GPU with `pytest tests/python -m gpu`):
openmla.flash_mla.fused_norm_rope_attn_rope_cast on CUDA tensors against the CPU backend on the
same inputs (copied to the host, the same function called).

The comparison: out_fp8 dequantised with its out_sf (UE8M0 bytes decoded) against the CPU's,
relative L2 error < 2e-2 and every value within 0.13 of its (token, head) row's largest
magnitude (one e4m3 step at the top of the row's range, 1/8, plus the attention's own
rounding); the out_sf bytes equal the CPU's for >= 99% of the chunks and never more than one
binade apart (a chunk whose amax sits next to a power of two may round either way); lse and
max_logits within 1e-2 (infinities exactly where the CPU has them). Lonely tokens (no valid key)
give exact zeros with scale byte 105, as on the CPU. The inputs: invalid (-1 and past the end)
indices mixed in, topk_length including 0, attn_sink with +inf and -inf entries, q norm on and
off, groups of 8 and 16 heads; NaN in every cache slot / kv row no index names. The outputs are
allocated by the operation, so they cannot be poisoned directly: freed blocks of the outputs'
sizes are filled with NaN (0x7F bytes) right before each call, which the caching allocator hands
to the call's outputs (best effort: a byte the kernel fails to write then reads NaN).

Also: keys past topk_length never read (NaN there), a CUDA-graph capture of a decode call
replayed on new inputs, batch_invariant=True (a token's bits alone = in its call), the current
stream, torch.compile, the out-of-range position contract (NaN output) and NotImplementedError
for d_qk != 512.

OPENMLA_GPU_TEST_DEVICE=cpu runs the same comparisons on CPU tensors (a dry run of the tests
themselves where no GPU is present; the CUDA-only tests are skipped then)."""

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests need torch")

import openmla  # noqa: E402
from openmla.flash_mla import fused_norm_rope_attn_rope_cast as fused  # noqa: E402
from test_fused_attention import EPS, ROPE, build_cos_sin_cache, dequant, unpack_sf  # noqa: E402
from test_gpu_ops import DEVICE, capture  # noqa: E402  (skips this module without CUDA)

needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")

D = 512                # d_qk = d_v: the CUDA kernel's only size
NUM_POSITIONS = 8192
OUT_RTOL = 2e-2        # relative L2 error of the dequantised output
ROW_ATOL = 0.13        # max |gpu - cpu| / the row's amax
SF_MATCH = 0.99        # share of scale bytes equal to the CPU's
STATS_ATOL = 1e-2      # lse, max_logits

_COS_SIN = build_cos_sin_cache(NUM_POSITIONS)


# --- helpers --------------------------------------------------------------------------------

def gen(seed):
    return torch.Generator().manual_seed(seed)


def to_dev(x):
    return None if x is None else x.to(DEVICE)


def to_cpu(x):
    return None if x is None else x.detach().cpu()


def same(x):
    return x


def on(c, to):
    """The case's tensors through `to` (to_dev / to_cpu), its other values as they are."""
    return {k: to(v) if isinstance(v, torch.Tensor) else v for k, v in c.items()}


def poison_next_outputs(s_q, h_q, n_wv_group, stats):
    """Fills freed blocks of the sizes the next call allocates (out_fp8, out_sf, `stats`
    [s_q, h_q] fp32 arrays) with 0x7F / NaN bytes: torch's caching allocator hands them to the
    call's outputs (best effort, CUDA only)."""
    if DEVICE != "cuda":
        return
    group = h_q // n_wv_group
    _, _, storage = openmla._C.fused_out_sf_layout(s_q, n_wv_group, group, D)
    blocks = [torch.full((s_q, n_wv_group, group * D), 0x7F, dtype=torch.uint8, device=DEVICE),
              torch.full((max(storage, 1),), -1, dtype=torch.int32, device=DEVICE)]
    blocks += [torch.full((s_q, h_q), float("nan"), device=DEVICE) for _ in range(stats)]
    del blocks


def row_amax(x):
    return x.abs().amax(dim=-1)  # [s, h]


def assert_out_close(name, got_fp8, got_sf, want_fp8, want_sf, n_wv_group):
    """The dequantised outputs and the scale bytes, as the module docstring says."""
    assert got_fp8.shape == want_fp8.shape and got_fp8.dtype == torch.float8_e4m3fn
    assert got_sf.shape == want_sf.shape and got_sf.stride() == want_sf.stride()
    got_fp8, got_sf = got_fp8.cpu(), got_sf.cpu()
    got = dequant(got_fp8, got_sf, n_wv_group, D)
    want = dequant(want_fp8, want_sf, n_wv_group, D)
    assert torch.isfinite(want).all(), f"{name}: the CPU output has non-finite values"
    bad = ~torch.isfinite(got)
    assert not bad.any(), (f"{name}: {int(bad.sum())} non-finite values (unwritten or NaN "
                           f"bytes) at [token, head] {bad.any(-1).nonzero()[:8].tolist()}")
    denom = torch.linalg.norm(want)
    err = (torch.linalg.norm(got - want) / denom).item() if denom > 0 else 0.0
    assert err < OUT_RTOL, f"{name}: relative L2 error {err:.3e}"
    diff = (got - want).abs().amax(dim=-1)
    amax = row_amax(want)
    over = diff > ROW_ATOL * amax
    assert not over.any(), (f"{name}: {int(over.sum())} rows off by more than {ROW_ATOL} of "
                            f"their amax, worst {(diff / amax.clamp_min(1e-30)).max():.3f} at "
                            f"[token, head] {over.nonzero()[:8].tolist()}")
    e_got, e_want = unpack_sf(got_sf), unpack_sf(want_sf)
    share = (e_got == e_want).float().mean().item()
    assert share >= SF_MATCH, f"{name}: only {share:.4f} of the scale bytes match the CPU's"
    assert (e_got - e_want).abs().max() <= 1, f"{name}: a scale more than one binade off"


def assert_stats_close(name, got, want, atol=STATS_ATOL):
    got, want = got.detach().cpu().double(), want.double()
    assert got.shape == want.shape
    finite = torch.isfinite(want)
    where = (torch.isfinite(got) != finite).nonzero()[:8].tolist()
    assert torch.equal(torch.isfinite(got), finite), f"{name}: finite entries differ at {where}"
    assert torch.equal(got[~finite], want[~finite]), f"{name}: infinities differ in sign"
    if finite.any():
        worst = (got[finite] - want[finite]).abs().max().item()
        assert worst <= atol, f"{name}: off by up to {worst:.3e}"


def assert_lonely(out_fp8, out_sf, lse, tokens):
    """Tokens with no valid key: exact zeros, scale bytes 105 (e = -22), lse +inf."""
    for t in tokens:
        assert (out_fp8[t].cpu().view(torch.uint8) == 0).all(), f"token {t}: not all zero"
        assert (unpack_sf(out_sf.cpu())[t] == -22).all(), f"token {t}: scale bytes not 105"
        assert torch.isposinf(lse[t].cpu()).all(), f"token {t}: lse not +inf"


def make_sink(h_q, seed):
    sink = torch.randn(h_q, generator=gen(seed))
    sink[1], sink[2] = float("inf"), float("-inf")
    return sink


def make_q(s_q, h_q, seed):
    """q in the permute_q_b_proj layout (random values: the layout is the CPU's too)."""
    return (torch.randn(s_q, h_q, D, generator=gen(seed)) * 2).to(torch.bfloat16)


def pick_rows(pool, s_q, topk, g):
    """[s_q, topk] int32: per token, topk distinct entries of `pool` (1-D) in random order."""
    rows = [pool[torch.randperm(pool.numel(), generator=g)[:topk]] for _ in range(s_q)]
    return torch.stack(rows).to(torch.int32)


def spoil(indices, g, invalid, past_end):
    """~10% of the entries set to -1 and a few to `past_end` (out of range: ignored)."""
    idx = indices.clone()
    idx[torch.rand(idx.shape, generator=g) < 0.1] = -1
    idx[torch.rand(idx.shape, generator=g) < 0.01] = past_end
    idx[:, :3] = invalid  # every row has some
    return idx


def lengths_for(s_q, topk, g):
    """[s_q] int32 in [0, topk]: token 0 gets 0, the last (of more than one) topk."""
    lengths = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32)
    lengths[-1] = topk
    lengths[0] = 0
    return lengths


def new_cache(fmt, num_blocks, page, seed, nan_slots):
    """A CPU cache of `fmt`, every slot written from random latents; slots in `nan_slots` hold
    NaN (so reading one shows)."""
    n = num_blocks * page
    x = torch.randn(n, D, generator=gen(seed))
    x[nan_slots] = float("nan")
    cache = openmla.new_kv_cache(num_blocks, page, fmt, d_qk=D, like=torch.empty(0))
    openmla.kv_cache_write(x, torch.arange(n, dtype=torch.int32), cache, kv_format=fmt)
    return cache


def cache_to_dev(cache, fmt):
    """The cache on DEVICE with the same (padded) block stride."""
    if DEVICE == "cpu":
        return cache
    dev = openmla.new_kv_cache(cache.shape[0], cache.shape[1], fmt, d_qk=D,
                               like=torch.empty(0, device=DEVICE))
    dev.copy_(cache)
    return dev


# --- prefill --------------------------------------------------------------------------------

def prefill_case(seed, s_q, h_q, topk, lengths=True, sink=True, s_kv=None):
    """bf16 kv rows with NaN in every row no index names; indices with invalid entries."""
    g = gen(seed)
    s_kv = s_kv or 2 * topk + 64
    used = torch.randperm(s_kv, generator=g)[: s_kv * 3 // 4]
    unused = torch.ones(s_kv, dtype=torch.bool)
    unused[used] = False
    kv = torch.randn(s_kv, 1, D, generator=g)
    kv[unused] = float("nan")
    idx = spoil(pick_rows(used, s_q, topk, g), g, -1, s_kv)
    if s_q > 1:
        idx[1] = -1  # a token with no valid key at all
    return dict(q=make_q(s_q, h_q, seed + 1), kv=kv.to(torch.bfloat16), indices=idx.unsqueeze(1),
                positions=torch.randint(0, NUM_POSITIONS, (s_q,), generator=g, dtype=torch.int32),
                topk_length=lengths_for(s_q, topk, g) if lengths else None,
                attn_sink=make_sink(h_q, seed + 2) if sink else None, cos_sin=_COS_SIN)


def run_prefill(c, norm, n_wv_group, sm_scale, to=same):
    """The call on c's tensors passed through `to` (as they are by default)."""
    return fused.prefill(norm, EPS, to(c["positions"]), False, ROPE, to(c["cos_sin"]),
                         n_wv_group, 32, True, True, True, to(c["q"]), to(c["kv"]),
                         to(c["indices"]), sm_scale=sm_scale, attn_sink=to(c["attn_sink"]),
                         topk_length=to(c["topk_length"]))


def prefill_lonely(c):
    s_q = c["q"].shape[0]
    tokens = [1] if s_q > 1 else []
    if c["topk_length"] is not None:
        tokens.append(0)
    return tokens


@pytest.mark.parametrize("h_q,s_q,topk,norm,group,lengths,sink", [
    (64, 1, 512, True, 8, True, True),
    (64, 37, 1024, False, 16, True, True),
    (128, 300, 512, True, 8, False, True),
    (128, 37, 1024, False, 8, True, True),
    (64, 300, 1024, True, 16, True, False),
    (128, 1, 512, False, 16, False, True),
    (128, 37, 512, True, 16, True, True),
])
def test_prefill_matches_cpu(h_q, s_q, topk, norm, group, lengths, sink):
    c = prefill_case(seed=h_q + s_q + topk, s_q=s_q, h_q=h_q, topk=topk, lengths=lengths,
                     sink=sink)
    n_wv_group = h_q // group
    sm_scale = 1 / math.sqrt(D)
    dev = on(c, to_dev)  # (before the poison: the inputs' copies must not take its blocks)
    poison_next_outputs(s_q, h_q, n_wv_group, stats=2)
    out_fp8, out_sf, max_logits, lse = run_prefill(dev, norm, n_wv_group, sm_scale)
    assert out_fp8.device.type == DEVICE
    want = run_prefill(c, norm, n_wv_group, sm_scale, to_cpu)
    assert_out_close("out", out_fp8, out_sf, want[0], want[1], n_wv_group)
    assert_stats_close("max_logits", max_logits, want[2])
    assert_stats_close("lse", lse, want[3])
    assert_lonely(out_fp8, out_sf, lse, prefill_lonely(c))
    if sink:  # +inf sink: the head's output is exactly zero
        got = dequant(out_fp8.cpu(), out_sf.cpu(), n_wv_group, D)
        assert (got[:, 1] == 0).all()


def test_prefill_never_reads_past_topk_length():
    """Entries past a token's topk_length name NaN rows: none may reach the output."""
    s_q, h_q, topk = 9, 64, 512
    c = prefill_case(seed=5, s_q=s_q, h_q=h_q, topk=topk)
    s_kv = c["kv"].shape[0]
    nan_rows = torch.isnan(c["kv"][:, 0, 0].float()).nonzero().flatten()
    assert nan_rows.numel() > 0
    pos = torch.arange(topk).view(1, -1)
    past = pos >= c["topk_length"].view(-1, 1)
    fill = nan_rows[torch.randint(0, nan_rows.numel(), (s_q, topk), generator=gen(6))]
    c["indices"][:, 0][past] = fill[past].to(torch.int32)
    assert int(c["indices"].max()) <= s_kv
    out_fp8, out_sf, max_logits, lse = run_prefill(c, True, 8, 0.05, to_dev)
    want = run_prefill(c, True, 8, 0.05, to_cpu)
    assert_out_close("out", out_fp8, out_sf, want[0], want[1], 8)
    assert_stats_close("max_logits", max_logits, want[2])
    assert_stats_close("lse", lse, want[3])


# --- decode ---------------------------------------------------------------------------------

MAIN_PAGE, EXTRA_PAGE = 256, 64


def decode_case(seed, fmt, extra_fmt, s_q, h_q, topk, extra_topk, lengths, sink=True,
                nan_past_length=False):
    """Main cache `fmt` on pages of 256, the optional extra cache `extra_fmt` on pages of 64;
    every slot no index names holds NaN; indices with -1 and past-the-end entries."""
    g = gen(seed)
    main_blocks = (topk * 4 // 3 + MAIN_PAGE) // MAIN_PAGE + 1
    n = main_blocks * MAIN_PAGE
    used = torch.randperm(n, generator=g)[: max(topk, n * 3 // 4)]
    idx = spoil(pick_rows(used, s_q, topk, g), g, -1, n)
    c = dict(q=make_q(s_q, h_q, seed + 1), fmt=fmt, extra_fmt=extra_fmt,
             positions=torch.randint(0, NUM_POSITIONS, (s_q,), generator=g, dtype=torch.int32),
             topk_length=lengths_for(s_q, topk, g) if lengths else None,
             attn_sink=make_sink(h_q, seed + 2) if sink else None,
             extra_cache=None, extra_indices=None, extra_topk_length=None)
    unused = torch.ones(n, dtype=torch.bool)
    unused[used] = False
    if nan_past_length and lengths:  # entries past the length name NaN slots
        nan_slots = unused.nonzero().flatten()
        past = torch.arange(topk).view(1, -1) >= c["topk_length"].view(-1, 1)
        pick = torch.randint(0, nan_slots.numel(), idx.shape, generator=g)
        idx[past] = nan_slots[pick][past].int()
    c["cache"] = new_cache(fmt, main_blocks, MAIN_PAGE, seed + 3, unused)
    c["indices"] = idx
    lonely = [0] if lengths else []
    if extra_fmt is not None:
        extra_blocks = (extra_topk * 4 // 3 + EXTRA_PAGE) // EXTRA_PAGE + 1
        m = extra_blocks * EXTRA_PAGE
        eused = torch.randperm(m, generator=g)[: max(extra_topk, m * 3 // 4)]
        eidx = spoil(pick_rows(eused, s_q, extra_topk, g), g, -1, m)
        c["extra_topk_length"] = lengths_for(s_q, extra_topk, g) if lengths else None
        eunused = torch.ones(m, dtype=torch.bool)
        eunused[eused] = False
        if nan_past_length and lengths:
            nan_slots = eunused.nonzero().flatten()
            past = torch.arange(extra_topk).view(1, -1) >= c["extra_topk_length"].view(-1, 1)
            pick = torch.randint(0, nan_slots.numel(), eidx.shape, generator=g)
            eidx[past] = nan_slots[pick][past].int()
        c["extra_cache"] = new_cache(extra_fmt, extra_blocks, EXTRA_PAGE, seed + 4, eunused)
        c["extra_indices"] = eidx
        if lengths:
            c["extra_topk_length"][0] = 0  # token 0: no key in either cache
    if s_q > 2:  # a token whose every entry is invalid, in both caches
        c["indices"][2] = -1
        if extra_fmt is not None:
            c["extra_indices"][2] = -1
        lonely.append(2)
    c["lonely"] = lonely
    c["cache_dev"] = cache_to_dev(c["cache"], fmt)
    c["extra_cache_dev"] = (cache_to_dev(c["extra_cache"], extra_fmt)
                            if extra_fmt is not None else None)
    return c


TOKEN_KEYS = ("q", "positions", "indices", "topk_length", "extra_indices", "extra_topk_length")


def decode_inputs(c, on_device=True, rows=None):
    """The call's tensors on DEVICE (the caches with their block stride) or, on_device=False,
    the CPU; `rows` a slice of the tokens."""
    to = to_dev if on_device else to_cpu
    sl = rows if rows is not None else slice(None)
    x = {k: None if c[k] is None else to(c[k][sl]) for k in TOKEN_KEYS}
    x["attn_sink"], x["cos_sin"] = to(c["attn_sink"]), to(_COS_SIN)
    x["cache"] = c["cache_dev"] if on_device else c["cache"]
    x["extra_cache"] = c["extra_cache_dev"] if on_device else c["extra_cache"]
    return x


def run_decode(x, norm, n_wv_group, sm_scale, batch_invariant=False):
    """The call on decode_inputs' tensors `x`."""
    return fused.decode(
        enable_q_norm=norm, rms_norm_eps=EPS, token_positions=x["positions"],
        is_rope_neox_style=False, rope_dim=ROPE, cos_sin_cache=x["cos_sin"],
        n_wv_group=n_wv_group, num_per_channels=32, use_tma_aligned_col_major_sf=True,
        round_sf=True, use_packed_ue8m0=True, q=x["q"], k_cache=x["cache"],
        indices_in_kvcache=x["indices"], sm_scale=sm_scale, attn_sink=x["attn_sink"],
        topk_length=x["topk_length"], extra_k_cache=x["extra_cache"],
        extra_indices_in_kvcache=x["extra_indices"], extra_topk_length=x["extra_topk_length"],
        batch_invariant=batch_invariant)


def decode_both(c, norm, n_wv_group, sm_scale, batch_invariant=False, poison=True):
    """(the call on DEVICE, the same on the CPU); the device outputs poisoned first."""
    x = decode_inputs(c)
    if poison:
        s_q, h_q, _ = c["q"].shape
        poison_next_outputs(s_q, h_q, n_wv_group, stats=1)
    got = run_decode(x, norm, n_wv_group, sm_scale, batch_invariant)
    return got, run_decode(decode_inputs(c, on_device=False), norm, n_wv_group, sm_scale)


DECODE_CASES = [
    # fmt, extra_fmt, h_q, s_q, topk, extra_topk, lengths, group, norm
    ("fp8_model1", None, 128, 1, 512, 0, True, 8, True),
    ("fp8_model1", None, 64, 4, 128, 0, False, 16, False),
    ("fp8_model1", "fp8_model1", 64, 4, 128, 512, True, 16, True),
    ("fp8_model1", "fp8_model1", 128, 64, 512, 1024, False, 8, True),
    ("fp8_model1", "fp8_model1", 64, 64, 512, 1024, True, 8, True),
    ("fp8_model1", "fp8_model1", 128, 1, 128, 512, False, 16, True),
    ("fp8_mx", None, 64, 64, 128, 0, True, 8, False),
    ("fp8_mx", None, 128, 4, 512, 0, False, 16, False),
    ("fp8_mx", "fp8_mx", 128, 4, 512, 1024, True, 16, False),
    ("fp8_mx", "fp8_mx", 64, 1, 128, 512, False, 8, False),
    ("fp8_mx", "fp8_mx", 64, 64, 512, 1024, True, 16, True),
    ("fp8_mx", "fp4", 128, 64, 512, 1024, True, 8, False),
    ("fp8_mx", "fp4", 64, 4, 128, 512, False, 16, False),
    ("fp8_mx", "fp4", 128, 1, 512, 1024, True, 16, True),
    ("fp8_mx", "fp4", 64, 64, 128, 512, False, 8, False),
]


@pytest.mark.parametrize("fmt,extra_fmt,h_q,s_q,topk,extra_topk,lengths,group,norm",
                         DECODE_CASES)
def test_decode_matches_cpu(fmt, extra_fmt, h_q, s_q, topk, extra_topk, lengths, group, norm):
    c = decode_case(seed=7 * s_q + h_q + topk + extra_topk, fmt=fmt, extra_fmt=extra_fmt,
                    s_q=s_q, h_q=h_q, topk=topk, extra_topk=extra_topk, lengths=lengths)
    n_wv_group = h_q // group
    sm_scale = 1 / math.sqrt(D)
    (out_fp8, out_sf, lse), want = decode_both(c, norm, n_wv_group, sm_scale)
    assert out_fp8.device.type == DEVICE
    assert_out_close("out", out_fp8, out_sf, want[0], want[1], n_wv_group)
    assert_stats_close("lse", lse, want[2])
    assert_lonely(out_fp8, out_sf, lse, c["lonely"])


@pytest.mark.parametrize("extra_fmt", ["fp8_mx", "fp4"])
def test_decode_never_reads_past_topk_length(extra_fmt):
    """Entries past topk_length / extra_topk_length name NaN slots: none may reach the output."""
    c = decode_case(seed=40, fmt="fp8_mx", extra_fmt=extra_fmt, s_q=16, h_q=64, topk=512,
                    extra_topk=512, lengths=True, nan_past_length=True)
    (out_fp8, out_sf, lse), want = decode_both(c, False, 8, 0.05)
    assert_out_close("out", out_fp8, out_sf, want[0], want[1], 8)
    assert_stats_close("lse", lse, want[2])


# --- batch invariance, streams, CUDA graphs, torch.compile ------------------------------------

def test_decode_batch_invariant_tokens_alone_and_in_the_call():
    """batch_invariant=True: each token's bytes (out_fp8, its scale bytes, lse) are the same
    computed alone, in a slice of the call and in the whole call; and they match the CPU."""
    s_q, h_q = 64, 128
    c = decode_case(seed=50, fmt="fp8_mx", extra_fmt="fp4", s_q=s_q, h_q=h_q, topk=512,
                    extra_topk=1024, lengths=True)
    full, want = decode_both(c, False, 16, 0.05, batch_invariant=True)
    assert_out_close("out", full[0], full[1], want[0], want[1], 16)
    assert_stats_close("lse", full[2], want[2])
    full_e = unpack_sf(full[1].cpu())
    for rows in (slice(5, 6), slice(8, 12), slice(60, 64), slice(0, 1)):
        part = run_decode(decode_inputs(c, rows=rows), False, 16, 0.05, batch_invariant=True)
        assert torch.equal(part[0].cpu().view(torch.uint8), full[0][rows].cpu().view(torch.uint8))
        assert torch.equal(unpack_sf(part[1].cpu()), full_e[rows])
        assert torch.equal(part[2].cpu(), full[2][rows].cpu())


@needs_cuda
def test_decode_runs_on_the_current_stream():
    c = decode_case(seed=60, fmt="fp8_model1", extra_fmt="fp8_model1", s_q=8, h_q=64, topk=512,
                    extra_topk=512, lengths=True)
    eager = run_decode(decode_inputs(c), True, 8, 0.05)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # the copies and the call wait for this, on its stream
        got = run_decode(decode_inputs(c), True, 8, 0.05)
    side.synchronize()
    assert torch.equal(got[0].view(torch.uint8), eager[0].view(torch.uint8))
    assert torch.equal(got[1], eager[1])
    assert torch.equal(got[2], eager[2])


@needs_cuda
def test_cuda_graph_decode_replays_on_new_inputs():
    """A decode call (V4.1 caches with the fp4 extra cache, lengths) captured once and replayed
    after new q, positions, indices and lengths are copied into its inputs: the same bytes as
    an eager call on those inputs, and close to the CPU."""
    s_q, h_q, topk, extra_topk, n_wv_group = 16, 64, 512, 1024, 8
    c = decode_case(seed=70, fmt="fp8_mx", extra_fmt="fp4", s_q=s_q, h_q=h_q, topk=topk,
                    extra_topk=extra_topk, lengths=True)
    static = {k: to_dev(c[k]) for k in ("q", "positions", "indices", "topk_length",
                                         "extra_indices", "extra_topk_length", "attn_sink")}
    cos_sin = to_dev(_COS_SIN)

    def step():
        return fused.decode(True, EPS, static["positions"], False, ROPE, cos_sin, n_wv_group, 32,
                            True, True, True, static["q"], c["cache_dev"], static["indices"],
                            0.05, 512, static["attn_sink"], static["topk_length"],
                            c["extra_cache_dev"], static["extra_indices"],
                            static["extra_topk_length"])

    graph, outs = capture(step)
    for trial in range(2):
        # new inputs over the graph's caches: the index rows shuffled (slots that hold keys,
        # -1 and past-the-end entries), new lengths, positions and q
        g = gen(71 + trial)
        rows = torch.randperm(s_q, generator=g)
        new = dict(q=make_q(s_q, h_q, seed=72 + trial),
                   positions=torch.randint(0, NUM_POSITIONS, (s_q,), generator=g,
                                           dtype=torch.int32),
                   indices=c["indices"][rows][:, torch.randperm(topk, generator=g)],
                   extra_indices=c["extra_indices"][rows][:, torch.randperm(extra_topk,
                                                                            generator=g)],
                   topk_length=lengths_for(s_q, topk, g),
                   extra_topk_length=lengths_for(s_q, extra_topk, g))
        for k, v in new.items():
            static[k].copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert torch.equal(outs[0].view(torch.uint8), eager[0].view(torch.uint8))
        assert torch.equal(outs[1], eager[1])
        assert torch.equal(outs[2], eager[2])
        ref = dict(c, **{k: static[k].cpu() for k in static})
        want = run_decode(decode_inputs(ref, on_device=False), True, n_wv_group, 0.05)
        assert_out_close("out", outs[0], outs[1], want[0], want[1], n_wv_group)
        assert_stats_close("lse", outs[2], want[2])


@needs_cuda
def test_cuda_graph_prefill():
    s_q, h_q = 37, 128
    c = prefill_case(seed=80, s_q=s_q, h_q=h_q, topk=1024)
    dev = on(c, to_dev)

    def step():
        return fused.prefill(False, EPS, dev["positions"], False, ROPE, dev["cos_sin"], 16, 32,
                             True, True, True, dev["q"], dev["kv"], dev["indices"], sm_scale=0.05,
                             attn_sink=dev["attn_sink"], topk_length=dev["topk_length"])

    graph, outs = capture(step)
    dev["q"].copy_(make_q(s_q, h_q, seed=81))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for got, want in zip(outs, eager):
        assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                           want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want)


@needs_cuda
def test_torch_compile_decode_on_cuda():
    c = decode_case(seed=90, fmt="fp8_mx", extra_fmt="fp8_mx", s_q=4, h_q=64, topk=128,
                    extra_topk=512, lengths=True)
    args = [to_dev(c[k]) for k in ("q", "positions", "indices", "topk_length", "extra_indices",
                                   "extra_topk_length", "attn_sink")]
    cos_sin = to_dev(_COS_SIN)

    def fn(q, positions, indices, lengths, eidx, elengths, sink):
        out_fp8, out_sf, lse = fused.decode(
            False, EPS, positions, False, ROPE, cos_sin, 8, 32, True, True, True, q,
            c["cache_dev"], indices, 0.05, 512, sink, lengths, c["extra_cache_dev"], eidx,
            elengths, batch_invariant=True)
        return out_fp8.view(torch.uint8), out_sf, lse

    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# --- contracts of the CUDA path -------------------------------------------------------------

@needs_cuda
def test_position_out_of_range_gives_nan_output():
    """CUDA tensors: positions are not read on the host; a token whose position is outside
    [0, num_positions) gets out_fp8 all 0x7F (NaN), the others are unaffected."""
    c = prefill_case(seed=100, s_q=6, h_q=64, topk=512, lengths=False, sink=False)
    good = run_prefill(c, True, 8, 0.05, to_dev)
    c["positions"][3] = NUM_POSITIONS
    c["positions"][4] = -7
    bad = run_prefill(c, True, 8, 0.05, to_dev)
    b = bad[0].cpu().view(torch.uint8)
    assert (b[3] == 0x7F).all() and (b[4] == 0x7F).all()
    keep = [0, 1, 2, 5]
    assert torch.equal(b[keep], good[0].cpu().view(torch.uint8)[keep])


@needs_cuda
def test_other_head_dims_are_not_implemented_on_cuda():
    """The kernel is built for d_qk = d_v = 512 (FlashMLA's size); the CPU takes others."""
    g = gen(110)
    s_q, h_q, d = 3, 16, 256
    q = torch.randn(s_q, h_q, d, generator=g).to(torch.bfloat16)
    kv = torch.randn(64, 1, d, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 64, (s_q, 1, 32), generator=g, dtype=torch.int32)
    pos = torch.zeros(s_q, dtype=torch.int32)

    def call(to):
        return fused.prefill(False, EPS, to(pos), False, ROPE, to(_COS_SIN), 2, 32, True, True,
                             True, to(q), to(kv), to(idx), sm_scale=0.1, d_v=d)

    call(to_cpu)
    with pytest.raises(NotImplementedError, match="512"):
        call(to_dev)


def test_workspace_size():
    q = make_q(4, 64, seed=120)
    assert fused.fused_workspace_size(q) == 0  # the CPU backend needs none
    for s_q in (1, 64, 4096):  # (more tokens may need less: fewer key lists split)
        size = fused.fused_workspace_size(torch.empty(s_q, 128, D, device=DEVICE))
        assert isinstance(size, int) and size >= 0
        if DEVICE == "cpu":
            assert size == 0
    with pytest.raises(ValueError, match="s_q"):
        openmla._C.fused_workspace_size("cpu", 0, -1, 64)
