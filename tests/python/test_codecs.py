"""KV-cache formats through the Python package (numpy): quantize/dequantize against an
independent numpy codec, byte layouts, format inference, write/gather into paged caches."""

import numpy as np
import pytest

import openmla
import _reference as ref

QUANT_FORMATS = ["fp8_v32", "fp8_model1", "fp8_mx", "fp4"]


def random_rows(n, d_qk, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_qk)).astype(np.float32) * scale
    # groups of very different magnitudes exercise every scale
    x[:, :32] *= 50.0
    x[:, 64:96] *= 1e-3
    return x


def test_format_facts():
    assert openmla.KV_FORMATS == ("bf16", "fp16", "fp8_v32", "fp8_model1", "fp8_mx", "fp4")
    for fmt, (d_qk, _, group, rope, bpt) in ref.FORMATS.items():
        info = openmla.kv_format_info(fmt)
        assert (info["d_qk"], info["group_size"], info["rope_dims"], info["bytes_per_token"]) == \
            (d_qk, group, rope, bpt)
        assert openmla.infer_kv_format(bpt) == fmt
    assert openmla.kv_format_info("bf16", 512)["bytes_per_token"] == 1024
    assert openmla.infer_kv_format(1152) is None
    assert openmla.infer_kv_format(100) is None
    with pytest.raises(ValueError, match="kv_format"):
        openmla.kv_format_info("fp8_e4m3")


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("layout", ["interleaved", "default"])
def test_quantize_matches_reference(fmt, layout):
    d_qk = ref.FORMATS[fmt][0]
    x = random_rows(6, d_qk, seed=QUANT_FORMATS.index(fmt))
    data = openmla.quantize(x, fmt, layout=layout)
    assert data.dtype == np.uint8 and data.shape == (6, ref.FORMATS[fmt][4])
    expected = ref.quantize_rows(x, fmt)
    # the package's decoder, and an independent decoder of the token-interleaved bytes
    np.testing.assert_array_equal(openmla.dequantize(data, layout=layout), expected)
    np.testing.assert_array_equal(ref.decode_interleaved(data, fmt), expected)


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_quantize_bf16_input_and_output(fmt):
    d_qk = ref.FORMATS[fmt][0]
    x = ref.to_bf16(random_rows(3, d_qk, seed=3))
    data = openmla.quantize(x, fmt)
    expected = ref.quantize_rows(x.astype(np.float32), fmt)
    np.testing.assert_array_equal(openmla.dequantize(data), expected)
    y = openmla.dequantize(data, out_dtype="bf16")
    assert y.dtype == ref.BF16
    np.testing.assert_array_equal(y.astype(np.float64), ref.bf16_round(expected))


@pytest.mark.parametrize("fmt,d_qk", [("bf16", 576), ("bf16", 512), ("fp16", 576)])
def test_plain_formats(fmt, d_qk):
    x = random_rows(4, d_qk, seed=4, scale=0.1)
    data = openmla.quantize(x, fmt)
    assert data.shape == (4, 2 * d_qk)
    y = openmla.dequantize(data, fmt)
    cast = ref.bf16_round(x) if fmt == "bf16" else x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(y, cast)
    with pytest.raises(ValueError, match="cannot infer"):
        openmla.dequantize(data)  # 1152 bytes per token: name the format


def test_quantize_edge_values():
    x = np.zeros((3, 512), np.float32)
    x[1] = 1e-30          # below the minimum scale
    x[2, :16] = 1e6       # saturating group
    x[2, 16:32] = -6.0
    for fmt in ("fp8_mx", "fp4", "fp8_model1"):
        y = openmla.dequantize(openmla.quantize(x, fmt))
        assert np.all(np.isfinite(y))
        np.testing.assert_array_equal(y, ref.quantize_rows(x, fmt))
    assert openmla.quantize(np.zeros((0, 512), np.float32), "fp8_mx").shape == (0, 528)
    assert openmla.dequantize(np.zeros((0, 528), np.uint8)).shape == (0, 512)


def test_fp8_v32_token_bytes():
    x = np.zeros((1, 576), np.float32)
    x[0, :128] = 448.0  # scale 1 for group 0
    x[0, 128:256] = 1.0
    x[0, 512:] = 2.5
    row = openmla.quantize(x, "fp8_v32")[0]
    scales = row[512:528].view(np.float32)
    assert scales[0] == 1.0
    assert scales[1] == 2.0 ** np.ceil(np.log2(1.0 / 448.0))
    assert np.all(row[528:656].view(ref.BF16).astype(np.float32) == 2.5)
    assert row[:128].view(ref.E4M3).astype(np.float32).tolist() == [448.0] * 128


def test_layouts():
    d = openmla.kv_layout("fp8_model1", 64)
    assert d["block_stride"] % 576 == 0 and d["block_stride"] >= 64 * 584
    assert d["scale_offset"] == 64 * 576
    i = openmla.kv_layout("fp8_model1", 64, "interleaved")
    assert i["block_stride"] == 64 * 584 and i["data_stride"] == 584
    mx = openmla.kv_layout("fp8_mx", 64)
    assert mx["scale_offset"] == 64 * 512 and mx["block_stride"] == 64 * 528
    with pytest.raises(ValueError, match="layout"):
        openmla.kv_layout("fp8_mx", 64, "columnar")


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("layout", ["default", "interleaved"])
def test_write_gather_paged(fmt, layout):
    d_qk, bpt = ref.FORMATS[fmt][0], ref.FORMATS[fmt][4]
    num_blocks, page = 5, 16
    cache = openmla.new_kv_cache(num_blocks, page, fmt, layout=layout)
    assert cache.shape == (num_blocks, page, 1, bpt) and cache.dtype == np.uint8
    desc = openmla.describe_kv_cache(cache, kv_layout=layout)
    assert desc["format"] == fmt and desc["num_blocks"] == num_blocks
    assert desc["block_stride"] == openmla.kv_layout(fmt, page, layout)["block_stride"]

    x = random_rows(20, d_qk, seed=7)
    rng = np.random.default_rng(1)
    slots = rng.permutation(num_blocks * page)[:20].astype(np.int64)
    slots[3] = -1                         # skipped
    slots[5] = num_blocks * page + 7      # out of range: skipped
    openmla.kv_cache_write(x, slots, cache, kv_layout=layout)
    got = openmla.kv_cache_gather(cache, slots.astype(np.int32), kv_layout=layout)
    expected = ref.quantize_rows(x, fmt)
    expected[3] = 0.0
    expected[5] = 0.0
    np.testing.assert_array_equal(got, expected)
    # untouched slots stay zero
    others = np.setdiff1d(np.arange(num_blocks * page), slots)
    assert np.all(openmla.kv_cache_gather(cache, others.astype(np.int32), kv_layout=layout) == 0)


def test_strided_cache_view():
    """A cache may be a view of a larger buffer: the block stride comes from the array."""
    page, bpt = 8, 528
    big = np.zeros((4, page * bpt + 64), np.uint8)   # 64 spare bytes per block
    cache = big[:, :page * bpt].reshape(4, page, 1, bpt)
    assert openmla.describe_kv_cache(cache)["block_stride"] == page * bpt + 64
    x = random_rows(32, 512, seed=9)
    slots = np.arange(32, dtype=np.int32)
    openmla.kv_cache_write(x, slots, cache)
    assert np.all(big[:, page * bpt:] == 0)
    np.testing.assert_array_equal(openmla.kv_cache_gather(cache, slots),
                                  ref.quantize_rows(x, "fp8_mx"))
    # the same cache as [num_blocks, page, bytes] and as float8 bytes
    np.testing.assert_array_equal(openmla.kv_cache_gather(cache[:, :, 0, :], slots),
                                  ref.quantize_rows(x, "fp8_mx"))
    np.testing.assert_array_equal(openmla.kv_cache_gather(cache.view(ref.E4M3), slots),
                                  ref.quantize_rows(x, "fp8_mx"))


def test_bf16_cache_write_gather():
    cache = openmla.new_kv_cache(2, 4, "bf16", d_qk=576)
    assert cache.dtype == ref.BF16 and cache.shape == (2, 4, 1, 576)
    x = random_rows(8, 576, seed=2)
    openmla.kv_cache_write(x, np.arange(8, dtype=np.int32), cache)
    np.testing.assert_array_equal(cache.reshape(8, 576).astype(np.float32), ref.bf16_round(x))
    np.testing.assert_array_equal(openmla.kv_cache_gather(cache, np.arange(8, dtype=np.int32)),
                                  ref.bf16_round(x))


def test_explicit_format_mismatch():
    cache = np.zeros((2, 4, 1, 528), np.uint8)
    with pytest.raises(ValueError, match="bytes per token"):
        openmla.describe_kv_cache(cache, kv_format="fp8_model1")
    with pytest.raises(ValueError, match="cannot infer"):
        openmla.describe_kv_cache(np.zeros((2, 4, 1, 600), np.uint8))
    with pytest.raises(ValueError, match="kv head"):
        openmla.describe_kv_cache(np.zeros((2, 4, 2, 528), np.uint8))
    with pytest.raises(ValueError, match="packed"):
        openmla.describe_kv_cache(np.zeros((2, 8, 1, 1056), np.uint8)[:, :, :, :528])


def test_kv_cache_convert():
    if not hasattr(openmla._C, "kv_cache_convert"):
        pytest.skip("this build has no kv_cache_convert")
    page = 8
    src = openmla.new_kv_cache(3, page, "fp8_v32")
    x = random_rows(3 * page, 576, seed=11)
    slots = np.arange(3 * page, dtype=np.int32)
    openmla.kv_cache_write(x, slots, src)
    # fp8_v32 → bf16: the dequantised values, rounded to bf16
    dst = openmla.new_kv_cache(3, page, "bf16", d_qk=576)
    openmla.kv_cache_convert(src, dst)
    np.testing.assert_array_equal(openmla.kv_cache_gather(dst, slots),
                                  ref.bf16_round(ref.quantize_rows(x, "fp8_v32")))
    # fp8_mx default → interleaved, moving blocks (block 2 → 0, block 0 → 1)
    mx = openmla.new_kv_cache(3, page, "fp8_mx")
    openmla.kv_cache_write(random_rows(3 * page, 512, seed=12), slots, mx)
    inter = openmla.new_kv_cache(2, page, "fp8_mx", layout="interleaved")
    openmla.kv_cache_convert(mx, inter, dst_layout="interleaved",
                             src_blocks=np.array([2, 0], np.int32),
                             dst_blocks=np.array([0, 1], np.int32))
    got = openmla.kv_cache_gather(inter, np.arange(2 * page, dtype=np.int32),
                                  kv_layout="interleaved")
    want = openmla.kv_cache_gather(mx, np.r_[np.arange(2 * page, 3 * page),
                                             np.arange(page)].astype(np.int32))
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="kv_cache_convert"):
        openmla.kv_cache_convert(src, openmla.new_kv_cache(3, 4, "fp8_v32"))
