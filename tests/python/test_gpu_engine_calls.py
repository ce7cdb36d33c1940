"""GPU tier of test_engine_calls.py (run on a Hopper GPU with `pytest tests/python -m gpu`):
FlashMLA's newest interface as engines call it, on CUDA tensors. `enable_batch_invariant=True`
(sparse decode, dense decode over a bf16 cache): a request's result is the same bits alone, in
its batch and in another batch, and the reference's within bf16 rounding; vLLM's hand-built
one-row schedule decodes every key; `flash_mla_sparse_fwd(..., out=slice)` writes vLLM's V4
prefill chunks into its output buffer. Each eager, under torch.compile(fullgraph=True) (aot_eager
and inductor) and captured in a CUDA graph, replayed on new inputs.

OPENMLA_GPU_TEST_DEVICE=cpu runs the same on CPU tensors (a dry run of the tests themselves; the
compile-with-inductor and CUDA-graph tests are skipped then)."""

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests need torch")

import openmla  # noqa: E402
import openmla.flash_mla as flash_mla  # noqa: E402
from test_gpu_ops import (DEVICE, OUT_RTOL, assert_lse_close, capture, fill_cache,  # noqa: E402
                          on_device, randn, ref_sparse, rel_err)

needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")


def ref_dense_decode(q, k_cache, table, lengths, causal, d_v=512):
    """Float32 reference of dense decode with one kv head (MQA, as MLA caches it), without
    copying the keys per head: (out [b, s_q, h_q, d_v], lse [b, h_q, s_q])."""
    b, s_q, h_q, d_qk = q.shape
    page = k_cache.shape[1]
    max_len = table.shape[1] * page
    keys = k_cache[table.long()].reshape(b, max_len, d_qk).float()           # [b, t, d]
    t = torch.arange(max_len, device=q.device)
    limit = lengths.long().view(b, 1).expand(b, s_q)
    if causal:
        limit = limit - s_q + 1 + torch.arange(s_q, device=q.device).view(1, s_q)
    valid = t.view(1, 1, -1) < limit.unsqueeze(-1)                            # [b, s_q, t]
    logits = torch.einsum("bshd,btd->bsht", q.float(), keys) * d_qk ** -0.5
    logits = logits.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)                                     # [b, s_q, h]
    lonely = torch.isneginf(lse)
    p = torch.exp(logits - lse.masked_fill(lonely, 0).unsqueeze(-1)).masked_fill(
        lonely.unsqueeze(-1), 0)
    out = torch.einsum("bsht,btd->bshd", p, keys[..., :d_v])
    return out, lse.masked_fill(lonely, float("inf")).transpose(1, 2)


def sparse_inputs(b, h_q, topk, seed, fmt="fp8_mx", s_q=1, num_blocks=32, page=64):
    cache, flat, used = fill_cache(fmt, num_blocks, page, seed=seed)
    q = randn(b, s_q, h_q, flat.shape[1], seed=seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    indices = used[torch.randint(0, used.numel(), (b, s_q, topk), generator=g)].to(DEVICE)
    indices[0, 0, : topk // 4] = -1
    topk_length = torch.randint(0, topk + 1, (b,), generator=g).to(torch.int32).to(DEVICE)
    topk_length[-1] = topk
    sink = randn(h_q, seed=seed + 3, dtype=torch.float32)
    return q, cache, flat, indices, topk_length, sink


def dense_inputs(b, h_q, seed, s_q=1, page=64, max_blocks=128):
    """A bf16 cache and lengths from 1 key to 8192: long requests the default schedule splits
    over SMs (a small batch), short ones it keeps whole."""
    num_blocks = b * max_blocks
    k_cache = randn(num_blocks, page, 1, 576, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    table = torch.randperm(num_blocks, generator=g).view(b, max_blocks).to(torch.int32)
    lengths = torch.randint(1, page * max_blocks + 1, (b,), generator=g).to(torch.int32)
    lengths[0], lengths[-1] = page * max_blocks, 1
    q = randn(b, s_q, h_q, 576, seed=seed + 2)
    return q, k_cache, table.to(DEVICE), lengths.to(DEVICE)


def sparse_call(q, cache, indices, topk_length, sink, invariant=True, **kwargs):
    meta, _ = flash_mla.get_mla_metadata()
    fp8 = cache.dtype != torch.bfloat16   # OpenMLA also reads a bf16 sparse cache
    return flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=fp8,
                                            indices=indices, attn_sink=sink,
                                            topk_length=topk_length,
                                            enable_batch_invariant=invariant, **kwargs)


def dense_call(q, k_cache, table, lengths, causal=False, invariant=True):
    meta, _ = flash_mla.get_mla_metadata()
    return flash_mla.flash_mla_with_kvcache(q, k_cache, table, lengths, 512, meta, causal=causal,
                                            enable_batch_invariant=invariant)


def assert_batch_invariant(call, batch, subsets):
    """call(picks) decodes the requests `picks`: each subset's results are the whole batch's
    rows, bit for bit."""
    out, lse = call(list(range(batch)))
    for picks in subsets:
        out_i, lse_i = call(picks)
        assert torch.equal(out_i, out[picks]), f"out of requests {picks} depends on the batch"
        assert torch.equal(lse_i, lse[picks]), f"lse of requests {picks} depends on the batch"
    return out, lse


# --- enable_batch_invariant -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt,h_q,topk", [("fp8_mx", 64, 2048), ("fp8_model1", 128, 512),
                                          ("fp8_v32", 16, 2048), ("bf16", 8, 512)])
def test_sparse_batch_invariant(fmt, h_q, topk):
    """Head counts below 64 are not padded; the CPU backend agrees within bf16 rounding."""
    b = 8
    q, cache, flat, idx, lengths, sink = sparse_inputs(b, h_q, topk, seed=100, fmt=fmt, s_q=2)

    def call(picks):
        return sparse_call(q[picks], cache, idx[picks], lengths[picks], sink)

    if on_device(lambda: call([0]), f"sparse decode[{fmt}], enable_batch_invariant") is None:
        return
    out, lse = assert_batch_invariant(call, b, [[0], [5], [7, 2], [3, 4, 1]])
    ref_out, ref_lse = ref_sparse(q, flat, idx, lengths, sink=sink)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    cpu_out, cpu_lse = openmla.sparse_decode(q.cpu(), cache.cpu(), idx.cpu(),
                                             topk_length=lengths.cpu(), attn_sink=sink.cpu())
    assert rel_err(out, cpu_out) < OUT_RTOL
    assert_lse_close(lse, cpu_lse)
    default_out, _ = sparse_call(q, cache, idx, lengths, sink, invariant=False)
    assert rel_err(out, default_out) < OUT_RTOL


@pytest.mark.parametrize("h_q,s_q,causal", [(128, 1, False), (16, 1, False), (64, 2, True)])
def test_dense_batch_invariant(h_q, s_q, causal):
    b = 6
    q, k_cache, table, lengths = dense_inputs(b, h_q, seed=110, s_q=s_q)

    def call(picks):
        return dense_call(q[picks], k_cache, table[picks], lengths[picks], causal)

    if on_device(lambda: call([0]), "dense decode, enable_batch_invariant") is None:
        return
    out, lse = assert_batch_invariant(call, b, [[0], [3], [5, 1], [2, 4, 0]])
    ref_out, ref_lse = ref_dense_decode(q, k_cache, table, lengths, causal)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    default_out, default_lse = dense_call(q, k_cache, table, lengths, causal, invariant=False)
    assert rel_err(out, default_out) < OUT_RTOL
    assert_lse_close(lse, default_lse)


@needs_cuda
def test_dense_batch_invariant_over_a_quantised_cache_is_not_implemented():
    cache, flat, used = fill_cache("fp8_v32", 4, 64, seed=120, unused_nan=False)
    q = randn(2, 1, 64, 576, seed=121)
    table = torch.arange(4, dtype=torch.int32, device=DEVICE).view(2, 2)
    lengths = torch.tensor([100, 7], dtype=torch.int32, device=DEVICE)
    meta, _ = flash_mla.get_mla_metadata()
    with pytest.raises(NotImplementedError, match="batch_invariant"):
        flash_mla.flash_mla_with_kvcache(q, cache, table, lengths, 512, meta, is_fp8_kvcache=True,
                                         enable_batch_invariant=True)


# --- a schedule built by hand (vLLM's batch-invariant dense path) ---------------------------

def vllm_dense(q, k_cache, table, lengths):
    """vLLM's FlashMLA dense decode under VLLM_BATCH_INVARIANT, as written there: a one-row
    tile_scheduler_metadata in FlashMLA's layout (64-key blocks) and an all-zero num_splits,
    made on the device and assigned before the call (by device fills: under CUDA-graph capture a
    Python scalar's host-to-device copy is not allowed)."""
    meta, _ = flash_mla.get_mla_metadata(lengths, q.shape[1] * q.shape[2], 1,
                                         is_fp8_kvcache=False)
    b = q.shape[0]
    md = torch.zeros((1, 8), dtype=torch.int32, device=q.device)
    md[0, 2].fill_(b - 1)
    md[0, 3].fill_(table.shape[-1] // 64)
    meta.tile_scheduler_metadata = md
    meta.num_splits = torch.zeros((b + 1,), dtype=torch.int32, device=q.device)
    return flash_mla.flash_mla_with_kvcache(q=q, k_cache=k_cache, block_table=table,
                                            cache_seqlens=lengths, head_dim_v=512,
                                            tile_scheduler_metadata=meta,
                                            softmax_scale=576 ** -0.5, causal=True,
                                            is_fp8_kvcache=False)


def test_vllm_hand_built_schedule_attends_every_key():
    """Read as OpenMLA's layout, that schedule would cut the last request to table.shape[-1] //
    64 keys (here 2) and give each request no split; decoded as what it asks for (no split-KV),
    every key counts and the result is batch-invariant."""
    b = 5
    q, k_cache, table, lengths = dense_inputs(b, 128, seed=130)
    lengths[-1] = 4000

    def call(picks):
        return vllm_dense(q[picks], k_cache, table[picks], lengths[picks])

    if on_device(lambda: call([0]), "dense decode, hand-built schedule") is None:
        return
    out, lse = assert_batch_invariant(call, b, [[4], [1, 4], [3, 0]])
    ref_out, ref_lse = ref_dense_decode(q, k_cache, table, lengths, True)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)


# --- flash_mla_sparse_fwd(out=) ------------------------------------------------------------------

def prefill_inputs(s_q, h_q, seed, s_kv=4096, topk=512):
    q = randn(s_q, h_q, 512, seed=seed)
    kv = randn(s_kv, 1, 512, seed=seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    indices = torch.randint(-1, s_kv + 1, (s_q, 1, topk), generator=g).to(torch.int32)
    lengths = torch.randint(0, topk + 1, (s_q,), generator=g).to(torch.int32)
    sink = randn(h_q, seed=seed + 3, dtype=torch.float32)
    return q, kv, indices.to(DEVICE), lengths.to(DEVICE), sink


def chunked_prefill(q, kv, indices, lengths, sink, output, chunks):
    """vLLM's DeepSeek V4 prefill: each chunk of query tokens into its rows of `output`."""
    for start, end in chunks:
        flash_mla.flash_mla_sparse_fwd(q=q[start:end], kv=kv, indices=indices[start:end],
                                       sm_scale=512 ** -0.5, attn_sink=sink,
                                       topk_length=lengths[start:end], out=output[start:end])
    return output


def chunk_results(q, kv, indices, lengths, sink, chunks):
    """The same chunks returned (no out=), concatenated."""
    return torch.cat([openmla.sparse_prefill(q[a:b], kv, indices[a:b], softmax_scale=512 ** -0.5,
                                             attn_sink=sink, topk_length=lengths[a:b])[0]
                      for a, b in chunks])


def test_sparse_prefill_out_into_slices():
    s_q, h_q = 96, 64
    q, kv, idx, lengths, sink = prefill_inputs(s_q, h_q, seed=140)
    output = torch.full((s_q + 8, h_q, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    chunks = [(0, 40), (40, 95), (95, 96)]
    if on_device(lambda: chunked_prefill(q, kv, idx, lengths, sink, output, chunks),
                 "sparse prefill (out=)") is None:
        return
    want = chunk_results(q, kv, idx, lengths, sink, chunks)
    assert torch.equal(output[:s_q], want)
    assert bool(torch.isnan(output[s_q:].float()).all())   # rows past the prefill untouched
    cpu = openmla.sparse_prefill(q.cpu(), kv.cpu(), idx.cpu(), softmax_scale=512 ** -0.5,
                                 attn_sink=sink.cpu(), topk_length=lengths.cpu())[0]
    assert rel_err(output[:s_q], cpu) < OUT_RTOL
    padded = torch.zeros((s_q, 128, 512), dtype=torch.bfloat16, device=DEVICE)  # a head slice
    flash_mla.flash_mla_sparse_fwd(q, kv, idx, 512 ** -0.5, 512, sink, lengths,
                                   out=padded[:, :h_q])
    assert torch.equal(padded[:, :h_q], chunk_results(q, kv, idx, lengths, sink, [(0, s_q)]))
    assert not bool(padded[:, h_q:].any())


# --- torch.compile and CUDA graphs ---------------------------------------------------------------

@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_engine_patterns(backend):
    if backend == "inductor" and DEVICE != "cuda":
        pytest.skip("inductor on the GPU only here")
    q, cache, flat, idx, lengths, sink = sparse_inputs(4, 64, 512, seed=150)
    qd, k_cache, table, dense_lengths = dense_inputs(3, 128, seed=151, max_blocks=32)
    qp, kv, idx_p, len_p, sink_p = prefill_inputs(48, 64, seed=152)

    def sparse_layers(q, cache, idx, lengths, sink):
        meta, _ = flash_mla.get_mla_metadata()
        outs = []
        for layer in range(2):
            outs += flash_mla.flash_mla_with_kvcache(q * (layer + 1), cache, None, None, 512,
                                                     meta, is_fp8_kvcache=True, indices=idx,
                                                     attn_sink=sink, topk_length=lengths,
                                                     enable_batch_invariant=True)
        return outs

    def dense_layers(q, k_cache, table, lengths):
        meta, _ = flash_mla.get_mla_metadata()
        outs = []
        for layer in range(2):
            outs += flash_mla.flash_mla_with_kvcache(q * (layer + 1), k_cache, table, lengths,
                                                     512, meta, enable_batch_invariant=True)
        return outs

    def prefill(q, kv, idx, lengths, sink):
        output = torch.zeros((q.shape[0], q.shape[1], 512), dtype=torch.bfloat16,
                             device=q.device)
        return chunked_prefill(q, kv, idx, lengths, sink, output, [(0, 20), (20, 48)])

    cases = ((sparse_layers, (q, cache, idx, lengths, sink)),
             (dense_layers, (qd, k_cache, table, dense_lengths)),
             (vllm_dense, (qd, k_cache, table, dense_lengths)),
             (prefill, (qp, kv, idx_p, len_p, sink_p)))
    for fn, args in cases:
        eager = on_device(lambda: fn(*args), f"{fn.__name__} (eager)")
        if eager is None:
            continue
        torch._dynamo.reset()
        got = torch.compile(fn, backend=backend, fullgraph=True)(*args)
        eager = eager if isinstance(eager, (list, tuple)) else [eager]
        got = got if isinstance(got, (list, tuple)) else [got]
        for a, b in zip(got, eager):
            assert torch.equal(a, b), f"{fn.__name__} under {backend}"


@needs_cuda
def test_cuda_graph_batch_invariant_decode_step():
    """A decode step as the engines write it, captured once and replayed on new inputs: vLLM's
    V4 sparse decode (SWA cache + compressed extra cache, sink, out= into its output buffer)
    with enable_batch_invariant=True, and vLLM's hand-built dense schedule made inside the
    step. Replays match eager calls and the reference, and are batch-invariant."""
    b, h_q = 4, 64
    swa, swa_flat, swa_used = fill_cache("fp8_model1", 16, 64, seed=160, unused_nan=False)
    extra, extra_flat, extra_used = fill_cache("fp8_model1", 8, 64, seed=161, unused_nan=False)
    q = randn(b, 1, h_q, 512, seed=162)
    swa_idx = torch.zeros(b, 1, 128, dtype=torch.int32, device=DEVICE)
    swa_len = torch.full((b,), 128, dtype=torch.int32, device=DEVICE)
    extra_idx = torch.zeros(b, 1, 512, dtype=torch.int32, device=DEVICE)
    extra_len = torch.full((b,), 512, dtype=torch.int32, device=DEVICE)
    sink = randn(h_q, seed=163, dtype=torch.float32)
    output = torch.empty(b, h_q, 512, dtype=torch.bfloat16, device=DEVICE)
    qd, k_cache, table, dense_lengths = dense_inputs(b, 128, seed=164, max_blocks=32)

    def step():
        meta, _ = flash_mla.get_mla_metadata()
        flash_mla.flash_mla_with_kvcache(
            q=q, k_cache=swa, block_table=None, head_dim_v=512, tile_scheduler_metadata=meta,
            cache_seqlens=None, is_fp8_kvcache=True, indices=swa_idx, topk_length=swa_len,
            softmax_scale=512 ** -0.5, attn_sink=sink, extra_k_cache=extra,
            extra_indices_in_kvcache=extra_idx, extra_topk_length=extra_len,
            enable_batch_invariant=True, out=output.unsqueeze(1))
        return (output,) + tuple(vllm_dense(qd, k_cache, table, dense_lengths))

    try:
        graph, static = capture(step)
    except NotImplementedError as error:
        pytest.skip(f"no CUDA kernel yet: {error}")
    g = torch.Generator().manual_seed(165)
    for trial in range(2):
        swa_idx.copy_(swa_used[torch.randint(0, swa_used.numel(), (b, 1, 128), generator=g)])
        extra_idx.copy_(extra_used[torch.randint(0, extra_used.numel(), (b, 1, 512),
                                                 generator=g)])
        swa_len.copy_(torch.randint(0, 129, (b,), generator=g).to(torch.int32))
        extra_len.copy_(torch.randint(0, 513, (b,), generator=g).to(torch.int32))
        q.copy_(randn(b, 1, h_q, 512, seed=170 + trial))
        qd.copy_(randn(b, 1, 128, 576, seed=180 + trial))
        dense_lengths.copy_(torch.randint(1, 2049, (b,), generator=g).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in static]
        eager = step()
        for got, want in zip(replayed, eager):
            assert torch.equal(got, want)
        ref_out, ref_lse = ref_sparse(q, swa_flat, swa_idx, swa_len, extra_flat, extra_idx,
                                      extra_len, sink)
        assert rel_err(replayed[0], ref_out[:, 0]) < OUT_RTOL
        ref_out, ref_lse = ref_dense_decode(qd, k_cache, table, dense_lengths, True)
        assert rel_err(replayed[1], ref_out) < OUT_RTOL
        assert_lse_close(replayed[2], ref_lse)
        for i in range(b):   # each request alone: the same bits as in the replayed batch
            alone, _ = sparse_call(q[i:i + 1], swa, swa_idx[i:i + 1], swa_len[i:i + 1], sink,
                                   extra_k_cache=extra,
                                   extra_indices_in_kvcache=extra_idx[i:i + 1],
                                   extra_topk_length=extra_len[i:i + 1],
                                   softmax_scale=512 ** -0.5)
            assert torch.equal(alone[:, 0], replayed[0][i:i + 1])
            dense_alone, _ = vllm_dense(qd[i:i + 1], k_cache, table[i:i + 1],
                                        dense_lengths[i:i + 1])
            assert torch.equal(dense_alone, replayed[1][i:i + 1])


@needs_cuda
def test_cuda_graph_chunked_prefill_out():
    s_q, h_q = 64, 64
    q, kv, idx, lengths, sink = prefill_inputs(s_q, h_q, seed=190)
    output = torch.zeros((s_q, h_q, 512), dtype=torch.bfloat16, device=DEVICE)

    def step():
        return chunked_prefill(q, kv, idx, lengths, sink, output, [(0, 30), (30, 64)])

    try:
        graph, static = capture(step)
    except NotImplementedError as error:
        pytest.skip(f"no CUDA kernel yet: {error}")
    q.copy_(randn(s_q, h_q, 512, seed=191))
    lengths.copy_(torch.randint(0, 513, (s_q,), generator=torch.Generator().manual_seed(192))
                  .to(torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(output, chunk_results(q, kv, idx, lengths, sink, [(0, 30), (30, 64)]))
    cpu = openmla.sparse_prefill(q.cpu(), kv.cpu(), idx.cpu(), softmax_scale=512 ** -0.5,
                                 attn_sink=sink.cpu(), topk_length=lengths.cpu())[0]
    assert rel_err(output, cpu) < OUT_RTOL
