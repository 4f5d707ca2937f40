"""A Llama-family decoder in Flax NNX (Llama 2/3 incl. SmolLM2, Qwen2/2.5, Qwen3), computing what
transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM compute, with a KV cache for decoding.

Pre-norm blocks: x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)). Attention is grouped-query (each key/value
head serves num_attention_heads / num_key_value_heads query heads), with rotary position embeddings in
Hugging Face's rotate-half layout (the two halves of each head are the rotated pairs; llama.cpp's GGUF
stores q/k interleaved, and its reader un-permutes them into this layout), Llama 3's frequency scaling when
the config has it, q/k/v biases (Qwen2) and per-head q/k RMSNorm before RoPE (Qwen3). Parameters are float32
or bfloat16 and the computation runs in that dtype, except RMSNorm statistics, RoPE and the softmax (float32)
and the logits (float32).

Module attributes mirror Hugging Face's names, so a parameter path reads like its checkpoint tensor
(`layers[3].self_attn.q_proj.kernel` <- `model.layers.3.self_attn.q_proj.weight`, transposed);
common/backbones/decoder/weights.py holds that table. Every parameter carries logical axis names
(common/backbones/axes.py) for sharding.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.backbones.axes import names
from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.lora import LoraConfig, Projection


class KVCache(NamedTuple):
    """Keys and values of every layer for `T` slots per row (a pytree, so it passes through jax.jit)."""

    keys: jax.Array
    """[layers, B, T, kv_heads, head_dim], after RoPE."""
    values: jax.Array
    """Same shape as keys."""
    valid: jax.Array
    """[B, T] bool: the slot holds a real token (False: padding, or not written yet)."""
    end: jax.Array
    """int32 scalar: slots written so far (the same for every row; the next call writes from here)."""


def init_cache(cfg: DecoderConfig, batch: int, max_len: int, dtype: Any = jnp.float32) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens (prompt and generated together)."""
    shape = (cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
    return KVCache(
        keys=jnp.zeros(shape, dtype),
        values=jnp.zeros(shape, dtype),
        valid=jnp.zeros((batch, max_len), bool),
        end=jnp.zeros((), jnp.int32),
    )


def rope_frequencies(cfg: DecoderConfig) -> np.ndarray:
    """RoPE's inverse frequencies [head_dim / 2] (float32), with Llama 3's scaling when configured: the
    wavelengths longer than original_max_position_embeddings / low_freq_factor are stretched by `factor`,
    those shorter than ... / high_freq_factor kept, and the band between interpolated smoothly."""
    d = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    scaling = cfg.rope_scaling_dict
    if scaling is not None:
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv_freq
        smooth = np.clip((old_len / wavelen - low) / (high - low), 0.0, 1.0)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return inv_freq.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """x [B, L, heads, head_dim] rotated by `positions` [B, L] (Hugging Face's rotate_half layout: dim i
    pairs with dim i + head_dim / 2), in float32, returned in x's dtype."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, head_dim / 2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array) -> jax.Array:
    """Grouped-query attention: q [B, L, heads, d], k and v [B, S, kv_heads, d], allowed [B, L, S] ->
    [B, L, heads * d]. Query head h reads key/value head h // (heads / kv_heads), as transformers'
    repeat_kv. Scores and softmax in float32; a query with no allowed key (padding) gets a uniform,
    finite average instead of NaN.

    Laid out heads first ([B, kv_heads, group * L, d] against [B, kv_heads, S, d]): two plain batched
    matmuls, whose gradients XLA:CPU computes without transposing the [L, S] probabilities; with the
    heads inside each row (`blkgd,bskd->bkgls`) the update's attention took 1.4x as long, forward and
    backward (benchmarks/lm_agent.py)."""
    b, n, heads, d = q.shape
    kv = k.shape[2]
    g = heads // kv
    qh = q.reshape(b, n, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * n, d)
    kh, vh = (t.astype(q.dtype).transpose(0, 2, 1, 3) for t in (k, v))
    scores = jnp.einsum("bkqd,bksd->bkqs", qh, kh, preferred_element_type=jnp.float32) / np.sqrt(d)
    mask = jnp.broadcast_to(allowed[:, None, None], (b, kv, g, n, allowed.shape[-1]))
    scores = jnp.where(mask.reshape(scores.shape), scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, vh)
    return out.reshape(b, kv, g, n, d).transpose(0, 3, 1, 2, 4).reshape(b, n, heads * d)


class RMSNorm(nnx.Module):
    """x / sqrt(mean(x^2) + eps), computed in float32 and cast back, then times the weight (the order of
    transformers' LlamaRMSNorm, which matters in bfloat16)."""

    def __init__(self, dim: int, eps: float, param_dtype: Any = jnp.float32):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype), **names("norm"))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * normed.astype(x.dtype)


class LayerKV(NamedTuple):
    """The cache arrays threaded through the layers of one call: every layer writes its new keys and
    values into its own slice, at slots end .. end + L - 1."""

    keys: jax.Array
    values: jax.Array
    end: jax.Array

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> tuple[LayerKV, jax.Array, jax.Array]:
        at = (layer, 0, self.end, 0, 0)
        keys = jax.lax.dynamic_update_slice(self.keys, k[None].astype(self.keys.dtype), at)
        values = jax.lax.dynamic_update_slice(self.values, v[None].astype(self.values.dtype), at)
        return self._replace(keys=keys, values=values), keys[layer], values[layer]


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE, optional q/k/v biases and optional per-head q/k RMSNorm."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs, param_dtype: Any, lora: LoraConfig | None):
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d

        def proj(name: str, d_in: int, d_out: int, axes: tuple[str, str], bias: bool) -> Projection:
            adapter = lora if lora is not None and name in lora.targets else None
            return Projection(d_in, d_out, axes, bias=bias, rngs=rngs, param_dtype=param_dtype, lora=adapter)

        self.q_proj = proj("q_proj", h, self.heads * d, ("embed", "heads"), cfg.attention_bias)
        self.k_proj = proj("k_proj", h, self.kv_heads * d, ("embed", "kv_heads"), cfg.attention_bias)
        self.v_proj = proj("v_proj", h, self.kv_heads * d, ("embed", "kv_heads"), cfg.attention_bias)
        self.o_proj = proj("o_proj", self.heads * d, h, ("heads", "embed"), cfg.o_proj_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype) if cfg.qk_norm else None

    def __call__(self, x, positions, allowed, inv_freq, cache: LayerKV | None, layer: int, prefix_kv=None):
        """`prefix_kv`: (keys, values) [1, P, kv_heads, head_dim] of a prefix every row shares (`keys_values`
        of it), prepended to each row's own; `allowed` then covers P + L keys."""
        b, n, _ = x.shape
        q = self.q_proj(x).reshape(b, n, self.heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q, positions, inv_freq)
        k, v = self.keys_values(x, positions, inv_freq)
        if cache is not None:
            cache, k, v = cache.write(layer, k, v)
        if prefix_kv is not None:
            pk, pv = (jnp.broadcast_to(t, (b, *t.shape[1:])).astype(k.dtype) for t in prefix_kv)
            k, v = jnp.concatenate([pk, k], axis=1), jnp.concatenate([pv, v], axis=1)
        return self.o_proj(attend(q, k, v, allowed)), cache

    def keys_values(self, x, positions, inv_freq) -> tuple[jax.Array, jax.Array]:
        """Keys (after RoPE) and values [B, L, kv_heads, head_dim] of normalized inputs x [B, L, hidden]."""
        b, n, _ = x.shape
        k = self.k_proj(x).reshape(b, n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, n, self.kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, positions, inv_freq), v


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs, param_dtype: Any, lora: LoraConfig | None):
        h, i = cfg.hidden_size, cfg.intermediate_size

        def proj(name: str, d_in: int, d_out: int, axes: tuple[str, str]) -> Projection:
            adapter = lora if lora is not None and name in lora.targets else None
            return Projection(d_in, d_out, axes, bias=False, rngs=rngs, param_dtype=param_dtype, lora=adapter)

        self.gate_proj = proj("gate_proj", h, i, ("embed", "mlp"))
        self.up_proj = proj("up_proj", h, i, ("embed", "mlp"))
        self.down_proj = proj("down_proj", i, h, ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """One pre-norm block: x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x))."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs, param_dtype: Any, lora: LoraConfig | None):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype)
        self.self_attn = Attention(cfg, rngs, param_dtype, lora)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype)
        self.mlp = MLP(cfg, rngs, param_dtype, lora)

    def __call__(self, x, positions, allowed, inv_freq, cache: LayerKV | None, layer: int, prefix_kv=None):
        normed = self.input_layernorm(x)
        out, cache = self.self_attn(normed, positions, allowed, inv_freq, cache, layer, prefix_kv)
        x = x + out
        return x + self.mlp(self.post_attention_layernorm(x)), cache

    def prefix_pass(self, x, positions, allowed, inv_freq) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """A shared prefix [1, P, hidden] through this block: its output and its keys and values, which
        every row's attention in this block prepends (`__call__`'s `prefix_kv`)."""
        kv = self.self_attn.keys_values(self.input_layernorm(x), positions, inv_freq)
        return self(x, positions, allowed, inv_freq, None, 0)[0], kv


class Decoder(nnx.Module):
    """Token ids -> next-token logits, optionally reading and extending a KV cache (see `__call__`)."""

    def __init__(
        self,
        cfg: DecoderConfig,
        *,
        rngs: nnx.Rngs,
        param_dtype: Any = jnp.float32,
        lora: LoraConfig | None = None,
    ):
        self.cfg, self.param_dtype, self.lora = cfg, param_dtype, lora
        self.embed_tokens = nnx.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=param_dtype,
            param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(0.02),
            embedding_metadata=names("vocab", "embed"),
            rngs=rngs,
        )
        self.layers = nnx.List(
            [
                DecoderLayer(
                    cfg, rngs, param_dtype, lora if _adapted(lora, i, cfg.num_hidden_layers) else None
                )
                for i in range(cfg.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Projection(
                cfg.hidden_size,
                cfg.vocab_size,
                ("embed", "vocab"),
                bias=False,
                rngs=rngs,
                param_dtype=param_dtype,
            )
        )

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        """Logits [B, L, vocab] (float32) for tokens [B, L] (int32) at RoPE `positions` [B, L] (with left
        padding: cumsum(mask) - 1), `mask` [B, L] True on real tokens; and the extended cache (None without).

        Without a cache, query i attends to keys j <= i with mask[j]. With one, the L new keys and values
        go to slots end .. end + L - 1 (valid there = mask), query i attends to valid slots s <= end + i,
        and the returned cache has end + L. The caller keeps end + L <= T: past T, XLA would clamp the
        write onto the last L slots. `last_only` returns the last position's logits alone [B, 1, vocab]
        (generation's prefill: the full [B, L, vocab] would be most of its memory)."""
        states, cache = self.states(tokens, positions, mask, cache)
        return self.logits(states[:, -1:] if last_only else states), cache

    def states(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        remat: bool = False,
        trunk: jax.Array | None = None,
        prefix: SharedPrefix | None = None,
        segments: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The final normalized hidden states [B, L, hidden] (before the output head) and the extended
        cache, as `__call__` computes them: for heads of one's own (a value head) and for logits at a few
        chosen positions only (`logits`). `remat` (without a cache) recomputes each block in the backward
        pass instead of keeping its activations: a train step over many prompts then holds one block's
        attention scores at a time, for about a third more compute. `trunk` [B, L, hidden] (without a
        cache): what `trunk` computed for these tokens, so only the blocks above `frozen_layers` run.
        `prefix` (without a cache): tokens every row starts with, left out of `tokens` and computed once
        (one row, each block's keys and values prepended to every row's; `positions` then start after it);
        with `trunk`, its own trunk states come with it. `segments` [B, L] int (without a cache): several
        sequences packed into one row, numbered from 1; a token attends only to its own sequence's keys
        (and the prefix), so each scores as it would alone, at the positions the caller gives it."""
        mask = jnp.asarray(mask, bool)
        _check_shapes(tokens, positions, mask, cache)
        if trunk is not None and (cache is not None or trunk.shape != (*tokens.shape, self.cfg.hidden_size)):
            raise ValueError(
                f"trunk states must be [B, L, {self.cfg.hidden_size}] for tokens {tokens.shape}, without a "
                f"cache; got {trunk.shape}"
            )
        if segments is not None and cache is not None:
            raise ValueError("packed sequences (segments) take no cache")
        if prefix is not None and (cache is not None or (trunk is None) != (prefix.trunk is None)):
            raise ValueError(
                "a shared prefix takes no cache, and trunk states for it exactly when the rows have them"
            )
        x = self.embed_tokens(tokens) if trunk is None else trunk.astype(self.param_dtype)
        first = 0 if trunk is None else self.frozen_layers
        inv_freq = rope_frequencies(self.cfg)
        if cache is None:
            allowed = _self_allowed(mask, segments)
            layer_kv = None
            if prefix is not None:
                px, p_positions, p_allowed = self._prefix_inputs(prefix)
                allowed = jnp.concatenate([jnp.ones((*allowed.shape[:2], px.shape[1]), bool), allowed], -1)
        else:
            valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.end))
            slots = jnp.arange(cache.valid.shape[1])
            query_slots = cache.end + jnp.arange(tokens.shape[1])
            allowed = (slots[None, :] <= query_slots[:, None])[None] & valid[:, None, :]
            layer_kv = LayerKV(cache.keys, cache.values, cache.end)
        for i, layer in enumerate(self.layers):
            if i < first:
                continue
            prefix_kv = None
            if prefix is not None:  # the prefix's one row through this block: its keys and values
                px, prefix_kv = layer.prefix_pass(px, p_positions, p_allowed, inv_freq)
            if remat and layer_kv is None:
                x = _remat_block(layer, x, positions, allowed, inv_freq, prefix_kv)
            else:
                x, layer_kv = layer(x, positions, allowed, inv_freq, layer_kv, i, prefix_kv)
        x = self.norm(x)
        if cache is None:
            return x, None
        new_end = cache.end + tokens.shape[1]
        return x, KVCache(layer_kv.keys, layer_kv.values, valid, new_end.astype(jnp.int32))

    @property
    def frozen_layers(self) -> int:
        """How many blocks from the bottom carry no adapter (0 without LoRA or with every block adapted):
        with LoRA their output, the `trunk`, is a function of the token ids alone."""
        return frozen_layers(self.lora, self.cfg.num_hidden_layers)

    def trunk(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
        """The hidden states [B, L, hidden] after the `frozen_layers` blocks (the embeddings when there
        are none), as `states` computes them: what `states(..., trunk=)` starts from. Real tokens' states
        do not depend on padding (masked keys are never attended to), so they can be kept per prompt."""
        return self.trunk_after(tokens, positions, mask, None)[0]

    def trunk_after(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        prefix: jax.Array | None,
        segments: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """`trunk` of rows that all follow the shared `prefix` [P] ids (left out of `tokens`, `positions`
        starting after it), the prefix computed once as `states` does it: (the rows' states [B, L,
        hidden], the prefix's own [P, hidden]). Equal to the trunk of the whole rows at their positions
        after the prefix, with the prefix's work done once instead of in every row. Without a prefix,
        (`trunk`, None). `segments`: several sequences packed per row, as in `states`."""
        mask = jnp.asarray(mask, bool)
        _check_shapes(tokens, positions, mask, None)
        x = self.embed_tokens(tokens)
        allowed = _self_allowed(mask, segments)
        inv_freq = rope_frequencies(self.cfg)
        px = None
        if prefix is not None:
            px, p_positions, p_allowed = self._prefix_inputs(SharedPrefix(prefix))
            allowed = jnp.concatenate([jnp.ones((*allowed.shape[:2], px.shape[1]), bool), allowed], -1)
        for i in range(self.frozen_layers):
            prefix_kv = None
            if px is not None:
                px, prefix_kv = self.layers[i].prefix_pass(px, p_positions, p_allowed, inv_freq)
            x, _ = self.layers[i](x, positions, allowed, inv_freq, None, i, prefix_kv)
        return x, None if px is None else px[0]

    def _prefix_inputs(self, prefix: SharedPrefix) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(states [1, P, hidden] entering the first block `states` runs, positions, causal mask) of a
        shared prefix."""
        p = prefix.tokens.shape[-1]
        if prefix.trunk is None:
            x = self.embed_tokens(prefix.tokens[None])
        else:
            x = prefix.trunk[None].astype(self.param_dtype)
        return x, jnp.arange(p, dtype=jnp.int32)[None], jnp.tril(jnp.ones((p, p), bool))[None]

    def logits(self, x: jax.Array) -> jax.Array:
        """Final states [..., L, hidden] (`states`) -> float32 logits [..., L, vocab], through the embedding
        table when tied."""
        if self.lm_head is None:
            table = self.embed_tokens.embedding[...]
            return jnp.einsum("...ld,vd->...lv", x, table, preferred_element_type=jnp.float32)
        kernel = self.lm_head.kernel[...]
        return jnp.einsum("...ld,dv->...lv", x, kernel, preferred_element_type=jnp.float32)


def _self_allowed(mask: jax.Array, segments: jax.Array | None) -> jax.Array:
    """[B, L, L] which keys each query of rows [B, L] reads without a cache: real keys at or before it,
    of its own packed sequence when `segments` numbers them."""
    n = mask.shape[1]
    allowed = jnp.tril(jnp.ones((n, n), bool))[None] & mask[:, None, :]
    if segments is not None:
        segments = jnp.asarray(segments)
        allowed = allowed & (segments[:, :, None] == segments[:, None, :])
    return allowed


def _adapted(lora: LoraConfig | None, layer: int, layers: int) -> bool:
    """Whether block `layer` of `layers` gets adapters (LoraConfig.last_layers)."""
    return lora is not None and layer >= frozen_layers(lora, layers)


def frozen_layers(lora: LoraConfig | None, layers: int) -> int:
    """How many of `layers` blocks from the bottom get no adapter under `lora` (0 without LoRA or with
    every block adapted, last_layers 0)."""
    return 0 if lora is None or not lora.last_layers else max(0, layers - lora.last_layers)


def _remat_block(
    layer: DecoderLayer, x: jax.Array, positions, allowed, inv_freq, prefix_kv=None
) -> jax.Array:
    """One block without a cache under jax.checkpoint: its activations are recomputed for the gradient."""
    graphdef, state = nnx.split(layer)

    def block(state, x, prefix_kv):
        return nnx.merge(graphdef, state)(x, positions, allowed, inv_freq, None, 0, prefix_kv)[0]

    return jax.checkpoint(block)(state, x, prefix_kv)


class SharedPrefix(NamedTuple):
    """Tokens every row of a call starts with, computed once for all of them (`Decoder.states`)."""

    tokens: jax.Array
    """[P] int32 ids."""
    trunk: jax.Array | None = None
    """[P, hidden] their `Decoder.trunk` states, when the rows come with theirs."""


def _check_shapes(tokens: jax.Array, positions: jax.Array, mask: jax.Array, cache: KVCache | None) -> None:
    """ValueError for inputs that would otherwise broadcast into a wrong answer (shapes are static)."""
    if tokens.ndim != 2 or positions.shape != tokens.shape or mask.shape != tokens.shape:
        raise ValueError(
            f"tokens, positions and mask must all be [B, L]; got {tokens.shape}, {positions.shape}, {mask.shape}"
        )
    if cache is not None:
        batch, slots = cache.valid.shape
        if batch != tokens.shape[0] or tokens.shape[1] > slots:
            raise ValueError(
                f"a cache of {batch} rows x {slots} slots cannot take tokens of shape {tokens.shape}"
            )
