"""A slow, plainly written float64 numpy forward pass of the Llama family (Llama, Qwen2, Qwen3) and writers
of tiny random Hugging Face checkpoint folders, for the decoder's tests (and anyone else's).

The reference works from the checkpoint tensors by their Hugging Face names and the config.json dict, one
row, one layer, one head and one query at a time: RMSNorm, RoPE in transformers' rotate_half layout (dim j
pairs with dim j + head_dim / 2), Llama 3's frequency scaling written as its three cases, grouped-query
attention by looking up each query head's key/value head, SwiGLU, and the output head (the embedding table
when tied). It shares no code with common/backbones, so a mistake there shows up as a mismatch here.

Helpers: VARIANTS (tiny configs of each kind), random_hf_tensors, write_hf_folder (config.json plus
model.safetensors, or shards and a model.safetensors.index.json), left_padded_batch, and reference_logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

_COMMON = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 128,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

VARIANTS: dict[str, dict] = {
    # Llama 2 / SmolLM2 style: tied embeddings, grouped-query attention (4 query heads, 2 kv heads).
    "llama_tied": {
        **_COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    },
    # Qwen2 / 2.5: q/k/v biases (no o_proj bias), a separate output head, 4 query heads on one kv head.
    "qwen2_bias": {
        **_COMMON,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "eos_token_id": [2, 3],
    },
    # Qwen3: per-head q/k RMSNorm, head_dim 16 where hidden / heads would be 8, separate head.
    "qwen3_qknorm": {
        **_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
    # Llama 3: rope_scaling llama3, chosen so the tiny head's 8 frequencies fall in all three cases
    # (wavelengths 6.3 < 64/4 kept, 19.9 and 62.8 interpolated, the rest > 64/1 divided by 8); o_proj bias too.
    "llama3_scaled": {
        **_COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "tie_word_embeddings": False,
        "attention_bias": True,
    },
}
"""Tiny configs (2 layers, d 32, vocab 64) of each supported kind, as config.json dicts."""


def _dims(config: dict) -> tuple[int, int, int, int]:
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return heads, kv, head_dim, config["intermediate_size"]


def _biases(config: dict) -> tuple[str, ...]:
    """The attention projections with a bias, by transformers' modelling code."""
    if config["model_type"] == "qwen2":
        return ("q_proj", "k_proj", "v_proj")
    return ("q_proj", "k_proj", "v_proj", "o_proj") if config.get("attention_bias") else ()


def random_hf_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor of the config's *ForCausalLM in the Hugging Face layout (Linear weights [out, in],
    float32), random but large enough that every part moves the logits; lm_head.weight only when untied.
    Adds a rotary inv_freq buffer, as old checkpoints carry, that loaders must ignore."""
    rng = np.random.default_rng(seed)
    h, v = config["hidden_size"], config["vocab_size"]
    heads, kv, d, i = _dims(config)

    def r(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": r(v, h, scale=1.0), "model.norm.weight": 1 + r(h, scale=0.1)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        t[f"{p}.input_layernorm.weight"] = 1 + r(h, scale=0.1)
        t[f"{p}.post_attention_layernorm.weight"] = 1 + r(h, scale=0.1)
        shapes = {
            "q_proj": (heads * d, h),
            "k_proj": (kv * d, h),
            "v_proj": (kv * d, h),
            "o_proj": (h, heads * d),
        }
        for name, shape in shapes.items():
            t[f"{p}.self_attn.{name}.weight"] = r(*shape)
            if name in _biases(config):
                t[f"{p}.self_attn.{name}.bias"] = r(shape[0], scale=0.5)
        if config["model_type"] == "qwen3":
            t[f"{p}.self_attn.q_norm.weight"] = 1 + r(d, scale=0.2)
            t[f"{p}.self_attn.k_norm.weight"] = 1 + r(d, scale=0.2)
        t[f"{p}.mlp.gate_proj.weight"], t[f"{p}.mlp.up_proj.weight"] = r(i, h), r(i, h)
        t[f"{p}.mlp.down_proj.weight"] = r(h, i)
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(d // 2, np.float32)
    if not config.get("tie_word_embeddings", False):
        t["lm_head.weight"] = r(v, h)
    return t


def write_hf_folder(
    folder: Path, config: dict, tensors: dict[str, np.ndarray] | None = None, shards: int = 1
) -> Path:
    """`folder` with config.json and the tensors (random_hf_tensors(config) when None): one
    model.safetensors, or with shards > 1 the files model-0000k-of-0000n.safetensors (tensors dealt out in
    turn) and a model.safetensors.index.json mapping each tensor to its file, as transformers saves them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = random_hf_tensors(config) if tensors is None else tensors
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    files = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    weight_map = {name: files[k % shards] for k, name in enumerate(sorted(tensors))}
    for file in files:
        save_file({n: tensors[n] for n, f in weight_map.items() if f == file}, str(folder / file))
    total = sum(int(t.nbytes) for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return folder


def left_padded_batch(
    vocab: int, lengths: list[int], length: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random tokens [B, length] int32 with row b's `lengths[b]` real tokens at the right end (left padding,
    pad id 0), their mask, and the RoPE positions cumsum(mask) - 1 (-1 on padding) the decoder expects."""
    rng = np.random.default_rng(seed)
    mask = np.arange(length)[None, :] >= length - np.asarray(lengths)[:, None]
    tokens = np.where(mask, rng.integers(3, vocab, (len(lengths), length)), 0).astype(np.int32)
    positions = (np.cumsum(mask, axis=1) - 1).astype(np.int32)
    return tokens, mask, positions


def reference_inv_freq(config: dict) -> np.ndarray:
    """RoPE inverse frequencies (float64), Llama 3's scaling applied case by case."""
    _, _, d, _ = _dims(config)
    theta = config.get("rope_theta", 10000.0)
    freqs = [1.0 / theta ** (2 * j / d) for j in range(d // 2)]
    scaling = config.get("rope_scaling")
    if scaling is None:
        return np.array(freqs)
    old = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    out = []
    for f in freqs:
        wavelength = 2 * np.pi / f
        if wavelength < old / high:
            out.append(f)
        elif wavelength > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(vec: np.ndarray, position: int, inv_freq: np.ndarray) -> np.ndarray:
    """One head's vector rotated: the pair (j, j + d/2) turns by position * inv_freq[j]."""
    half = len(vec) // 2
    out = np.empty_like(vec)
    for j in range(half):
        c, s = np.cos(position * inv_freq[j]), np.sin(position * inv_freq[j])
        out[j] = vec[j] * c - vec[j + half] * s
        out[j + half] = vec[j + half] * c + vec[j] * s
    return out


def _linear(t: dict, name: str, x: np.ndarray) -> np.ndarray:
    y = x @ t[f"{name}.weight"].astype(np.float64).T
    bias = t.get(f"{name}.bias")
    return y if bias is None else y + bias


def _attention(config: dict, t: dict, p: str, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """One layer's attention over one row's real tokens x [n, hidden] (causal)."""
    heads, kv, d, _ = _dims(config)
    eps, inv_freq = config.get("rms_norm_eps", 1e-6), reference_inv_freq(config)
    q, k, v = (_linear(t, f"{p}.self_attn.{m}_proj", x) for m in "qkv")
    n = len(x)
    out = np.zeros((n, heads * d))
    for head in range(heads):
        g = head // (heads // kv)  # the key/value head this query head reads
        for i in range(n):
            qi = q[i, head * d : (head + 1) * d]
            if config["model_type"] == "qwen3":
                qi = _rms_norm(qi, t[f"{p}.self_attn.q_norm.weight"], eps)
            qi = _rope(qi, positions[i], inv_freq)
            scores, values = [], []
            for j in range(i + 1):
                kj = k[j, g * d : (g + 1) * d]
                if config["model_type"] == "qwen3":
                    kj = _rms_norm(kj, t[f"{p}.self_attn.k_norm.weight"], eps)
                scores.append(qi @ _rope(kj, positions[j], inv_freq) / np.sqrt(d))
                values.append(v[j, g * d : (g + 1) * d])
            w = np.exp(np.array(scores) - max(scores))
            out[i, head * d : (head + 1) * d] = (w / w.sum()) @ np.array(values)
    return _linear(t, f"{p}.self_attn.o_proj", out)


def _row_logits(config: dict, t: dict, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    eps = config.get("rms_norm_eps", 1e-6)
    t = {k: v.astype(np.float64) for k, v in t.items()}
    h = t["model.embed_tokens.weight"][ids]
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        h = h + _attention(config, t, p, _rms_norm(h, t[f"{p}.input_layernorm.weight"], eps), positions)
        x = _rms_norm(h, t[f"{p}.post_attention_layernorm.weight"], eps)
        gate, up = _linear(t, f"{p}.mlp.gate_proj", x), _linear(t, f"{p}.mlp.up_proj", x)
        h = h + _linear(t, f"{p}.mlp.down_proj", gate / (1 + np.exp(-gate)) * up)
    h = _rms_norm(h, t["model.norm.weight"], eps)
    tied = config.get("tie_word_embeddings", False)
    return h @ (t["model.embed_tokens.weight"] if tied else t["lm_head.weight"]).T


def reference_logits(
    config: dict,
    tensors: dict[str, np.ndarray],
    tokens: np.ndarray,
    mask: np.ndarray,
    positions: np.ndarray | None = None,
) -> np.ndarray:
    """Float64 logits [B, L, vocab] of the checkpoint (config.json dict + Hugging Face tensors) on `tokens`
    [B, L]: each row's real tokens (mask True) attend causally to the earlier real tokens of their row, at
    RoPE `positions` (default cumsum(mask) - 1). Padded positions are NaN (nothing defines them)."""
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    positions = np.cumsum(mask, axis=1) - 1 if positions is None else np.asarray(positions)
    out = np.full((*tokens.shape, config["vocab_size"]), np.nan)
    for b in range(tokens.shape[0]):
        real = np.flatnonzero(mask[b])
        out[b, real] = _row_logits(config, tensors, tokens[b, real], positions[b, real])
    return out
