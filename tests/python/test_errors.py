"""Bad input raises before anything runs: TypeError for a wrong dtype, ValueError for a wrong
shape / device / format, NotImplementedError where no kernel exists, each naming the argument;
and nothing brings the interpreter down."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import openmla
import openmla.flash_mla as flash_mla
import _reference as ref

BF16 = ref.BF16


def dense_args(**override):
    args = dict(
        q=np.zeros((2, 1, 16, 576), BF16),
        k_cache=np.zeros((4, 16, 1, 576), BF16),
        block_table=np.zeros((2, 2), np.int32),
        cache_seqlens=np.array([3, 20], np.int32),
    )
    args.update(override)
    return args


def call_dense_scale(scale):
    a = dense_args()
    return openmla.dense_decode(*a.values(), softmax_scale=scale)


def call_dense(**override):
    a = dense_args(**override)
    return openmla.dense_decode(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"])


@pytest.mark.parametrize("arg,value,match", [
    ("q", np.zeros((2, 1, 16, 576), np.float32), "q: expected dtype bf16 or fp16, got fp32"),
    ("k_cache", np.zeros((4, 16, 1, 576), np.float16), "k_cache: expected dtype bf16"),
    ("block_table", np.zeros((2, 2), np.int64), "block_table: expected dtype int32"),
    ("cache_seqlens", np.array([3, 20], np.uint8), "cache_seqlens: expected dtype int32"),
    ("q", [[1.0]], "q: expected an array"),
    ("cache_seqlens", None, "cache_seqlens: required"),
])
def test_dense_decode_type_errors(arg, value, match):
    with pytest.raises(TypeError, match=match):
        call_dense(**{arg: value})


@pytest.mark.parametrize("arg,value,match", [
    ("q", np.zeros((2, 16, 576), BF16), "q: expected 4 dimensions"),
    ("q", np.zeros((2, 1, 16, 320), BF16), "q: expected head dim 576 or 512"),
    ("k_cache", np.zeros((4, 16, 1, 512), BF16), "k_cache"),
    ("k_cache", np.zeros((4, 16, 3, 576), BF16), "k_cache: expected h_kv"),
    ("block_table", np.zeros((3, 2), np.int32), "block_table"),
    ("cache_seqlens", np.array([3, 40], np.int32), r"cache_seqlens\[1\]"),
    ("block_table", np.full((2, 2), 9, np.int32), r"block_table\[0, 0\]"),
    ("cache_seqlens", np.array([3, -1], np.int32), r"cache_seqlens\[1\]"),
    ("q", np.zeros((2, 1, 16, 1152), BF16)[..., ::2], "q: the last dimension must be contiguous"),
])
def test_dense_decode_value_errors(arg, value, match):
    with pytest.raises(ValueError, match=match):
        call_dense(**{arg: value})


def test_output_errors():
    a = dense_args()
    with pytest.raises(ValueError, match="out: expected shape"):
        openmla.dense_decode(*a.values(), out=np.zeros((2, 1, 16, 576), BF16))
    with pytest.raises(TypeError, match="lse: expected dtype fp32"):
        openmla.dense_decode(*a.values(), lse=np.zeros((2, 16, 1), np.float64))
    ro = np.zeros((2, 1, 16, 512), BF16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        openmla.dense_decode(*a.values(), out=ro)
    with pytest.raises(ValueError, match="d_v: expected 512"):
        openmla.dense_decode(*a.values(), d_v=256)


def test_sparse_decode_errors():
    q = np.zeros((2, 1, 8, 512), BF16)
    cache = np.zeros((4, 16, 1, 528), np.uint8)
    idx = np.zeros((2, 1, 8), np.int32)
    with pytest.raises(TypeError, match="q: expected dtype bf16, got fp16"):
        openmla.sparse_decode(q.astype(np.float16), cache, idx)
    with pytest.raises(TypeError, match="k_cache: expected dtype"):
        openmla.sparse_decode(q, cache.astype(np.float32), idx)
    with pytest.raises(TypeError, match="indices: expected dtype int32, got int64"):
        openmla.sparse_decode(q, cache, idx.astype(np.int64))
    with pytest.raises(TypeError, match="attn_sink: expected dtype fp32"):
        openmla.sparse_decode(q, cache, idx, attn_sink=np.zeros(8, BF16))
    with pytest.raises(ValueError, match="k_cache: format fp8_v32 holds d_qk 576"):
        openmla.sparse_decode(q, np.zeros((4, 16, 1, 656), np.uint8), idx)
    with pytest.raises(ValueError, match="cannot infer the KV format from 600"):
        openmla.sparse_decode(q, np.zeros((4, 16, 1, 600), np.uint8), idx)
    with pytest.raises(ValueError, match="kv_format: unknown KV format"):
        openmla.sparse_decode(q, cache, idx, kv_format="e4m3")
    with pytest.raises(ValueError, match="unknown KV layout"):
        openmla.sparse_decode(q, cache, idx, kv_layout="paged")
    with pytest.raises(ValueError, match="indices: expected size 1 in dim 1"):
        openmla.sparse_decode(q, cache, np.zeros((2, 2, 8), np.int32))
    with pytest.raises(ValueError, match="attn_sink: expected size 8"):
        openmla.sparse_decode(q, cache, idx, attn_sink=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="extra_indices: required"):
        openmla.sparse_decode(q, cache, idx, extra_k_cache=np.zeros((2, 16, 1, 288), np.uint8))
    with pytest.raises(ValueError, match="extra_indices: given without extra_k_cache"):
        openmla.sparse_decode(q, cache, idx, extra_indices=idx)
    with pytest.raises(ValueError, match="topk_length: expected size 2"):
        openmla.sparse_decode(q, cache, idx, topk_length=np.zeros(3, np.int32))


def test_other_op_errors():
    with pytest.raises(TypeError, match="kv: expected dtype bf16 or fp32, got fp64"):
        openmla.kv_cache_write(np.zeros((2, 512)), np.zeros(2, np.int32),
                               np.zeros((1, 4, 1, 528), np.uint8))
    with pytest.raises(ValueError, match="kv: expected 512 dims per token"):
        openmla.kv_cache_write(np.zeros((2, 576), np.float32), np.zeros(2, np.int32),
                               np.zeros((1, 4, 1, 528), np.uint8))
    with pytest.raises(ValueError, match="slot_mapping: expected size 2"):
        openmla.kv_cache_write(np.zeros((2, 512), np.float32), np.zeros(3, np.int32),
                               np.zeros((1, 4, 1, 528), np.uint8))
    ro = np.zeros((1, 4, 1, 528), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        openmla.kv_cache_write(np.zeros((2, 512), np.float32), np.zeros(2, np.int32), ro)
    with pytest.raises(TypeError, match="slots: expected dtype int32 or int64"):
        openmla.kv_cache_gather(np.zeros((1, 4, 1, 528), np.uint8), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="part_lse: expected size 2 in dim 0"):
        openmla.merge_attention_states(np.zeros((2, 1, 1, 8), np.float32),
                                       np.zeros((3, 1, 1), np.float32))
    with pytest.raises(TypeError, match="out_dtype"):
        openmla.merge_attention_states(np.zeros((2, 1, 1, 8), np.float32),
                                       np.zeros((2, 1, 1), np.float32), out_dtype="int32")
    with pytest.raises(ValueError, match="kv: expected h_kv"):
        openmla.sparse_prefill(np.zeros((2, 8, 512), BF16), np.zeros((4, 3, 512), BF16),
                               np.zeros((2, 3, 4), np.int32))
    with pytest.raises(ValueError, match="x: format fp8_v32 holds 576 dims"):
        openmla.quantize(np.zeros((2, 512), np.float32), "fp8_v32")
    with pytest.raises(TypeError, match="data: expected dtype"):
        openmla.dequantize(np.zeros((2, 528), np.float32))
    with pytest.raises(ValueError, match="seqlens"):
        openmla.plan_decode_schedule(np.array([-4], np.int32), 1, 16)
    with pytest.raises(TypeError, match="x: expected an array"):
        openmla.quantize(memoryview(np.zeros((2, 512), np.float32)), "fp8_mx")
    with pytest.raises(ValueError, match="softmax_scale"):
        call_dense_scale(float("nan"))
    with pytest.raises(ValueError, match="softmax_scale"):
        call_dense_scale(-1.0)


def test_cpp_status_mapping():
    """The extension raises by Status kind (here: InvalidArgument → ValueError), message kept."""
    from openmla import _C
    with pytest.raises(ValueError, match="^kv_cache_gather: out: expected 512 dims"):
        _C.kv_cache_gather(np.zeros((1, 4, 1, 528), np.uint8), np.zeros(2, np.int32),
                           np.zeros((2, 511), np.float32))
    with pytest.raises(TypeError, match="unsupported dtype float64"):
        _C.merge_attention_states(np.zeros((2, 1, 1, 8)), np.zeros((2, 1, 1), np.float32),
                                  np.zeros((1, 1, 8), np.float32))
    with pytest.raises(ValueError, match="at most 5 dimensions"):
        _C.kv_cache_gather(np.zeros((1, 4, 1, 528), np.uint8), np.zeros((1,) * 6, np.int32),
                           np.zeros((1, 512), np.float32))
    with pytest.raises(ValueError, match="negative strides"):
        _C.kv_cache_gather(np.zeros((1, 4, 1, 528), np.uint8), np.zeros(2, np.int32),
                           np.zeros((2, 512), np.float32)[::-1])
    if not openmla.cuda_backend_available():
        with pytest.raises(RuntimeError, match="no CUDA backend"):
            _C.cuda_device_arch(0)


def test_flash_mla_argument_errors():
    a = dense_args()
    with pytest.raises(TypeError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"],
                                         a["cache_seqlens"], 512, object())
    with pytest.raises(ValueError, match="attn_sink: only for sparse"):
        flash_mla.flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"],
                                         a["cache_seqlens"], 512, None,
                                         attn_sink=np.zeros(16, np.float32))
    with pytest.raises(ValueError, match="block_table and cache_seqlens"):
        flash_mla.flash_mla_with_kvcache(a["q"], a["k_cache"], None, None, 512, None)
    with pytest.raises(ValueError, match="is_fp8_kvcache"):
        flash_mla.flash_mla_with_kvcache(np.zeros((2, 1, 16, 576), BF16), a["k_cache"], None,
                                         None, 512, None, is_fp8_kvcache=True,
                                         indices=np.zeros((2, 1, 4), np.int32))


def test_interpreter_survives_bad_input():
    """Many malformed calls in a fresh interpreter: each raises, none crashes the process."""
    script = textwrap.dedent("""
        import numpy as np, ml_dtypes, openmla
        from openmla import _C
        bf = ml_dtypes.bfloat16
        q = np.zeros((2, 1, 16, 576), bf)
        k = np.zeros((4, 16, 1, 576), bf)
        bt = np.zeros((2, 2), np.int32)
        sl = np.array([3, 20], np.int32)
        calls = [
            lambda: openmla.dense_decode(q, k, np.full((2, 2), 2**31 - 1, np.int32), sl),
            lambda: openmla.dense_decode(q, k, np.full((2, 2), -7, np.int32), sl),
            lambda: openmla.dense_decode(q, k, bt, np.array([2**31 - 1, 0], np.int32)),
            lambda: openmla.dense_decode(q, k, bt[:, :0], sl),
            lambda: openmla.dense_decode(q, k[:0], bt, sl),
            lambda: openmla.dense_decode(q[:0], k, bt, sl),  # (a batch of 0 is valid)
            lambda: openmla.dense_decode(q, k, bt, sl, softmax_scale=float("nan")),
            lambda: _C.dense_decode(q.view(np.uint16), k, bt, sl, q, sl),
            lambda: _C.dense_decode(None, None, None, None, None, None),
            lambda: _C.sparse_decode(q, np.zeros((0, 0, 0), np.uint8), bt, q, sl),
            lambda: _C.sparse_decode(q, np.zeros((4, 0, 1, 656), np.uint8), bt, q, sl),
            lambda: _C.kv_cache_write(np.zeros((2, 512), np.float32), np.array([0, 1], np.int32),
                                      np.zeros((1, 1, 1, 584), np.uint8), cache_format="fp8_mx"),
            lambda: _C.kv_cache_gather(np.zeros((1, 4, 1, 1056), np.uint8)[..., ::2],
                                       np.zeros(1, np.int32), np.zeros((1, 512), np.float32)),
            lambda: _C.merge_attention_states(np.zeros((0, 1, 1, 8), np.float32),
                                              np.zeros((0, 1, 1), np.float32),
                                              np.zeros((1, 1, 8), np.float32)),
            lambda: _C.plan_decode_schedule(sl, np.zeros((0, 8), np.int32), np.zeros(3, np.int32),
                                            1, 16),
            lambda: _C.plan_decode_schedule(sl, np.zeros((2, 8), np.int32), np.zeros(3, np.int32),
                                            1, 16, block_tokens=0),
            lambda: _C.reinterpret(np.zeros(3, np.float32), "bf16"),
            lambda: _C.reinterpret(3, "bf16"),
            lambda: _C.kv_layout("fp8_mx", 0),
            lambda: _C.decode_num_sm_parts("tpu", 0, 1, 16),
            lambda: _C.dense_decode_workspace_size("cpu", 0, -1, 1, 16),
            lambda: _C.sparse_prefill_cache_workspace_size(np.zeros((2, 4, 1, 584), np.uint8), 4,
                                                           8, -1),
            lambda: _C.sparse_prefill_cache_workspace_size(np.zeros(3, np.float32), 4, 8, 16),
            lambda: _C.sparse_prefill_cache_workspace_size(np.zeros((2, 4, 1, 600), np.uint8), 4,
                                                           8, 16),
        ]
        raised = 0
        for number, call in enumerate(calls):
            try:
                call()
                print("no error from call", number)
            except (TypeError, ValueError, RuntimeError, NotImplementedError):
                raised += 1
        # out-of-range indices and slots are semantics (ignored), not errors
        openmla.sparse_decode(np.zeros((1, 1, 8, 512), bf), np.zeros((2, 4, 1, 528), np.uint8),
                              np.array([[[-2**31, 2**31 - 1, 8, 7]]], np.int32))
        openmla.kv_cache_write(np.ones((3, 512), np.float32), np.array([-1, 2**40, 9], np.int64),
                               np.zeros((2, 4, 1, 528), np.uint8))
        print("raised", raised, "of", len(calls))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1].split()
    assert last[0] == "raised" and last[1] == last[3], result.stdout
