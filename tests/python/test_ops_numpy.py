"""The operations on numpy arrays (the C++ CPU backend) against the float64 oracles of
_reference.py, and FlashMLA's interface (openmla.flash_mla) on the same data."""

import math

import numpy as np
import pytest

import openmla
import openmla.flash_mla as flash_mla
import _reference as ref

OUT_RTOL = 1e-2  # ‖out − ref‖ / ‖ref‖ for bf16 outputs (docs/architecture.md, testing)


def dense_inputs(b=3, s_q=1, h_q=16, h_kv=1, d_qk=576, page=16, seqlens=(37, 0, 64), seed=0,
                 dtype=ref.BF16):
    rng = np.random.default_rng(seed)
    max_blocks = max(1, max(math.ceil(s / page) for s in seqlens))
    num_blocks = b * max_blocks + 2
    q = rng.standard_normal((b, s_q, h_q, d_qk)).astype(np.float32).astype(dtype)
    k_cache = rng.standard_normal((num_blocks, page, h_kv, d_qk)).astype(np.float32).astype(dtype)
    block_table = rng.permutation(num_blocks)[:b * max_blocks].reshape(b, max_blocks)
    block_table = block_table.astype(np.int32)
    cache_seqlens = np.array(seqlens, np.int32)
    return q, k_cache, block_table, cache_seqlens


@pytest.mark.parametrize("s_q,causal", [(1, False), (2, True), (3, False)])
@pytest.mark.parametrize("d_qk", [576, 512])
def test_dense_decode(s_q, causal, d_qk):
    q, k, bt, sl = dense_inputs(s_q=s_q, d_qk=d_qk, seed=s_q)
    out, lse = openmla.dense_decode(q, k, bt, sl, causal=causal)
    assert out.shape == (3, s_q, 16, 512) and out.dtype == ref.BF16
    assert lse.shape == (3, 16, s_q) and lse.dtype == np.float32
    ref_out, ref_lse = ref.dense_decode(q.astype(np.float64), k.astype(np.float64), bt, sl,
                                        causal=causal)
    assert ref.rel_err(out.astype(np.float64), ref_out) < OUT_RTOL
    assert ref.close_lse(lse, ref_lse)
    # the empty request (seqlen 0): lonely queries give out = 0, lse = +inf
    assert np.all(out[1].astype(np.float32) == 0) and np.all(np.isposinf(lse[1]))


def test_dense_decode_fp16_gqa_and_scale():
    q, k, bt, sl = dense_inputs(h_q=8, h_kv=2, seqlens=(20, 50, 3), dtype=np.float16, seed=5)
    out, lse = openmla.dense_decode(q, k, bt, sl, softmax_scale=0.05)
    assert out.dtype == np.float16
    ref_out, ref_lse = ref.dense_decode(q.astype(np.float64), k.astype(np.float64), bt, sl,
                                        scale=0.05)
    assert ref.rel_err(out, ref_out) < OUT_RTOL
    assert ref.close_lse(lse, ref_lse)


def test_dense_decode_into_given_outputs_and_schedule():
    q, k, bt, sl = dense_inputs(seed=6)
    out = np.full((3, 1, 16, 512), np.nan, np.float32).astype(ref.BF16)
    lse = np.full((3, 16, 1), np.nan, np.float32)
    schedule = openmla.plan_decode_schedule(sl, 1, 16)
    assert schedule.metadata.shape[1] == 8 and schedule.num_splits.shape == (4,)
    r_out, r_lse = openmla.dense_decode(q, k, bt, sl, out=out, lse=lse, schedule=schedule)
    assert r_out is out and r_lse is lse
    expected, expected_lse = openmla.dense_decode(q, k, bt, sl)
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))
    np.testing.assert_array_equal(lse, expected_lse)


def test_strided_q_and_cache():
    q, k, bt, sl = dense_inputs(seed=8)
    big_q = np.zeros((3, 1, 32, 576), ref.BF16)
    big_q[:, :, ::2] = q
    big_k = np.zeros((k.shape[0], 16, 1, 640), ref.BF16)
    big_k[..., :576] = k
    out, lse = openmla.dense_decode(big_q[:, :, ::2], big_k[..., :576], bt, sl)
    expected, expected_lse = openmla.dense_decode(q, k, bt, sl)
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))
    np.testing.assert_array_equal(lse, expected_lse)


def make_cache(fmt, num_blocks, page, seed, layout="default"):
    """A paged cache of `fmt` filled with random tokens, and its dequantised slots (float64)."""
    d_qk = 576 if fmt in ("fp8_v32", "bf16") else 512
    x = np.random.default_rng(seed).standard_normal((num_blocks * page, d_qk)).astype(np.float32)
    if fmt == "bf16":
        cache = openmla.new_kv_cache(num_blocks, page, "bf16", d_qk=d_qk)
    else:
        cache = openmla.new_kv_cache(num_blocks, page, fmt, layout=layout)
    openmla.kv_cache_write(x, np.arange(num_blocks * page, dtype=np.int32), cache,
                           kv_layout=layout)
    flat = (ref.bf16_round(x).astype(np.float64) if fmt == "bf16"
            else ref.quantize_rows(x, fmt))
    return cache, flat


@pytest.mark.parametrize("fmt,layout", [("fp8_v32", "default"), ("fp8_model1", "default"),
                                        ("fp8_model1", "interleaved"), ("fp8_mx", "default"),
                                        ("fp8_mx", "interleaved"), ("bf16", "default")])
def test_sparse_decode_formats(fmt, layout):
    num_blocks, page, b, s_q, h_q, topk = 6, 16, 2, 2, 8, 24
    cache, flat = make_cache(fmt, num_blocks, page, seed=1, layout=layout)
    d_qk = flat.shape[1]
    rng = np.random.default_rng(2)
    q = rng.standard_normal((b, s_q, h_q, d_qk)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(0, num_blocks * page, (b, s_q, topk)).astype(np.int32)
    indices[0, 0, :4] = -1                      # invalid: ignored
    indices[0, 1, 5] = num_blocks * page        # out of range: ignored
    indices[1, 0, 1] = indices[1, 0, 0]         # duplicate: counts twice
    out, lse = openmla.sparse_decode(q, cache, indices, kv_layout=layout)
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == ref.BF16
    ref_out, ref_lse = ref.sparse_decode(q.astype(np.float64), flat, indices)
    assert ref.rel_err(out, ref_out) < OUT_RTOL
    assert ref.close_lse(lse, ref_lse)


def test_sparse_decode_options():
    """topk_length, attn_sink (finite, ±inf), an fp4 extra cache with its own lengths."""
    b, s_q, h_q, topk, extra_topk = 3, 1, 8, 16, 12
    cache, flat = make_cache("fp8_mx", 4, 16, seed=3)
    extra, extra_flat = make_cache("fp4", 3, 16, seed=4)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((b, s_q, h_q, 512)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(0, 64, (b, s_q, topk)).astype(np.int32)
    extra_indices = rng.integers(0, 48, (b, s_q, extra_topk)).astype(np.int32)
    topk_length = np.array([16, 5, 0], np.int32)
    extra_topk_length = np.array([12, 0, 0], np.int32)   # request 2 attends nothing: lonely
    sink = rng.standard_normal(h_q).astype(np.float32)
    sink[0], sink[1] = np.inf, -np.inf
    out, lse = openmla.sparse_decode(q, cache, indices, topk_length=topk_length,
                                     attn_sink=sink, extra_k_cache=extra,
                                     extra_indices=extra_indices,
                                     extra_topk_length=extra_topk_length)
    ref_out, ref_lse = ref.sparse_decode(q.astype(np.float64), flat, indices, topk_length,
                                         extra_flat, extra_indices, extra_topk_length, sink)
    assert ref.rel_err(out, ref_out) < OUT_RTOL
    assert ref.close_lse(lse, ref_lse)
    assert np.all(out[:, :, 0].astype(np.float32) == 0)     # +inf sink: zero output
    assert np.all(out[2].astype(np.float32) == 0) and np.all(np.isposinf(lse[2]))


def test_sparse_prefill():
    s_q, s_kv, h_q, h_kv, topk = 5, 40, 8, 1, 16
    rng = np.random.default_rng(6)
    q = rng.standard_normal((s_q, h_q, 576)).astype(np.float32).astype(ref.BF16)
    kv = rng.standard_normal((s_kv, h_kv, 576)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(-2, s_kv + 2, (s_q, h_kv, topk)).astype(np.int32)
    indices[4] = -1                              # a lonely query row
    topk_length = np.array([16, 16, 3, 0, 16], np.int32)
    sink = np.linspace(-1, 1, h_q).astype(np.float32)
    out, max_logits, lse = openmla.sparse_prefill(q, kv, indices, attn_sink=sink,
                                                  topk_length=topk_length)
    assert out.shape == (s_q, h_q, 512) and max_logits.shape == (s_q, h_q) == lse.shape
    r_out, r_max, r_lse = ref.sparse_prefill(q.astype(np.float64), kv.astype(np.float64),
                                             indices, topk_length, sink)
    assert ref.rel_err(out, r_out) < OUT_RTOL
    assert ref.close_lse(lse, r_lse) and ref.close_lse(max_logits, r_max)
    assert np.all(np.isneginf(max_logits[3])) and np.all(np.isposinf(lse[4]))


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp8_mx", "fp4", "bf16"])
@pytest.mark.parametrize("dequantize_once", [None, False, True])
def test_sparse_prefill_from_cache(fmt, dequantize_once):
    """Prefill straight from a paged cache equals the float64 oracle on the dequantised slots
    (dequantize_once only sizes the GPU's workspace: the same operation either way)."""
    num_blocks, page, s_q, h_q, topk = 5, 16, 4, 8, 24
    cache, flat = make_cache(fmt, num_blocks, page, seed=11)
    d_qk = flat.shape[1]
    rng = np.random.default_rng(12)
    q = rng.standard_normal((s_q, h_q, d_qk)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(-3, num_blocks * page + 3, (s_q, 1, topk)).astype(np.int32)
    indices[2] = -1                                   # a lonely query row
    topk_length = np.array([24, 5, 24, 0], np.int32)
    sink = np.linspace(-1, 2, h_q).astype(np.float32)
    out, max_logits, lse = openmla.sparse_prefill_from_cache(q, cache, indices, attn_sink=sink,
                                                             topk_length=topk_length,
                                                             dequantize_once=dequantize_once)
    r_out, r_max, r_lse = ref.sparse_prefill(q.astype(np.float64), flat[:, None, :], indices,
                                             topk_length, sink)
    assert ref.rel_err(out, r_out) < OUT_RTOL
    assert ref.close_lse(lse, r_lse) and ref.close_lse(max_logits, r_max)
    assert np.all(np.isposinf(lse[2])) and np.all(np.isneginf(max_logits[3]))


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp4"])
def test_sparse_prefill_from_cache_fp8_tensor_cores(fmt):
    """fp8_tensor_cores=True runs on the CPU backend (the FP8 path's roundings of q, keys and P):
    close to the default path but not equal to it, with the same lonely rows."""
    num_blocks, page, s_q, h_q, topk = 5, 16, 4, 8, 24
    cache, flat = make_cache(fmt, num_blocks, page, seed=13)
    d_qk = flat.shape[1]
    rng = np.random.default_rng(14)
    q = rng.standard_normal((s_q, h_q, d_qk)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(-3, num_blocks * page + 3, (s_q, 1, topk)).astype(np.int32)
    indices[2] = -1                                   # a lonely query row
    topk_length = np.array([24, 5, 24, 0], np.int32)
    sink = np.linspace(-1, 2, h_q).astype(np.float32)
    kwargs = dict(attn_sink=sink, topk_length=topk_length)
    out, max_logits, lse = openmla.sparse_prefill_from_cache(q, cache, indices,
                                                             fp8_tensor_cores=True, **kwargs)
    d_out, d_max, d_lse = openmla.sparse_prefill_from_cache(q, cache, indices, **kwargs)
    assert out.shape == (s_q, h_q, 512) and out.dtype == ref.BF16
    assert 1e-3 < ref.rel_err(out, d_out) < 0.1       # another arithmetic, close to the default
    assert ref.close_lse(lse, d_lse, atol=0.1) and ref.close_lse(max_logits, d_max, atol=0.1)
    assert np.all(np.isposinf(lse[2])) and np.all(np.isneginf(max_logits[[2, 3]]))
    assert np.all(out[[2, 3]].astype(np.float32) == 0)
    # a caller's workspace (the CPU needs none), the same result
    given = openmla.sparse_prefill_from_cache(q, cache, indices, fp8_tensor_cores=True,
                                              workspace=np.zeros(8, np.uint8), **kwargs)
    assert np.array_equal(given[0].view(np.uint16), out.view(np.uint16))


def test_prefill_workspace():
    """prefill_workspace_size on the CPU (which needs none), a caller's workspace taken, and bad
    arguments named."""
    cache, flat = make_cache("fp8_model1", 2, 16, seed=3)
    assert openmla.prefill_workspace_size("cpu", 4, 8) == 0
    assert openmla.prefill_workspace_size("cpu", 4, 8, topk=16, k_cache=cache) == 0
    rng = np.random.default_rng(4)
    q = rng.standard_normal((4, 8, 512)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(0, 32, (4, 1, 16)).astype(np.int32)
    given = openmla.sparse_prefill_from_cache(q, cache, indices, workspace=np.zeros(8, np.uint8))
    plain = openmla.sparse_prefill_from_cache(q, cache, indices)
    assert np.array_equal(given[0].view(np.uint16), plain[0].view(np.uint16))
    with pytest.raises(ValueError, match="topk: required with k_cache"):
        openmla.prefill_workspace_size("cpu", 4, 8, k_cache=cache)
    with pytest.raises(TypeError, match="workspace"):
        openmla.sparse_prefill_from_cache(q, cache, indices, workspace=np.zeros(8, np.float32))


def test_merge_attention_states():
    """Splitting a sequence's keys in two and merging gives the whole attention."""
    rng = np.random.default_rng(7)
    n, tokens, heads, d_v = 3, 4, 8, 512
    part_out = rng.standard_normal((n, tokens, heads, d_v)).astype(np.float32)
    part_lse = rng.standard_normal((n, tokens, heads)).astype(np.float32)
    part_lse[1, 0] = np.inf       # a part without keys (lonely) is skipped
    part_lse[:, 1, 0] = np.inf    # no part holds keys: out 0, lse +inf
    out, lse = openmla.merge_attention_states(part_out, part_lse)
    assert out.dtype == np.float32 and out.shape == (tokens, heads, d_v)
    lse64 = part_lse.astype(np.float64)
    valid = np.isfinite(lse64)
    m = np.where(valid, lse64, -np.inf).max(axis=0)
    w = np.where(valid, np.exp(lse64 - np.where(np.isfinite(m), m, 0)), 0.0)
    total = w.sum(axis=0)
    expected_lse = np.where(total > 0, m + np.log(np.where(total > 0, total, 1)), np.inf)
    expected = np.einsum("nth,nthd->thd", w / np.where(total > 0, total, 1), part_out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert ref.close_lse(lse, expected_lse, atol=1e-5)
    assert np.all(out[1, 0] == 0) and np.isposinf(lse[1, 0])
    # bf16 parts, output dtype choice, no lse, and a transposed decode-style lse view
    out16 = openmla.merge_attention_states(part_out.astype(ref.BF16),
                                           part_lse.transpose(0, 2, 1).copy().transpose(0, 2, 1),
                                           out_dtype="fp32", return_lse=False)
    assert out16.dtype == np.float32 and ref.rel_err(out16, expected) < OUT_RTOL


def test_merge_of_two_decode_halves():
    """Context parallel: attention over two halves of the keys, merged, equals the whole."""
    cache, flat = make_cache("fp8_mx", 4, 16, seed=8)
    rng = np.random.default_rng(9)
    q = rng.standard_normal((2, 1, 8, 512)).astype(np.float32).astype(ref.BF16)
    idx = rng.permutation(64)[:32].astype(np.int32)
    indices = np.broadcast_to(idx, (2, 1, 32)).copy()
    whole, whole_lse = openmla.sparse_decode(q, cache, indices)
    a_out, a_lse = openmla.sparse_decode(q, cache, indices[..., :20].copy())
    b_out, b_lse = openmla.sparse_decode(q, cache, indices[..., 20:].copy())
    # [b, s_q, h, d] → tokens = b*s_q; lse [b, h, s_q] → [b, s_q, h]
    parts = np.stack([a_out, b_out]).astype(np.float32).reshape(2, 2, 8, 512)
    lses = np.stack([a_lse, b_lse]).transpose(0, 1, 3, 2).reshape(2, 2, 8)
    merged, merged_lse = openmla.merge_attention_states(parts, lses)
    assert ref.rel_err(merged, whole.astype(np.float32).reshape(2, 8, 512)) < OUT_RTOL
    assert ref.close_lse(merged_lse, whole_lse.transpose(0, 2, 1).reshape(2, 8))


def test_schedule():
    seqlens = np.array([0, 100, 5000, 64], np.int32)
    parts = openmla.decode_num_sm_parts("cpu", 1, 128, 1)
    assert parts >= 1
    s = openmla.plan_decode_schedule(seqlens, 1, 128, num_sm_parts=4)
    assert s.metadata.shape == (4, 8) and s.num_splits.shape == (5,)
    assert s.num_splits[0] == 0 and np.all(np.diff(s.num_splits) >= 1)


# --- FlashMLA's interface -------------------------------------------------------------------

def test_flash_mla_dense():
    q, k, bt, sl = dense_inputs(s_q=2, seed=11)
    meta, none = flash_mla.get_mla_metadata(sl, 2 * 16, 1)   # the old call form is accepted
    assert none is None and isinstance(meta, flash_mla.FlashMLASchedMeta)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, None, causal=True)
    assert meta.have_initialized and meta.tile_scheduler_metadata is not None
    expected, expected_lse = openmla.dense_decode(q, k, bt, sl, causal=True)
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))
    np.testing.assert_array_equal(lse, expected_lse)
    # reuse across "layers"; out= writes in place
    buf = np.zeros_like(out)
    out2, _ = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True, out=buf)
    assert out2 is buf
    np.testing.assert_array_equal(buf.astype(np.float32), expected.astype(np.float32))
    with pytest.raises(ValueError, match="causal"):
        flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=False)
    with pytest.raises(ValueError, match="num_splits"):
        flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, np.zeros(4, np.int32))


def test_flash_mla_sparse_decode():
    cache, flat = make_cache("fp8_v32", 4, 64, seed=12)
    rng = np.random.default_rng(13)
    q = rng.standard_normal((2, 1, 16, 576)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(-1, 256, (2, 1, 64)).astype(np.int32)
    sink = rng.standard_normal(16).astype(np.float32)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=indices,
                                                attn_sink=sink)
    r_out, r_lse = ref.sparse_decode(q.astype(np.float64), flat, indices, attn_sink=sink)
    assert out.shape == (2, 1, 16, 512) and lse.shape == (2, 16, 1)
    assert ref.rel_err(out, r_out) < OUT_RTOL and ref.close_lse(lse, r_lse)
    with pytest.raises(ValueError, match="causal"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, None, causal=True,
                                         indices=indices)


def test_flash_mla_sparse_fwd():
    rng = np.random.default_rng(14)
    q = rng.standard_normal((4, 16, 512)).astype(np.float32).astype(ref.BF16)
    kv = rng.standard_normal((30, 1, 512)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(0, 30, (4, 1, 8)).astype(np.int32)
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 512 ** -0.5)
    r_out, r_max, r_lse = ref.sparse_prefill(q.astype(np.float64), kv.astype(np.float64), indices)
    assert ref.rel_err(out, r_out) < OUT_RTOL and ref.close_lse(lse, r_lse)
    with pytest.raises(NotImplementedError, match="indexer_topk"):
        flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.1, indexer_topk=512)


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp8_mx", "fp4"])
@pytest.mark.parametrize("s_q,causal", [(1, False), (2, True)])
def test_dense_decode_over_quantised_cache(fmt, s_q, causal):
    """Dense decode over an FP8/FP4 cache through a block table (flash_mla's is_fp8_kvcache=True
    without indices) equals the oracle on the dequantised keys."""
    num_blocks, page = 10, 16
    cache, flat = make_cache(fmt, num_blocks, page, seed=21)
    d_qk = flat.shape[1]
    rng = np.random.default_rng(22)
    seqlens = np.array([37, 0, 64], np.int32)
    block_table = rng.permutation(num_blocks)[:12 if num_blocks >= 12 else num_blocks]
    block_table = np.resize(block_table, (3, 4)).astype(np.int32)
    q = rng.standard_normal((3, s_q, 16, d_qk)).astype(np.float32).astype(ref.BF16)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, block_table, seqlens, 512, meta,
                                                causal=causal, is_fp8_kvcache=True)
    k = flat.reshape(num_blocks, page, 1, d_qk)
    r_out, r_lse = ref.dense_decode(q.astype(np.float64), k, block_table, seqlens, causal=causal)
    assert ref.rel_err(out.astype(np.float64), r_out) < OUT_RTOL
    assert ref.close_lse(lse, r_lse)


def test_read_only_and_broadcast_inputs():
    """Read-only arrays (no DLPack export from numpy: the buffer protocol carries them) and
    zero-stride broadcasts are read as they are."""
    cache, _ = make_cache("fp8_mx", 4, 16, seed=16)
    rng = np.random.default_rng(17)
    q = rng.standard_normal((3, 1, 8, 512)).astype(np.float32).astype(ref.BF16)
    idx = rng.integers(0, 64, 20).astype(np.int32)
    broadcast = np.broadcast_to(idx, (3, 1, 20))
    assert not broadcast.flags.writeable
    cache.flags.writeable = False
    q.flags.writeable = False
    out, lse = openmla.sparse_decode(q, cache, broadcast)
    expected, expected_lse = openmla.sparse_decode(q.copy(), cache.copy(), broadcast.copy())
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))
    np.testing.assert_array_equal(lse, expected_lse)


def test_empty_batch_and_empty_cache():
    """Zero-size arrays (numpy 2 gives them all-zero strides) are valid: a batch of 0 requests,
    a cache of 0 blocks (every index invalid: lonely queries), 0 rows to write, 0 tokens to
    merge."""
    q, k, bt, sl = dense_inputs(b=3)
    out, lse = openmla.dense_decode(q[:0], k, bt[:0], sl[:0])
    assert out.shape == (0, 1, 16, 512) and lse.shape == (0, 16, 1)

    empty = openmla.new_kv_cache(0, 16, "fp8_mx")
    assert empty.shape == (0, 16, 1, 528)
    rng = np.random.default_rng(18)
    q = rng.standard_normal((2, 1, 8, 512)).astype(np.float32).astype(ref.BF16)
    indices = rng.integers(-1, 64, (2, 1, 10)).astype(np.int32)
    out, lse = openmla.sparse_decode(q, empty, indices)
    assert np.all(out.astype(np.float32) == 0) and np.all(np.isposinf(lse))

    cache = openmla.new_kv_cache(2, 16, "fp8_mx")
    openmla.kv_cache_write(np.zeros((0, 512), np.float32), np.zeros(0, np.int64), cache)
    assert not cache.any()
    merged, merged_lse = openmla.merge_attention_states(np.zeros((3, 0, 4, 512), np.float32),
                                                        np.zeros((3, 0, 4), np.float32))
    assert merged.shape == (0, 4, 512) and merged_lse.shape == (0, 4)
