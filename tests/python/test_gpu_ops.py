"""GPU tier of the Python package (run on a Hopper GPU with `pytest tests/python -m gpu`).

Each operation on CUDA tensors is compared with a plain-torch float32 reference and with the C++
CPU backend on the same data (outputs poisoned with NaN before the launch, unused cache slots
filled with NaN, block tables permuted), and a whole decode step is captured in a CUDA graph
and replayed on new inputs. An operation that has no CUDA kernel yet must raise
NotImplementedError (asserted, and reported as a warning) rather than fail in any other way.

OPENMLA_GPU_TEST_DEVICE=cpu runs the same comparisons on CPU tensors (a dry run of the tests
themselves where no GPU is present; the CUDA-graph tests are skipped then).
"""

import math
import os
import warnings

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests need torch")

import openmla  # noqa: E402
import openmla.flash_mla as flash_mla  # noqa: E402

DEVICE = os.environ.get("OPENMLA_GPU_TEST_DEVICE", "cuda")
if DEVICE == "cuda":
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch", allow_module_level=True)
    if not openmla.cuda_backend_available():
        pytest.skip("openmla was built without the CUDA backend (OPENMLA_CUDA=OFF or no nvcc)",
                    allow_module_level=True)

OUT_RTOL = 1e-2   # ‖out − ref‖ / ‖ref‖ for bf16 (docs/architecture.md, testing)
LSE_ATOL = 1e-3


def on_device(call, what):
    """Runs `call`; an operation without a CUDA kernel must raise NotImplementedError: then the
    test asserts that and ends (with a warning naming it). Returns call()'s result or None."""
    try:
        return call()
    except NotImplementedError as error:
        assert str(error), f"{what}: NotImplementedError without a message"
        warnings.warn(f"{what}: no CUDA kernel yet: {error}")
        return None


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b).clamp_min(1e-30)).item()


def assert_lse_close(a, b, atol=LSE_ATOL):
    a, b = a.double().cpu(), b.double().cpu()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    near = (a - b).abs() <= atol
    worst = (a - b).abs().nan_to_num(0).max()
    assert bool((both_inf | near).all()), f"lse differs by up to {worst}"


def randn(*shape, seed, dtype=torch.bfloat16, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(device)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


# --- plain-torch references (float32, on the device) ----------------------------------------

def attend(q, keys, valid, scale, d_v, sink=None):
    """q [..., h, d], keys [..., t, d], valid [..., t] → out [..., h, d_v], lse [..., h]."""
    logits = torch.einsum("...hd,...td->...ht", q.float(), keys.float()) * scale
    logits = logits.masked_fill(~valid.unsqueeze(-2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    lonely = torch.isneginf(lse)
    p = torch.exp(logits - lse.masked_fill(lonely, 0).unsqueeze(-1)).masked_fill(
        lonely.unsqueeze(-1), 0)
    out = torch.einsum("...ht,...td->...hd", p, keys[..., :d_v].float())
    lse = lse.masked_fill(lonely, float("inf"))
    if sink is not None:
        out = out * torch.sigmoid(lse - sink.float()).masked_fill(lonely, 0).unsqueeze(-1)
    return out, lse


def ref_dense_decode(q, k_cache, block_table, seqlens, causal, d_v=512):
    b, s_q, h_q, d_qk = q.shape
    page, h_kv = k_cache.shape[1], k_cache.shape[2]
    max_len = block_table.shape[1] * page
    keys = k_cache[block_table.long()].reshape(b, max_len, h_kv, d_qk)       # [b, t, h_kv, d]
    keys = keys.repeat_interleave(h_q // h_kv, dim=2).permute(0, 2, 1, 3)   # [b, h_q, t, d]
    t = torch.arange(max_len, device=q.device)
    limit = seqlens.long().view(b, 1)                                        # [b, 1]
    if causal:
        limit = limit - s_q + 1 + torch.arange(s_q, device=q.device).view(1, s_q)
    valid = t.view(1, 1, -1) < limit.expand(b, s_q).unsqueeze(-1)           # [b, s_q, t]
    scale = d_qk ** -0.5
    logits = torch.einsum("bshd,bhtd->bsht", q.float(), keys.float().nan_to_num(0)) * scale
    logits = logits.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)                                    # [b, s_q, h]
    lonely = torch.isneginf(lse)
    p = torch.exp(logits - lse.masked_fill(lonely, 0).unsqueeze(-1)).masked_fill(
        lonely.unsqueeze(-1), 0)
    out = torch.einsum("bsht,bhtd->bshd", p, keys[..., :d_v].float().nan_to_num(0))
    return out, lse.masked_fill(lonely, float("inf")).transpose(1, 2)


def ref_sparse(q, flat, indices, topk_length=None, extra_flat=None, extra_indices=None,
               extra_topk_length=None, sink=None, d_v=512):
    """q [b, s_q, h, d]; flat: dequantised slots [num_slots, d] (float32)."""
    def gather(flat, idx, length):
        valid = (idx >= 0) & (idx < flat.shape[0])
        if length is not None:
            pos = torch.arange(idx.shape[-1], device=idx.device)
            valid &= pos.view(1, 1, -1) < length.view(-1, 1, 1)
        keys = flat[idx.long().clamp(0, flat.shape[0] - 1)]
        return keys.masked_fill(~valid.unsqueeze(-1), 0), valid

    keys, valid = gather(flat, indices, topk_length)
    if extra_flat is not None:
        ek, ev = gather(extra_flat, extra_indices, extra_topk_length)
        keys, valid = torch.cat([keys, ek], dim=2), torch.cat([valid, ev], dim=2)
    out, lse = attend(q, keys, valid, q.shape[-1] ** -0.5, d_v, sink)
    return out, lse.transpose(1, 2)


# --- helpers --------------------------------------------------------------------------------

def fill_cache(fmt, num_blocks, page, seed, layout="default", unused_nan=True):
    """A cache of `fmt` on the device (written by the CPU codec), its dequantised slots, and
    the used slots. Unused slots hold NaN so a read of one shows."""
    d_qk = 576 if fmt in ("fp8_v32", "bf16") else 512
    n = num_blocks * page
    x = randn(n, d_qk, seed=seed, dtype=torch.float32, device="cpu")
    used = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: n * 3 // 4]
    if unused_nan:
        mask = torch.ones(n, dtype=torch.bool)
        mask[used] = False
        x[mask] = float("nan")
    cache = openmla.new_kv_cache(num_blocks, page, fmt, layout=layout, d_qk=d_qk,
                                 like=torch.empty(0))
    openmla.kv_cache_write(x, torch.arange(n, dtype=torch.int32), cache, kv_layout=layout)
    flat = openmla.kv_cache_gather(cache, torch.arange(n, dtype=torch.int32), kv_layout=layout)
    if DEVICE != "cpu":
        # copy_ into a device cache of the same layout keeps the (padded) block stride; .to()
        # would make the view contiguous
        on_dev = openmla.new_kv_cache(num_blocks, page, fmt, layout=layout, d_qk=d_qk,
                                      like=torch.empty(0, device=DEVICE))
        on_dev.copy_(cache)
        cache = on_dev
    return cache, flat.to(DEVICE), used.to(torch.int32)


# --- tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp8_mx", "fp4", "bf16"])
@pytest.mark.parametrize("layout", ["default", "interleaved"])
def test_kv_cache_write_gather(fmt, layout):
    d_qk = 576 if fmt in ("fp8_v32", "bf16") else 512
    num_blocks, page, n = 8, 64, 300
    x = randn(n, d_qk, seed=1, dtype=torch.float32, device="cpu")
    x[:, :32] *= 100
    slots = torch.randperm(num_blocks * page, generator=torch.Generator().manual_seed(2))[:n]
    slots = slots.to(torch.int64)
    slots[7] = -1
    cpu_cache = openmla.new_kv_cache(num_blocks, page, fmt, layout=layout, d_qk=d_qk,
                                     like=torch.empty(0))
    openmla.kv_cache_write(x, slots, cpu_cache, kv_layout=layout)
    gpu_cache = openmla.new_kv_cache(num_blocks, page, fmt, layout=layout, d_qk=d_qk,
                                     like=torch.empty(0, device=DEVICE))
    wrote = on_device(lambda: openmla.kv_cache_write(x.to(DEVICE), slots.to(DEVICE), gpu_cache,
                                                     kv_layout=layout) or True,
                      f"kv_cache_write[{fmt}]")
    if wrote is None:
        return
    all_slots = torch.arange(num_blocks * page, dtype=torch.int32)
    expected = openmla.kv_cache_gather(cpu_cache, all_slots, kv_layout=layout)
    written = openmla.kv_cache_gather(gpu_cache.cpu() if DEVICE == "cuda" else gpu_cache,
                                      all_slots, kv_layout=layout)
    assert torch.equal(written, expected)   # the same scales and roundings as the host codec
    gathered = on_device(lambda: openmla.kv_cache_gather(gpu_cache, all_slots.to(DEVICE),
                                                         kv_layout=layout), "kv_cache_gather")
    if gathered is not None:
        assert torch.equal(gathered.cpu(), expected)


@pytest.mark.parametrize("b,s_q,h_q,h_kv,causal,seqlens", [
    (4, 1, 128, 1, False, [1, 700, 4096, 0]),
    (2, 2, 64, 1, True, [130, 1]),
    (3, 1, 16, 1, False, [8000, 64, 65]),
])
@pytest.mark.parametrize("d_qk", [576, 512])
def test_dense_decode(b, s_q, h_q, h_kv, causal, seqlens, d_qk):
    page = 64
    max_blocks = max(1, max(math.ceil(s / page) for s in seqlens))
    num_blocks = b * max_blocks + 3
    q = randn(b, s_q, h_q, d_qk, seed=3)
    k_cache = randn(num_blocks, page, h_kv, d_qk, seed=4)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(5))
    block_table = perm[: b * max_blocks].view(b, max_blocks).to(torch.int32).to(DEVICE)
    unused = perm[b * max_blocks:]
    k_cache[unused.to(DEVICE)] = float("nan")
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    # slots past each sequence's end inside its last block are never read either
    for i, length in enumerate(seqlens):
        if length % page and length:
            k_cache[block_table[i, length // page].long(), length % page:] = float("nan")
    out = poisoned((b, s_q, h_q, 512), torch.bfloat16)
    lse = poisoned((b, h_q, s_q), torch.float32)
    result = on_device(lambda: openmla.dense_decode(q, k_cache, block_table, seqlens_t,
                                                    causal=causal, out=out, lse=lse),
                       "dense_decode")
    if result is None:
        return
    ref_out, ref_lse = ref_dense_decode(q, k_cache, block_table, seqlens_t, causal)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    cpu_out, cpu_lse = openmla.dense_decode(q.cpu(), k_cache.cpu(), block_table.cpu(),
                                            seqlens_t.cpu(), causal=causal)
    assert rel_err(out, cpu_out) < OUT_RTOL
    assert_lse_close(lse, cpu_lse)


def test_empty_batch_and_merge_of_no_tokens():
    """A batch of 0 requests and a merge of 0 tokens are valid and launch nothing harmful."""
    q = randn(0, 1, 128, 576, seed=6)
    k_cache = randn(4, 64, 1, 576, seed=7)
    block_table = torch.zeros((0, 2), dtype=torch.int32, device=DEVICE)
    seqlens = torch.zeros((0,), dtype=torch.int32, device=DEVICE)
    out, lse = openmla.dense_decode(q, k_cache, block_table, seqlens)
    assert out.shape == (0, 1, 128, 512) and lse.shape == (0, 128, 1)
    merged, merged_lse = openmla.merge_attention_states(
        torch.zeros((3, 0, 4, 512), device=DEVICE), torch.zeros((3, 0, 4), device=DEVICE))
    assert merged.shape == (0, 4, 512) and merged_lse.shape == (0, 4)
    # the stream is still healthy afterwards
    assert torch.isfinite(randn(4, seed=8).float()).all()


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp8_mx", "fp4", "bf16"])
@pytest.mark.parametrize("h_q,s_q,causal", [(16, 1, False), (128, 2, True), (8, 4, True)])
def test_dense_decode_over_quantised_cache(fmt, h_q, s_q, causal):
    """Dense decode over a paged cache of any format (openmla.dense_decode with kv_format, and
    flash_mla_with_kvcache(is_fp8_kvcache=True) without indices): NaN in every slot no request
    uses, a permuted block table, poisoned outputs; against the torch reference on the
    dequantised cache and the CPU backend."""
    b, page, max_blocks = 3, 64, 6
    num_blocks = b * max_blocks + 2
    d_qk = 576 if fmt in ("fp8_v32", "bf16") else 512
    g = torch.Generator().manual_seed(70)
    block_table = torch.randperm(num_blocks, generator=g)[: b * max_blocks].view(b, max_blocks)
    seqlens = torch.tensor([300, 1, page * max_blocks], dtype=torch.int32)
    n = num_blocks * page
    used = torch.zeros(n, dtype=torch.bool)
    for i in range(b):
        t = torch.arange(int(seqlens[i]))
        used[block_table[i, t // page] * page + t % page] = True
    x = randn(n, d_qk, seed=71, dtype=torch.float32, device="cpu")
    x[~used] = float("nan")
    cache = openmla.new_kv_cache(num_blocks, page, fmt, d_qk=d_qk, like=torch.empty(0))
    openmla.kv_cache_write(x, torch.arange(n, dtype=torch.int32), cache)
    flat = openmla.kv_cache_gather(cache, torch.arange(n, dtype=torch.int32))
    block_table = block_table.to(torch.int32)
    dev_cache = openmla.new_kv_cache(num_blocks, page, fmt, d_qk=d_qk,
                                     like=torch.empty(0, device=DEVICE))
    dev_cache.copy_(cache)
    q = randn(b, s_q, h_q, d_qk, seed=72)
    bt, sl = block_table.to(DEVICE), seqlens.to(DEVICE)
    out = poisoned((b, s_q, h_q, 512), torch.bfloat16)
    lse = poisoned((b, h_q, s_q), torch.float32)
    result = on_device(lambda: openmla.dense_decode(q, dev_cache, bt, sl, causal=causal,
                                                    kv_format=fmt, out=out, lse=lse),
                       f"dense_decode over {fmt}")
    if result is None:
        return
    keys = flat.to(DEVICE).view(num_blocks, page, 1, d_qk)
    ref_out, ref_lse = ref_dense_decode(q, keys, bt, sl, causal)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    cpu_out, cpu_lse = openmla.dense_decode(q.cpu(), cache, block_table, seqlens, causal=causal,
                                            kv_format=fmt)
    assert rel_err(out, cpu_out) < OUT_RTOL
    assert_lse_close(lse, cpu_lse)
    if fmt == "fp8_v32":  # as engines call it: FlashMLA's name and schedule object
        meta, _ = flash_mla.get_mla_metadata()
        out2, lse2 = flash_mla.flash_mla_with_kvcache(q, dev_cache, bt, sl, 512, meta,
                                                      causal=causal, is_fp8_kvcache=True)
        assert rel_err(out2, out) < 1e-6 or torch.equal(out2, out)
        assert_lse_close(lse2, lse, atol=1e-6)


@pytest.mark.parametrize("fmt,layout", [("fp8_v32", "default"), ("fp8_model1", "default"),
                                        ("fp8_mx", "default"), ("fp8_mx", "interleaved"),
                                        ("bf16", "default")])
@pytest.mark.parametrize("h_q,topk", [(128, 2048), (64, 512)])
def test_sparse_decode(fmt, layout, h_q, topk):
    b, s_q, num_blocks, page = 2, 2, 48, 64
    cache, flat, used = fill_cache(fmt, num_blocks, page, seed=6, layout=layout)
    d_qk = flat.shape[1]
    q = randn(b, s_q, h_q, d_qk, seed=7)
    g = torch.Generator().manual_seed(8)
    indices = used[torch.randint(0, used.numel(), (b, s_q, topk), generator=g)].to(DEVICE)
    indices[0, 0, :100] = -1
    indices[1, 1, 5] = num_blocks * page
    topk_length = torch.tensor([topk, topk // 3], dtype=torch.int32, device=DEVICE)
    sink = randn(h_q, seed=9, dtype=torch.float32)
    out = poisoned((b, s_q, h_q, 512), torch.bfloat16)
    lse = poisoned((b, h_q, s_q), torch.float32)
    result = on_device(lambda: openmla.sparse_decode(q, cache, indices, topk_length=topk_length,
                                                     attn_sink=sink, kv_layout=layout, out=out,
                                                     lse=lse), f"sparse_decode[{fmt}]")
    if result is None:
        return
    ref_out, ref_lse = ref_sparse(q, flat, indices, topk_length, sink=sink)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    cpu_out, cpu_lse = openmla.sparse_decode(q.cpu(), cache.cpu(), indices.cpu(),
                                             topk_length=topk_length.cpu(), attn_sink=sink.cpu(),
                                             kv_layout=layout)
    assert rel_err(out, cpu_out) < OUT_RTOL
    assert_lse_close(lse, cpu_lse)


def test_sparse_decode_extra_fp4_cache():
    b, s_q, h_q, topk, extra_topk = 2, 1, 64, 512, 256
    cache, flat, used = fill_cache("fp8_mx", 16, 64, seed=10)
    extra, extra_flat, extra_used = fill_cache("fp4", 8, 64, seed=11)
    q = randn(b, s_q, h_q, 512, seed=12)
    g = torch.Generator().manual_seed(13)
    indices = used[torch.randint(0, used.numel(), (b, s_q, topk), generator=g)].to(DEVICE)
    extra_indices = extra_used[torch.randint(0, extra_used.numel(), (b, s_q, extra_topk),
                                             generator=g)].to(DEVICE)
    extra_topk_length = torch.tensor([extra_topk, 0], dtype=torch.int32, device=DEVICE)
    sink = torch.full((h_q,), float("inf"), device=DEVICE)
    sink[1:] = randn(h_q - 1, seed=14, dtype=torch.float32)
    result = on_device(lambda: openmla.sparse_decode(q, cache, indices, extra_k_cache=extra,
                                                     extra_indices=extra_indices,
                                                     extra_topk_length=extra_topk_length,
                                                     attn_sink=sink), "sparse_decode[+fp4]")
    if result is None:
        return
    out, lse = result
    ref_out, ref_lse = ref_sparse(q, flat, indices, None, extra_flat, extra_indices,
                                  extra_topk_length, sink)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    assert bool((out[:, :, 0] == 0).all())   # +inf sink


@pytest.mark.parametrize("h_q,d_qk,topk", [(128, 576, 2048), (64, 512, 512)])
def test_sparse_prefill(h_q, d_qk, topk):
    s_q, s_kv = 32, 4096
    q = randn(s_q, h_q, d_qk, seed=15)
    kv = randn(s_kv, 1, d_qk, seed=16)
    g = torch.Generator().manual_seed(17)
    indices = torch.randint(-1, s_kv + 1, (s_q, 1, topk), generator=g).to(torch.int32).to(DEVICE)
    indices[3] = -1
    topk_length = torch.randint(0, topk + 1, (s_q,), generator=g).to(torch.int32).to(DEVICE)
    sink = randn(h_q, seed=18, dtype=torch.float32)
    result = on_device(lambda: openmla.sparse_prefill(q, kv, indices, attn_sink=sink,
                                                      topk_length=topk_length), "sparse_prefill")
    if result is None:
        return
    out, max_logits, lse = result
    pos = torch.arange(topk, device=DEVICE)
    idx = indices[:, 0]
    valid = (idx >= 0) & (idx < s_kv) & (pos.view(1, -1) < topk_length.view(-1, 1))
    keys = kv[idx.long().clamp(0, s_kv - 1), 0].masked_fill(~valid.unsqueeze(-1), 0)
    ref_out, ref_lse = attend(q, keys, valid, d_qk ** -0.5, 512, sink)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    cpu = openmla.sparse_prefill(q.cpu(), kv.cpu(), indices.cpu(), attn_sink=sink.cpu(),
                                 topk_length=topk_length.cpu())
    assert rel_err(out, cpu[0]) < OUT_RTOL
    assert_lse_close(lse, cpu[2])
    assert_lse_close(max_logits, cpu[1])


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp4"])
@pytest.mark.parametrize("dequantize_once", [None, True, False])
def test_sparse_prefill_from_cache(fmt, dequantize_once):
    """Prefill straight from a quantised cache, each named slot dequantised once (the default at
    this shape: 64 tokens x 512 indices over 2048 slots) or decoded where gathered, against the
    float reference on the dequantised slots; unused slots hold NaN."""
    cache, flat, used = fill_cache(fmt, 32, 64, seed=40)
    d_qk = flat.shape[1]
    s_q, h_q, topk = 64, 128, 512
    q = randn(s_q, h_q, d_qk, seed=41)
    g = torch.Generator().manual_seed(42)
    pick = torch.randint(0, used.numel(), (s_q, 1, topk), generator=g)
    indices = used[pick]
    indices[:, :, ::7] = -1
    indices[5] = flat.shape[0]  # past the end: a lonely query
    indices = indices.to(DEVICE)
    topk_length = torch.randint(0, topk + 1, (s_q,), generator=g).to(torch.int32).to(DEVICE)
    sink = randn(h_q, seed=43, dtype=torch.float32)
    result = on_device(lambda: openmla.sparse_prefill_from_cache(
        q, cache, indices, attn_sink=sink, topk_length=topk_length,
        dequantize_once=dequantize_once), "sparse_prefill_from_cache")
    if result is None:
        return
    out, max_logits, lse = result
    ref_out, ref_lse = ref_sparse(q.unsqueeze(1), flat, indices, topk_length, sink=sink)
    assert rel_err(out, ref_out[:, 0]) < OUT_RTOL
    assert_lse_close(lse, ref_lse[:, :, 0])
    assert torch.isposinf(lse[5]).all() and torch.isneginf(max_logits[5]).all()


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1"])
def test_sparse_prefill_from_cache_fp8_tensor_cores(fmt):
    """fp8_tensor_cores=True on the GPU against the CPU backend's definition of that arithmetic:
    the logits within the FP8 MMA's precision (lse within 5e-3, max_logits within 1e-2: skipping
    the e4m3 rounding of q and k would move them by 2-7e-2), out within 4e-2 (P's e4m3 roundings follow
    the logits); and against the float reference within the path's own error."""
    cache, flat, used = fill_cache(fmt, 32, 64, seed=50)
    d_qk = flat.shape[1]
    s_q, h_q, topk = 32, 64, 256
    q = randn(s_q, h_q, d_qk, seed=51)
    g = torch.Generator().manual_seed(52)
    indices = used[torch.randint(0, used.numel(), (s_q, 1, topk), generator=g)]
    indices[:, :, ::9] = -1
    indices[3] = -1  # a lonely query
    indices = indices.to(DEVICE)
    sink = randn(h_q, seed=53, dtype=torch.float32)
    result = on_device(lambda: openmla.sparse_prefill_from_cache(
        q, cache, indices, attn_sink=sink, fp8_tensor_cores=True), "sparse_prefill_from_cache")
    if result is None:
        return
    out, max_logits, lse = result
    cpu = openmla.sparse_prefill_from_cache(q.cpu(), cache.cpu(), indices.cpu(),
                                            attn_sink=sink.cpu(), fp8_tensor_cores=True)
    assert rel_err(out, cpu[0]) < 4e-2
    assert_lse_close(lse, cpu[2], atol=5e-3)
    # The row max is one logit, not a sum over keys: it carries the FP8 wgmma's accumulation error
    # (Hopper keeps ~14 mantissa bits in FP8 accumulation, DeepSeek-V3's report) undiluted; an
    # H100 showed 5.0e-3 on fp8_model1 (2026-12-07). Still 2-7x below what skipping the e4m3
    # rounding of q and k moves it.
    assert_lse_close(max_logits, cpu[1], atol=1e-2)
    ref_out, _ = ref_sparse(q.unsqueeze(1), flat, indices, None, sink=sink)
    assert 2e-3 < rel_err(out, ref_out[:, 0]) < 0.1  # the FP8 arithmetic, near the reference
    assert torch.isposinf(lse[3]).all() and (out[3] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_attention_states(dtype):
    n, tokens, heads = 4, 33, 128
    part_out = randn(n, tokens, heads, 512, seed=19, dtype=dtype)
    part_lse = randn(n, tokens, heads, seed=20, dtype=torch.float32) * 5
    part_lse[1, 0] = float("inf")
    part_lse[:, 2, 3] = float("inf")
    result = on_device(lambda: openmla.merge_attention_states(part_out, part_lse),
                       "merge_attention_states")
    if result is None:
        return
    out, lse = result
    cpu_out, cpu_lse = openmla.merge_attention_states(part_out.cpu(), part_lse.cpu())
    assert rel_err(out, cpu_out) < (1e-5 if dtype == torch.float32 else OUT_RTOL)
    assert_lse_close(lse, cpu_lse, atol=1e-5)


def test_schedule_matches_cpu_planner():
    seqlens = torch.tensor([0, 1, 63, 64, 65, 5000, 100000, 7], dtype=torch.int32)
    parts = openmla.decode_num_sm_parts(seqlens.to(DEVICE), 1, 128, 1)
    assert parts >= 1
    gpu = on_device(lambda: openmla.plan_decode_schedule(seqlens.to(DEVICE), 1, 128,
                                                         num_sm_parts=parts),
                    "plan_decode_schedule")
    if gpu is None:
        return
    cpu = openmla.plan_decode_schedule(seqlens, 1, 128, num_sm_parts=parts)
    assert torch.equal(gpu.metadata.cpu(), cpu.metadata)
    assert torch.equal(gpu.num_splits.cpu(), cpu.num_splits)


def test_flash_mla_interface_on_a_side_stream():
    """FlashMLA's call shapes; the operation runs on torch's current stream."""
    b, s_q, h_q = 4, 1, 128
    cache, flat, used = fill_cache("fp8_v32", 32, 64, seed=21)
    q = randn(b, s_q, h_q, 576, seed=22)
    indices = used[torch.randint(0, used.numel(), (b, s_q, 2048),
                                 generator=torch.Generator().manual_seed(23))].to(DEVICE)
    meta, _ = flash_mla.get_mla_metadata()
    side = torch.cuda.Stream() if DEVICE == "cuda" else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            result = on_device(lambda: flash_mla.flash_mla_with_kvcache(
                q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices),
                "flash_mla_with_kvcache[sparse]")
        side.synchronize()
    else:
        result = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                  is_fp8_kvcache=True, indices=indices)
    if result is None:
        return
    out, lse = result
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    ref_out, ref_lse = ref_sparse(q, flat, indices)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)


def test_device_mismatch_is_a_value_error():
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA device")
    q = randn(1, 1, 16, 576, seed=24)
    k = randn(2, 64, 1, 576, seed=25, device="cpu")
    with pytest.raises(ValueError, match="k_cache: expected device cuda:0"):
        openmla.dense_decode(q, k, torch.zeros(1, 1, dtype=torch.int32, device=DEVICE),
                             torch.ones(1, dtype=torch.int32, device=DEVICE))


# --- CUDA graphs ----------------------------------------------------------------------------

def capture(step):
    """Warms `step` up on a side stream, then captures it; returns (graph, static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    return graph, static


def test_cuda_graph_dense_decode_step():
    """A decode step of two layers (kv_cache_write of the new token, schedule planned by the
    first layer's call and reused by the second) captured once and replayed on new inputs."""
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    b, h_q, page, max_blocks = 4, 128, 64, 40
    num_blocks = b * max_blocks
    k_cache = randn(num_blocks, page, 1, 576, seed=26)
    block_table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(27))
    block_table = block_table.view(b, max_blocks).to(torch.int32).to(DEVICE)
    q = randn(b, 1, h_q, 576, seed=28)
    seqlens = torch.tensor([100, 2000, 1, 2559], dtype=torch.int32, device=DEVICE)
    new_kv = randn(b, 576, seed=29)

    def slot_of(lengths):
        pos = lengths.long() - 1
        return block_table.gather(1, (pos // page).view(b, 1)).view(b).long() * page + pos % page

    slots = slot_of(seqlens)
    can_write = on_device(lambda: openmla.kv_cache_write(new_kv, slots, k_cache) or True,
                          "kv_cache_write[bf16] in the CUDA-graph step") is not None

    def step():
        if can_write:
            openmla.kv_cache_write(new_kv, slots, k_cache)
        meta, _ = flash_mla.get_mla_metadata()
        out1, lse1 = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta)
        out2, lse2 = flash_mla.flash_mla_with_kvcache(q * 2, k_cache, block_table, seqlens, 512,
                                                      meta)
        return out1, lse1, out2, lse2

    try:
        graph, static = capture(step)
    except NotImplementedError as error:
        warnings.warn(f"CUDA-graph decode step: no CUDA kernel yet: {error}")
        return
    for trial in range(2):
        q.copy_(randn(b, 1, h_q, 576, seed=30 + trial))
        new_kv.copy_(randn(b, 576, seed=40 + trial))
        seqlens.copy_(torch.tensor([101 + trial, 1, 2560, 700], dtype=torch.int32))
        slots.copy_(slot_of(seqlens))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for got, want in zip(static, eager):
            assert rel_err(got, want) < 1e-3 or torch.equal(got, want)
        ref_out, ref_lse = ref_dense_decode(q, k_cache, block_table, seqlens, False)
        assert rel_err(static[0], ref_out) < OUT_RTOL
        assert_lse_close(static[1], ref_lse)


def test_cuda_graph_sparse_decode_step():
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    b, h_q, topk = 8, 64, 512
    cache, flat, used = fill_cache("fp8_model1", 32, 64, seed=50, unused_nan=False)
    q = randn(b, 1, h_q, 512, seed=51)
    indices = torch.zeros(b, 1, topk, dtype=torch.int32, device=DEVICE)
    topk_length = torch.full((b,), topk, dtype=torch.int32, device=DEVICE)

    def step():
        meta, _ = flash_mla.get_mla_metadata()
        return flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=indices,
                                                topk_length=topk_length)

    try:
        graph, static = capture(step)
    except NotImplementedError as error:
        warnings.warn(f"CUDA-graph sparse decode step: no CUDA kernel yet: {error}")
        return
    g = torch.Generator().manual_seed(52)
    indices.copy_(torch.randint(0, 32 * 64, (b, 1, topk), generator=g).to(torch.int32))
    topk_length.copy_(torch.randint(0, topk + 1, (b,), generator=g).to(torch.int32))
    q.copy_(randn(b, 1, h_q, 512, seed=53))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = ref_sparse(q, flat, indices, topk_length)
    assert rel_err(static[0], ref_out) < OUT_RTOL
    assert_lse_close(static[1], ref_lse)


# --- values on the GPU: the fast path clamps, the checked mode raises (issue 28) ---------------

def test_dense_decode_fast_path_clamps_out_of_range_values():
    """Without the checked mode nothing is synchronised: a length above the block table's
    capacity counts as the capacity, a negative one as 0 keys (out 0, lse +inf), a used block id
    outside the cache reads zero keys. Nothing outside the cache is read (run this under
    compute-sanitizer memcheck: tools/device_check.sh does)."""
    b, h_q, page, max_blocks, num_blocks = 4, 64, 64, 3, 8
    capacity = max_blocks * page
    q = randn(b, 1, h_q, 576, seed=60)
    k_cache = randn(num_blocks, page, 1, 576, seed=61)
    block_table = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 0], [1, 10**6, -3]],
                               dtype=torch.int32, device=DEVICE)
    seqlens = torch.tensor([capacity + 1000, -5, 2**31 - 1, capacity], dtype=torch.int32,
                           device=DEVICE)
    if DEVICE != "cuda":  # the CPU always checks values
        with pytest.raises(ValueError, match="cache_seqlens"):
            openmla.dense_decode(q, k_cache, block_table, seqlens, check_values=False)
        return
    result = on_device(lambda: openmla.dense_decode(q, k_cache, block_table, seqlens,
                                                    check_values=False), "dense_decode")
    if result is None:
        return
    out, lse = result
    # The reference: lengths clamped, the out-of-range blocks as zero keys.
    zeros_cache = torch.cat([k_cache, torch.zeros_like(k_cache[:1])])
    table = block_table.clone()
    table[(table < 0) | (table >= num_blocks)] = num_blocks
    clamped = seqlens.clamp(0, capacity)
    ref_out, ref_lse = ref_dense_decode(q, zeros_cache, table, clamped, False)
    assert rel_err(out, ref_out) < OUT_RTOL
    assert_lse_close(lse, ref_lse)
    assert torch.equal(out[1].float(), torch.zeros_like(out[1].float()))
    assert bool(torch.isposinf(lse[1]).all())


def test_dense_decode_checked_mode_raises(monkeypatch):
    b, h_q, page, max_blocks = 2, 16, 64, 2
    q = randn(b, 1, h_q, 576, seed=62)
    k_cache = randn(6, page, 1, 576, seed=63)
    block_table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    good = torch.tensor([100, 5], dtype=torch.int32, device=DEVICE)
    for seqlens, match in (([129, 5], r"cache_seqlens\[0\]: expected 0 <= value <= 128"),
                           ([3, -1], r"cache_seqlens\[1\]")):
        bad = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
        with pytest.raises(ValueError, match=match):
            openmla.dense_decode(q, k_cache, block_table, bad, check_values=True)
        monkeypatch.setenv("OPENMLA_CHECK_VALUES", "1")
        with pytest.raises(ValueError, match=match):
            openmla.dense_decode(q, k_cache, block_table, bad)
        meta, _ = flash_mla.get_mla_metadata()
        with pytest.raises(ValueError, match=match):
            flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, bad, 512, meta)
        monkeypatch.delenv("OPENMLA_CHECK_VALUES")
    table = block_table.clone()
    table[0, 1] = 6
    with pytest.raises(ValueError, match=r"block_table\[0, 1\]: expected a block in \[0, 6\)"):
        openmla.dense_decode(q, k_cache, table, good, check_values=True)
    on_device(lambda: openmla.dense_decode(q, k_cache, block_table, good, check_values=True),
              "dense_decode (checked mode, good values)")


# --- the swap on the GPU: lse strides, torch.compile, a step that allocates nothing -----------

def test_lse_strides_and_compiled_flash_mla_pattern():
    if DEVICE != "cuda":
        pytest.skip("the GPU variant of test_flash_mla_swap.py")
    b, s_q, h_q, page = 2, 2, 64, 64
    q = randn(b, s_q, h_q, 576, seed=64)
    k_cache = randn(8, page, 1, 576, seed=65)
    block_table = torch.arange(8, dtype=torch.int32, device=DEVICE).view(2, 4)
    seqlens = torch.tensor([200, 31], dtype=torch.int32, device=DEVICE)

    def layers(q, k_cache, block_table, seqlens):
        meta, _ = flash_mla.get_mla_metadata()
        out1, lse1 = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512,
                                                      meta, causal=True)
        out2, lse2 = flash_mla.flash_mla_with_kvcache(q * 2, k_cache, block_table, seqlens, 512,
                                                      meta, causal=True)
        return out1, lse1.transpose(1, 2).reshape(b * s_q, h_q), out2, lse2

    eager = on_device(lambda: layers(q, k_cache, block_table, seqlens), "flash_mla dense")
    if eager is None:
        return
    assert eager[3].stride() == (s_q * h_q, 1, h_q)
    for backend in ("aot_eager", "inductor"):
        got = torch.compile(layers, backend=backend, fullgraph=True)(q, k_cache, block_table,
                                                                     seqlens)
        for a, want in zip(got, eager):
            assert torch.equal(a, want), backend
    planned = torch.compile(lambda s: openmla.plan_decode_schedule(s, s_q, h_q),
                            backend="aot_eager", fullgraph=True)(seqlens)
    assert planned.metadata.shape[0] == openmla.decode_num_sm_parts(seqlens, s_q, h_q)


def test_cuda_graph_step_allocates_nothing():
    """out=, lse=, workspace= and plan_decode_schedule(out=): capturing the step allocates no
    memory (the allocator's count is unchanged), and replays match eager calls."""
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    b, h_q, page, max_blocks = 4, 128, 64, 16
    k_cache = randn(b * max_blocks, page, 1, 576, seed=66)
    block_table = torch.arange(b * max_blocks, dtype=torch.int32,
                               device=DEVICE).view(b, max_blocks)
    q = randn(b, 1, h_q, 576, seed=67)
    seqlens = torch.tensor([1000, 1, 64, 777], dtype=torch.int32, device=DEVICE)
    schedule = openmla.plan_decode_schedule(seqlens, 1, h_q)
    workspace = openmla.decode_workspace(q)
    out = torch.empty(b, 1, h_q, 512, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(b, 1, h_q, device=DEVICE).transpose(1, 2)

    def step():
        openmla.plan_decode_schedule(seqlens, 1, h_q, out=schedule)
        openmla.dense_decode(q, k_cache, block_table, seqlens, schedule=schedule, out=out,
                             lse=lse, workspace=workspace)
        return out, lse

    if on_device(step, "dense_decode (given buffers)") is None:
        return
    # torch's capture keeps small state of its own alive (the CUDA generator's graph-safe seed
    # and offset, 1 KB on torch 2.11): a capture of an empty step measures it.
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    empty_graph, _ = capture(lambda: None)
    torch_own = torch.cuda.memory_allocated() - before
    before = torch.cuda.memory_allocated()
    graph, _ = capture(step)
    grown = torch.cuda.memory_allocated() - before
    assert grown <= torch_own, f"capturing the step allocated {grown - torch_own} bytes"
    seqlens.copy_(torch.tensor([5, 1024, 3, 63], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want_out, want_lse = openmla.dense_decode(q, k_cache, block_table, seqlens)
    assert rel_err(out, want_out) < 1e-3 or torch.equal(out, want_out)
    assert_lse_close(lse, want_lse)


def test_sparse_lse_strides_on_gpu():
    cache, flat, used = fill_cache("fp8_mx", 8, 64, seed=68, unused_nan=False)
    q = randn(2, 3, 64, 512, seed=69)
    indices = torch.randint(0, 8 * 64, (2, 3, 32), dtype=torch.int32,
                            generator=torch.Generator().manual_seed(70)).to(DEVICE)
    meta, _ = flash_mla.get_mla_metadata()
    result = on_device(lambda: flash_mla.flash_mla_with_kvcache(
        q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices),
        "sparse_decode (lse strides)")
    if result is None:
        return
    out, lse = result
    assert lse.shape == (2, 64, 3) and lse.stride() == (3 * 64, 1, 64)
    assert lse.transpose(1, 2).view(6, 64).shape == (6, 64)
    assert meta.tile_scheduler_metadata is not None and meta.num_splits is not None
