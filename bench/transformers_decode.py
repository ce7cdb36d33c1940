#!/usr/bin/env python3
"""Decode tokens/s of a mid-size random DeepSeek-V3 (or V3.2) model in transformers: its eager and
sdpa attention against OpenMLA's (openmla.integrations.transformers), in one run on one device.

  python3 bench/transformers_decode.py [--kind v3|v32] [--batch 8] [--prompt 1024] [--steps 64]
  python3 bench/transformers_decode.py --smoke      # a tiny config on the CPU: that it runs

Every variant decodes the same greedy continuation of the same random prompt (teacher-forced
after the prompt so all do the same work); time is wall time of the decode steps only (the
prefill excluded), after a warm-up step, with torch.cuda.synchronize() around it.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import time

import torch

import openmla.integrations.transformers as omla_tf


def make_model(kind: str, attn: str, smoke: bool, device: str, dtype):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    common = dict(
        vocab_size=1024 if smoke else 32000, hidden_size=128 if smoke else 2048,
        intermediate_size=192 if smoke else 4096, moe_intermediate_size=32 if smoke else 512,
        num_hidden_layers=2 if smoke else 4, num_attention_heads=16 if smoke else 128,
        num_key_value_heads=16 if smoke else 128, n_shared_experts=1,
        n_routed_experts=4 if smoke else 8, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=96 if smoke else 1536,
        qk_rope_head_dim=64, qk_nope_head_dim=32 if smoke else 128, v_head_dim=32 if smoke else 128,
        max_position_embeddings=8192, eos_token_id=None, pad_token_id=0, bos_token_id=None,
        tie_word_embeddings=False)
    if kind == "v3":
        config = DeepseekV3Config(**common)
        cls = DeepseekV3ForCausalLM
    else:
        from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
        config = DeepseekV32Config(**common, index_topk=2048, index_head_dim=64, index_n_heads=4)
        cls = DeepseekV32ForCausalLM
    config._attn_implementation = attn
    torch.manual_seed(0)
    return cls(config).eval().to(device=device, dtype=dtype)


def decode_tokens_per_s(model, ids, prompt: int, steps: int, cache=None) -> float:
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    # transformers 5.x names the cache argument `cache` (`past_key_values` before).
    arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        kwargs = {"use_cache": True}
        if cache is not None:
            kwargs[arg] = cache
        out = model(ids[:, :prompt], **kwargs)
        past = out.past_key_values
        out = model(ids[:, prompt:prompt + 1], use_cache=True, **{arg: past})  # warm-up
        past = out.past_key_values
        sync()
        start = time.perf_counter()
        for t in range(prompt + 1, prompt + 1 + steps):
            out = model(ids[:, t:t + 1], use_cache=True, **{arg: past})
            past = out.past_key_values
        sync()
        elapsed = time.perf_counter() - start
    return ids.shape[0] * steps / elapsed


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["v3", "v32"], default="v3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        device, dtype, args.batch, args.prompt, args.steps = "cpu", torch.float32, 2, 16, 4
    else:
        device, dtype = "cuda", torch.bfloat16
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    gen = torch.Generator().manual_seed(1)
    ids = None
    rows = []
    for variant in ("eager", "sdpa", "openmla"):
        model = make_model(args.kind, "eager" if variant == "openmla" else variant, args.smoke,
                           device, dtype)
        if ids is None:
            ids = torch.randint(1, model.config.vocab_size, (args.batch, args.prompt + args.steps + 1),
                                generator=gen).to(device)
        cache = None
        if variant == "openmla":
            omla_tf.enable(model)
            cache = omla_tf.OpenMLACache(model)
        try:
            rate = decode_tokens_per_s(model, ids, args.prompt, args.steps, cache)
            rows.append((variant, f"{rate:.1f}"))
        except Exception as error:  # an attention implementation transformers lacks, say
            rows.append((variant, f"failed: {type(error).__name__}: {error}"[:120]))
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"transformers {args.kind} decode, {name}, batch {args.batch}, prompt {args.prompt}, "
          f"{args.steps} steps: decode tokens/s")
    print("| attention | tokens/s |")
    print("|---|---|")
    for variant, rate in rows:
        print(f"| {variant} | {rate} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
