"""The engine switches of docs/engines.md on the CPU: openmla.integrations.vllm and .sglang
replace the FlashMLA entry points where vLLM and SGLang keep them. Each engine is stood in for
by a small package of its real module paths whose FlashMLA functions raise if called, and whose
backend modules call them the way the engines' current call sites do (keyword names, a
FlashMLASchedMeta or tensor metadata, out= slices). Run in fresh interpreters, through a
sitecustomize.py as the docs show (install()) and after the engine has imported (patch()); the
results must be OpenMLA's, bit for bit."""

import os
import re
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import openmla
import openmla.flash_mla as flash_mla
from openmla.integrations import sglang as omla_sglang

BF16 = ml_dtypes.bfloat16

VENDORED = "raise RuntimeError('the engine\\'s own FlashMLA was called')"

FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/flashmla/__init__.py": "",
    # vLLM's vendored FlashMLA interface, over torch.ops._flashmla_C.
    "vllm/third_party/flashmla/flash_mla_interface.py": f"""
        import dataclasses
        @dataclasses.dataclass
        class FlashMLASchedMeta:
            have_initialized: bool = False
        def get_mla_metadata(*args, **kwargs):
            return FlashMLASchedMeta(), None
        def flash_mla_with_kvcache(*args, **kwargs):
            {VENDORED}
        def flash_mla_sparse_fwd(*args, **kwargs):
            {VENDORED}
        def flash_attn_varlen_func(*args, **kwargs):
            return "vllm's own dense MHA prefill"
    """,
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/ops/__init__.py": "",
    # The wrapper module every MLA backend imports from.
    "vllm/v1/attention/ops/flashmla.py": """
        from vllm.third_party.flashmla.flash_mla_interface import (
            FlashMLASchedMeta, flash_attn_varlen_func, flash_mla_sparse_fwd,
            flash_mla_with_kvcache, get_mla_metadata)
        def flash_mla_with_kvcache_fp8(*args, **kwargs):
            return "vllm's own FP8 dense decode"
    """,
    "vllm/v1/attention/backends/__init__.py": "",
    "vllm/v1/attention/backends/mla/__init__.py": "",
    # The call sites, as vLLM writes them (flashmla_sparse.py, flashmla.py, DeepSeek V4).
    "vllm/v1/attention/backends/mla/flashmla_sparse.py": """
        from vllm.v1.attention.ops.flashmla import (
            FlashMLASchedMeta, flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata)

        def fp8_decode(q, cache, topk_indices, scale, dummy_block_table, cache_lens):
            scheduler_metadata, _ = get_mla_metadata()
            assert isinstance(scheduler_metadata, FlashMLASchedMeta)
            return flash_mla_with_kvcache(
                q=q, k_cache=cache, block_table=dummy_block_table, head_dim_v=512,
                cache_seqlens=cache_lens, tile_scheduler_metadata=scheduler_metadata,
                is_fp8_kvcache=True, indices=topk_indices, softmax_scale=scale)

        def v4_prefill(q, kv, indices, lengths, sink, scale, output, chunks):
            for start, end in chunks:
                flash_mla_sparse_fwd(q=q[start:end], kv=kv, indices=indices[start:end],
                                     sm_scale=scale, attn_sink=sink,
                                     topk_length=lengths[start:end], out=output[start:end])
            return output
    """,
    "vllm/v1/attention/backends/mla/flashmla.py": """
        import numpy as np
        from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache, get_mla_metadata

        def batch_invariant_decode(q, cache, block_table, seq_lens, scale):
            scheduler_metadata, _ = get_mla_metadata(seq_lens, q.shape[1] * q.shape[2], 1,
                                                     is_fp8_kvcache=False)
            b = q.shape[0]
            tile = np.zeros((1, 8), np.int32)
            tile[0, 2] = b - 1
            tile[0, 3] = block_table.shape[-1] // 64
            scheduler_metadata.tile_scheduler_metadata = tile
            scheduler_metadata.num_splits = np.zeros((b + 1,), np.int32)
            return flash_mla_with_kvcache(q=q, k_cache=cache, block_table=block_table,
                                          cache_seqlens=seq_lens, head_dim_v=512,
                                          tile_scheduler_metadata=scheduler_metadata,
                                          softmax_scale=scale, causal=True,
                                          is_fp8_kvcache=False)
    """,
}

FAKE_SGLANG = {
    "sgl_kernel/__init__.py": "",
    # sgl_kernel's FlashMLA (the older interface: tensor metadata).
    "sgl_kernel/flash_mla.py": f"""
        def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k,
                             num_heads_q=None, is_fp8_kvcache=False, topk=None):
            {VENDORED}
        def flash_mla_with_kvcache(*args, **kwargs):
            {VENDORED}
        def flash_mla_sparse_fwd(*args, **kwargs):
            {VENDORED}
    """,
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/attention/__init__.py": "",
    # The DSA (V3.2) backend: imports inside its methods, as SGLang does.
    "sglang/srt/layers/attention/dsa_backend.py": """
        import numpy as np

        class Backend:
            def __init__(self, num_q_heads, topk):
                self.num_q_heads, self.topk = num_q_heads, topk

            def _compute_flashmla_metadata(self, cache_seqlens, seq_len_q):
                from sgl_kernel.flash_mla import get_mla_metadata
                return get_mla_metadata(
                    cache_seqlens=cache_seqlens,
                    num_q_tokens_per_head_k=seq_len_q * self.num_q_heads // 1, num_heads_k=1,
                    num_heads_q=self.num_q_heads, is_fp8_kvcache=True, topk=self.topk)

            def _forward_flashmla_kv(self, q_all, kv_cache, cache_seqlens, metadata,
                                     page_table_1, sm_scale):
                from sgl_kernel.flash_mla import flash_mla_with_kvcache
                o, _ = flash_mla_with_kvcache(
                    q=q_all, k_cache=kv_cache, cache_seqlens=cache_seqlens, head_dim_v=512,
                    tile_scheduler_metadata=metadata[0], num_splits=metadata[1],
                    softmax_scale=sm_scale, indices=page_table_1[:, None, :],
                    block_table=np.empty((q_all.shape[0], 0), np.int32), is_fp8_kvcache=True)
                return o

            def _forward_flashmla_sparse(self, q_all, kv_cache, page_table_1, sm_scale):
                from sgl_kernel.flash_mla import flash_mla_sparse_fwd
                o, _, _ = flash_mla_sparse_fwd(q=q_all, kv=kv_cache,
                                               indices=page_table_1[:, None, :],
                                               sm_scale=sm_scale, d_v=512)
                return o
    """,
    # The FlashMLA backend of V3: imported at module level (bound before any patch()).
    "sglang/srt/layers/attention/flashmla_backend.py": """
        from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata

        def decode(q, k_cache, block_table, cache_seqlens, scale):
            md, ns = get_mla_metadata(cache_seqlens, q.shape[1] * q.shape[2], 1)
            return flash_mla_with_kvcache(q=q, k_cache=k_cache, block_table=block_table,
                                          cache_seqlens=cache_seqlens, head_dim_v=512,
                                          tile_scheduler_metadata=md, num_splits=ns,
                                          softmax_scale=scale, causal=True)
    """,
}


def write_tree(root, files):
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))


def run(root, code, sitecustomize=None):
    if sitecustomize is not None:
        (root / "sitecustomize.py").write_text(textwrap.dedent(sitecustomize))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


VLLM_CHECKS = """
    import ml_dtypes, numpy as np, openmla
    from vllm.v1.attention.backends.mla import flashmla, flashmla_sparse
    import vllm.v1.attention.ops.flashmla as ops
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    cache = openmla.new_kv_cache(4, 64, "fp8_v32")               # vLLM's fp8_ds_mla, 656 B
    openmla.kv_cache_write(rng.standard_normal((256, 576)).astype(np.float32),
                           np.arange(256, dtype=np.int32), cache)
    q = rng.standard_normal((3, 1, 16, 576)).astype(bf16)       # 16 heads, no padding to 64
    idx = rng.integers(-1, 256, (3, 1, 64)).astype(np.int32)
    out, lse = flashmla_sparse.fp8_decode(q, cache, idx, 0.04, np.zeros((3, 1), np.int32),
                                          np.full(3, 256, np.int32))
    want, want_lse = openmla.sparse_decode(q, cache, idx, softmax_scale=0.04)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(lse, want_lse)
    qp = rng.standard_normal((9, 16, 512)).astype(bf16)
    kv = rng.standard_normal((50, 1, 512)).astype(bf16)
    pidx = rng.integers(-1, 50, (9, 1, 32)).astype(np.int32)
    lens = rng.integers(0, 33, 9).astype(np.int32)
    sink = rng.standard_normal(16).astype(np.float32)
    output = np.zeros((9, 16, 512), bf16)
    flashmla_sparse.v4_prefill(qp, kv, pidx, lens, sink, 0.05, output, [(0, 4), (4, 9)])
    want = openmla.sparse_prefill(qp, kv, pidx, softmax_scale=0.05, attn_sink=sink,
                                  topk_length=lens)[0]
    assert np.array_equal(output.view(np.uint16), want.view(np.uint16))
    qd = rng.standard_normal((2, 1, 16, 576)).astype(bf16)
    kd = rng.standard_normal((4, 64, 1, 576)).astype(bf16)
    table = np.arange(4, dtype=np.int32).reshape(2, 2)
    lens = np.array([128, 70], np.int32)
    out, lse = flashmla.batch_invariant_decode(qd, kd, table, lens, 576 ** -0.5)
    want, want_lse = openmla.dense_decode(qd, kd, table, lens, causal=True)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert ops.flash_mla_with_kvcache_fp8() == "vllm's own FP8 dense decode"
    assert ops.flash_attn_varlen_func() == "vllm's own dense MHA prefill"
    print("vllm on openmla: OK")
"""


def test_vllm_install_from_sitecustomize(tmp_path):
    write_tree(tmp_path, FAKE_VLLM)
    out = run(tmp_path, VLLM_CHECKS, sitecustomize="""
        import openmla.integrations.vllm
        openmla.integrations.vllm.install()
    """)
    assert "vllm on openmla: OK" in out


def test_vllm_patch_after_import(tmp_path):
    write_tree(tmp_path, FAKE_VLLM)
    out = run(tmp_path, textwrap.dedent("""
        import sys
        from vllm.v1.attention.backends.mla import flashmla, flashmla_sparse
        try:
            flashmla_sparse.fp8_decode(None, None, None, 0.1, None, None)
            raise AssertionError("the stand-in's FlashMLA did not raise")
        except RuntimeError as error:
            assert "own FlashMLA" in str(error)
        import openmla.integrations.vllm as omla_vllm
        changed = omla_vllm.patch()
        for name in ("vllm.v1.attention.ops.flashmla",
                     "vllm.third_party.flashmla.flash_mla_interface",
                     "vllm.v1.attention.backends.mla.flashmla_sparse",
                     "vllm.v1.attention.backends.mla.flashmla"):
            assert name in changed, changed
        assert omla_vllm.patch()   # idempotent
    """) + textwrap.dedent(VLLM_CHECKS))
    assert "vllm on openmla: OK" in out
    assert run(tmp_path, """
        import openmla.integrations.vllm as omla_vllm
        assert omla_vllm.patch() == []    # vLLM not imported: nothing to do
        print("nothing")
    """).strip() == "nothing"


SGLANG_CHECKS = """
    import ml_dtypes, numpy as np, openmla
    from sglang.srt.layers.attention import dsa_backend, flashmla_backend
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(1)
    backend = dsa_backend.Backend(num_q_heads=16, topk=64)
    cache = openmla.new_kv_cache(4, 64, "fp8_v32")
    openmla.kv_cache_write(rng.standard_normal((256, 576)).astype(np.float32),
                           np.arange(256, dtype=np.int32), cache)
    q = rng.standard_normal((3, 1, 16, 576)).astype(bf16)
    page_table_1 = rng.integers(-1, 256, (3, 64)).astype(np.int32)
    seqlens = np.array([64, 10, 64], np.int32)
    metadata = backend._compute_flashmla_metadata(seqlens, 1)
    assert metadata[0].shape[1] == 8 and metadata[1].shape == (4,)
    out = backend._forward_flashmla_kv(q, cache, seqlens, metadata, page_table_1, 0.04)
    want, _ = openmla.sparse_decode(q, cache, page_table_1[:, None, :], softmax_scale=0.04)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    bf16_cache = openmla.kv_cache_gather(cache, np.arange(256, dtype=np.int32), out_dtype="bf16")
    import sgl_kernel.flash_mla as sgl_flash_mla   # a bf16 cache, no quantisation (not FlashMLA)
    out, _ = sgl_flash_mla.flash_mla_with_kvcache(
        q=q, k_cache=bf16_cache.reshape(4, 64, 1, 576), cache_seqlens=seqlens, head_dim_v=512,
        tile_scheduler_metadata=metadata[0], num_splits=metadata[1], softmax_scale=0.04,
        indices=page_table_1[:, None, :], block_table=np.empty((3, 0), np.int32),
        is_fp8_kvcache=False)
    want, _ = openmla.sparse_decode(q, bf16_cache.reshape(4, 64, 1, 576),
                                    page_table_1[:, None, :], softmax_scale=0.04)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    qp = rng.standard_normal((5, 16, 576)).astype(bf16)
    kv = bf16_cache.reshape(256, 1, 576)
    got = backend._forward_flashmla_sparse(qp, kv, page_table_1[[0, 1, 2, 0, 1]], 0.04)
    want = openmla.sparse_prefill(qp, kv, page_table_1[[0, 1, 2, 0, 1]][:, None, :],
                                  softmax_scale=0.04)[0]
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    qd = rng.standard_normal((2, 1, 16, 576)).astype(bf16)
    kd = rng.standard_normal((4, 64, 1, 576)).astype(bf16)
    table = np.arange(4, dtype=np.int32).reshape(2, 2)
    lens = np.array([128, 70], np.int32)
    out, lse = flashmla_backend.decode(qd, kd, table, lens, 576 ** -0.5)
    want, want_lse = openmla.dense_decode(qd, kd, table, lens, causal=True)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(lse, want_lse)
    print("sglang on openmla: OK")
"""


def test_sglang_install_from_sitecustomize(tmp_path):
    write_tree(tmp_path, FAKE_SGLANG)
    out = run(tmp_path, SGLANG_CHECKS, sitecustomize="""
        import openmla.integrations.sglang
        openmla.integrations.sglang.install()
    """)
    assert "sglang on openmla: OK" in out


def test_sglang_patch_after_import(tmp_path):
    write_tree(tmp_path, FAKE_SGLANG)
    out = run(tmp_path, textwrap.dedent("""
        import sgl_kernel.flash_mla
        from sglang.srt.layers.attention import flashmla_backend
        import openmla.integrations.sglang as omla_sglang
        changed = omla_sglang.patch()
        assert changed == ["sgl_kernel.flash_mla",
                           "sglang.srt.layers.attention.flashmla_backend"], changed
    """) + textwrap.dedent(SGLANG_CHECKS))
    assert "sglang on openmla: OK" in out


# --- the older FlashMLA interface sgl_kernel keeps ------------------------------------------

def test_sglang_metadata_shapes_and_interfaces():
    seqlens = np.array([5, 300, 0, 64], np.int32)
    md, ns = omla_sglang.get_mla_metadata(seqlens, 16, 1)
    assert md.dtype == np.int32 and md.shape[1] == 8 and ns.shape == (5,)
    md2, ns2 = omla_sglang.get_mla_metadata(seqlens[:2], 16, 1)
    assert md2.shape == md.shape and ns2.shape == (3,)   # rows independent of the batch
    md3, ns3 = omla_sglang.get_mla_metadata(cache_seqlens=seqlens, num_q_tokens_per_head_k=128,
                                            num_heads_k=1, num_heads_q=64, is_fp8_kvcache=True,
                                            topk=2048)
    assert md3.shape[1] == 8 and ns3.shape == (5,)
    meta, none = omla_sglang.get_mla_metadata()   # the newest interface
    assert isinstance(meta, flash_mla.FlashMLASchedMeta) and none is None
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 1, 16, 576)).astype(BF16)
    k = rng.standard_normal((4, 64, 1, 576)).astype(BF16)
    table = np.arange(4, dtype=np.int32).reshape(2, 2)
    lens = np.array([100, 3], np.int32)
    md, ns = omla_sglang.get_mla_metadata(lens, 16, 1)
    out, lse = omla_sglang.flash_mla_with_kvcache(q, k, table, lens, 512, md, ns)
    want, want_lse = openmla.dense_decode(q, k, table, lens)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    out2, _ = omla_sglang.flash_mla_with_kvcache(q, k, table, lens, 512, meta,
                                                 enable_batch_invariant=True)
    assert np.array_equal(out2.view(np.uint16), want.view(np.uint16))
    with pytest.raises(NotImplementedError, match="descale_q"):
        omla_sglang.flash_mla_with_kvcache(q, k, table, lens, 512, md, ns,
                                           descale_q=np.ones(2, np.float32),
                                           descale_k=np.ones(2, np.float32))
    with pytest.raises(TypeError, match="enable_batch_invariant"):
        omla_sglang.flash_mla_with_kvcache(q, k, table, lens, 512, md, ns,
                                           enable_batch_invariant=True)
    with pytest.raises(TypeError, match="tile_scheduler_metadata"):
        omla_sglang.flash_mla_with_kvcache(q, k, table, lens, 512, "metadata", ns)
    with pytest.raises(ValueError, match="is_fp8_kvcache"):
        omla_sglang.flash_mla_with_kvcache(q, k, table, lens, 512, md, ns, is_fp8_kvcache=True)
    with pytest.raises(TypeError, match="cache_seqlens"):
        omla_sglang.get_mla_metadata(lens.astype(np.int64), 16, 1)


def test_the_examples_of_docs_engines_md_run(tmp_path):
    """Every Python block of docs/engines.md runs as it is, in a fresh interpreter (the
    sitecustomize blocks import nothing of the engines)."""
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "engines.md")
    if not os.path.exists(doc):
        pytest.skip("docs/ is not next to the tests (an installed copy of the tests)")
    with open(doc, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= 3
    for block in blocks:
        run(tmp_path, block)
