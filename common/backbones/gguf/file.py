"""Reading a GGUF file (llama.cpp's format) into Hugging Face names, shapes and config.

`read_gguf` opens the file memory-mapped with the `gguf` package's own reader, dequantises every tensor the
decoder needs to float32 with `gguf.quants.dequantize`, renames it to the Hugging Face name
(`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`) with the Hugging Face [out, in] shape,
and builds the config.json dict `DecoderConfig.from_dict` reads from the `{arch}.*` metadata. So one loader
(`decoder_weights.from_tensors`) serves both formats.

One trap: llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of q and k
for the llama architecture, from Hugging Face's rotate-half RoPE layout to the interleaved one llama.cpp's
kernel wants. Loaded as is, the model gives garbage, so `_unpermute` inverts it exactly. qwen2 and qwen3
files are written without the permutation and are taken as they are.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from common.backbones.checkpoint import CheckpointError
from common.backbones.gguf.rope import llama3_scaling
from common.backbones.gguf.tokenizer import special_ids

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
"""GGUF `general.architecture` -> the Hugging Face class the decoder implements."""

SUPPORTED_TYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip
"""Tensor types `gguf.quants.dequantize` turns into floats (the i-quants and ternary types are not here)."""

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
_CORE = (
    "attn_norm",
    "ffn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


@dataclass
class GgufCheckpoint:
    """What a GGUF file holds, in the terms the Hugging Face loader uses."""

    path: Path
    """The file read."""
    config: dict
    """A Hugging Face config.json dict (model_type llama/qwen2/qwen3) that DecoderConfig.from_dict reads."""
    tensors: dict[str, np.ndarray]
    """Hugging Face names -> float32 arrays, [out, in] for weights, q/k un-permuted for llama."""
    metadata: dict[str, Any]
    """Every GGUF key -> its python value (token lists included): the tokenizer is rebuilt from it."""


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name, or None for tensors the decoder has no use for."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK.fullmatch(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
    return None


@lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, cached by (path, size, mtime) so a process hashes a large file once."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256 hex digest (computed once per process while the file is unchanged)."""
    stat = Path(path).stat()
    return _digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def read_gguf(path, *, sha256: str | None = None) -> GgufCheckpoint:
    """The file's config, float32 tensors by Hugging Face name and metadata. With `sha256`, the file is
    checked against it first, so a corrupted or substituted download is refused before anything is parsed.
    Every fault is one CheckpointError naming the file and what to do."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (give the path of a .gguf file)")
    if sha256 is not None:
        got = file_sha256(path)
        if got != sha256.lower():
            raise CheckpointError(
                f"{path}: sha256 mismatch: expected {sha256.lower()}, got {got}; the file is corrupted or "
                "not the one expected: reinstall or download it again"
            )
    reader = _open(path)
    metadata = _metadata(reader, path)
    raw = {tensor.name: tensor for tensor in reader.tensors}
    config = gguf_config(metadata, raw, path)
    tensors = _tensors(raw, config, path)
    return GgufCheckpoint(path=path, config=config, tensors=tensors, metadata=metadata)


def read_metadata(path) -> dict[str, Any]:
    """Only the file's metadata (the tokenizer, the chat template), without dequantising any tensor.

    Parsed once per process while the file is unchanged: the metadata holds the whole vocabulary and its
    merges, which gguf's reader builds field by field (2.1 s for SmolLM2's 49,152 tokens on the 2-core
    machine, each time). Every call gets its own dict and lists, so a caller may change them."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (give the path of a .gguf file)")
    stat = path.stat()
    cached = _cached_metadata(str(path), str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    return {k: list(v) if isinstance(v, list) else v for k, v in cached.items()}


@lru_cache(maxsize=4)
def _cached_metadata(where: str, resolved: str, size: int, mtime_ns: int) -> dict[str, Any]:
    """The parsed metadata of one version of a file (`where` is the path its errors name)."""
    del resolved, size, mtime_ns  # the cache key only
    return _metadata(_open(Path(where)), Path(where))


def _open(path: Path):
    """gguf's memory-mapped reader; a file that is not GGUF or is cut short fails here with its message."""
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as err:
        raise CheckpointError(
            f"{path}: not a complete GGUF file ({err}); the file is damaged, truncated or of another format"
        ) from None


def _metadata(reader, path: Path) -> dict[str, Any]:
    """Every key-value field as a python value (strings decoded, arrays as lists)."""
    metadata = {}
    for name, field in reader.fields.items():
        try:
            metadata[name] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: metadata field {name} is unreadable ({err})") from None
    return metadata


def _key(metadata: dict, key: str, path: Path, default: Any = None) -> Any:
    if key in metadata:
        return metadata[key]
    if default is None:
        raise CheckpointError(f"{path}: GGUF metadata has no {key} (the file is incomplete or not a decoder)")
    return default


def _architecture(metadata: dict, path: Path) -> str:
    arch = _key(metadata, "general.architecture", path)
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return arch


def _head_count_kv(metadata: dict, arch: str, heads: int, path: Path) -> int:
    """Key-value heads; a per-layer list is accepted only when every layer has the same count."""
    value = metadata.get(f"{arch}.attention.head_count_kv", heads)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise CheckpointError(f"{path}: per-layer key-value head counts {value} are not supported")
        value = value[0]
    return int(value)


def gguf_config(metadata: dict, raw: dict, path: Path) -> dict:
    """The Hugging Face config.json dict of a GGUF decoder, from its `{arch}.*` metadata and tensor list
    (vocab size = rows of token_embd, tied embeddings = no output.weight, attention bias = q bias present)."""
    arch = _architecture(metadata, path)
    if "token_embd.weight" not in raw:
        raise CheckpointError(f"{path}: GGUF file has no tensor token_embd.weight")
    heads = int(_key(metadata, f"{arch}.attention.head_count", path))
    hidden = int(_key(metadata, f"{arch}.embedding_length", path))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // heads))
    theta = float(metadata.get(f"{arch}.rope.freq_base", 10000.0))
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(raw["token_embd.weight"].shape[1]),
        "hidden_size": hidden,
        "num_hidden_layers": int(_key(metadata, f"{arch}.block_count", path)),
        "num_attention_heads": heads,
        "num_key_value_heads": _head_count_kv(metadata, arch, heads, path),
        "head_dim": head_dim,
        "intermediate_size": int(_key(metadata, f"{arch}.feed_forward_length", path)),
        "max_position_embeddings": int(metadata.get(f"{arch}.context_length", 2048)),
        "rms_norm_eps": float(_key(metadata, f"{arch}.attention.layer_norm_rms_epsilon", path)),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(metadata, raw, arch, head_dim, theta, path),
        "tie_word_embeddings": "output.weight" not in raw,
        "attention_bias": arch == "qwen2" or "blk.0.attn_q.bias" in raw,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    config.update(_special_ids(metadata))
    return config


def _special_ids(metadata: dict) -> dict:
    """bos/eos ids for config.json, as the tokenizer reads them (end-of-turn ids count as eos ids)."""
    bos, eos, _ = special_ids(metadata)
    out: dict[str, Any] = {} if bos is None else {"bos_token_id": bos}
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else list(eos)
    return out


def _rope_scaling(
    metadata: dict, raw: dict, arch: str, head_dim: int, theta: float, path: Path
) -> dict | None:
    """Llama 3's frequency scaling, which llama.cpp stores only as the per-frequency factors of a
    `rope_freqs.weight` tensor; other scaling types (linear, yarn, ...) are refused by name."""
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind not in ("none", ""):
        raise CheckpointError(f"{path}: RoPE scaling type {kind!r} is not supported (only Llama 3's)")
    if "rope_freqs.weight" not in raw:
        return None
    factors = _dequantize(raw["rope_freqs.weight"], path)
    return llama3_scaling(factors.reshape(-1), head_dim, theta, str(path))


def _dequantize(tensor, path: Path) -> np.ndarray:
    """One tensor as a float32 array in numpy (Hugging Face) order: GGUF lists dims fastest first."""
    from gguf.quants import dequantize

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise CheckpointError(
            f"{path}: tensor {tensor.name} has quantisation type {kind}, which is not supported "
            f"(supported: {', '.join(SUPPORTED_TYPES)}); convert the model to one of those"
        )
    values = dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.array(values, dtype=np.float32).reshape(shape)  # a copy: nothing keeps the file mapped


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `reshape(heads, 2, rows // heads // 2, ...).swapaxes(1, 2)` on the rows of
    a llama q or k weight (or bias), restoring Hugging Face's rotate-half order within each head."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _required(config: dict) -> list[str]:
    """GGUF names of the tensors a decoder with this config cannot do without."""
    names = ["token_embd.weight", "output_norm.weight"]
    if not config["tie_word_embeddings"]:
        names.append("output.weight")
    per_block = [f"{part}.weight" for part in _CORE]
    if config["attention_bias"]:
        per_block += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    if config["model_type"] == "qwen3":
        per_block += ["attn_q_norm.weight", "attn_k_norm.weight"]
    blocks = range(config["num_hidden_layers"])
    return names + [f"blk.{i}.{part}" for i in blocks for part in per_block]


def _tensors(raw: dict, config: dict, path: Path) -> dict[str, np.ndarray]:
    """Every tensor the decoder uses, dequantised, renamed, and un-permuted for llama's q and k."""
    missing = [name for name in _required(config) if name not in raw]
    if missing:
        raise CheckpointError(
            f"{path}: GGUF file has no tensor {missing[0]} ({hf_name(missing[0])})"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
            + "; the file is incomplete or of another model family"
        )
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for name, tensor in raw.items():
        target = hf_name(name)
        if target is None:
            continue
        value = _dequantize(tensor, path)
        part = name.split(".")[-2]
        if config["model_type"] == "llama" and part in heads:
            if value.shape[0] % (2 * heads[part]):
                raise CheckpointError(f"{path}: tensor {name} has {value.shape[0]} rows, not whole heads")
            value = _unpermute(value, heads[part])
        out[target] = value
    return out
