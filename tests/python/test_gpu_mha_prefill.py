"""Dense MHA prefill forward on the GPU (OpenMLA's SM90 kernel) through the Python package:
openmla.mha_prefill and FlashMLA's flash_attn_varlen_func / _qkvpacked / _kvpacked with CUDA
tensors, against the same call on the CPU backend. Skipped where torch or CUDA is missing."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU MHA prefill tests skipped")

import openmla  # noqa: E402
import openmla.flash_mla as flash_mla  # noqa: E402

from test_mha_prefill import SEQ_KV, SEQ_Q, cu, inputs  # noqa: E402

pytestmark = pytest.mark.gpu


def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")


def _close(got, ref, what):
    got, ref = got.detach().float().cpu(), ref.detach().float()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), finite), f"{what}: -inf / non-finite entries differ"
    assert torch.equal(got[~finite], ref[~finite]), f"{what}: non-finite entries differ (NaN?)"
    err = (got[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30)
    assert err < 1e-2, f"{what}: relative L2 error {float(err):.3e}"


@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_matches_cpu(d_qk, causal, dtype):
    _need_cuda()
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(d_qk, 8, 2, dtype=dtype, seed=3)
    out_ref, lse_ref = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=causal)
    out, lse = openmla.mha_prefill(q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(), cu_kv.cuda(),
                                   max_q, max_kv, causal=causal)
    assert out.is_cuda and lse.stride(0) == 1
    _close(out, out_ref, "out")
    _close(lse, lse_ref, "lse")


def test_flash_attn_varlen_family_on_gpu():
    _need_cuda()
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(192, 4, 4, seed=5)
    ref, ref_lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_kv, max_q, max_kv,
                                                    causal=True)
    with torch.no_grad():
        out, lse = flash_mla.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(),
                                                    cu_kv.cuda(), max_q, max_kv, causal=True)
    _close(out, ref, "flash_attn_varlen_func out")
    _close(lse, ref_lse, "flash_attn_varlen_func lse")
    # Packed along the last dim (q, k, v views of one tensor: strided rows on the GPU).
    lengths = [70, 129, 1]
    total = sum(lengths)
    g = torch.Generator().manual_seed(9)
    qkv = torch.randn(total, 4, 2 * 192 + 128, generator=g).to(torch.bfloat16)
    cu_s = cu(lengths)
    ref, _ = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_s, max(lengths), 192, causal=True)
    with torch.no_grad():
        out, _ = flash_mla.flash_attn_varlen_qkvpacked_func(qkv.cuda(), cu_s.cuda(), max(lengths),
                                                            192, causal=True)
    _close(out, ref, "flash_attn_varlen_qkvpacked_func out")


def test_zero_length_and_lonely_rows_on_gpu():
    _need_cuda()
    # SEQ_Q / SEQ_KV hold an empty query list, an empty key list and s_q > s_kv (lonely rows).
    q, k, v, cu_q, cu_kv, max_q, max_kv = inputs(128, 2, 1, seq_q=SEQ_Q, seq_kv=SEQ_KV, seed=7)
    out_ref, lse_ref = openmla.mha_prefill(q, k, v, cu_q, cu_kv, max_q, max_kv, causal=True)
    out, lse = openmla.mha_prefill(q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(), cu_kv.cuda(),
                                   max_q, max_kv, causal=True)
    _close(out, out_ref, "out")
    _close(lse, lse_ref, "lse")
