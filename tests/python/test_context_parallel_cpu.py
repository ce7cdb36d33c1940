"""Context-parallel decode on the CPU backend: one sequence's KV sharded, each shard decoded on its
own, the partial (out, lse) merged with merge_attention_states, equals decode over the whole cache.
The GPU/NCCL version is examples/context_parallel_decode.py."""
import numpy as np
import pytest

import openmla


def paged(tokens, page_size, rng):
    """[b, L, d] tokens → (cache [blocks, page, 1, d] with NaN in unused slots, table, seqlens)."""
    b, length, d = tokens.shape
    blocks_per_req = max(1, -(-length // page_size))
    pages = np.full((b, blocks_per_req * page_size, d), np.nan, dtype=tokens.dtype)
    pages[:, :length] = tokens
    table = rng.permutation(b * blocks_per_req).astype(np.int32).reshape(b, blocks_per_req)
    cache = np.empty((b * blocks_per_req, page_size, 1, d), dtype=tokens.dtype)
    cache[table.reshape(-1)] = pages.reshape(b * blocks_per_req, page_size, 1, d)
    return cache, table, np.full((b,), length, dtype=np.int32)


def shard_bounds(length, world):
    step = -(-length // world)
    return [(min(r * step, length), min((r + 1) * step, length)) for r in range(world)]


@pytest.mark.parametrize("world,length,s_q,page_size", [(2, 300, 1, 64), (4, 257, 2, 16),
                                                       (5, 3, 1, 1)])
def test_sharded_decode_merges_to_full_decode(world, length, s_q, page_size):
    rng = np.random.default_rng(world * 1000 + length)
    b, h_q, d, d_v = 2, 16, 576, 512
    q = rng.standard_normal((b, s_q, h_q, d)).astype(np.float16)
    kv = rng.standard_normal((b, length, d)).astype(np.float16)
    ref_out, ref_lse = openmla.dense_decode(q, *paged(kv, page_size, rng))

    # (5, 3, ...) leaves two shards empty: their lonely queries (lse = +inf) must merge as nothing.
    parts = [openmla.dense_decode(q, *paged(kv[:, lo:hi], page_size, rng))
             for lo, hi in shard_bounds(length, world)]
    outs = np.stack([p[0] for p in parts]).astype(np.float32)  # [N, b, s_q, h, d_v]
    lses = np.stack([p[1] for p in parts])                       # [N, b, h, s_q]
    if world > length:
        assert np.isposinf(lses[-1]).all() and (outs[-1] == 0).all()
    part_out = outs.reshape(world, b * s_q, h_q, d_v)
    part_lse = np.ascontiguousarray(lses.transpose(0, 1, 3, 2)).reshape(world, b * s_q, h_q)
    out, lse = openmla.merge_attention_states(part_out, part_lse)

    ref = ref_out.astype(np.float32).reshape(b * s_q, h_q, d_v)
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel < 1e-2, rel
    ref_lse_rows = ref_lse.transpose(0, 2, 1).reshape(b * s_q, h_q)
    assert np.abs(lse - ref_lse_rows).max() < 1e-3


def test_all_shards_empty_gives_lonely_query():
    part_out = np.zeros((3, 2, 4, 512), dtype=np.float32)
    part_lse = np.full((3, 2, 4), np.inf, dtype=np.float32)
    out, lse = openmla.merge_attention_states(part_out, part_lse)
    assert (out == 0).all() and np.isposinf(lse).all()
