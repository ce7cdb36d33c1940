"""transformers' DeepSeek-V3, V3.2 and V4 attention served by OpenMLA, checked logit for logit.

Tiny random models (2 layers, the real latent and RoPE widths 512 and 64, 16 or 128 heads; V4: 3
layers, one each of sliding-window, CSA and HCA attention, head_dim 512 with 64 RoPE dims) in
float32, run by transformers' eager attention (the reference) and by
`openmla.integrations.transformers` (MLA's absorbed form over OpenMLA's paged cache, CPU backend),
prefill then 32 teacher-forced decode steps.

Tolerances: the reference is eager attention run on the *dequantised* cache (the same latents,
rounded through the same KV format: bf16 for V3, fp8_v32 or bf16 for V3.2, fp8_model1, fp8_mx +
fp4 or bf16 for V4), so what remains is OpenMLA's own rounding: the query and the attention
output pass through bf16 (the operations take and return bf16), ~2^-9 relative each. The checks,
relative to max |reference logit|: bf16 caches max |Δlogit| <= 1.2%, mean <= 0.15%; fp8_v32 max
<= 2%, mean <= 0.3%; V4 fp8_model1 3%, 0.45%; V4.1 formats 5%, 0.75% (see REL_MAX below for what
is seen). The float32 model without any cache rounding: <= 1.5%, 0.2%. docs/transformers.md
explains them.

V3.2's (and V4's CSA) indexer picks its top-k from hidden states that carry that rounding from
the layers before, so on a near-tie at the k-th score the two runs can pick different keys. The
reference therefore attends the keys OpenMLA's run picked (its own indexer still runs, and its
picks are compared: equal in V3.2's first layer, whose input is the embedding, and for >= 90% of
the queries after it).
"""

import math

import pytest

try:
    import torch
    import transformers
except ImportError as error:  # CI installs both (tools/test.sh); elsewhere they are optional
    pytest.skip(f"needs torch and transformers>=5 (pip install '.[transformers]'): {error}",
                allow_module_level=True)

if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers>=5, found {transformers.__version__}",
                allow_module_level=True)

import openmla  # noqa: E402
import openmla.integrations.transformers as omla_tf  # noqa: E402
from transformers.cache_utils import Cache, DynamicCache, DynamicIndexedLayer, DynamicLayer  # noqa: E402

try:
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
except ImportError:  # pragma: no cover - transformers without V3.2
    DeepseekV32Config = DeepseekV32ForCausalLM = None
try:
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
except ImportError:  # pragma: no cover - transformers without V4
    DeepseekV4Config = DeepseekV4ForCausalLM = None
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402

needs_v32 = pytest.mark.skipif(
    DeepseekV32ForCausalLM is None,
    reason=f"transformers {transformers.__version__} has no deepseek_v32")
needs_v4 = pytest.mark.skipif(DeepseekV4ForCausalLM is None,
                              reason=f"transformers {transformers.__version__} has no deepseek_v4")

DECODE_STEPS = 32
VOCAB = 256
# Tolerances, relative to max |reference logit| (seen over 6 seeds: bf16 max <= 0.8%, mean <=
# 0.09%; fp8_v32 max <= 1.1%, mean <= 0.17%; a softmax scale 2% off gives mean 0.3-0.4%).
REL_MAX = 1.2e-2   # max |Δlogit|, bf16 cache
REL_MEAN = 1.5e-3  # mean |Δlogit|, bf16 cache
# fp8_v32: a latent that rounding upstream moved across an e4m3 rounding boundary lands a whole
# e4m3 step (2^-4 relative) away from the reference's, in the layers after the first.
FP8_REL_MAX, FP8_REL_MEAN = 2e-2, 3e-3
# V4's fp8_model1 cache holds keys and values themselves in e4m3 (and the compressed entries), 3
# layers deep: seen over 6 seeds max <= 1.6%, mean <= 0.25%.
V4_FP8_REL_MAX, V4_FP8_REL_MEAN = 3e-2, 4.5e-3
# V4.1's formats (fp8_mx main, fp4 compressed entries: e2m1 steps are 25-50%): seen over 5 seeds
# max <= 2.7%, mean <= 0.39%.
V41_REL_MAX, V41_REL_MEAN = 5e-2, 7.5e-3


def _config(kind, heads=16, nope=32, v=32, topk=16, yarn=False, q_lora_rank=96,
            rope_interleave=True, attn="eager"):
    common = dict(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=192, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=q_lora_rank, qk_rope_head_dim=64,
        qk_nope_head_dim=nope, v_head_dim=v, max_position_embeddings=512, eos_token_id=None,
        pad_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    if yarn:
        common["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 128,
                                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                     "mscale_all_dim": 1.0}
    if kind == "v3":
        config = DeepseekV3Config(**common, rope_interleave=rope_interleave)
    else:
        config = DeepseekV32Config(**common, index_topk=topk, index_head_dim=64, index_n_heads=4)
    config._attn_implementation = attn
    return config


def _model(kind, seed=0, **config):
    torch.manual_seed(seed)
    cls = DeepseekV3ForCausalLM if kind == "v3" else DeepseekV32ForCausalLM
    model = cls(_config(kind, **config)).eval()
    # transformers' init (std 0.02) leaves every attention score near 0 (uniform attention, blind
    # to a wrong scale or key): sharpen the query, RoPE key and kv_b projections so scores spread
    # over a few units.
    with torch.no_grad():
        for layer in model.model.layers:
            att = layer.self_attn
            (att.q_b_proj if att.q_b_proj is not None else att.q_proj).weight.mul_(5.0)
            att.kv_a_proj_with_mqa.weight.mul_(5.0)
            att.kv_b_proj.weight.mul_(5.0)
    return model


# --- the reference: eager attention on the dequantised cache ------------------------------------

def _roundtrip(kv_nope, k_rot, kv_format):
    """The latents as OpenMLA's cache holds them: quantised and dequantised through kv_format."""
    b, _, s, _ = kv_nope.shape
    latent = torch.cat([kv_nope, k_rot], -1).reshape(b * s, 576).float().contiguous()
    deq = openmla.dequantize(openmla.quantize(latent, kv_format), kv_format).to(kv_nope.dtype)
    deq = deq.view(b, 1, s, 576)
    return deq[..., :512], deq[..., 512:]


def _dequantised_cache(model, kv_format):
    """A transformers DynamicCache whose layers store the dequantised latents."""
    base = DynamicIndexedLayer if isinstance(model, _v32_classes()) else DynamicLayer

    class Layer(base):
        def update(self, key_states, value_states, *args, **kwargs):
            key_states, value_states = _roundtrip(key_states, value_states, kv_format)
            return super().update(key_states, value_states, *args, **kwargs)

    cache = DynamicCache()
    Cache.__init__(cache, layers=[Layer() for _ in range(model.config.num_hidden_layers)])
    return cache


def _v32_classes():
    return (DeepseekV32ForCausalLM,) if DeepseekV32ForCausalLM is not None else ()


class _Indexers:
    """Records the given indexers' picks in one run ("record") and makes another run attend them
    ("replay"), keeping what its own indexers picked (own_entry)."""

    def __init__(self, indexers):
        self.indexers = indexers
        self.mode = "off"
        self.recorded = [[] for _ in self.indexers]
        self.own = [[] for _ in self.indexers]
        self.calls = [0 for _ in self.indexers]
        for i, indexer in enumerate(self.indexers):
            indexer.forward = self._wrap(i, indexer.forward)

    def own_entry(self, picks, args):
        return picks.clone()

    def _wrap(self, i, forward):
        def wrapped(*args, **kwargs):
            picks = forward(*args, **kwargs)
            if self.mode == "record":
                self.recorded[i].append(picks.clone())
            elif self.mode == "replay":
                self.own[i].append(self.own_entry(picks, args))
                picks = self.recorded[i][self.calls[i]]
                self.calls[i] += 1
            return picks
        return wrapped


class _V32Indexers(_Indexers):
    """V3.2's indexers; what they picked is kept with the keys each query could see."""

    def __init__(self, model):
        super().__init__([layer.self_attn.indexer for layer in model.model.layers])

    def own_entry(self, picks, args):
        mask = args[3]
        visible = mask if mask.dtype == torch.bool else mask == 0
        return picks.clone(), visible.clone()

    def agreement(self, layer):
        """Fraction of (sequence, query) whose picks among the visible keys are the same set."""
        same = total = 0
        for ours, (theirs, visible) in zip(self.recorded[layer], self.own[layer]):
            for bi in range(ours.shape[0]):
                for si in range(ours.shape[1]):
                    seen = visible[bi, si]
                    a = {t for t in ours[bi, si].tolist() if seen[t]}
                    c = {t for t in theirs[bi, si].tolist() if seen[t]}
                    same += a == c
                    total += 1
        return same / max(total, 1)


def _teacher_forced(model, ids, prompt, cache):
    """Logits [b, prompt + steps, vocab]: prefill `prompt` tokens, then one token a step."""
    with torch.no_grad():
        logits = [model(ids[:, :prompt], cache=cache, use_cache=True).logits]
        for t in range(prompt, ids.shape[1]):
            logits.append(model(ids[:, t:t + 1], cache=cache, use_cache=True).logits)
    return torch.cat(logits, dim=1)


def _assert_close(got, ref, rel_max=None, rel_mean=None, what=""):
    rel_max = REL_MAX if rel_max is None else rel_max
    rel_mean = REL_MEAN if rel_mean is None else rel_mean
    scale = ref.abs().max().item()
    err = (got - ref).abs()
    assert err.max().item() <= rel_max * scale, (
        f"{what}: max |Δlogit| {err.max().item():.3e} > {rel_max} × {scale:.3f}")
    assert err.mean().item() <= rel_mean * scale, (
        f"{what}: mean |Δlogit| {err.mean().item():.3e} > {rel_mean} × {scale:.3f}")
    _errors.append((what, err.max().item() / scale, err.mean().item() / scale))
    return err.max().item() / scale


_errors = []  # (what, max, mean) relative errors of every comparison (for reports)


def _compare(kind, kv_format, page_size, batch, prompt, seed=0, device="cpu", **config):
    model = _model(kind, seed=seed, **config).to(device)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, VOCAB, (batch, prompt + DECODE_STEPS), generator=gen).to(device)
    indexers = _V32Indexers(model) if kind == "v32" else None
    omla_tf.enable(model)
    cache = omla_tf.OpenMLACache(model, page_size=page_size, kv_format=kv_format)
    if indexers:
        indexers.mode = "record"
    got = _teacher_forced(model, ids, prompt, cache)
    assert cache.get_seq_length() == prompt + DECODE_STEPS
    assert cache.layers[0].kv_cache.shape[1] == page_size
    omla_tf.disable(model)
    if indexers:
        indexers.mode = "replay"
    ref = _teacher_forced(model, ids, prompt, _dequantised_cache(model, kv_format))
    fp8 = kv_format != "bf16"
    rel = _assert_close(got, ref, rel_max=FP8_REL_MAX if fp8 else None,
                        rel_mean=FP8_REL_MEAN if fp8 else None,
                        what=f"{kind} {kv_format} vs eager on the dequantised cache")
    if indexers:
        indexers.mode = "off"
        assert indexers.agreement(0) == 1.0
        assert indexers.agreement(1) >= 0.9, indexers.agreement(1)
    if kv_format == "bf16" and kind == "v3":
        with torch.no_grad():
            exact = model(ids, use_cache=False).logits
        _assert_close(got, exact, rel_max=1.5e-2, rel_mean=2e-3,
                      what=f"{kind} bf16 vs the float32 model")
    return rel


# --- V3: dense decode (prefill: dense decode with s_q = prompt, causal) ------------------------

@pytest.mark.parametrize("heads,nope,v,page_size,batch,prompt,extra", [
    (16, 32, 32, 64, 1, 7, {}),
    (16, 64, 64, 16, 3, 33, {"yarn": True}),   # YaRN: the softmax scale carries mscale
    (128, 32, 32, 16, 2, 20, {}),
    # q_proj (no q LoRA), half-split RoPE
    (16, 32, 64, 64, 2, 3, {"q_lora_rank": None, "rope_interleave": False}),
])
def test_v3_teacher_forced_decode(heads, nope, v, page_size, batch, prompt, extra):
    _compare("v3", "bf16", page_size, batch, prompt, heads=heads, nope=nope, v=v, **extra)


def _left_padded(lengths, extra, seed):
    """Prompts of `lengths` left-padded to the longest, then `extra` more tokens each: ids and
    the 2D attention mask [batch, longest + extra]."""
    gen = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), longest + extra), generator=gen)
    mask = torch.ones_like(ids)
    for b, n in enumerate(lengths):
        mask[b, : longest - n] = 0
        ids[b, : longest - n] = 0
    return ids, mask


def _teacher_forced_padded(model, ids, mask, prompt, cache):
    """_teacher_forced with a left-padded batch: positions as generate() makes them."""
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        logits = [model(ids[:, :prompt], attention_mask=mask[:, :prompt], cache=cache,
                        position_ids=positions[:, :prompt], use_cache=True).logits]
        for t in range(prompt, ids.shape[1]):
            logits.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], cache=cache,
                                position_ids=positions[:, t:t + 1], use_cache=True).logits)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("kind,kv_format", [
    ("v3", "bf16"),
    pytest.param("v32", "fp8_v32", marks=needs_v32),
])
def test_left_padded_batch(kind, kv_format):
    """A batch of prompts 4, 17 and 9 tokens long, left-padded (as generate() batches them):
    padding is not cached, each sequence attends its own tokens."""
    model = _model(kind, topk=8) if kind == "v32" else _model(kind)
    ids, mask = _left_padded([4, 17, 9], DECODE_STEPS, seed=21)
    prompt = 17
    indexers = _V32Indexers(model) if kind == "v32" else None
    omla_tf.enable(model)
    cache = omla_tf.OpenMLACache(model, page_size=16)
    if indexers:
        indexers.mode = "record"
    got = _teacher_forced_padded(model, ids, mask, prompt, cache)
    assert cache.layers[0].real.tolist() == [4 + DECODE_STEPS, 17 + DECODE_STEPS, 9 + DECODE_STEPS]
    assert cache.get_seq_length() == prompt + DECODE_STEPS
    omla_tf.disable(model)
    if indexers:
        indexers.mode = "replay"
    ref = _teacher_forced_padded(model, ids, mask, prompt, _dequantised_cache(model, kv_format))
    real = mask.bool()
    fp8 = kv_format != "bf16"
    _assert_close(got[real], ref[real], rel_max=FP8_REL_MAX if fp8 else None,
                  rel_mean=FP8_REL_MEAN if fp8 else None, what=f"{kind} left-padded batch")
    if indexers:
        assert indexers.agreement(0) == 1.0


def test_v3_softmax_scale_includes_yarn_mscale():
    model = _model("v3", yarn=True)
    att = model.model.layers[0].self_attn
    factor = 0.1 * math.log(4.0) + 1.0  # yarn_get_mscale(4, mscale_all_dim=1)
    assert att.scaling == pytest.approx((32 + 64) ** -0.5 * factor * factor)


# --- V3.2: sparse decode / sparse prefill with the model's indexer top-k ------------------------

@needs_v32
@pytest.mark.parametrize("kv_format,heads,page_size,batch,prompt,topk", [
    ("fp8_v32", 16, 64, 2, 12, 16),
    ("fp8_v32", 128, 16, 1, 40, 32),
    ("bf16", 16, 16, 3, 5, 8),
])
def test_v32_teacher_forced_decode(kv_format, heads, page_size, batch, prompt, topk):
    _compare("v32", kv_format, page_size, batch, prompt, heads=heads, topk=topk)


# --- greedy generation -------------------------------------------------------------------------

def _greedy_matches(kind, kv_format, batch, prompt, new_tokens, lengths=None, **config):
    """OpenMLA's greedy tokens are the reference's argmax wherever its top-2 margin exceeds the
    rounding (the reference re-reads OpenMLA's tokens, teacher-forced). `lengths`: prompts of
    these lengths, left-padded to `prompt`."""
    if kind == "v4":
        model = _v4_model(**config)
        indexers = _V4Indexers(model)
        reference_cache = lambda: _v4_dequantised_cache(model, kv_format)  # noqa: E731
    else:
        model = _model(kind, **config)
        indexers = _V32Indexers(model) if kind == "v32" else None
        reference_cache = lambda: _dequantised_cache(model, kv_format)  # noqa: E731
    if lengths is None:
        ids = torch.randint(0, VOCAB, (batch, prompt), generator=torch.Generator().manual_seed(7))
        mask = torch.ones_like(ids)
    else:
        ids, mask = _left_padded(lengths, 0, seed=7)
    omla_tf.enable(model, page_size=16, kv_format=kv_format)
    if indexers:
        indexers.mode = "record"
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False)   # no cache given: enable() supplies an OpenMLACache
    assert out.shape == (batch, prompt + new_tokens)
    assert torch.equal(out[:, :prompt], ids)
    omla_tf.disable(model)
    if indexers:
        # generate's last token is never fed back: replay the recorded picks for the rest
        indexers.mode = "replay"
    full_mask = torch.cat([mask, torch.ones_like(out[:, prompt:])], dim=1)
    ref = _teacher_forced_padded(model, out[:, :-1], full_mask[:, :-1], prompt, reference_cache())
    ref = ref[:, prompt - 1:]                       # the logits that chose each new token
    chosen = out[:, prompt:]
    top2 = ref.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1])
    tol = {"v3": REL_MAX, "v32": FP8_REL_MAX, "v4": V4_FP8_REL_MAX}[kind] * ref.abs().max().item()
    argmax = ref.argmax(-1)
    agree = argmax == chosen
    assert bool((agree | (margin <= 2 * tol)).all()), (
        f"greedy token differs where the reference's margin is clear: {(~agree).sum().item()} "
        f"differing of {agree.numel()}")
    return agree.float().mean().item()


def test_v3_greedy_generation():
    assert _greedy_matches("v3", "bf16", batch=2, prompt=9, new_tokens=24) >= 0.9


def test_v3_greedy_generation_left_padded():
    assert _greedy_matches("v3", "bf16", batch=3, prompt=13, new_tokens=16,
                           lengths=[13, 5, 9]) >= 0.9


@needs_v32
def test_v32_greedy_generation_left_padded():
    assert _greedy_matches("v32", "fp8_v32", batch=2, prompt=11, new_tokens=16, topk=8,
                           lengths=[6, 11]) >= 0.9


@needs_v32
def test_v32_greedy_generation():
    assert _greedy_matches("v32", "fp8_v32", batch=2, prompt=9, new_tokens=24, topk=8) >= 0.9


@needs_v4
def test_v4_greedy_generation():
    assert _greedy_matches("v4", "fp8_model1", batch=2, prompt=11, new_tokens=24) >= 0.9


# --- the integration's own behaviour -----------------------------------------------------------

@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_without_cache_matches_eager(attn):
    model = _model("v3", attn=attn)
    ids = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        omla_tf.enable(model)
        got = model(ids, use_cache=False).logits          # a throw-away paged cache per layer
        got_default = model(ids).logits                   # enable() supplies an OpenMLACache
    _assert_close(got, ref, rel_max=1.5e-2, rel_mean=2e-3, what="no cache")
    assert torch.equal(got, got_default)


def test_cache_layout_and_block_table():
    model = _model("v3")
    omla_tf.enable(model)
    cache = omla_tf.OpenMLACache(model, page_size=16)
    ids = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(ids, cache=cache)
    table = cache.block_table()
    assert table.shape == (3, 3) and table.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(9))   # every block once
    assert table[0].tolist() != [0, 1, 2]                        # round-robin: not contiguous
    layer = cache.layers[1]
    assert layer.kv_cache.dtype == torch.bfloat16
    assert tuple(layer.kv_cache.shape[1:]) == (16, 1, 576)
    # the cached vector is kv_a_layernorm(c_kv) ++ RoPE(k_pe): the first 512 dims are RMS-normed
    latent = layer.gather("fp32")
    assert latent.shape == (3, 40, 576)
    rms = latent[..., :512].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=2e-2)
    cache.crop(5)
    assert cache.get_seq_length() == 35


@needs_v32
def test_v32_default_format_is_fp8_v32():
    model = _model("v32")
    assert omla_tf.default_kv_format(model) == "fp8_v32"
    cache = omla_tf.OpenMLACache(model, page_size=64)
    omla_tf.enable(model)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 10)), cache=cache)
    assert cache.layers[0].kv_cache.dtype == torch.uint8
    assert tuple(cache.layers[0].kv_cache.shape[1:]) == (64, 1, 656)


def test_errors():
    model = _model("v3")
    with pytest.raises(ValueError, match="kv_format"):
        omla_tf.OpenMLACache(model, kv_format="fp8_v32")   # V3 reads plain caches (dense decode)
    omla_tf.enable(model)
    ids = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        with pytest.raises(TypeError, match="OpenMLACache"):
            model(ids, cache=DynamicCache(config=model.config))
        mask = torch.ones_like(ids)
        mask[0, -1] = 0  # right padding
        with pytest.raises(NotImplementedError, match="left padding"):
            model(ids, attention_mask=mask, use_cache=False)
    assert omla_tf.is_enabled(model)
    omla_tf.disable(model)
    assert not omla_tf.is_enabled(model)
    with pytest.raises(RuntimeError, match="enable"):
        with torch.no_grad():
            model(ids, cache=omla_tf.OpenMLACache(model))
    with pytest.raises(ValueError, match="DeepseekV3Attention"):
        omla_tf.enable(torch.nn.Linear(2, 2))


# --- V4: sliding window + compressed entries (CSA with indexer, HCA) + attention sink ----------

def _v4_model(seed=0, heads=16, window=8, csa=4, hca=8, topk=4):
    torch.manual_seed(seed)
    config = DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=3, num_attention_heads=heads,
        head_dim=512, q_lora_rank=96, o_groups=2, o_lora_rank=64, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": csa, "heavily_compressed_attention": hca},
        sliding_window=window, index_topk=topk, index_head_dim=64, index_n_heads=4,
        eos_token_id=None, pad_token_id=0, bos_token_id=None)
    config._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            att = layer.self_attn
            att.sinks.normal_(0.0, 1.0)  # transformers initialises the sinks to 0
            if att.compressor is not None:  # and the window-pooling biases: make them matter
                att.compressor.position_bias.normal_(0.0, 1.0)
    return model


def _v4_dequantised_cache(model, kv_format, extra_kv_format=None):
    """transformers' own V4 DynamicCache, its main tokens (kv_format) and compressed entries
    (extra_kv_format) stored dequantised (the compressors' inputs, indexer keys untouched)."""
    cache = DynamicCache(config=model.config)
    extra_kv_format = extra_kv_format or kv_format

    def rounded(x, fmt):  # [..., n, 512]
        shape = x.shape
        flat = x.reshape(-1, 512).float().contiguous()
        return openmla.dequantize(openmla.quantize(flat, fmt), fmt).to(x.dtype).view(shape)

    for layer in cache.layers:
        update = layer.update
        layer.update = lambda k, v, *a, _u=update, **kw: _u(
            rounded(k, kv_format), rounded(k, kv_format), *a, **kw)
        if hasattr(layer, "update_compressor_states"):
            ucs = layer.update_compressor_states
            layer.update_compressor_states = lambda name, c, _u=ucs: _u(
                name, rounded(c, extra_kv_format) if name == "compressor" else c)
    return cache


class _V4Indexers(_Indexers):
    """V4's CSA indexers (their picks are compressed-entry numbers, -1 invalid)."""

    def __init__(self, model):
        super().__init__([layer.self_attn.compressor.indexer for layer in model.model.layers
                          if layer.self_attn.layer_type == "compressed_sparse_attention"])

    def agreement(self):
        same = total = 0
        for rec, own in zip(self.recorded, self.own):
            for ours, theirs in zip(rec, own):
                for a, c in zip(ours.reshape(-1, ours.shape[-1]).tolist(),
                                theirs.reshape(-1, theirs.shape[-1]).tolist()):
                    same += {t for t in a if t >= 0} == {t for t in c if t >= 0}
                    total += 1
        return same / max(total, 1)


@needs_v4
@pytest.mark.parametrize("kv_format,extra_kv_format,heads,page_size,batch,prompt", [
    ("fp8_model1", None, 16, 64, 2, 13),
    ("fp8_model1", None, 64, 16, 1, 21),
    ("bf16", None, 16, 16, 3, 6),
    ("fp8_mx", "fp4", 16, 16, 2, 9),      # V4.1's formats: main fp8_mx, compressed entries fp4
])
def test_v4_teacher_forced_decode(kv_format, extra_kv_format, heads, page_size, batch, prompt):
    _compare_v4(kv_format, extra_kv_format, heads, page_size, batch, prompt)


def _compare_v4(kv_format, extra_kv_format, heads, page_size, batch, prompt, device="cpu"):
    model = _v4_model(heads=heads).to(device)
    ids = torch.randint(0, VOCAB, (batch, prompt + DECODE_STEPS),
                        generator=torch.Generator().manual_seed(11)).to(device)
    indexers = _V4Indexers(model)
    omla_tf.enable(model)
    cache = omla_tf.OpenMLACache(model, page_size=page_size, kv_format=kv_format,
                                 extra_kv_format=extra_kv_format)
    indexers.mode = "record"
    got = _teacher_forced(model, ids, prompt, cache)
    csa, hca = cache.layers[1], cache.layers[2]
    total = prompt + DECODE_STEPS
    assert csa.extra.length == total // 4 and hca.extra.length == total // 8
    omla_tf.disable(model)
    indexers.mode = "replay"
    ref = _teacher_forced(model, ids, prompt,
                          _v4_dequantised_cache(model, kv_format, extra_kv_format))
    rel_max, rel_mean = {"bf16": (None, None), "fp8_model1": (V4_FP8_REL_MAX, V4_FP8_REL_MEAN),
                         "fp8_mx": (V41_REL_MAX, V41_REL_MEAN)}[kv_format]
    _assert_close(got, ref, rel_max=rel_max, rel_mean=rel_mean,
                  what=f"v4 {kv_format}/{extra_kv_format} vs eager on the dequantised caches")
    assert indexers.agreement() >= 0.9


@needs_v4
def test_v4_default_formats_and_sink():
    model = _v4_model()
    assert omla_tf.default_kv_format(model) == "fp8_model1"
    omla_tf.enable(model)
    cache = omla_tf.OpenMLACache(model, page_size=64)
    with torch.no_grad():
        got = model(torch.randint(0, VOCAB, (1, 20)), cache=cache).logits
    main, extra = cache.layers[1].kv_cache, cache.layers[1].extra.kv_cache
    assert main.dtype == torch.uint8 and main.shape[1:3] == (64, 1) and main.shape[3] == 584
    assert extra.dtype == torch.uint8 and cache.layers[1].extra.length == 5
    assert cache.layers[0].extra is None
    # a sink far above every score takes all the probability: the attention nearly vanishes,
    # in OpenMLA (out *= 1 / (1 + exp(sink - lse))) as in transformers (sink in the softmax)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(30.0)
        got = model(ids, use_cache=False).logits
        omla_tf.disable(model)
        ref = model(ids, use_cache=False).logits
    _assert_close(got, ref, what="v4 with dominant sinks")


# --- on the GPU (tools/device_check.sh runs `pytest -m gpu`; CI deselects these) ---------------

def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not openmla.cuda_backend_available():
        pytest.skip("openmla was built without the CUDA backend")


@pytest.mark.gpu
def test_v3_on_cuda():
    """V3 on CUDA tensors: kv_cache_write and dense_decode (prefill: s_q = prompt, causal) on
    the GPU, against eager attention on the GPU, same tolerances as on the CPU."""
    _cuda_or_skip()
    _compare("v3", "bf16", 64, 2, 20, heads=128, device="cuda")
    _compare("v3", "bf16", 16, 3, 33, heads=16, nope=64, v=64, yarn=True, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [pytest.param("v32", marks=needs_v32),
                                  pytest.param("v4", marks=needs_v4)])
def test_sparse_models_on_cuda(kind):
    """V3.2 / V4 on CUDA tensors (sparse_decode and sparse_prefill on the GPU), checked like on
    the CPU."""
    _cuda_or_skip()
    if kind == "v32":
        _compare("v32", "fp8_v32", 64, 2, 12, heads=16, topk=16, device="cuda")
    else:
        _compare_v4("fp8_model1", None, 16, 64, 2, 13, device="cuda")
