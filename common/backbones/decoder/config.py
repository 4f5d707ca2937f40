"""The config of a Llama-family decoder (Llama 2/3 incl. SmolLM2, Qwen2/2.5, Qwen3), read from and written as
a Hugging Face config.json.

One dataclass covers the three `model_type`s because they differ only in a few switches: Qwen2 adds biases
to q/k/v, Qwen3 normalises q and k per head (and may set a head_dim other than hidden / heads), Llama 3 scales
RoPE's low frequencies. Anything this decoder would compute differently from transformers (another
activation, another RoPE scaling, a sliding window, MLP biases) is refused with a CheckpointError naming the
file, rather than loaded and silently wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.backbones.checkpoint import CheckpointError, read_config

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
"""model_type -> the transformers class name written into an exported config.json."""

_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
LLAMA3_KEYS = ("factor", "high_freq_factor", "low_freq_factor", "original_max_position_embeddings")
"""The numbers of a rope_scaling {"rope_type": "llama3", ...} entry (all required)."""


@dataclass(frozen=True)
class DecoderConfig:
    """The fields of a Hugging Face decoder config.json that shape the model."""

    model_type: str
    """"llama", "qwen2" or "qwen3"."""
    vocab_size: int
    """Rows of the embedding table (and of the output head)."""
    hidden_size: int
    """Width of the residual stream."""
    num_hidden_layers: int
    """Decoder blocks."""
    num_attention_heads: int
    """Query heads per block."""
    num_key_value_heads: int
    """Key/value heads per block (grouped-query attention: it divides num_attention_heads)."""
    head_dim: int
    """Width of one head (hidden_size // num_attention_heads unless the config says otherwise, as Qwen3's)."""
    intermediate_size: int
    """Hidden width of each block's SwiGLU MLP."""
    max_position_embeddings: int
    """The longest context the model was trained for (informational: RoPE has no table)."""
    rms_norm_eps: float
    """Epsilon of every RMSNorm."""
    rope_theta: float
    """RoPE base (10,000 in Llama 2, 500,000 in Llama 3, 100,000 in SmolLM2, 1,000,000 in Qwen)."""
    rope_scaling: tuple[tuple[str, float | str], ...] | None
    """Llama 3's frequency scaling as sorted (key, value) items incl. ("rope_type", "llama3"); None without."""
    tie_word_embeddings: bool
    """The output head is the embedding table (no lm_head weight)."""
    attention_bias: bool
    """q/k/v projections have biases (always in qwen2; llama and qwen3: config "attention_bias")."""
    qk_norm: bool
    """RMSNorm over head_dim on q and k before RoPE (qwen3)."""
    bos_token_id: int | None
    """The beginning-of-sequence token, when the config names one."""
    eos_token_id: tuple[int, ...]
    """Tokens that end generation (a config may give one id or a list)."""

    @property
    def o_proj_bias(self) -> bool:
        """The attention output projection has a bias: llama and qwen3 follow attention_bias, qwen2 never."""
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @classmethod
    def from_folder(cls, folder: str | Path) -> DecoderConfig:
        """The config of a Hugging Face checkpoint folder (CheckpointError naming its config.json)."""
        folder = Path(folder)
        return cls.from_dict(read_config(folder), str(folder / "config.json"))

    @classmethod
    def from_dict(cls, raw: dict, where: str) -> DecoderConfig:
        """A config.json dict -> DecoderConfig, with Hugging Face's defaults for absent optional fields;
        `where` (the file) is named in every CheckpointError."""
        model_type = raw.get("model_type")
        if model_type not in ARCHITECTURES:
            raise CheckpointError(
                f"{where}: model_type {model_type!r} is not a supported decoder (one of {sorted(ARCHITECTURES)})"
            )
        _check_unsupported(raw, where)
        shape = _shape_fields(raw, where)
        return cls(
            model_type=model_type,
            **shape,
            max_position_embeddings=_positive_int(raw, "max_position_embeddings", where, 2048),
            rms_norm_eps=_number(raw, "rms_norm_eps", where, 1e-6),
            rope_theta=_number(raw, "rope_theta", where, 10000.0),
            rope_scaling=_rope_scaling(raw.get("rope_scaling"), where),
            tie_word_embeddings=_flag(raw, "tie_word_embeddings", where, False),
            attention_bias=model_type == "qwen2" or _flag(raw, "attention_bias", where, False),
            qk_norm=model_type == "qwen3",
            bos_token_id=_bos_id(raw.get("bos_token_id"), where),
            eos_token_id=_token_ids(raw.get("eos_token_id"), "eos_token_id", where),
        )

    def to_dict(self) -> dict[str, Any]:
        """A Hugging Face config.json (architectures, model_type and every field) that from_dict reads back
        and transformers loads."""
        eos = list(self.eos_token_id)
        return {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "torch_dtype": "float32",
        }


def _check_unsupported(raw: dict, where: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(
            f"{where}: hidden_act {act!r} is not supported (this decoder's MLP is SwiGLU: 'silu')"
        )
    if raw.get("mlp_bias"):
        raise CheckpointError(f"{where}: mlp_bias true is not supported (MLP projections without biases)")
    if raw.get("use_sliding_window"):
        raise CheckpointError(f"{where}: use_sliding_window true is not supported (full attention only)")


def _shape_fields(raw: dict, where: str) -> dict[str, int]:
    """The integer sizes, defaults filled in and checked to fit together."""
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: lacks {', '.join(missing)}")
    out = {k: _positive_int(raw, k, where) for k in _REQUIRED}
    heads = out["num_attention_heads"]
    out["num_key_value_heads"] = _positive_int(raw, "num_key_value_heads", where, heads)
    if heads % out["num_key_value_heads"]:
        raise CheckpointError(
            f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
            f"{out['num_key_value_heads']}"
        )
    if raw.get("head_dim") is None and out["hidden_size"] % heads:
        raise CheckpointError(
            f"{where}: hidden_size {out['hidden_size']} is not a multiple of num_attention_heads {heads} "
            "and no head_dim is given"
        )
    out["head_dim"] = _positive_int(raw, "head_dim", where, out["hidden_size"] // heads)
    return out


def _positive_int(raw: dict, key: str, where: str, default: int | None = None) -> int:
    value = raw.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _number(raw: dict, key: str, where: str, default: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def _flag(raw: dict, key: str, where: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise CheckpointError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _token_ids(value: Any, key: str, where: str) -> tuple[int, ...]:
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CheckpointError(f"{where}: {key} must be a token id or a list of them, got {value!r}")
    return tuple(ids)


def _bos_id(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(f"{where}: bos_token_id must be a token id or null, got {value!r}")
    return value


def _rope_scaling(value: Any, where: str) -> tuple[tuple[str, float | str], ...] | None:
    """None, or Llama 3's scaling as sorted items; any other scaling type is refused (this decoder would
    compute different frequencies than the checkpoint was trained with)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: rope_scaling must be an object or null, got {value!r}")
    kind = value.get("rope_type", value.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(
            f"{where}: rope_scaling type {kind!r} is not supported (only 'llama3' frequency scaling)"
        )
    items: dict[str, float | str] = {"rope_type": "llama3"}
    for key in LLAMA3_KEYS:
        number = value.get(key)
        if not isinstance(number, int | float) or isinstance(number, bool) or number <= 0:
            raise CheckpointError(f"{where}: rope_scaling {key} must be a positive number, got {number!r}")
        items[key] = int(number) if key == "original_max_position_embeddings" else float(number)
    if items["high_freq_factor"] <= items["low_freq_factor"]:
        raise CheckpointError(f"{where}: rope_scaling high_freq_factor must exceed low_freq_factor")
    return tuple(sorted(items.items()))
