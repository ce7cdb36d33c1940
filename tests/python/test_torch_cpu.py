"""torch CPU tensors: outputs come back as torch tensors, results equal the numpy path (same C++
CPU backend), the custom ops pass torch.library.opcheck, and torch.compile traces them.
Skipped, visibly, where torch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torch CPU tests skipped")

import openmla  # noqa: E402
import openmla.flash_mla as flash_mla  # noqa: E402
import _reference as ref  # noqa: E402


def t_bf16(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


def to_np(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ref.BF16)
    return t.numpy()


def dense_inputs(seed=0, s_q=1):
    q = t_bf16((2, s_q, 16, 576), seed)
    k = t_bf16((6, 16, 1, 576), seed + 1)
    block_table = torch.tensor([[3, 1, 4], [0, 5, 2]], dtype=torch.int32)
    seqlens = torch.tensor([40, 17], dtype=torch.int32)
    return q, k, block_table, seqlens


def sparse_inputs(fmt="fp8_mx", seed=0):
    d_qk = 576 if fmt == "fp8_v32" else 512
    cache = openmla.new_kv_cache(4, 16, fmt, like=torch.empty(0))
    x = torch.randn(64, d_qk, generator=torch.Generator().manual_seed(seed))
    openmla.kv_cache_write(x, torch.arange(64, dtype=torch.int32), cache)
    q = t_bf16((2, 1, 8, d_qk), seed + 1)
    idx = torch.randint(-1, 64, (2, 1, 20), dtype=torch.int32,
                        generator=torch.Generator().manual_seed(seed + 2))
    return q, cache, idx, x


def test_registered():
    assert openmla.torch_ops_registered
    for name in ("dense_decode", "dense_decode_out", "sparse_decode", "sparse_decode_out",
                 "sparse_prefill", "merge_attention_states", "kv_cache_write", "kv_cache_gather",
                 "plan_decode_schedule"):
        assert hasattr(torch.ops.openmla, name)


def test_dense_decode_matches_numpy():
    q, k, bt, sl = dense_inputs(s_q=2)
    out, lse = openmla.dense_decode(q, k, bt, sl, causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert out.shape == (2, 2, 16, 512) and lse.shape == (2, 16, 2) and lse.dtype == torch.float32
    np_out, np_lse = openmla.dense_decode(to_np(q), to_np(k), bt.numpy(), sl.numpy(), causal=True)
    np.testing.assert_array_equal(to_np(out).astype(np.float32), np_out.astype(np.float32))
    np.testing.assert_array_equal(lse.numpy(), np_lse)
    r_out, r_lse = ref.dense_decode(q.double().numpy(), k.double().numpy(), bt.numpy(),
                                    sl.numpy(), causal=True)
    assert ref.rel_err(out.double().numpy(), r_out) < 1e-2 and ref.close_lse(lse.numpy(), r_lse)


def test_inputs_requiring_grad_and_strided():
    q, k, bt, sl = dense_inputs()
    big = torch.zeros(2, 1, 32, 576, dtype=torch.bfloat16)
    big[:, :, ::2] = q
    out, lse = openmla.dense_decode(big[:, :, ::2].requires_grad_(False), k.requires_grad_(True),
                                    bt, sl)
    expected, _ = openmla.dense_decode(q, k.detach(), bt, sl)
    assert torch.equal(out, expected)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_sparse_and_nested_tensors_are_named():
    q, k, bt, sl = dense_inputs()
    with pytest.raises(TypeError, match="block_table: expected a dense .strided. tensor, got "
                                        "layout torch.sparse_coo"):
        openmla.dense_decode(q, k, bt.to_sparse(), sl)
    with pytest.raises(TypeError, match="q: expected a dense .strided. tensor, got a nested"):
        openmla.dense_decode(torch.nested.nested_tensor([q[0], q[1]]), k, bt, sl)


@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_model1", "fp8_mx"])
def test_sparse_decode_and_float8_view(fmt):
    q, cache, idx, x = sparse_inputs(fmt)
    out, lse = openmla.sparse_decode(q, cache, idx)
    flat = ref.quantize_rows(x.numpy(), fmt)
    r_out, r_lse = ref.sparse_decode(q.double().numpy(), flat, idx.numpy())
    assert ref.rel_err(out.double().numpy(), r_out) < 1e-2 and ref.close_lse(lse.numpy(), r_lse)
    if hasattr(torch, "float8_e4m3fn"):
        out8, lse8 = openmla.sparse_decode(q, cache.view(torch.float8_e4m3fn), idx)
        assert torch.equal(out8, out) and torch.equal(lse8, lse)


def test_quantize_and_gather_return_torch():
    x = torch.randn(5, 512)
    data = openmla.quantize(x, "fp4")
    assert isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.shape == (5, 288)
    back = openmla.dequantize(data)
    np.testing.assert_array_equal(back.numpy(), ref.quantize_rows(x.numpy(), "fp4"))
    assert openmla.dequantize(data, out_dtype="bf16").dtype == torch.bfloat16


def test_merge_and_prefill():
    part_out = torch.randn(2, 3, 4, 512)
    part_lse = torch.randn(2, 3, 4)
    out, lse = openmla.merge_attention_states(part_out, part_lse)
    np_out, np_lse = openmla.merge_attention_states(part_out.numpy(), part_lse.numpy())
    np.testing.assert_array_equal(out.numpy(), np_out)
    q = t_bf16((3, 8, 512), 4)
    kv = t_bf16((10, 1, 512), 5)
    idx = torch.randint(0, 10, (3, 1, 6), dtype=torch.int32)
    o, m, l = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.05)
    assert o.shape == (3, 8, 512) and m.shape == (3, 8) and l.shape == (3, 8)


def test_flash_mla_interface():
    q, k, bt, sl = dense_inputs()
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    assert isinstance(meta.tile_scheduler_metadata, torch.Tensor)
    out2, lse2 = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)  # a second "layer"
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    q, cache, idx, _ = sparse_inputs("fp8_v32")
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx,
                                                attn_sink=torch.zeros(8))
    assert out.shape == (2, 1, 8, 512) and lse.shape == (2, 8, 1)


def test_opcheck():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    q, k, bt, sl = dense_inputs()
    ops = torch.ops.openmla
    torch.library.opcheck(ops.dense_decode, (q, k, bt, sl, 512, 0.0, False, None, None, None, -1))
    workspace = openmla.decode_workspace(q)
    torch.library.opcheck(ops.dense_decode, (q, k, bt, sl, 512, 0.0, False, None, None,
                                             workspace, 1))
    out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16)
    lse = torch.empty(2, 16, 1)
    torch.library.opcheck(ops.dense_decode_out,
                          (q, k, bt, sl, 512, 0.0, False, None, None, out, lse, workspace, 0))
    q, cache, idx, _ = sparse_inputs("fp8_mx")
    torch.library.opcheck(ops.sparse_decode, (q, cache, idx, None, None, None, None, None, None,
                                              "default", None, "default", 512, 0.0, None, None,
                                              None, -1))
    torch.library.opcheck(ops.kv_cache_gather, (cache, torch.arange(5), None, "default", "fp32"))
    torch.library.opcheck(ops.kv_cache_write, (torch.randn(3, 512), torch.arange(3), cache,
                                               None, "default"))
    torch.library.opcheck(ops.merge_attention_states,
                          (torch.randn(2, 3, 4, 512), torch.randn(2, 3, 4), None))
    torch.library.opcheck(ops.plan_decode_schedule, (sl, 1, 16, 1, 3, 64))
    torch.library.opcheck(ops.plan_decode_schedule, (sl, 1, 16, 1, 0, 64))  # 0: the device's
    md, ns = torch.empty(3, openmla._C.SCHEDULE_METADATA_INTS, dtype=torch.int32), \
        torch.empty(3, dtype=torch.int32)
    torch.library.opcheck(ops.plan_decode_schedule_out, (sl, 1, 16, 1, 3, 64, md, ns))
    if hasattr(ops, "kv_cache_convert") and hasattr(openmla._C, "kv_cache_convert"):
        dst = openmla.new_kv_cache(4, 16, "fp8_mx", layout="interleaved", like=torch.empty(0))
        torch.library.opcheck(ops.kv_cache_convert, (cache, dst, None, "default", None,
                                                     "interleaved", None, None))
    qp = t_bf16((3, 8, 512), 4)
    kv = t_bf16((10, 1, 512), 5)
    torch.library.opcheck(ops.sparse_prefill,
                          (qp, kv, torch.zeros(3, 1, 4, dtype=torch.int32), 0.1, 512, None, None))


def test_torch_compile_fullgraph():
    q, cache, idx, _ = sparse_inputs("fp8_mx")
    k_q, k_cache, bt, sl = dense_inputs()

    def step(q, cache, idx, k_q, k_cache, bt, sl):
        out, lse = openmla.sparse_decode(q, cache, idx)
        dense, dense_lse = openmla.dense_decode(k_q, k_cache, bt, sl)
        schedule = openmla.plan_decode_schedule(sl, 1, 16, num_sm_parts=2)
        dense2, _ = openmla.dense_decode(k_q, k_cache, bt, sl, schedule=schedule)
        merged = openmla.merge_attention_states(torch.stack([out, out]).float().flatten(1, 2),
                                                lse.transpose(1, 2).flatten(0, 1)[None]
                                                .expand(2, -1, -1), return_lse=False)
        return out * 2, lse, dense, dense2, merged

    eager = step(q, cache, idx, k_q, k_cache, bt, sl)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(q, cache, idx, k_q, k_cache, bt, sl)
    for a, b in zip(eager, got):
        assert torch.equal(a, b)


def test_torch_compile_kv_cache_write():
    cache = openmla.new_kv_cache(2, 16, "fp8_mx", like=torch.empty(0))
    expected = cache.clone()
    x = torch.randn(4, 512)
    slots = torch.tensor([0, 3, 17, 31], dtype=torch.int32)
    openmla.kv_cache_write(x, slots, expected)

    def write(x, slots, cache):
        openmla.kv_cache_write(x, slots, cache)
        return openmla.kv_cache_gather(cache, slots)

    got = torch.compile(write, backend="aot_eager", fullgraph=True)(x, slots, cache)
    assert torch.equal(cache, expected)
    assert torch.equal(got, openmla.kv_cache_gather(expected, slots))


def test_torch_compile_with_given_outputs():
    part_out = torch.randn(2, 3, 4, 512)
    part_lse = torch.randn(2, 3, 4)
    q, k, bt, sl = dense_inputs()

    def run(part_out, part_lse, out, q, k, bt, sl, dense_out, dense_lse):
        openmla.merge_attention_states(part_out, part_lse, out=out, return_lse=False)
        openmla.dense_decode(q, k, bt, sl, out=dense_out, lse=dense_lse)
        return out.sum() + dense_out.float().sum()

    bufs = [torch.empty(3, 4, 512), torch.empty(2, 1, 16, 512, dtype=torch.bfloat16),
            torch.empty(2, 16, 1)]
    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    compiled(part_out, part_lse, bufs[0], q, k, bt, sl, bufs[1], bufs[2])
    expected, _ = openmla.merge_attention_states(part_out, part_lse)
    dense, dense_lse = openmla.dense_decode(q, k, bt, sl)
    assert torch.equal(bufs[0], expected)
    assert torch.equal(bufs[1], dense) and torch.equal(bufs[2], dense_lse)
