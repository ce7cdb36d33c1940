"""Dense MHA prefill (openmla.mha_prefill / mha_prefill_backward and FlashMLA's
flash_attn_varlen_* in openmla.flash_mla) on the CPU backend: forward against a plain float64
torch reference, backward against torch autograd of that reference, the packed layouts, the
numpy path, the custom ops (opcheck), torch.compile(fullgraph=True) and bad input.
Skipped, visibly, where torch is not installed."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: MHA prefill tests skipped")

import openmla  # noqa: E402
import openmla.flash_mla as flash_mla  # noqa: E402

# Sequences with s_q < s_kv, s_q > s_kv (causal: leading queries see no key), zero-length
# queries and keys, odd lengths, one past a 64-row work chunk.
SEQ_Q = [5, 0, 70, 1, 17]
SEQ_KV = [9, 4, 70, 0, 6]


def cu(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def inputs(d_qk=192, h_q=8, h_kv=8, dtype=torch.bfloat16, seq_q=SEQ_Q, seq_kv=SEQ_KV, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(seq_q), sum(seq_kv)
    q = torch.randn(tq, h_q, d_qk, generator=g).to(dtype)
    k = torch.randn(tk, h_kv, d_qk, generator=g).to(dtype)
    v = torch.randn(tk, h_kv, 128, generator=g).to(dtype)
    return q, k, v, cu(seq_q), cu(seq_kv), max(seq_q, default=0), max(seq_kv, default=0)


def reference(q, k, v, cu_q, cu_kv, causal, scale=None):
    """out, lse of plain attention, sequence by sequence, in q's (float) dtype; differentiable.
    The mask is the definition: query t of s_q sees key u of s_kv iff u <= t + s_kv - s_q."""
    h_q, h_kv = q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outs, lses = [], []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_kv[i]), int(cu_kv[i + 1])
        s_q, s_kv = q1 - q0, k1 - k0
        qi = q[q0:q1].transpose(0, 1)                                  # [h, s_q, d]
        ki = k[k0:k1].repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)
        vi = v[k0:k1].repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)
        logits = scale * qi @ ki.transpose(1, 2)                        # [h, s_q, s_kv]
        t = torch.arange(s_q)[:, None]
        u = torch.arange(s_kv)[None, :]
        sees = (u <= t + s_kv - s_q) if causal else torch.ones(s_q, s_kv, dtype=torch.bool)
        logits = logits.masked_fill(~sees, -math.inf)
        lse = torch.logsumexp(logits, dim=-1) if s_kv else torch.full((h_q, s_q), -math.inf,
                                                                        dtype=q.dtype)
        lonely = ~sees.any(dim=-1)                                      # [s_q]
        p = torch.exp(logits - torch.where(lonely[None, :, None], 0.0, lse[..., None]))
        outs.append((p @ vi).transpose(0, 1))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def check_lse(lse, want):
    assert lse.stride(0) == 1 and tuple(lse.shape) == tuple(want.shape)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.all(lse[~finite] == -math.inf)
    diff = (lse[finite].double() - want.detach()[finite]).abs()
    assert diff.numel() == 0 or float(diff.max()) < 1e-4


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ratio", [1, 2, 8])
def test_forward_and_backward_match_reference(causal, d_qk, dtype, ratio):
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(d_qk, 8, 8 // ratio, dtype,
                                                 seed=d_qk + ratio + causal)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_kv, max_q, max_kv,
                                                causal=causal)
    assert out.dtype == dtype and lse.dtype == torch.float32 and not lse.requires_grad
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    r_out, r_lse = reference(q64, k64, v64, cu_q, cu_kv, causal)
    bf16 = dtype == torch.bfloat16
    assert rel_err(out, r_out) < (6e-3 if bf16 else 8e-4)
    check_lse(lse, r_lse)
    lonely = torch.isinf(r_lse)
    assert torch.all(out[lonely] == 0)

    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    (out.float() * dout.float()).sum().backward()
    (r_out * dout.double()).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.dtype == dtype
        assert rel_err(got, want) < (1e-2 if bf16 else 1.5e-3)
    assert torch.all(q.grad[lonely] == 0)


def test_explicit_scale_and_neutral_functions():
    """openmla.mha_prefill / mha_prefill_backward, with float32 gradients and a scale."""
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(128, 4, 1, torch.float16, [21, 2], [30, 2], 3)
    out, lse = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=True,
                                   softmax_scale=0.05)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    r_out, r_lse = reference(q64, k64, v64, cu_q, cu_kv, True, 0.05)
    assert rel_err(out, r_out) < 8e-4
    check_lse(lse, r_lse)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).half()
    grads = [torch.empty(x.shape) for x in (q, k, v)]
    got = openmla.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_kv, max_q, max_kv,
                                       causal=True, softmax_scale=0.05, dq=grads[0],
                                       dk=grads[1], dv=grads[2])
    assert all(a is b for a, b in zip(got, grads))
    (r_out * dout.double()).sum().backward()
    for g, want in zip(grads, (q64.grad, k64.grad, v64.grad)):
        assert rel_err(g, want) < 6e-4


def test_packed_layouts_match_unpacked():
    """qkv [tokens, h, 2 d_qk + d_v] and kv [tokens, h_kv, d_qk + d_v], packed along the last
    dim as FlashMLA documents: same results, gradients reach the packed tensor."""
    lengths = [7, 0, 12]
    q, k, v, cu_q, _, max_q, _ = inputs(192, 4, 4, seq_q=lengths, seq_kv=lengths, seed=5)
    qkv = torch.cat([q, k, v], dim=-1).requires_grad_()
    out, lse = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, 192, causal=True)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    want, want_lse = flash_mla.flash_attn_varlen_func(qs, ks, vs, cu_q, cu_q, max_q, max_q,
                                                      causal=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).bfloat16()
    out.backward(dout)
    want.backward(dout)
    assert torch.equal(qkv.grad, torch.cat([qs.grad, ks.grad, vs.grad], dim=-1))

    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(128, 4, 2, seed=6)
    kv = torch.cat([k, v], dim=-1).requires_grad_()
    qk = q.clone().requires_grad_()
    out, lse = flash_mla.flash_attn_varlen_kvpacked_func(qk, kv, cu_q, cu_kv, max_q, max_kv, 128)
    want, _ = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_kv, max_q, max_kv)
    assert torch.equal(out, want)
    out.float().sum().backward()
    assert kv.grad.shape == kv.shape and qk.grad.shape == q.shape


def test_fixed_length_mode():
    """is_varlen=False: b = len(cu_seqlens) - 1 sequences of total / b tokens (values unused)."""
    q, k, v, cu_q, cu_kv, _, _ = inputs(192, 2, 2, seq_q=[6, 6, 6], seq_kv=[8, 8, 8], seed=8)
    want = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_kv, 6, 8, causal=True)
    junk = torch.zeros(4, dtype=torch.int32)
    got = flash_mla.flash_attn_varlen_func(q, k, v, junk, junk, 0, 0, causal=True,
                                           is_varlen=False)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_numpy_path_equals_torch():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(192, 4, 2, seed=9)

    def np_bf16(t):
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)

    out, lse = flash_mla.flash_attn_varlen_func(np_bf16(q), np_bf16(k), np_bf16(v),
                                                cu_q.numpy(), cu_kv.numpy(), max_q, max_kv,
                                                causal=True)
    want, want_lse = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=True)
    assert isinstance(out, np.ndarray) and lse.strides == (4, 4 * q.shape[0])
    assert np.array_equal(out.view(np.uint16), want.view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(lse, want_lse.numpy())


def test_opcheck():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(128, 4, 2, seed=10)
    ops = torch.ops.openmla
    torch.library.opcheck(ops.mha_prefill, (q, k, v, cu_q, cu_kv, max_q, max_kv, True, 0.0))
    out, lse = ops.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, True, 0.0)
    torch.library.opcheck(ops.mha_prefill_backward,
                          (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_kv, max_q, max_kv,
                           True, 0.0))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph(backend):
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(192, 4, 2, seed=11)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def step(q, k, v):
        out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_kv, max_q, max_kv,
                                                    causal=True)
        return out, lse

    out, lse = step(q, k, v)
    out.float().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    torch._dynamo.reset()
    c_out, c_lse = torch.compile(step, backend=backend, fullgraph=True)(q, k, v)
    c_out.float().sum().backward()
    assert torch.equal(c_out, out) and torch.equal(c_lse, lse) and c_lse.stride() == lse.stride()
    assert all(torch.equal(x.grad, g) for x, g in zip((q, k, v), grads))


def test_flashmla_signatures():
    """FlashMLA's parameter names, order and defaults (flash_mla/flash_mla_interface.py)."""
    import inspect
    tail = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
            ("deterministic", False), ("is_varlen", True)]
    want = {
        "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_qo", "cu_seqlens_kv",
                                   "max_seqlen_qo", "max_seqlen_kv"],
        "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen", "head_dim_qk"],
        "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_qo", "cu_seqlens_kv",
                                            "max_seqlen_qo", "max_seqlen_kv", "head_dim_qk"],
    }
    for name, positional in want.items():
        params = inspect.signature(getattr(flash_mla, name)).parameters
        assert list(params) == positional + [n for n, _ in tail]
        assert all(params[n].default is inspect.Parameter.empty for n in positional)
        assert all(params[n].default == d for n, d in tail)


def test_inference_mode():
    """Engines prefill under torch.inference_mode: eager and compiled."""
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(192, 4, 2, seed=13)
    want = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=True)

    def step(q, k, v):
        return flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=True)

    with torch.inference_mode():
        got = step(q, k, v)
        torch._dynamo.reset()
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v)
    for out, lse in (got, compiled):
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


def call(**override):
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(192, 4, 2, seq_q=[3, 2], seq_kv=[4, 2])
    args = dict(q=q, k=k, v=v, cu_seqlens_qo=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_qo=max_q,
                max_seqlen_kv=max_kv)
    args.update(override)
    return flash_mla.flash_attn_varlen_func(**args)


I32 = torch.int32


@pytest.mark.parametrize("override,error,match", [
    (dict(cu_seqlens_qo=torch.tensor([0, 3, 2], dtype=I32)), ValueError,
     "cu_seqlens_q: expected non-decreasing"),
    (dict(cu_seqlens_kv=torch.tensor([0, 6, 6], dtype=I32)), ValueError,
     "cu_seqlens_kv: sequence 0 has length 6"),
    (dict(cu_seqlens_qo=torch.tensor([1, 3, 5], dtype=I32)), ValueError, r"cu_seqlens_q\[0\]"),
    (dict(cu_seqlens_qo=torch.tensor([0, 3, 4], dtype=I32)), ValueError,
     r"cu_seqlens_q\[2\]: expected 5"),
    (dict(max_seqlen_qo=2), ValueError, "max_seqlen_q = 2"),
    (dict(cu_seqlens_qo=torch.tensor([0, 3, 5])), TypeError, "cu_seqlens_q.*int32"),
    (dict(cu_seqlens_kv=torch.tensor([0, 4], dtype=I32)), ValueError,
     "cu_seqlens_kv: expected 3 entries"),
    (dict(q=torch.zeros(5, 4, 192)), TypeError, "q: expected dtype bf16 or fp16"),
    (dict(k=torch.zeros(6, 2, 192, dtype=torch.float16)), ValueError, "k: expected dtype bf16"),
    (dict(q=torch.zeros(5, 4, 64, dtype=torch.bfloat16)), ValueError, "192 or 128"),
    (dict(v=torch.zeros(6, 2, 64, dtype=torch.bfloat16)), ValueError, "v: expected head dim d_v"),
    (dict(k=torch.zeros(6, 3, 192, dtype=torch.bfloat16),
          v=torch.zeros(6, 3, 128, dtype=torch.bfloat16)), ValueError, "dividing h_q"),
    (dict(max_seqlen_kv=4.0), TypeError, "max_seqlen_kv: expected an int"),
    (dict(cu_seqlens_kv=np.array([0, 4, 6], np.int32)), TypeError,
     "cu_seqlens_kv: expected a torch.Tensor"),
    (dict(dropout_p=0.1), ValueError, "dropout_p"),
    (dict(deterministic=True), ValueError, "deterministic"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(is_varlen=False), ValueError, "is_varlen=False"),
])
def test_bad_input(override, error, match):
    with pytest.raises(error, match=match):
        call(**override)


def test_bad_packed_input():
    qkv = torch.zeros(5, 2, 320, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="qkv: expected a last dim of 2 \\* head_dim_qk"):
        flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu([5]), 5, 192)
    with pytest.raises(TypeError, match="head_dim_qk"):
        flash_mla.flash_attn_varlen_kvpacked_func(qkv, qkv, cu([5]), cu([5]), 5, 5, "192")
