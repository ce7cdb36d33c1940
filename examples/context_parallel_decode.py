#!/usr/bin/env python3
"""Context-parallel MLA decode: one sequence's paged KV cache sharded over GPUs.

Each rank holds a contiguous shard of every request's tokens (its own paged bf16 cache and block
table), runs OpenMLA dense decode on its shard, all-gathers (out, lse) through torch.distributed
(NCCL), and merges the partial states with `openmla.merge_attention_states`. The result is
compared with a single-GPU decode over the whole cache.

  torchrun --nproc-per-node 2 examples/context_parallel_decode.py          # N GPUs, NCCL
  torchrun --nproc-per-node 2 examples/context_parallel_decode.py --device cpu   # CPU, gloo
  python examples/context_parallel_decode.py --simulate 4                  # 1 GPU, shards in turn
  python examples/context_parallel_decode.py --simulate 4 --device cpu     # CPU backend

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its torch/NVSHMEM twins) as the machines it
runs on require.
"""
import argparse
import os
import statistics
import sys

# Forced, not defaulted: on the shared machines a multicast user can take the host's GPUs out of
# service, so an inherited setting must not turn it back on (the all-gather is small anyway).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402

import openmla  # noqa: E402


def make_problem(args, device):
    """q and the whole cache (tokens in order), identical on every rank (seeded)."""
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    b, s_q, h_q, d = args.batch, args.s_q, args.heads, 576
    q = torch.randn(b, s_q, h_q, d, generator=g).to(torch.bfloat16)
    kv = torch.randn(b, args.seqlen, d, generator=g).to(torch.bfloat16)  # [b, L, d] per request
    return q.to(device), kv.to(device)


def paged(kv_tokens, page_size, shuffle_seed):
    """Packs [b, L_shard, d] tokens into a paged cache with a shuffled block table; the unused
    tail of the last page is NaN, so a kernel that reads past a sequence's end shows it."""
    b, length, d = kv_tokens.shape
    blocks_per_req = max(1, -(-length // page_size))
    pages = torch.full((b, blocks_per_req * page_size, d), float("nan"), dtype=kv_tokens.dtype,
                       device=kv_tokens.device)
    pages[:, :length] = kv_tokens
    perm = torch.randperm(b * blocks_per_req, generator=torch.Generator().manual_seed(shuffle_seed))
    table = perm.view(b, blocks_per_req).to(torch.int32).to(kv_tokens.device)
    cache = torch.empty((b * blocks_per_req, page_size, 1, d), dtype=kv_tokens.dtype,
                        device=kv_tokens.device)
    cache[table.view(-1).long()] = pages.view(b * blocks_per_req, page_size, 1, d)
    seqlens = torch.full((b,), length, dtype=torch.int32, device=kv_tokens.device)
    return cache, table, seqlens


def shard_bounds(length, world, rank):
    step = -(-length // world)
    return min(rank * step, length), min((rank + 1) * step, length)


def decode(q, cache, table, seqlens):
    return openmla.dense_decode(q, cache, table, seqlens)  # (out [b,s_q,h,512], lse [b,h,s_q])


def merge(outs, lses):
    """outs [N, b, s_q, h, d_v], lses [N, b, h, s_q] → (out [b, s_q, h, d_v], lse [b, h, s_q])."""
    n, b, s_q, h, d_v = outs.shape
    part_out = outs.reshape(n, b * s_q, h, d_v)
    part_lse = lses.transpose(2, 3).reshape(n, b * s_q, h)
    out, lse = openmla.merge_attention_states(part_out, part_lse, out_dtype="bf16")
    return out.view(b, s_q, h, d_v), lse.view(b, s_q, h).transpose(1, 2)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            import time
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            import time
            self.ms = (time.perf_counter() - self.t0) * 1e3


def graph_ms(fn, iters):
    """Median ms of one replay of `fn` captured in a CUDA graph: device time without Python's
    per-call overhead, as an engine that captures its decode steps sees it. (ms, None), or
    (None, why) when the capture fails; the eager figures stand either way."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up outside the capture (allocator pools, one-time attributes)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog thread's event queries must not void the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            fn()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times), None
    except Exception as error:  # noqa: BLE001 - reported next to the eager figures
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def check(out, lse, ref_out, ref_lse, label):
    err, lse_err = rel_err(out, ref_out), (lse - ref_lse).abs().max().item()
    ok = err < 1e-2 and lse_err < 1e-3
    print(f"{label}: rel err out {err:.2e}, max |lse err| {lse_err:.2e} -> {'OK' if ok else 'FAIL'}")
    return ok


def run_simulated(args):
    device = torch.device(args.device)
    q, kv = make_problem(args, device)
    full = paged(kv, args.page_size, 0)
    ref_out, ref_lse = decode(q, *full)
    shards = [paged(kv[:, lo:hi], args.page_size, r + 1)
              for r, (lo, hi) in enumerate(shard_bounds(args.seqlen, args.simulate, r)
                                          for r in range(args.simulate))]
    step_ms, merge_ms = [], []
    for _ in range(args.iters):
        with Timer(device) as t_step:
            parts = [decode(q, *s) for s in shards]
            outs = torch.stack([p[0] for p in parts])
            lses = torch.stack([p[1] for p in parts])
            with Timer(device) as t_merge:
                out, lse = merge(outs, lses)
        step_ms.append(t_step.ms)
        merge_ms.append(t_merge.ms)
    print(f"simulated {args.simulate} shards on {device}: b={args.batch} s_q={args.s_q} "
          f"h_q={args.heads} seqlen={args.seqlen}: step {statistics.median(step_ms):.3f} ms "
          f"(median of {args.iters}), merge {statistics.median(merge_ms):.3f} ms "
          f"({100 * statistics.median(merge_ms) / statistics.median(step_ms):.1f}% of the step)")
    ok = check(out, lse, ref_out, ref_lse, "sharded vs single decode")
    if device.type == "cuda":  # after the check: a failed capture cannot touch its result
        def step():
            parts = [decode(q, *s) for s in shards]
            return merge(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
        step_g, why = graph_ms(step, args.iters)
        merge_g, why_merge = graph_ms(lambda: merge(outs, lses), args.iters)
        if step_g is not None and merge_g is not None:
            print(f"CUDA graph (device time): step {step_g:.3f} ms, merge {merge_g:.3f} ms "
                  f"({100 * merge_g / step_g:.1f}% of the step), median of {args.iters} replays")
        else:
            print(f"CUDA graph timing unavailable: {why or why_merge}")
    return ok


def run_distributed(args):
    import torch.distributed as dist

    device = torch.device(args.device)
    if device.type == "cuda":
        # The rank's GPU first: NCCL's communicator (and a barrier before any collective) then
        # use it, never GPU 0 for every rank.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    q, kv = make_problem(args, device)
    lo, hi = shard_bounds(args.seqlen, world, rank)
    shard = paged(kv[:, lo:hi], args.page_size, rank + 1)
    step_ms, gather_ms, merge_ms = [], [], []
    for _ in range(args.iters):
        dist.barrier()
        with Timer(device) as t_step:
            out_r, lse_r = decode(q, *shard)
            # The ranks' parts concatenated along dim 0 (the layout every backend's
            # all_gather_into_tensor takes; gloo checks it), then viewed as [world, ...].
            outs = torch.empty((world * out_r.shape[0],) + tuple(out_r.shape[1:]),
                               dtype=out_r.dtype, device=device)
            lses = torch.empty((world * lse_r.shape[0],) + tuple(lse_r.shape[1:]),
                               dtype=lse_r.dtype, device=device)
            with Timer(device) as t_gather:
                dist.all_gather_into_tensor(outs, out_r.contiguous())
                dist.all_gather_into_tensor(lses, lse_r.contiguous())
            outs = outs.view((world,) + tuple(out_r.shape))
            lses = lses.view((world,) + tuple(lse_r.shape))
            with Timer(device) as t_merge:
                out, lse = merge(outs, lses)
        step_ms.append(t_step.ms)
        gather_ms.append(t_gather.ms)
        merge_ms.append(t_merge.ms)
    ok = True
    if rank == 0:
        ref_out, ref_lse = decode(q, *paged(kv, args.page_size, 0))
        med = statistics.median
        print(f"{world} ranks ({dist.get_backend().upper()}): b={args.batch} s_q={args.s_q} h_q={args.heads} "
              f"seqlen={args.seqlen} ({hi - lo} tokens per rank): step {med(step_ms):.3f} ms, "
              f"all-gather {med(gather_ms):.3f} ms, merge {med(merge_ms):.3f} ms "
              f"({100 * med(merge_ms) / med(step_ms):.1f}% of the step), median of {args.iters}")
        ok = check(out, lse, ref_out, ref_lse, "context-parallel vs one-device decode")
    flag = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if device.type != "cuda":
        dist.destroy_process_group()
        return bool(flag.item())
    # Each rank's decode and the merge in CUDA graphs (no collective inside a graph: a capture
    # failing on one rank cannot leave another waiting in it), after the check.
    decode_g, why = graph_ms(lambda: decode(q, *shard), args.iters)
    merge_g, why_merge = graph_ms(lambda: merge(outs, lses), args.iters)
    if rank == 0:
        if decode_g is not None and merge_g is not None:
            gather = statistics.median(gather_ms)
            print(f"CUDA graph (device time, rank 0): decode {decode_g:.3f} ms, merge "
                  f"{merge_g:.3f} ms; with the eager all-gather ({gather:.3f} ms) the merge is "
                  f"{100 * merge_g / (decode_g + gather + merge_g):.1f}% of the step")
        else:
            print(f"CUDA graph timing unavailable: {why or why_merge}")
    dist.destroy_process_group()
    return bool(flag.item())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulate", type=int, default=0, help="run N shards in turn in one process")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--s-q", dest="s_q", type=int, default=1)
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.simulate:
        return run_simulated(args)
    if "WORLD_SIZE" not in os.environ:
        p.error("run under torchrun for the distributed mode, or pass --simulate N")
    return run_distributed(args)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
