"""FlashMLA's newest interface as engines call it, on the CPU backend: `enable_batch_invariant=`
on flash_mla_with_kvcache (fixed per FlashMLASchedMeta), `out=` on flash_mla_sparse_fwd (vLLM's
DeepSeek V4 prefill writes each chunk into a slice of its output buffer), and schedules an
engine builds by hand in FlashMLA's layout (vLLM's batch-invariant dense path), which are never
read as OpenMLA's. numpy always; torch (eager, torch.compile(fullgraph=True), opcheck) where it
is installed. The GPU side of the same: test_gpu_engine_calls.py."""

import dataclasses
import importlib.util
import inspect

import ml_dtypes
import numpy as np
import pytest

import _reference as ref
import openmla
import openmla.flash_mla as flash_mla
from openmla import _C

BF16 = ml_dtypes.bfloat16
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
OUT_RTOL = 1e-2

# FlashMLA's names, in order (flash_mla/flash_mla_interface.py of its newest interface).
FLASHMLA_DECODE_PARAMS = [
    "q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata",
    "num_splits", "softmax_scale", "causal", "is_fp8_kvcache", "indices", "attn_sink",
    "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length",
    "enable_batch_invariant"]
FLASHMLA_CONFIG_FIELDS = [
    "b", "s_q", "h_q", "page_block_size", "h_k", "causal", "is_fp8_kvcache", "topk",
    "extra_page_block_size", "extra_topk", "enable_batch_invariant"]


# --- inputs ---------------------------------------------------------------------------------

def sparse_case(b, seed, fmt="fp8_mx", s_q=1, h_q=8, topk=24, num_blocks=6, page=16):
    """A quantised cache with random keys, and b requests of random indices (some invalid),
    topk_length and a sink."""
    rng = np.random.default_rng(seed)
    d_qk = openmla.kv_format_info(fmt)["d_qk"]
    cache = openmla.new_kv_cache(num_blocks, page, fmt, d_qk=d_qk)
    slots = num_blocks * page
    openmla.kv_cache_write(rng.standard_normal((slots, d_qk)).astype(np.float32),
                           np.arange(slots, dtype=np.int32), cache)
    q = rng.standard_normal((b, s_q, h_q, d_qk)).astype(BF16)
    indices = rng.integers(-2, slots + 2, (b, s_q, topk)).astype(np.int32)
    topk_length = rng.integers(0, topk + 1, (b,)).astype(np.int32)
    sink = rng.standard_normal(h_q).astype(np.float32)
    return q, cache, indices, topk_length, sink


def dense_case(b, seed, h_q=16, page=16, max_blocks=4):
    rng = np.random.default_rng(seed)
    num_blocks = b * max_blocks + 1
    q = rng.standard_normal((b, 1, h_q, 576)).astype(BF16)
    k = rng.standard_normal((num_blocks, page, 1, 576)).astype(BF16)
    table = rng.permutation(num_blocks)[: b * max_blocks].reshape(b, max_blocks).astype(np.int32)
    seqlens = rng.integers(0, page * max_blocks + 1, (b,)).astype(np.int32)
    return q, k, table, seqlens


def bits(x):
    return np.asarray(x).view(np.uint16) if np.asarray(x).dtype == BF16 else np.asarray(x)


def schedule_pieces(metadata, num_splits, seqlens):
    """What OpenMLA's decode kernels read from a schedule (the layout include/openmla/ops.h
    documents: per worker {begin_request, begin_token, end_request, end_token, begin_split},
    end_request inclusive, end_token exclusive, clamped to the request's keys as the kernel
    clamps them): the key ranges covering each request, and each request's split count."""
    metadata, num_splits = np.asarray(metadata), np.asarray(num_splits)
    pieces = {r: [] for r in range(len(seqlens))}
    for begin_r, begin_t, last_r, end_t, _ in metadata[:, :5].tolist():
        for r in range(begin_r, last_r + 1):
            n = int(seqlens[r])
            lo = min(max(begin_t if r == begin_r else 0, 0), n)
            hi = min(max(end_t if r == last_r else n, lo), n)
            pieces[r].append((lo, hi))
    return pieces, np.diff(num_splits)


def vllm_hand_built_schedule(batch, block_table, xp=np):
    """vLLM's batch-invariant dense FlashMLA path (v1/attention/backends/mla/flashmla.py): one
    SM part over every request, in FlashMLA's layout counted in 64-key blocks, and an all-zero
    num_splits, assigned to the FlashMLASchedMeta before the first call."""
    end_block = block_table.shape[-1] // 64
    metadata = xp.zeros((1, 8), dtype=xp.int32)
    metadata[0, 2] = batch - 1
    metadata[0, 3] = end_block
    return metadata, xp.zeros((batch + 1,), dtype=xp.int32)


# --- the interface ----------------------------------------------------------------------------

def test_signatures_are_flashmlas():
    params = list(inspect.signature(flash_mla.flash_mla_with_kvcache).parameters.values())
    assert [p.name for p in params[:len(FLASHMLA_DECODE_PARAMS)]] == FLASHMLA_DECODE_PARAMS
    invariant = params[len(FLASHMLA_DECODE_PARAMS) - 1]
    assert invariant.default is False and invariant.kind is invariant.POSITIONAL_OR_KEYWORD
    assert all(p.kind is p.KEYWORD_ONLY for p in params[len(FLASHMLA_DECODE_PARAMS):])
    assert [f.name for f in dataclasses.fields(flash_mla.FlashMLASchedMeta.Config)] == \
        FLASHMLA_CONFIG_FIELDS
    prefill = inspect.signature(flash_mla.flash_mla_sparse_fwd).parameters
    assert list(prefill)[:8] == ["q", "kv", "indices", "sm_scale", "d_v", "attn_sink",
                                 "topk_length", "indexer_topk"]
    assert prefill["out"].kind is inspect.Parameter.KEYWORD_ONLY and prefill["out"].default is None


# --- enable_batch_invariant ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp8_mx", "fp8_model1", "fp8_v32"])
def test_sparse_batch_invariant_results_do_not_depend_on_the_batch(fmt):
    """Each request decoded in a batch of 5 equals, bit for bit, the same request decoded alone
    and in a batch of 2 (against other requests), and the reference within bf16 rounding."""
    q, cache, idx, lengths, sink = sparse_case(5, seed=1, fmt=fmt, s_q=2)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx,
                                                attn_sink=sink, topk_length=lengths,
                                                enable_batch_invariant=True)
    assert meta.config.enable_batch_invariant is True
    for picks in ([0], [3], [4, 1], [2, 0]):
        meta_i, _ = flash_mla.get_mla_metadata()
        out_i, lse_i = flash_mla.flash_mla_with_kvcache(
            q[picks], cache, None, None, 512, meta_i, None, None, False, True, idx[picks], sink,
            None, None, lengths[picks], None, True)   # positional, FlashMLA's order
        assert np.array_equal(bits(out_i), bits(out[picks]))
        assert np.array_equal(lse_i, lse[picks])
    flat = openmla.kv_cache_gather(cache, np.arange(6 * 16, dtype=np.int32)).astype(np.float64)
    want_out, want_lse = ref.sparse_decode(q.astype(np.float64), flat, idx, lengths,
                                           attn_sink=sink)
    assert ref.rel_err(out.astype(np.float64), want_out) < OUT_RTOL
    assert ref.close_lse(lse, want_lse)
    default_out, _ = openmla.sparse_decode(q, cache, idx, topk_length=lengths, attn_sink=sink)
    assert ref.rel_err(out.astype(np.float64), default_out.astype(np.float64)) < OUT_RTOL


def test_dense_batch_invariant_results_do_not_depend_on_the_batch():
    q, k, table, seqlens = dense_case(6, seed=2)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta,
                                                enable_batch_invariant=True)
    for picks in ([5], [1, 3], [4, 0, 2]):
        meta_i, _ = flash_mla.get_mla_metadata()
        out_i, lse_i = flash_mla.flash_mla_with_kvcache(q[picks], k, table[picks],
                                                        seqlens[picks], 512, meta_i,
                                                        enable_batch_invariant=True)
        assert np.array_equal(bits(out_i), bits(out[picks]))
        assert np.array_equal(lse_i, lse[picks])
    want_out, want_lse = ref.dense_decode(q.astype(np.float64), k.astype(np.float64), table,
                                          seqlens)
    assert ref.rel_err(out.astype(np.float64), want_out) < OUT_RTOL
    assert ref.close_lse(lse, want_lse)
    # A causal multi-token step over a quantised cache is batch-invariant on the CPU too.
    rng = np.random.default_rng(3)
    cache = openmla.new_kv_cache(9, 16, "fp8_v32")
    openmla.kv_cache_write(rng.standard_normal((144, 576)).astype(np.float32),
                           np.arange(144, dtype=np.int32), cache)
    q2 = rng.standard_normal((3, 2, 16, 576)).astype(BF16)
    table2 = np.arange(9, dtype=np.int32).reshape(3, 3)
    lens2 = np.array([40, 2, 48], np.int32)
    meta, _ = flash_mla.get_mla_metadata()
    whole, _ = flash_mla.flash_mla_with_kvcache(q2, cache, table2, lens2, 512, meta, causal=True,
                                                is_fp8_kvcache=True, enable_batch_invariant=True)
    meta, _ = flash_mla.get_mla_metadata()
    alone, _ = flash_mla.flash_mla_with_kvcache(q2[1:2], cache, table2[1:2], lens2[1:2], 512,
                                                meta, causal=True, is_fp8_kvcache=True,
                                                enable_batch_invariant=True)
    assert np.array_equal(bits(alone), bits(whole[1:2]))


def test_enable_batch_invariant_is_fixed_per_sched_meta():
    q, cache, idx, lengths, _ = sparse_case(2, seed=4)
    for first, second in ((True, False), (False, True)):
        meta, _ = flash_mla.get_mla_metadata()
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                                         indices=idx, topk_length=lengths,
                                         enable_batch_invariant=first)
        assert meta.config.enable_batch_invariant is first
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                                         indices=idx, topk_length=lengths,
                                         enable_batch_invariant=first)   # the same: reused
        with pytest.raises(ValueError, match=f"made for enable_batch_invariant={first}, but "
                                             f"this call has enable_batch_invariant={second}"):
            flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                             is_fp8_kvcache=True, indices=idx,
                                             topk_length=lengths, enable_batch_invariant=second)
    q, k, table, seqlens = dense_case(2, seed=5)
    meta, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta, enable_batch_invariant=True)
    with pytest.raises(ValueError, match="enable_batch_invariant"):
        flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta)
    # Without split-KV there is no split plan: none is made or kept.
    assert meta.tile_scheduler_metadata is None and meta.num_splits is None
    meta, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta)
    assert meta.tile_scheduler_metadata is not None and not meta.config.enable_batch_invariant


def test_enable_batch_invariant_must_be_a_bool():
    q, k, table, seqlens = dense_case(2, seed=6)
    for bad in (1, "yes", None):
        meta, _ = flash_mla.get_mla_metadata()
        with pytest.raises(TypeError, match="enable_batch_invariant: expected a bool"):
            flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta,
                                             enable_batch_invariant=bad)
        assert not meta.have_initialized
    meta, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta,
                                     enable_batch_invariant=np.bool_(True))
    assert meta.config.enable_batch_invariant is True
    with pytest.raises(TypeError, match="batch_invariant: expected a bool"):
        openmla.dense_decode(q, k, table, seqlens, batch_invariant=0)
    with pytest.raises(ValueError, match="schedule: must be None with batch_invariant"):
        openmla.dense_decode(q, k, table, seqlens, batch_invariant=True,
                             schedule=openmla.plan_decode_schedule(seqlens, 1, 16))


@pytest.mark.parametrize("batch,parts", [(0, 4), (1, 4), (5, 2), (7, 7), (3, 8), (64, 5)])
def test_no_split_schedule_keeps_every_request_whole(batch, parts):
    """The schedule of batch-invariant dense decode, read the way the kernels read it: every
    request is covered once, by one piece over all of its keys (whatever its length: the
    schedule reads none), with one split each; at most `parts` workers."""
    metadata, num_splits = openmla.no_split_schedule(np.zeros(1, np.int32), batch, parts)
    assert metadata.dtype == np.int32 and metadata.shape == (max(1, min(batch, parts)),
                                                             _C.SCHEDULE_METADATA_INTS)
    assert num_splits.shape == (batch + 1,)
    rng = np.random.default_rng(batch * 31 + parts)
    for seqlens in (rng.integers(0, 5000, batch), np.full(batch, 2**31 - 1), np.zeros(batch)):
        pieces, splits = schedule_pieces(metadata, num_splits, seqlens)
        assert all(pieces[r] == [(0, int(seqlens[r]))] for r in range(batch)), pieces
        assert np.all(splits == 1)
    if batch:  # the planner's layout, accepted by the C++ validation
        q, k, table, seqlens = dense_case(batch, seed=7, h_q=16)
        openmla.dense_decode(q, k, table, seqlens,
                             schedule=openmla.DecodeSchedule(metadata, num_splits))


# --- hand-built schedules (FlashMLA's layout) ---------------------------------------------------

def spy_on_dense_decode(monkeypatch):
    """Records the schedule each dense decode hands to the extension."""
    calls = []
    real = _C.dense_decode

    def spy(*args, **kwargs):
        calls.append((np.array(kwargs.get("sched_metadata")),
                      np.array(kwargs.get("sched_num_splits"))))
        return real(*args, **kwargs)

    monkeypatch.setattr(_C, "dense_decode", spy)
    return calls


def test_vllm_hand_built_schedule_is_not_misread(monkeypatch):
    """vLLM's batch-invariant dense path, as it writes it: get_mla_metadata(seq_lens, ...) with
    FlashMLA's old arguments, then a one-row tile_scheduler_metadata in FlashMLA's layout and an
    all-zero num_splits assigned before the first call of every layer. Read as OpenMLA's layout
    it would drop keys (the last request cut to end_block keys) and give every request zero
    splits; OpenMLA reads it as what it asks for, decoding every request whole, and the results
    are the full attention (and batch-invariant)."""
    b, page = 4, 16
    q, k, table, seqlens = dense_case(b, seed=8, page=page)
    seqlens[-1] = page * table.shape[1]   # the last request: more keys than end_block counts
    md, ns = vllm_hand_built_schedule(b, table)
    literal, literal_splits = schedule_pieces(md, ns, seqlens)
    assert literal[b - 1] != [(0, int(seqlens[b - 1]))] and np.all(literal_splits == 0)

    calls = spy_on_dense_decode(monkeypatch)
    meta, _ = flash_mla.get_mla_metadata(seqlens, 16, 1, is_fp8_kvcache=False)
    outs = []
    for layer in range(2):
        meta.tile_scheduler_metadata, meta.num_splits = vllm_hand_built_schedule(b, table)
        outs.append(flash_mla.flash_mla_with_kvcache(
            q=q, k_cache=k, block_table=table, cache_seqlens=seqlens, head_dim_v=512,
            tile_scheduler_metadata=meta, softmax_scale=576 ** -0.5, causal=True,
            is_fp8_kvcache=False))
    monkeypatch.undo()
    assert len(calls) == 2
    for metadata, num_splits in calls:
        assert metadata.shape[1] == _C.SCHEDULE_METADATA_INTS
        pieces, splits = schedule_pieces(metadata, num_splits, seqlens)
        assert all(pieces[r] == [(0, int(seqlens[r]))] for r in range(b)) and np.all(splits == 1)
    want_out, want_lse = ref.dense_decode(q.astype(np.float64), k.astype(np.float64), table,
                                          seqlens, causal=True)
    for out, lse in outs:
        assert ref.rel_err(out.astype(np.float64), want_out) < OUT_RTOL
        assert ref.close_lse(lse, want_lse)
    meta_alone, _ = flash_mla.get_mla_metadata()
    meta_alone.tile_scheduler_metadata, meta_alone.num_splits = vllm_hand_built_schedule(1, table)
    alone, _ = flash_mla.flash_mla_with_kvcache(q[2:3], k, table[2:3], seqlens[2:3], 512,
                                                meta_alone, causal=True)
    assert np.array_equal(bits(alone), bits(outs[0][0][2:3]))


def test_other_hand_built_schedules_are_refused():
    q, k, table, seqlens = dense_case(3, seed=9)
    q_s, cache, idx, lengths, _ = sparse_case(3, seed=10)
    two_rows = np.zeros((2, 8), np.int32)
    for call in (lambda m: flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, m),
                 lambda m: flash_mla.flash_mla_with_kvcache(q_s, cache, None, None, 512, m,
                                                            is_fp8_kvcache=True, indices=idx)):
        meta, _ = flash_mla.get_mla_metadata()
        meta.tile_scheduler_metadata, meta.num_splits = two_rows, np.zeros(4, np.int32)
        with pytest.raises(ValueError, match=r"schedule of 2 SM parts that OpenMLA did not plan"
                                             r".*None.*enable_batch_invariant=True"):
            call(meta)
        meta, _ = flash_mla.get_mla_metadata()
        meta.tile_scheduler_metadata = [[0] * 8]
        with pytest.raises(TypeError, match="tile_scheduler_metadata.tile_scheduler_metadata"):
            call(meta)
    # A plan OpenMLA made, then replaced by the caller, is the caller's: refused too.
    meta, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta)
    meta.tile_scheduler_metadata = meta.tile_scheduler_metadata.copy()
    if meta.tile_scheduler_metadata.shape[0] > 1:
        with pytest.raises(ValueError, match="did not plan"):
            flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, 512, meta)


def test_hand_built_one_row_schedule_for_sparse_decodes_without_splits(monkeypatch):
    q, cache, idx, lengths, sink = sparse_case(3, seed=11)
    seen = []
    real = openmla._api.sparse_decode

    def spy(*args, **kwargs):
        seen.append((kwargs["schedule"], kwargs["batch_invariant"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(openmla._api, "sparse_decode", spy)
    meta, _ = flash_mla.get_mla_metadata()
    meta.tile_scheduler_metadata, meta.num_splits = vllm_hand_built_schedule(3, np.zeros((3, 64)))
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx,
                                                attn_sink=sink, topk_length=lengths)
    monkeypatch.undo()
    assert seen == [(None, True)]
    want, want_lse = openmla.sparse_decode(q, cache, idx, topk_length=lengths, attn_sink=sink)
    assert np.array_equal(bits(out), bits(want)) and np.array_equal(lse, want_lse)


# --- flash_mla_sparse_fwd(out=) ------------------------------------------------------------------

def prefill_case(s_q, seed, h_q=8, s_kv=40, topk=16, d_qk=512):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((s_q, h_q, d_qk)).astype(BF16)
    kv = rng.standard_normal((s_kv, 1, d_qk)).astype(BF16)
    indices = rng.integers(-1, s_kv + 1, (s_q, 1, topk)).astype(np.int32)
    lengths = rng.integers(0, topk + 1, (s_q,)).astype(np.int32)
    sink = rng.standard_normal(h_q).astype(np.float32)
    return q, kv, indices, lengths, sink


def test_sparse_prefill_out_writes_into_a_slice_of_the_output_buffer():
    """vLLM's V4 prefill: each chunk of query tokens written by keyword into its rows of one
    output buffer (flash_mla_sparse_fwd(q=..., kv=..., indices=..., sm_scale=..., attn_sink=...,
    topk_length=..., out=output[start:end])), the return value unused."""
    s_q, h_q = 10, 8
    q, kv, idx, lengths, sink = prefill_case(s_q, seed=12, h_q=h_q)
    output = np.full((s_q + 3, h_q, 512), 7.0, BF16)   # rows past the prefill: another batch part
    for start, end in ((0, 4), (4, 9), (9, 10)):
        flash_mla.flash_mla_sparse_fwd(q=q[start:end], kv=kv, indices=idx[start:end],
                                       sm_scale=0.05, attn_sink=sink,
                                       topk_length=lengths[start:end], out=output[start:end])
    want, want_max, want_lse = openmla.sparse_prefill(q, kv, idx, softmax_scale=0.05,
                                                      attn_sink=sink, topk_length=lengths)
    assert np.array_equal(bits(output[:s_q]), bits(want))
    assert np.all(output[s_q:].astype(np.float32) == 7.0)
    ref_out, ref_max, ref_lse = ref.sparse_prefill(q, kv, idx, lengths, sink, scale=0.05)
    assert ref.rel_err(output[:s_q].astype(np.float64), ref_out) < OUT_RTOL
    # The returned out is the caller's buffer; a head slice (strided) works too.
    padded = np.zeros((s_q, 16, 512), BF16)
    got = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.05, 512, sink, lengths, out=padded[:, :h_q])
    assert got[0].base is padded and np.array_equal(bits(padded[:, :h_q]), bits(want))
    assert np.all(padded[:, h_q:].astype(np.float32) == 0)
    assert np.array_equal(got[2], want_lse) and np.array_equal(got[1], want_max)
    assert ref.close_lse(got[2], ref_lse)
    max_logits, lse = np.empty((s_q, h_q), np.float32), np.empty((s_q, h_q), np.float32)
    out, m, l = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.05, attn_sink=sink,
                                              topk_length=lengths, max_logits=max_logits, lse=lse)
    assert m is max_logits and l is lse and np.array_equal(lse, want_lse)


def test_sparse_prefill_bad_out_is_named():
    q, kv, idx, lengths, _ = prefill_case(4, seed=13)
    with pytest.raises(TypeError, match="out: expected dtype bf16"):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.1, out=np.zeros((4, 8, 512), np.float32))
    with pytest.raises(ValueError, match=r"out: expected shape \[4, 8, 512\]"):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.1, out=np.zeros((4, 8, 256), BF16))
    with pytest.raises(ValueError, match="out"):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.1,
                                       out=np.zeros((4, 8, 1024), BF16)[:, :, ::2])
    # out is keyword-only: FlashMLA's 8th positional argument is indexer_topk.
    with pytest.raises(TypeError, match="takes from 4 to 8 positional arguments but 9"):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.1, 512, None, None, 0,
                                       np.zeros((4, 8, 512), BF16))


# --- torch: eager, compiled, custom ops ----------------------------------------------------------

def as_torch(*arrays):
    import torch

    def one(a):
        if isinstance(a, np.ndarray) and a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a) if isinstance(a, np.ndarray) else a
    return tuple(one(a) for a in arrays)


@needs_torch
def test_torch_compile_fullgraph_engine_patterns():
    """The three patterns under torch.compile(fullgraph=True) on torch CPU tensors, against
    eager: batch-invariant sparse and dense decode over two layers sharing a FlashMLASchedMeta
    made inside the compiled function, vLLM's hand-built schedule assigned inside it, and a
    chunked prefill writing into slices of an output buffer."""
    import torch

    q, cache, idx, lengths, sink = as_torch(*sparse_case(3, seed=14, s_q=2))
    qd, k, table, seqlens = as_torch(*dense_case(3, seed=15))
    qp, kv, idx_p, len_p, sink_p = as_torch(*prefill_case(9, seed=16))

    def sparse_layers(q, cache, idx, lengths, sink):
        meta, _ = flash_mla.get_mla_metadata()
        outs = []
        for layer in range(2):
            outs += flash_mla.flash_mla_with_kvcache(q * (layer + 1), cache, None, None, 512,
                                                     meta, is_fp8_kvcache=True, indices=idx,
                                                     attn_sink=sink, topk_length=lengths,
                                                     enable_batch_invariant=True)
        return outs

    def dense_layers(q, k, table, seqlens):
        meta, _ = flash_mla.get_mla_metadata()
        outs = []
        for layer in range(2):
            outs += flash_mla.flash_mla_with_kvcache(q * (layer + 1), k, table, seqlens, 512,
                                                     meta, causal=True,
                                                     enable_batch_invariant=True)
        return outs

    def vllm_dense(q, k, table, seqlens):
        meta, _ = flash_mla.get_mla_metadata(seqlens, 16, 1, is_fp8_kvcache=False)
        md = torch.zeros((1, 8), dtype=torch.int32)
        md[0, 2] = q.shape[0] - 1
        md[0, 3] = table.shape[-1] // 64
        meta.tile_scheduler_metadata = md
        meta.num_splits = torch.zeros((q.shape[0] + 1,), dtype=torch.int32)
        return flash_mla.flash_mla_with_kvcache(q=q, k_cache=k, block_table=table,
                                                cache_seqlens=seqlens, head_dim_v=512,
                                                tile_scheduler_metadata=meta, causal=True)

    def chunked_prefill(q, kv, idx, lengths, sink):
        output = torch.zeros((q.shape[0] + 2, q.shape[1], 512), dtype=torch.bfloat16)
        for start, end in ((0, 5), (5, 9)):
            flash_mla.flash_mla_sparse_fwd(q=q[start:end], kv=kv, indices=idx[start:end],
                                           sm_scale=0.05, attn_sink=sink,
                                           topk_length=lengths[start:end],
                                           out=output[start:end])
        return output

    for fn, args in ((sparse_layers, (q, cache, idx, lengths, sink)),
                     (dense_layers, (qd, k, table, seqlens)),
                     (vllm_dense, (qd, k, table, seqlens)),
                     (chunked_prefill, (qp, kv, idx_p, len_p, sink_p))):
        torch._dynamo.reset()
        eager = fn(*args)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
        eager = eager if isinstance(eager, (list, tuple)) else [eager]
        compiled = compiled if isinstance(compiled, (list, tuple)) else [compiled]
        for got, want in zip(compiled, eager):
            assert torch.equal(got, want), fn.__name__
    want = openmla.sparse_prefill(qp, kv, idx_p, softmax_scale=0.05, attn_sink=sink_p,
                                  topk_length=len_p)[0]
    assert torch.equal(chunked_prefill(qp, kv, idx_p, len_p, sink_p)[:9], want)


@needs_torch
def test_torch_eager_out_and_batch_invariance():
    import torch

    qp, kv, idx, lengths, sink = as_torch(*prefill_case(6, seed=17))
    buf = torch.full((8, 8, 512), 3.0, dtype=torch.bfloat16)
    out, m, l = flash_mla.flash_mla_sparse_fwd(qp, kv, idx, 0.05, attn_sink=sink,
                                              topk_length=lengths, out=buf[1:7])
    assert out.data_ptr() == buf[1:7].data_ptr()
    assert bool((buf[0] == 3).all() and (buf[7] == 3).all())
    want = openmla.sparse_prefill(qp, kv, idx, softmax_scale=0.05, attn_sink=sink,
                                  topk_length=lengths)
    assert torch.equal(buf[1:7], want[0]) and torch.equal(l, want[2])
    q, cache, idx, lengths, sink = as_torch(*sparse_case(4, seed=18))
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx,
                                                topk_length=lengths, attn_sink=sink,
                                                enable_batch_invariant=True)
    meta, _ = flash_mla.get_mla_metadata()
    alone, lse_alone = flash_mla.flash_mla_with_kvcache(q[2:3], cache, None, None, 512, meta,
                                                        is_fp8_kvcache=True, indices=idx[2:3],
                                                        topk_length=lengths[2:3],
                                                        attn_sink=sink,
                                                        enable_batch_invariant=True)
    assert torch.equal(alone, out[2:3]) and torch.equal(lse_alone, lse[2:3])


@needs_torch
def test_opcheck_of_the_changed_ops():
    import torch

    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    ops = torch.ops.openmla
    qd, k, table, seqlens = as_torch(*dense_case(2, seed=19))
    torch.library.opcheck(ops.dense_decode, (qd, k, table, seqlens, 512, 0.0, False, None, None,
                                             None, -1, True))
    out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16)
    lse = torch.empty(2, 16, 1)
    torch.library.opcheck(ops.dense_decode_out, (qd, k, table, seqlens, 512, 0.0, True, None,
                                                 None, out, lse, None, 0, True))
    q, cache, idx, lengths, sink = as_torch(*sparse_case(2, seed=20))
    torch.library.opcheck(ops.sparse_decode, (q, cache, idx, lengths, sink, None, None, None,
                                              None, "default", None, "default", 512, 0.0, None,
                                              None, None, -1, True))
    qp, kv, idx_p, len_p, sink_p = as_torch(*prefill_case(3, seed=21))
    out = torch.empty(3, 8, 512, dtype=torch.bfloat16)
    m, l = torch.empty(3, 8), torch.empty(3, 8)
    torch.library.opcheck(ops.sparse_prefill_out, (qp, kv, idx_p, 0.05, 512, sink_p, len_p, out,
                                                   m, l))
