"""GPU tier of dense MHA prefill backward (the SM90 kernel), run on a Hopper GPU with
`pytest tests/python/test_gpu_mha_backward.py` (skipped without CUDA or without the CUDA backend).

The gradients of openmla.mha_prefill_backward on CUDA tensors are compared with the C++ CPU
backend on the same data (out and lse from the CPU forward) and with float32 torch autograd of
plain attention; the workspace is allocated per call on the tensors' device. Autograd through
openmla.flash_mla.flash_attn_varlen_func on CUDA tensors (loss.backward()) is checked the same
way once the CUDA forward exists (skipped while it raises NotImplementedError).
"""

import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests need torch")

import openmla  # noqa: E402
import openmla.flash_mla as flash_mla  # noqa: E402
from openmla import _frameworks as fw  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
if not openmla.cuda_backend_available():
    pytest.skip("openmla was built without the CUDA backend", allow_module_level=True)

# ‖grad − ref‖ / ‖ref‖ against the CPU backend, bf16 inputs (fp16: a quarter of it); twice that
# against float32 torch autograd, whose out (in D = rowsum(dout · out)) is not rounded to bf16.
GRAD_RTOL = 2e-2


def cu(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def make_inputs(d_qk, h_q, h_kv, dtype, seq_q, seq_kv, seed):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(seq_q), sum(seq_kv)
    q = torch.randn(tq, h_q, d_qk, generator=g).to(dtype)
    k = torch.randn(tk, h_kv, d_qk, generator=g).to(dtype)
    v = torch.randn(tk, h_kv, 128, generator=g).to(dtype)
    dout = torch.randn(tq, h_q, 128, generator=g).to(dtype)
    return q, k, v, dout, cu(seq_q), cu(seq_kv), max(seq_q, default=0), max(seq_kv, default=0)


def torch_reference_grads(q, k, v, dout, cu_q, cu_kv, causal):
    """dq, dk, dv of plain attention in float32 by torch autograd (the mask is the definition:
    query t of s_q sees key u of s_kv iff u <= t + s_kv - s_q; a query seeing no key gives 0)."""
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    h_q, h_kv = q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5
    outs = []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_kv[i]), int(cu_kv[i + 1])
        s_q, s_kv = q1 - q0, k1 - k0
        qi = q[q0:q1].transpose(0, 1)
        ki = k[k0:k1].repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)
        vi = v[k0:k1].repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)
        logits = scale * qi @ ki.transpose(1, 2)
        t = torch.arange(s_q)[:, None]
        u = torch.arange(s_kv)[None, :]
        sees = (u <= t + s_kv - s_q) if causal else torch.ones(s_q, s_kv, dtype=torch.bool)
        logits = logits.masked_fill(~sees, -math.inf)
        p = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # rows seeing no key: 0
        outs.append((p @ vi).transpose(0, 1))
    out = torch.cat(outs)
    (out * dout.float()).sum().backward()
    return q.grad, k.grad, v.grad


def rel_err(got, ref):
    got, ref = got.detach().float().cpu(), ref.detach().float().cpu()
    assert torch.isfinite(got).all(), "non-finite gradient"
    denom = ref.norm().item()
    return (got - ref).norm().item() / (denom if denom > 0 else 1.0)


CASES = [
    # d_qk, h_q, h_kv, dtype, causal, seq_q, seq_kv
    (128, 4, 4, torch.bfloat16, False, [63, 1, 129], [63, 1, 129]),
    (192, 4, 4, torch.bfloat16, True, [1, 63, 129, 0], [1, 63, 129, 5]),
    (192, 8, 2, torch.bfloat16, True, [17, 64, 100], [129, 200, 100]),
    (128, 4, 1, torch.float16, True, [17, 65, 3, 10], [129, 65, 130, 4]),
    (192, 4, 4, torch.float16, False, [300, 0], [257, 9]),
]


@pytest.mark.parametrize("d_qk,h_q,h_kv,dtype,causal,seq_q,seq_kv", CASES)
@pytest.mark.parametrize("grad_fp32", [False, True])
def test_backward_cuda_matches_cpu_and_torch(d_qk, h_q, h_kv, dtype, causal, seq_q, seq_kv,
                                             grad_fp32):
    q, k, v, dout, cu_q, cu_kv, max_q, max_kv = make_inputs(d_qk, h_q, h_kv, dtype, seq_q,
                                                            seq_kv, seed=d_qk + h_kv)
    out, lse = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=causal)
    cpu = openmla.mha_prefill_backward(
        dout, q, k, v, out, lse, cu_q, cu_kv, max_q, max_kv, causal=causal,
        dq=torch.empty(q.shape, dtype=torch.float32), dk=torch.empty(k.shape, dtype=torch.float32),
        dv=torch.empty(v.shape, dtype=torch.float32))
    ref = torch_reference_grads(q, k, v, dout, cu_q, cu_kv, causal)

    dev = [x.cuda() for x in (dout, q, k, v, out, lse, cu_q, cu_kv)]
    given = {}
    if grad_fp32:
        given = {name: torch.full(like.shape, math.nan, dtype=torch.float32, device="cuda")
                 for name, like in (("dq", q), ("dk", k), ("dv", v))}
    gpu = openmla.mha_prefill_backward(*dev, max_q, max_kv, causal=causal, **given)
    torch.cuda.synchronize()
    tol = GRAD_RTOL if dtype == torch.bfloat16 else GRAD_RTOL / 4
    for name, g, c, r in zip(("dq", "dk", "dv"), gpu, cpu, ref):
        assert g.device.type == "cuda"
        assert g.dtype == (torch.float32 if grad_fp32 else dtype), name
        assert rel_err(g, c) <= tol, f"{name} vs the CPU backend: {rel_err(g, c):.3e}"
        assert rel_err(g, r) <= 2 * tol, f"{name} vs torch float32 autograd: {rel_err(g, r):.3e}"


def test_backward_cuda_workspace_given_is_refused_when_small():
    q, k, v, dout, cu_q, cu_kv, max_q, max_kv = make_inputs(128, 2, 2, torch.bfloat16, [70],
                                                            [70], seed=3)
    out, lse = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv)
    size = openmla._C.mha_prefill_backward_workspace_size("cuda", 0, 70, 70, 2, 2, 128, 128)
    assert size >= 70 * 2 * 129 * 4
    dev = [x.cuda() for x in (dout, q, k, v, out, lse, cu_q, cu_kv)]
    grads = [torch.empty_like(x) for x in dev[1:4]]
    with pytest.raises(ValueError, match="workspace"):
        openmla._C.mha_prefill_backward(
            *(fw.to_c(t) for t in dev + grads), max_seqlen_q=max_q, max_seqlen_kv=max_kv,
            workspace=fw.to_c(torch.empty(size - 1, dtype=torch.uint8, device="cuda")))


def test_autograd_flash_attn_varlen_func_cuda():
    """loss.backward() through FlashMLA's name on CUDA tensors (the backward on the SM90
    kernel) against the same on CPU tensors."""
    q, k, v, dout, cu_q, cu_kv, max_q, max_kv = make_inputs(192, 4, 2, torch.bfloat16,
                                                            [33, 130], [64, 130], seed=5)
    qc, kc, vc = (x.cuda().requires_grad_() for x in (q, k, v))
    try:
        out_c, _ = flash_mla.flash_attn_varlen_func(qc, kc, vc, cu_q.cuda(), cu_kv.cuda(), max_q,
                                                    max_kv, causal=True)
    except NotImplementedError:
        pytest.skip("the CUDA forward of dense MHA prefill has not landed yet")
    (out_c.float() * dout.cuda().float()).sum().backward()
    qh, kh, vh = (x.clone().requires_grad_() for x in (q, k, v))
    out_h, _ = flash_mla.flash_attn_varlen_func(qh, kh, vh, cu_q, cu_kv, max_q, max_kv,
                                                causal=True)
    (out_h.float() * dout.float()).sum().backward()
    for name, g, h in (("q", qc, qh), ("k", kc, kh), ("v", vc, vh)):
        assert rel_err(g.grad, h.grad) <= GRAD_RTOL, f"d{name}: {rel_err(g.grad, h.grad):.3e}"
