"""The swap from FlashMLA as engines write it (issue 28): `import flash_mla` through the opt-in
alias, lse with FlashMLA's strides, the FlashMLASchedMeta filled after dense and sparse calls,
a decode that allocates nothing when given out/lse/workspace, torch.compile(fullgraph=True) of
the standard patterns, and the checked mode for values. CPU backend; numpy always, torch where
it is installed (the same on the GPU: tests/python/test_gpu_ops.py)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import openmla
import openmla.flash_mla as flash_mla
from openmla import _frameworks

BF16 = ml_dtypes.bfloat16
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def dense_numpy(s_q=1, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, s_q, 16, 576)).astype(BF16)
    k = rng.standard_normal((6, 16, 1, 576)).astype(BF16)
    block_table = np.array([[3, 1, 4], [0, 5, 2]], np.int32)
    seqlens = np.array([40, 17], np.int32)
    return q, k, block_table, seqlens


def sparse_numpy(s_q=2, fmt="fp8_mx", seed=0):
    rng = np.random.default_rng(seed)
    cache = openmla.new_kv_cache(4, 16, fmt)
    openmla.kv_cache_write(rng.standard_normal((64, 512)).astype(np.float32),
                           np.arange(64, dtype=np.int32), cache)
    q = rng.standard_normal((2, s_q, 8, 512)).astype(BF16)
    idx = rng.integers(-1, 64, (2, s_q, 20)).astype(np.int32)
    return q, cache, idx


def run_fresh(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


# --- the alias --------------------------------------------------------------------------------

def test_alias_by_call():
    proc = run_fresh("""
        import sys, openmla
        assert "flash_mla" not in sys.modules
        openmla.install_flash_mla_alias()
        import flash_mla
        import flash_mla.flash_mla_interface
        from flash_mla import flash_mla_with_kvcache, get_mla_metadata, FlashMLASchedMeta
        from flash_mla.flash_mla_interface import flash_mla_sparse_fwd
        assert flash_mla is openmla.flash_mla
        assert flash_mla.flash_mla_interface is openmla.flash_mla
        assert flash_mla.__version__ == openmla.__version__
        print(flash_mla.__version__)
    """)
    assert proc.returncode == 0, proc.stderr


def test_alias_by_environment_after_import_openmla():
    proc = run_fresh("""
        import openmla, flash_mla.flash_mla_interface as fmi
        assert fmi.flash_mla_with_kvcache is openmla.flash_mla.flash_mla_with_kvcache
    """, OPENMLA_FLASH_MLA_ALIAS="1")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("_openmla_flash_mla_alias") is None,
                    reason="the .pth hook is installed by pip (not in a PYTHONPATH layout)")
def test_alias_by_environment_without_code_edits():
    """What an engine does unchanged: `import flash_mla`, nothing else (the wheel's .pth)."""
    code = """
        import sys
        assert "openmla" not in sys.modules
        import flash_mla
        from flash_mla.flash_mla_interface import get_mla_metadata
        assert flash_mla.__name__ == "openmla.flash_mla", flash_mla.__name__
        meta, none = get_mla_metadata()
        assert none is None and not meta.have_initialized
    """
    proc = run_fresh(code, OPENMLA_FLASH_MLA_ALIAS="1")
    assert proc.returncode == 0, proc.stderr
    off = run_fresh("import sys; assert 'openmla' not in sys.modules\n"
                    "import importlib.util; print(importlib.util.find_spec('flash_mla'))",
                    OPENMLA_FLASH_MLA_ALIAS="0")
    assert off.returncode == 0 and "openmla" not in off.stdout, off.stdout + off.stderr


# --- lse strides ------------------------------------------------------------------------------

def flashmla_strides(lse):
    b, h_q, s_q = lse.shape
    return tuple(s // lse.itemsize for s in lse.strides) == (s_q * h_q, 1, h_q)


def test_lse_has_flashmla_strides_numpy():
    q, cache, idx = sparse_numpy(s_q=3)
    out, lse = openmla.sparse_decode(q, cache, idx)
    assert lse.shape == (2, 8, 3) and flashmla_strides(lse)
    lse.transpose(0, 2, 1).reshape(6, 8).view()  # a view, no copy needed
    assert lse.transpose(0, 2, 1).flags.c_contiguous
    q, k, bt, sl = dense_numpy(s_q=2)
    out, lse = openmla.dense_decode(q, k, bt, sl, causal=True)
    assert lse.shape == (2, 16, 2) and flashmla_strides(lse)
    meta, _ = flash_mla.get_mla_metadata()
    _, lse2 = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    assert flashmla_strides(lse2) and np.array_equal(lse, lse2)


# --- FlashMLASchedMeta --------------------------------------------------------------------------

def test_sched_meta_filled_after_sparse_and_dense_calls():
    q, cache, idx = sparse_numpy(s_q=1)
    topk_length = np.array([20, 7], np.int32)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx,
                                                topk_length=topk_length)
    assert meta.have_initialized
    assert meta.tile_scheduler_metadata is not None and meta.tile_scheduler_metadata.ndim == 2
    assert meta.num_splits is not None and meta.num_splits.shape == (3,)
    first = (meta.tile_scheduler_metadata, meta.num_splits, meta.workspace)
    out2, lse2 = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                  is_fp8_kvcache=True, indices=idx,
                                                  topk_length=topk_length)
    assert all(a is b for a, b in zip(first, (meta.tile_scheduler_metadata, meta.num_splits,
                                              meta.workspace)))
    assert np.array_equal(out.view(np.uint16), out2.view(np.uint16))
    want, _ = openmla.sparse_decode(q, cache, idx, topk_length=topk_length)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    meta, _ = flash_mla.get_mla_metadata()  # lengths outside [0, topk] count clamped
    flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                                     indices=idx, topk_length=np.array([-3, 99], np.int32))
    assert meta.num_splits is not None
    q, k, bt, sl = dense_numpy()
    meta, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    assert meta.tile_scheduler_metadata is not None and meta.num_splits.shape == (3,)


# --- no allocation per call -----------------------------------------------------------------

def test_decode_allocates_nothing_when_given_buffers(monkeypatch):
    q, k, bt, sl = dense_numpy(s_q=2)
    schedule = openmla.plan_decode_schedule(sl, 2, 16)
    workspace = openmla.decode_workspace(q)
    out = np.empty((2, 2, 16, 512), BF16)
    lse = np.empty((2, 2, 16), np.float32).transpose(0, 2, 1)
    want_out, want_lse = openmla.dense_decode(q, k, bt, sl, schedule=schedule)
    q_s, cache, idx = sparse_numpy(s_q=1)
    sparse_workspace = openmla.decode_workspace(q_s, sparse=True)
    sparse_out = np.empty((2, 1, 8, 512), BF16)
    sparse_lse = np.empty((2, 1, 8), np.float32).transpose(0, 2, 1)

    def no_allocation(*args, **kwargs):
        raise AssertionError("a decode step allocated")

    monkeypatch.setattr(_frameworks.Numpy, "empty", no_allocation)
    monkeypatch.setattr(_frameworks.Numpy, "zeros", no_allocation)
    openmla.plan_decode_schedule(sl, 2, 16, out=schedule)  # re-planned in place
    got_out, got_lse = openmla.dense_decode(q, k, bt, sl, schedule=schedule, out=out, lse=lse,
                                            workspace=workspace)
    assert got_out is out and got_lse is lse
    openmla.sparse_decode(q_s, cache, idx, out=sparse_out, lse=sparse_lse,
                          workspace=sparse_workspace)
    monkeypatch.undo()
    assert np.array_equal(out.view(np.uint16), want_out.view(np.uint16))
    assert np.array_equal(lse, want_lse)


def test_bad_workspace_is_named():
    q, k, bt, sl = dense_numpy()
    with pytest.raises(TypeError, match="workspace"):
        openmla.dense_decode(q, k, bt, sl, workspace=np.zeros(16, np.float32))
    size = openmla.decode_workspace_size(q, 2, 1, 16)
    assert size >= 0
    if size > 0:
        with pytest.raises(ValueError, match="workspace: expected at least"):
            openmla.dense_decode(q, k, bt, sl, workspace=np.zeros(size - 1, np.uint8))


# --- checked mode -----------------------------------------------------------------------------

def test_checked_mode_names_the_value(monkeypatch):
    q, k, bt, sl = dense_numpy()
    capacity = bt.shape[1] * k.shape[1]
    for bad, match in ((np.array([capacity + 1, 3], np.int32), r"cache_seqlens\[0\]"),
                       (np.array([3, -2], np.int32), r"cache_seqlens\[1\]")):
        with pytest.raises(ValueError, match=match + ".*checked mode"):
            openmla.dense_decode(q, k, bt, bad, check_values=True)
        monkeypatch.setenv("OPENMLA_CHECK_VALUES", "1")
        with pytest.raises(ValueError, match=match + ".*checked mode"):
            openmla.dense_decode(q, k, bt, bad)
        monkeypatch.delenv("OPENMLA_CHECK_VALUES")
        with pytest.raises(ValueError, match=match):  # the CPU always checks (C++ validation)
            openmla.dense_decode(q, k, bt, bad)
    table = bt.copy()
    table[1, 1] = 99  # used: request 1 has 17 keys = 2 blocks of 16
    with pytest.raises(ValueError, match=r"block_table\[1, 1\]"):
        openmla.dense_decode(q, k, table, sl, check_values=True)
    table = bt.copy()
    table[1, 2] = 99  # unused entry: fine
    openmla.dense_decode(q, k, table, sl, check_values=True)
    q_s, cache, idx = sparse_numpy(s_q=1)
    with pytest.raises(ValueError, match=r"topk_length\[0\]"):
        openmla.sparse_decode(q_s, cache, idx, topk_length=np.array([21, 0], np.int32),
                              check_values=True)
    openmla.sparse_decode(q_s, cache, idx, topk_length=np.array([21, 0], np.int32))  # clamped
    with pytest.raises(ValueError, match=r"seqlens\[1\]"):
        openmla.plan_decode_schedule(np.array([4, -1], np.int32), 1, 16, check_values=True)


# --- torch: fullgraph, strides ----------------------------------------------------------------

def torch_dense(s_q=1):
    import torch

    q, k, bt, sl = dense_numpy(s_q)
    as_t = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    return as_t(q), as_t(k), torch.from_numpy(bt), torch.from_numpy(sl)


@needs_torch
def test_torch_lse_transpose_view():
    import torch

    q, k, bt, sl = torch_dense(s_q=2)
    out, lse = openmla.dense_decode(q, k, bt, sl)
    assert lse.stride() == (2 * 16, 1, 16)
    lse.transpose(1, 2).view(4, 16)  # raises for contiguous [b, h, s] strides
    qs, cache, idx = (torch.from_numpy(a) if a.dtype != BF16 else
                      torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
                      for a in sparse_numpy(s_q=3))
    out, lse = openmla.sparse_decode(qs, cache, idx)
    assert lse.shape == (2, 8, 3) and lse.stride() == (24, 1, 8)
    assert lse.transpose(1, 2).view(6, 8).shape == (6, 8)
    meta, _ = flash_mla.get_mla_metadata()
    _, lse2 = flash_mla.flash_mla_with_kvcache(qs, cache, None, None, 512, meta,
                                               is_fp8_kvcache=True, indices=idx)
    assert lse2.stride() == (24, 1, 8) and torch.equal(lse, lse2)


@needs_torch
def test_torch_compile_fullgraph_flash_mla_patterns():
    """get_mla_metadata() then flash_mla_with_kvcache (the meta made outside and inside the
    compiled function), and plan_decode_schedule without num_sm_parts, under fullgraph."""
    import torch

    q, k, bt, sl = torch_dense(s_q=2)

    def layers(q, k, bt, sl, meta):
        out1, lse1 = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
        out2, lse2 = flash_mla.flash_mla_with_kvcache(q * 2, k, bt, sl, 512, meta, causal=True)
        return out1, lse1.transpose(1, 2).reshape(-1, 16), out2, lse2

    def inside(q, k, bt, sl):
        meta, _ = flash_mla.get_mla_metadata()
        return layers(q, k, bt, sl, meta)

    def planned(q, k, bt, sl):
        schedule = openmla.plan_decode_schedule(sl, 2, 16)
        return openmla.dense_decode(q, k, bt, sl, causal=True, schedule=schedule)

    eager_meta, _ = flash_mla.get_mla_metadata()
    want = layers(q, k, bt, sl, eager_meta)
    meta, _ = flash_mla.get_mla_metadata()
    got = torch.compile(layers, backend="aot_eager", fullgraph=True)(q, k, bt, sl, meta)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    assert meta.have_initialized and isinstance(meta.tile_scheduler_metadata, torch.Tensor)
    got = torch.compile(inside, backend="aot_eager", fullgraph=True)(q, k, bt, sl)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    got = torch.compile(planned, backend="aot_eager", fullgraph=True)(q, k, bt, sl)
    for a, b in zip(planned(q, k, bt, sl), got):
        assert torch.equal(a, b)


@needs_torch
def test_torch_compile_with_workspace_and_check_values():
    import torch

    q, k, bt, sl = torch_dense()
    workspace = openmla.decode_workspace(q)

    def step(q, k, bt, sl, workspace):
        return openmla.dense_decode(q, k, bt, sl, workspace=workspace, check_values=True)

    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, bt, sl, workspace)
    want = openmla.dense_decode(q, k, bt, sl)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    bad = sl.clone()
    bad[0] = 1000
    with pytest.raises(Exception, match=r"cache_seqlens\[0\]"):
        torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, bt, bad, workspace)
