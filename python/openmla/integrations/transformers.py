"""Hugging Face transformers' DeepSeek-V3, V3.2 and V4 attention, served by OpenMLA.

    import openmla.integrations.transformers as omla_tf

    omla_tf.enable(model)                          # patch the model's attention modules
    out = model.generate(input_ids, max_new_tokens=32)     # gets an OpenMLACache by itself
    cache = omla_tf.OpenMLACache(model)            # or hold one: model(ids, cache=cache)

`enable` replaces the forward of every `DeepseekV3Attention` / `DeepseekV32Attention` /
`DeepseekV4Attention` module; their projections, norms, RoPE, indexers and compressors stay the
model's own. V3 and V3.2 run in MLA's absorbed form over an OpenMLA paged cache:

- the cached vector of a token is its latent (`kv_a_layernorm(c_kv)`, kv_lora_rank = 512 dims)
  followed by its RoPE'd shared key (`k_pe`, 64 dims): 576 dims, written with
  `openmla.kv_cache_write` into `OpenMLACache`'s per-layer paged cache (`bf16` for V3, `fp8_v32`
  for V3.2 by default);
- the key up-projection is folded into the query: `q_latent[h] = q_nope[h] · W_UK[h]`
  (W_UK = the first qk_nope_head_dim rows of each head of `kv_b_proj`), `q = [q_latent, q_pe]`;
- attention over the cache with the model's own softmax scale (`module.scaling`, which holds the
  YaRN mscale), the latent (first 512 dims) as the value;
- the value up-projection after: `o[h] = W_UV[h] · out_latent[h]`, then `o_proj`.

Which OpenMLA operation runs:
- V3 prefill and decode: `dense_decode` with s_q = the new tokens and `causal=True` (OpenMLA has
  no dense MHA prefill yet; the causal dense decode is exact for any s_q, at decode speed);
- V3.2 decode (one new token): `sparse_decode` over the paged cache with the model's own indexer
  top-k (positions turned into cache slots through the block table);
- V3.2 prefill (several new tokens): `sparse_prefill` over the sequence's cached tokens gathered
  back (dequantised) with `kv_cache_gather`, indices = the indexer's top-k, causally masked;
- V4 (K = V, 512 dims, RoPE on the last 64): the main tokens in one paged cache (`fp8_model1` by
  default), the compressed entries of CSA / HCA layers in a second ("extra") one; decode through
  `sparse_decode` with the sliding window's slots, the visible compressed entries as
  `extra_indices` and the per-head `attn_sink`; prefill through one `sparse_prefill` over both.

Batches may be left-padded (V3, V3.2: padding is not cached, each sequence has its own length);
right padding, masks with holes, padding for V4, beam search and cache reordering raise
NotImplementedError. The attention runs
where the model's tensors are (CPU backend, or CUDA where a kernel exists for the operation).
docs/transformers.md has the design, the tolerances it is tested to and the findings.
"""

from __future__ import annotations

import sys
import types
from typing import Any, List, Optional, Tuple

import torch

import openmla
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["enable", "disable", "is_enabled", "OpenMLACache", "OpenMLACacheLayer",
           "default_kv_format", "absorbed_weights"]

_LATENT = 512   # kv_lora_rank OpenMLA's operations take (d_v)
_ROPE = 64      # qk_rope_head_dim
_D_QK = _LATENT + _ROPE


# --- which modules ------------------------------------------------------------------------------

def _attention_classes():
    """{class: kind} for the transformers attention classes this module knows ("v3", "v32")."""
    classes = {}
    try:
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m3
        classes[m3.DeepseekV3Attention] = "v3"
    except ImportError:  # pragma: no cover - every transformers 5.x has it
        pass
    try:
        from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m32
        classes[m32.DeepseekV32Attention] = "v32"
    except ImportError:  # pragma: no cover - older transformers
        pass
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m4
        classes[m4.DeepseekV4Attention] = "v4"
    except ImportError:  # pragma: no cover - older transformers
        pass
    return classes


def _attention_modules(model) -> List[Tuple[Any, str]]:
    classes = _attention_classes()
    found = []
    for module in model.modules():
        kind = classes.get(type(module))
        if kind is not None:
            found.append((module, kind))
    return found


def _model_kind(model) -> str:
    kinds = {kind for _, kind in _attention_modules(model)}
    if not kinds:
        raise ValueError("openmla: the model has no DeepseekV3Attention or DeepseekV32Attention "
                         "module (supported: transformers' DeepSeek-V3 and V3.2 models)")
    if len(kinds) > 1:
        raise ValueError(f"openmla: the model mixes attention kinds {sorted(kinds)}")
    return kinds.pop()


_DEFAULT_FORMATS = {"v3": "bf16", "v32": "fp8_v32", "v4": "fp8_model1"}
_ALLOWED_FORMATS = {"v3": ("bf16", "fp16"), "v32": ("fp8_v32", "bf16"),
                    "v4": ("fp8_model1", "fp8_mx", "bf16")}
_V4_EXTRA_FORMATS = ("fp8_model1", "fp8_mx", "fp4", "bf16")
_MODEL_NAMES = {"v3": "DeepSeek-V3", "v32": "DeepSeek-V3.2", "v4": "DeepSeek-V4"}


def default_kv_format(model) -> str:
    """The cache format a model's attention is served from by default: bf16 (V3), fp8_v32
    (V3.2), fp8_model1 (V4: its main and its compressed caches)."""
    return _DEFAULT_FORMATS[_model_kind(model)]


def _check_module(module, kind: str) -> None:
    if kind == "v4":
        if module.head_dim != _LATENT or module.config.qk_rope_head_dim != _ROPE:
            raise ValueError(f"openmla: layer {module.layer_idx}: OpenMLA's V4 caches hold "
                             f"{_LATENT}-dim vectors whose last {_ROPE} dims carry RoPE; the model "
                             f"has head_dim {module.head_dim} and qk_rope_head_dim "
                             f"{module.config.qk_rope_head_dim}")
        return
    if module.kv_lora_rank != _LATENT or module.qk_rope_head_dim != _ROPE:
        raise ValueError(f"openmla: layer {module.layer_idx}: OpenMLA's caches hold a "
                         f"{_LATENT}-dim latent and a {_ROPE}-dim RoPE key, the model has "
                         f"kv_lora_rank {module.kv_lora_rank} and qk_rope_head_dim "
                         f"{module.qk_rope_head_dim}")
    if module.num_key_value_groups != 1:
        raise ValueError(f"openmla: layer {module.layer_idx}: MLA has one latent shared by all "
                         "heads; num_key_value_heads must equal num_attention_heads")


def _base_models(model):
    """The DeepseekV3Model / V32Model / V4Model instances inside `model` (or `model` itself)."""
    classes = []
    try:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Model
        classes.append(DeepseekV3Model)
    except ImportError:  # pragma: no cover
        pass
    try:
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Model
        classes.append(DeepseekV32Model)
    except ImportError:  # pragma: no cover
        pass
    try:
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Model
        classes.append(DeepseekV4Model)
    except ImportError:  # pragma: no cover
        pass
    return [m for m in model.modules() if isinstance(m, tuple(classes))]


def enable(model, *, page_size: int = 64, kv_format: Optional[str] = None,
           extra_kv_format: Optional[str] = None) -> Any:
    """Serves the attention of every DeepSeek-V3 / V3.2 / V4 attention module of `model` through
    OpenMLA.

    Afterwards a forward or `generate` without a cache of its own gets a fresh `OpenMLACache`
    (`page_size`, `kv_format`, `extra_kv_format`: see OpenMLACache) where transformers would
    have made a DynamicCache; pass `cache=OpenMLACache(model, ...)` to keep it across calls. A
    cache of another kind raises TypeError. Returns the model; `disable(model)` undoes it."""
    modules = _attention_modules(model)
    if not modules:
        _model_kind(model)  # raises the error naming what is supported
    for module, kind in modules:
        _check_module(module, kind)
    defaults = {"page_size": page_size, "kv_format": kv_format, "extra_kv_format": extra_kv_format}
    OpenMLACache(model, **defaults)  # checks the arguments
    for module, kind in modules:
        if getattr(module, "_openmla_kind", None) is not None:
            continue
        module._openmla_kind = kind
        module._openmla_defaults = (page_size, kv_format or _DEFAULT_FORMATS[kind],
                                    extra_kv_format)
        module._openmla_original_forward = module.__dict__.get("forward")
        module.forward = types.MethodType(_FORWARDS[kind], module)
    for base in _base_models(model):
        if "_openmla_original_forward" not in base.__dict__:
            base._openmla_original_forward = base.forward
        base.forward = _with_cache(base, base._openmla_original_forward, defaults)
    if hasattr(model, "_prepare_cache_for_generation"):
        if "_openmla_original_prepare" not in model.__dict__:
            model._openmla_original_prepare = model._prepare_cache_for_generation
        model._prepare_cache_for_generation = _with_generation_cache(
            model, model._openmla_original_prepare, defaults)
    return model


def _with_cache(base, forward, defaults):
    """The base model's forward, given an OpenMLACache where it would make a DynamicCache."""
    def wrapped(*args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = getattr(base.config, "use_cache", False)
        if cache is None and use_cache:
            kwargs.pop("past_key_values", None)
            kwargs["cache"] = OpenMLACache(base, **defaults)
        return forward(*args, **kwargs)
    return wrapped


def _with_generation_cache(model, prepare, defaults):
    """generate's cache preparation, making an OpenMLACache where it would make its own."""
    def wrapped(generation_config, model_kwargs, *args, **kwargs):
        if (model_kwargs.get("cache") is None and generation_config.use_cache is not False
                and generation_config.cache_implementation is None):
            model_kwargs["cache"] = OpenMLACache(model, **defaults)
        return prepare(generation_config, model_kwargs, *args, **kwargs)
    return wrapped


def disable(model) -> Any:
    """Restores transformers' own attention forward on every module `enable` patched."""
    for module, _ in _attention_modules(model):
        if getattr(module, "_openmla_kind", None) is not None:
            del module.forward  # the class's forward again, or what was set on the instance
            if module._openmla_original_forward is not None:
                module.forward = module._openmla_original_forward
            del module._openmla_original_forward
            module._openmla_kind = None
    for base in _base_models(model):
        if "_openmla_original_forward" in base.__dict__:
            del base.forward  # the class's forward again
            del base._openmla_original_forward
    if "_openmla_original_prepare" in model.__dict__:
        del model._prepare_cache_for_generation
        del model._openmla_original_prepare
    return model


def is_enabled(model) -> bool:
    modules = _attention_modules(model)
    return bool(modules) and all(getattr(m, "_openmla_kind", None) for m, _ in modules)


# --- the paged latent cache ---------------------------------------------------------------------

class _BlockTable:
    """The block table every layer of a batch shares: which cache blocks hold each sequence.

    Blocks are handed out round-robin over the sequences as they grow, so a sequence's blocks are
    not contiguous once the batch has more than one sequence (as in a serving engine's pool)."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.blocks: Optional[List[List[int]]] = None
        self.num_blocks = 0
        self._tensor = None

    @property
    def batch_size(self) -> int:
        return -1 if self.blocks is None else len(self.blocks)

    def ensure(self, batch: int, length: int) -> None:
        """Every sequence of the batch holds blocks for `length` tokens."""
        if self.blocks is None:
            self.blocks = [[] for _ in range(batch)]
        elif len(self.blocks) != batch:
            raise ValueError(f"OpenMLACache: batch size changed from {len(self.blocks)} to "
                             f"{batch}; use a fresh cache for a new batch")
        need = -(-length // self.page_size)
        while len(self.blocks[0]) < need:
            for seq in self.blocks:
                seq.append(self.num_blocks)
                self.num_blocks += 1
            self._tensor = None

    def tensor(self, device) -> torch.Tensor:
        """[batch, max_blocks] int32 on `device`."""
        if self._tensor is None or self._tensor.device != torch.device(device):
            width = max(1, len(self.blocks[0]))
            rows = [seq + [0] * (width - len(seq)) for seq in self.blocks]
            self._tensor = torch.tensor(rows, dtype=torch.int32, device=device)
        return self._tensor

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """Cache slots (block * page_size + offset) of token positions [batch, n] (any int; < 0:
        -1)."""
        table = self.tensor(positions.device).long()
        pos = positions.long()
        valid = pos >= 0
        safe = pos.clamp(min=0)
        block = torch.gather(table, 1, safe // self.page_size)
        slot = block * self.page_size + safe % self.page_size
        return torch.where(valid, slot, torch.full_like(slot, -1)).to(torch.int32)


class OpenMLACacheLayer(CacheLayerMixin):
    """One layer's paged latent cache ([num_blocks, page_size, 1, bytes_per_token] in OpenMLA's
    format) and, for V3.2, the indexer's key cache (a dense [batch, tokens, index_head_dim])."""

    is_compileable = False
    is_croppable = True
    supports_early_init = False
    is_sliding = False

    def __init__(self, table: _BlockTable, kv_format: str, d_qk: int = _D_QK):
        super().__init__()
        self.table = table
        self.kv_format = kv_format
        self.d_qk = d_qk
        self.kv_cache = None          # the paged OpenMLA cache
        self.length = 0               # tokens per sequence, as transformers counts (padding too)
        self.real: Optional[torch.Tensor] = None  # [batch] tokens in the paged cache (no padding)
        self.indexer_keys: Optional[torch.Tensor] = None

    def lazy_initialization(self, key_states, value_states) -> None:  # pragma: no cover
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("OpenMLACache holds the latents in OpenMLA's paged format and is read "
                           "by OpenMLA's attention only: call openmla.integrations.transformers."
                           "enable(model) before running the model with it")

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        self.real = None
        self.indexer_keys = None

    @property
    def padding(self) -> torch.Tensor:
        """[batch] padding tokens each sequence has in transformers' count (left padding)."""
        return self.length - self.real

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:  # crop(-n) keeps the first n (transformers' convention)
            tokens_to_remove = self.length + tokens_to_remove
        tokens_to_remove = max(0, min(tokens_to_remove, self.length))
        self.length -= tokens_to_remove
        if self.real is not None:  # the last tokens of a left-padded batch are real
            self.real = (self.real - tokens_to_remove).clamp(min=0)
        if self.indexer_keys is not None and tokens_to_remove:
            self.indexer_keys = self.indexer_keys[:, : self.length]

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("OpenMLACache: beam search (cache reordering) is not supported")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("OpenMLACache: expanding the batch is not supported")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("OpenMLACache: selecting sequences is not supported")

    def offload(self):  # pragma: no cover - the paged cache stays where it is
        pass

    def prefetch(self):  # pragma: no cover
        pass

    @property
    def is_initialized(self) -> bool:
        return self.kv_cache is not None

    @is_initialized.setter
    def is_initialized(self, value) -> None:  # CacheLayerMixin.__init__ assigns it
        pass

    def _grow(self, like: torch.Tensor) -> None:
        have = 0 if self.kv_cache is None else int(self.kv_cache.shape[0])
        need = self.table.num_blocks
        if have >= need:
            return
        blocks = max(need, 2 * have)
        grown = openmla.new_kv_cache(blocks, self.table.page_size, self.kv_format, like=like,
                                     d_qk=self.d_qk)
        if have:
            grown[:have].copy_(self.kv_cache)
        self.kv_cache = grown

    def append(self, latent: torch.Tensor, real: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Writes latent [batch, n, d_qk] (the new tokens' cached vectors) after the cached ones,
        skipping the padding tokens (real [batch, n] bool: False); returns cache_seqlens [batch]
        int32 (each sequence's cached tokens after the write)."""
        batch, n, _ = latent.shape
        device = latent.device
        if self.real is None:
            self.real = torch.zeros(batch, dtype=torch.long, device=device)
        if real is None:
            real = torch.ones(batch, n, dtype=torch.bool, device=device)
        counts = real.long().cumsum(1)
        positions = torch.where(real, self.real[:, None] + counts - 1,
                                torch.full_like(counts, -1))
        after = self.real + counts[:, -1]
        self.table.ensure(batch, int(after.max()))
        self._grow(latent)
        slots = self.table.slots(positions).reshape(-1)
        flat = latent.reshape(batch * n, self.d_qk)
        if flat.dtype not in (torch.float32, torch.bfloat16):
            flat = flat.float()
        openmla.kv_cache_write(flat.contiguous(), slots, self.kv_cache, kv_format=self.kv_format)
        self.real = after
        self.length += n
        return after.to(torch.int32)

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        if self.indexer_keys is None:
            self.indexer_keys = indexer_key_states
        else:
            self.indexer_keys = torch.cat([self.indexer_keys, indexer_key_states], dim=1)
        return self.indexer_keys

    def gather(self, out_dtype: str = "bf16") -> torch.Tensor:
        """Every cached token, dequantised: [batch, max cached tokens, d_qk] (rows past a
        sequence's length are zeros)."""
        batch = self.table.batch_size
        longest = int(self.real.max())
        positions = torch.arange(longest, device=self.kv_cache.device).expand(batch, -1)
        positions = torch.where(positions < self.real[:, None], positions,
                                torch.full_like(positions, -1))
        slots = self.table.slots(positions).reshape(-1)
        out = openmla.kv_cache_gather(self.kv_cache, slots, kv_format=self.kv_format,
                                      out_dtype=out_dtype)
        return out.view(batch, longest, -1)


class OpenMLAV4CacheLayer(OpenMLACacheLayer):
    """A DeepSeek-V4 layer's caches: the main (sliding-window) tokens in one OpenMLA paged cache,
    and for CSA / HCA layers the compressed entries in a second ("extra") paged cache with its
    own block table. The compressors' running state (window buffers, CSA overlap, entry counts)
    stays transformers' own: a DeepseekV4CSACache / DeepseekV4HCACache held here, whose methods
    the model's compressor calls through this layer."""

    def __init__(self, table: _BlockTable, kv_format: str, config, layer_type: str,
                 extra_kv_format: Optional[str] = None):
        super().__init__(table, kv_format, d_qk=_LATENT)
        self.layer_type = layer_type
        self.compression = None
        self.extra = None
        if layer_type != "sliding_attention":
            from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m4
            cls = (m4.DeepseekV4CSACache if layer_type == "compressed_sparse_attention"
                   else m4.DeepseekV4HCACache)
            self.compression = cls(config)
            self.extra = OpenMLACacheLayer(_BlockTable(table.page_size),
                                           extra_kv_format or kv_format, d_qk=_LATENT)

    # what the model's compressors and indexer call on cache.layers[layer_idx]
    def store_compression_weights(self, *args, **kwargs):
        return self.compression.store_compression_weights(*args, **kwargs)

    def update_compressor_states(self, *args, **kwargs):
        return self.compression.update_compressor_states(*args, **kwargs)

    def update_overlap_state(self, *args, **kwargs):
        return self.compression.update_overlap_state(*args, **kwargs)

    def reset(self) -> None:
        super().reset()
        if self.compression is not None:
            self.compression.reset()
            self.extra.reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("OpenMLACache: a DeepSeek-V4 cache cannot be cropped (its "
                                      "compressors' state cannot be rolled back)")

    def sync_extra(self, compressed: torch.Tensor) -> int:
        """Writes the compressed entries [batch, T, 512] not yet in the extra cache; returns T."""
        total = int(compressed.shape[1])
        if total > self.extra.length:
            self.extra.append(compressed[:, self.extra.length:])
        return total


class OpenMLACache(Cache):
    """A transformers `Cache` whose layers are OpenMLA paged latent caches.

    OpenMLACache(model, page_size=64, kv_format=None, extra_kv_format=None): `kv_format`
    defaults to bf16 for V3, fp8_v32 for V3.2 and fp8_model1 for V4 (V3 takes bf16/fp16: dense
    decode reads plain caches; V3.2 fp8_v32 or bf16; V4 fp8_model1, fp8_mx or bf16).
    `extra_kv_format` (V4 only): the compressed entries' cache, default `kv_format` (V4.1 keeps
    them in fp4). The cache grows as tokens arrive; one cache serves one batch."""

    def __init__(self, model=None, *, page_size: int = 64, kv_format: Optional[str] = None,
                 extra_kv_format: Optional[str] = None, num_layers: Optional[int] = None):
        if model is not None:
            kind = _model_kind(model)
            if kv_format is None:
                kv_format = default_kv_format(model)
            if num_layers is None:
                num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
            allowed = _ALLOWED_FORMATS[kind]
            if kv_format not in allowed:
                raise ValueError(f"OpenMLACache: kv_format {kv_format!r} cannot serve a "
                                 f"{_MODEL_NAMES[kind]} model (expected one of "
                                 f"{', '.join(allowed)})")
        if kv_format is None or num_layers is None:
            raise ValueError("OpenMLACache: pass the model, or kv_format and num_layers")
        if extra_kv_format is not None and (model is None or kind != "v4"):
            raise ValueError("OpenMLACache: extra_kv_format is for DeepSeek-V4 models only")
        if page_size < 1:
            raise ValueError(f"OpenMLACache: page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.kv_format = kv_format
        self.table = _BlockTable(page_size)
        if model is not None and kind == "v4":
            config = model.config.get_text_config(decoder=True)
            if extra_kv_format is not None and extra_kv_format not in _V4_EXTRA_FORMATS:
                raise ValueError(f"OpenMLACache: extra_kv_format {extra_kv_format!r} cannot hold "
                                 f"DeepSeek-V4's compressed entries (expected one of "
                                 f"{', '.join(_V4_EXTRA_FORMATS)})")
            layers = [OpenMLAV4CacheLayer(self.table, kv_format, config, layer_type,
                                          extra_kv_format)
                      for layer_type in config.layer_types[:num_layers]]
        else:
            layers = [OpenMLACacheLayer(self.table, kv_format) for _ in range(num_layers)]
        super().__init__(layers=layers)

    @property
    def batch_size(self) -> int:
        return self.table.batch_size

    def block_table(self, device=None) -> torch.Tensor:
        return self.table.tensor(device or "cpu")


# --- the absorbed attention -------------------------------------------------------------------

def absorbed_weights(module) -> Tuple[torch.Tensor, torch.Tensor]:
    """(W_UK [h, qk_nope_head_dim, 512], W_UV [h, v_head_dim, 512]): views of kv_b_proj's weight."""
    weight = module.kv_b_proj.weight.view(module.num_heads,
                                          module.qk_nope_head_dim + module.v_head_dim, _LATENT)
    return weight[:, : module.qk_nope_head_dim], weight[:, module.qk_nope_head_dim:]


def _rope(module, q_rot, k_rot, position_embeddings):
    cos, sin = position_embeddings
    mod = sys.modules[type(module).__module__]  # the model's own RoPE helpers
    # V3 follows config.rope_interleave; V3.2's attention always interleaves (its indexer does not)
    if getattr(module, "_openmla_kind", None) == "v32" or getattr(module.config, "rope_interleave",
                                                                  True):
        return mod.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    return mod.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)


def _project(module, hidden_states, position_embeddings):
    """The module's own projections: q_nope [b, h, s, nope], q_pe [b, h, s, 64] (RoPE'd), the
    cached vectors [b, s, 576] and q_resid (the query's LoRA latent, V3.2's indexer input)."""
    batch, seq = hidden_states.shape[:-1]
    q_resid = None
    if getattr(module, "q_lora_rank", None) is None:
        q_states = module.q_proj(hidden_states)
    else:
        q_resid = module.q_a_layernorm(module.q_a_proj(hidden_states))
        q_states = module.q_b_proj(q_resid)
    q_states = q_states.view(batch, seq, -1, module.qk_head_dim).transpose(1, 2)
    q_nope, q_rot = torch.split(q_states, [module.qk_nope_head_dim, module.qk_rope_head_dim], -1)
    compressed = module.kv_a_proj_with_mqa(hidden_states)
    kv_nope, k_rot = torch.split(compressed, [module.kv_lora_rank, module.qk_rope_head_dim], -1)
    kv_nope = module.kv_a_layernorm(kv_nope)
    k_rot = k_rot.view(batch, 1, seq, module.qk_rope_head_dim)
    q_rot, k_rot = _rope(module, q_rot, k_rot, position_embeddings)
    latent = torch.cat([kv_nope, k_rot.view(batch, seq, module.qk_rope_head_dim)], dim=-1)
    return q_nope, q_rot, latent, q_resid


def _absorbed_query(module, q_nope, q_rot, dtype) -> torch.Tensor:
    """[b, s, h, 576] in `dtype`: (q_nope · W_UK) ++ q_pe."""
    w_uk, _ = absorbed_weights(module)
    q_latent = torch.einsum("bhsn,hnc->bshc", q_nope, w_uk.to(q_nope.dtype))
    return torch.cat([q_latent, q_rot.transpose(1, 2)], dim=-1).to(dtype).contiguous()


def _output(module, out_latent, dtype) -> torch.Tensor:
    """o_proj(W_UV · out_latent): out_latent [b, s, h, 512] → [b, s, hidden]."""
    _, w_uv = absorbed_weights(module)
    batch, seq = out_latent.shape[:2]
    values = torch.einsum("bshc,hvc->bshv", out_latent.to(dtype), w_uv.to(dtype))
    return module.o_proj(values.reshape(batch, seq, -1))


def _visible(attention_mask) -> Optional[torch.Tensor]:
    """The keys the last query sees, [batch, keys] bool, from transformers' 4D mask (None: no
    mask, every key)."""
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return None
    last = attention_mask[:, 0, -1, :] if attention_mask.dim() == 4 else attention_mask[:, -1, :]
    return last if last.dtype == torch.bool else last == 0


def _new_tokens(attention_mask, seq: int) -> Optional[torch.Tensor]:
    """Which of the `seq` new tokens are real (not padding): [batch, seq] bool, or None (all).
    Only left padding (padding before the real tokens) is served."""
    visible = _visible(attention_mask)
    if visible is None:
        return None
    real = visible[:, -seq:]
    if bool((real.long().cummax(1).values != real.long()).any()):
        raise NotImplementedError("openmla: only left padding is supported (a padding token after "
                                  "a real one in the batch)")
    return real


def _check_lengths(attention_mask, layer) -> None:
    """The last query sees exactly the sequence's cached tokens (no holes in the mask)."""
    visible = _visible(attention_mask)
    if visible is not None and not torch.equal(visible.sum(-1), layer.real.to(visible.device)):
        raise NotImplementedError("openmla: the attention mask hides tokens other than left "
                                  "padding; the transformers integration serves causal attention "
                                  "over left-padded batches only")


def _layer_of(module, cache):
    """The OpenMLA cache layer of this module, or a throw-away one (no cache passed)."""
    if cache is None:
        page_size, kv_format, extra_kv_format = module._openmla_defaults
        if module._openmla_kind == "v4":
            return OpenMLAV4CacheLayer(_BlockTable(page_size), kv_format, module.config,
                                       module.layer_type, extra_kv_format), None
        return OpenMLACacheLayer(_BlockTable(page_size), kv_format), None
    if not isinstance(cache, OpenMLACache):
        raise TypeError(f"openmla: the model's attention runs through OpenMLA and needs an "
                        f"OpenMLACache, got {type(cache).__name__}: pass "
                        "cache=openmla.integrations.transformers.OpenMLACache(model)")
    return cache.layers[module.layer_idx], cache


def _cache_of(kwargs, cache):
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    return cache


def _plain_dtype(kv_format: str):
    return torch.float16 if kv_format == "fp16" else torch.bfloat16


def _forward_v3(self, hidden_states, position_embeddings, attention_mask=None, cache=None,
                **kwargs):
    cache = _cache_of(kwargs, cache)
    layer, _ = _layer_of(self, cache)
    batch, seq = hidden_states.shape[:2]
    q_nope, q_rot, latent, _ = _project(self, hidden_states, position_embeddings)
    # Left padding is not cached: each sequence's own length, and the causal rule of
    # dense_decode (query j sees t <= L - s_q + j) puts its real queries on its real keys
    seqlens = layer.append(latent, _new_tokens(attention_mask, seq))
    _check_lengths(attention_mask, layer)
    q = _absorbed_query(self, q_nope, q_rot, _plain_dtype(layer.kv_format))
    out, _ = openmla.dense_decode(q, layer.kv_cache, layer.table.tensor(q.device), seqlens,
                                  softmax_scale=float(self.scaling), causal=True)
    return _output(self, out, hidden_states.dtype), None


def _indexer_mask(attention_mask, batch, seq, length, device):
    """The [b, s, t] mask V3.2's indexer scores against (transformers' 4D mask, or causal)."""
    if attention_mask is not None:
        return attention_mask[:, 0, :, :]
    t = torch.arange(length, device=device)
    s = torch.arange(length - seq, length, device=device)
    return (t[None, :] <= s[:, None]).expand(batch, seq, length)


def _forward_v32(self, hidden_states, position_embeddings, attention_mask=None, cache=None,
                 position_ids=None, **kwargs):
    cache = _cache_of(kwargs, cache)
    layer, owner = _layer_of(self, cache)
    batch, seq = hidden_states.shape[:2]
    q_nope, q_rot, latent, q_resid = _project(self, hidden_states, position_embeddings)
    layer.append(latent, _new_tokens(attention_mask, seq))
    _check_lengths(attention_mask, layer)
    length = layer.length  # transformers' count, padding included (the indexer's key axis)
    mask = _indexer_mask(attention_mask, batch, seq, length, hidden_states.device)
    # Without a cache (owner None) the indexer scores this call's tokens only, as they are all.
    topk = self.indexer(hidden_states, q_resid, position_embeddings, mask, position_ids,
                        cache=owner)  # [b, s, k] token positions
    # Causality: a query at position p attends keys t <= p. The indexer already scored later keys
    # (and padding) -inf, but picks them anyway when fewer than index_topk keys are visible.
    # Key t of transformers' (left-padded) axis is cached token t - padding.
    query_pos = torch.arange(length - seq, length, device=topk.device).view(1, seq, 1)
    pad = layer.padding.to(topk.device).view(batch, 1, 1)
    topk = topk.long()
    keep = (topk <= query_pos) & (topk >= pad)
    topk = torch.where(keep, topk - pad, torch.full_like(topk, -1))
    q = _absorbed_query(self, q_nope, q_rot, torch.bfloat16)
    scale = float(self.scaling)
    if seq == 1:
        slots = layer.table.slots(topk.view(batch, -1)).view(batch, seq, -1)
        out, _ = openmla.sparse_decode(q, layer.kv_cache, slots, kv_format=layer.kv_format,
                                       softmax_scale=scale)
    else:
        gathered = layer.gather("bf16")
        longest = gathered.shape[1]
        kv = gathered.reshape(batch * longest, 1, _D_QK)
        offset = (torch.arange(batch, device=topk.device) * longest).view(batch, 1, 1)
        indices = torch.where(topk >= 0, topk + offset, topk).to(torch.int32)
        out, _, _ = openmla.sparse_prefill(q.view(batch * seq, -1, _D_QK), kv,
                                           indices.view(batch * seq, 1, -1),
                                           softmax_scale=scale)
        out = out.view(batch, seq, -1, _LATENT)
    return _output(self, out, hidden_states.dtype), None


# --- DeepSeek-V4: sliding window + compressed entries + sink ------------------------------------

def _v4_rope(x, cos, sin):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb
    return apply_rotary_pos_emb(x, cos, sin)


def _check_unpadded_window(attention_mask, window: int) -> None:
    """The last query of a sliding-window mask without padding sees its last `window` keys."""
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return
    last = attention_mask[..., -1, -window:]
    ok = bool(last.all()) if attention_mask.dtype == torch.bool else bool((last == 0).all())
    if not ok:
        raise NotImplementedError("openmla: padded DeepSeek-V4 batches are not supported by the "
                                  "transformers integration yet: give every sequence the same "
                                  "length")


def _forward_v4(self, hidden_states, position_embeddings, position_ids=None, attention_mask=None,
                cache=None, **kwargs):
    """transformers' DeepseekV4Attention.forward, the attention through OpenMLA: sparse_decode
    (one new token) or sparse_prefill over the sliding window of the main cache and the visible
    compressed entries in one softmax with the per-head sink."""
    cache = _cache_of(kwargs, cache)
    _check_unpadded_window(attention_mask, self.sliding_window)
    layer, owner = _layer_of(self, cache)
    batch, seq = hidden_states.shape[:2]
    cos, sin = position_embeddings[self.rope_layer_type]

    q_residual = self.q_a_norm(self.q_a_proj(hidden_states))
    q = self.q_b_proj(q_residual).view(batch, seq, -1, self.head_dim).transpose(1, 2)
    q = _v4_rope(self.q_b_norm(q), cos, sin)                          # [b, h, s, 512]
    kv = self.kv_norm(self.kv_proj(hidden_states)).view(batch, seq, 1, self.head_dim)
    kv = _v4_rope(kv.transpose(1, 2), cos, sin)                       # [b, 1, s, 512]
    layer.append(kv[:, 0])
    length = layer.length
    device = hidden_states.device

    # main cache: query at position p sees p - W < t <= p (transformers' sliding window)
    query_pos = torch.arange(length - seq, length, device=device).view(1, seq, 1)
    window = query_pos - torch.arange(self.sliding_window - 1, -1, -1, device=device)
    window = torch.where(window >= 0, window, torch.full_like(window, -1)).expand(batch, -1, -1)

    # compressed entries: the model's compressor (its state lives in the layer), mirrored into
    # the extra paged cache; visible entries from the compressor's block bias (causality and,
    # for CSA, the indexer's top-k); HCA decode (no bias) sees every entry
    picks = None
    if self.compressor is not None:
        compressed, block_bias = self.compressor(hidden_states, q_residual, position_ids,
                                                 owner, self.layer_idx)
        total = layer.sync_extra(compressed[:, 0])
        if total > 0:
            entries = torch.arange(total, device=device).view(1, 1, total)
            if block_bias is None:
                visible = torch.ones(batch, seq, total, dtype=torch.bool, device=device)
            else:
                visible = block_bias[:, 0] == 0
            picks = torch.where(visible, entries, torch.full_like(entries, -1))

    q = q.transpose(1, 2).to(torch.bfloat16).contiguous()              # [b, s, h, 512]
    sinks = self.sinks.detach().float().contiguous()
    scale = float(self.scaling)
    fmt = layer.kv_format
    if seq == 1:
        slots = layer.table.slots(window.reshape(batch, -1)).view(batch, seq, -1)
        extra = {}
        if picks is not None:
            extra_slots = layer.extra.table.slots(picks.reshape(batch, -1)).view(batch, seq, -1)
            extra = dict(extra_k_cache=layer.extra.kv_cache, extra_indices=extra_slots,
                         extra_kv_format=layer.extra.kv_format)
        out, _ = openmla.sparse_decode(q, layer.kv_cache, slots, kv_format=fmt, attn_sink=sinks,
                                       softmax_scale=scale, **extra)
    else:
        # one kv for sparse_prefill: every main token of the batch, then every compressed entry
        main = layer.gather("bf16").reshape(batch * length, 1, _LATENT)
        offset = (torch.arange(batch, device=device) * length).view(batch, 1, 1)
        indices = torch.where(window >= 0, window + offset, window)
        kv_all = main
        if picks is not None:
            comp = layer.extra.gather("bf16").reshape(batch * total, 1, _LATENT)
            comp_offset = batch * length + (torch.arange(batch, device=device) * total).view(
                batch, 1, 1)
            indices = torch.cat([indices, torch.where(picks >= 0, picks + comp_offset, picks)], -1)
            kv_all = torch.cat([main, comp], 0)
        out, _, _ = openmla.sparse_prefill(q.view(batch * seq, -1, _LATENT), kv_all,
                                           indices.to(torch.int32).view(batch * seq, 1, -1),
                                           softmax_scale=scale, attn_sink=sinks)
        out = out.view(batch, seq, -1, _LATENT)

    # K = V: the output's RoPE slice is rotated back at the query position, as transformers does
    attn_output = out.to(hidden_states.dtype)
    attn_output = _v4_rope(attn_output.transpose(1, 2), cos, -sin).transpose(1, 2)
    grouped = attn_output.reshape(batch, seq, self.config.o_groups, -1)
    grouped = self.o_a_proj(grouped).flatten(2)
    return self.o_b_proj(grouped), None


_FORWARDS = {"v3": _forward_v3, "v32": _forward_v32, "v4": _forward_v4}
