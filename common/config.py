"""Typed configuration shared by the learner and the actors.

The learner owns the model configuration and sends it to every actor in WELCOME, so both sides always
build the same network and featurize observations the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Size of the default policy and of its featurized inputs."""

    vocab_size: int = 4096
    """Buckets of the hashing tokenizer (id 0 is padding)."""
    max_instruction_tokens: int = 16
    """Instruction words kept; the typed-text pointer chooses among them."""
    max_elements: int = 24
    """UI elements kept per screen, in tree order; the tap pointer chooses among them."""
    max_element_tokens: int = 6
    """Words kept per element label."""
    d_model: int = 64
    """Width of the transformer."""
    num_heads: int = 4
    """Attention heads per layer."""
    num_layers: int = 2
    """Transformer blocks over [summary, instruction words, elements]."""
    mlp_dim: int = 128
    """Hidden width of each block's MLP."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        values = {k: v for k, v in data.items() if k in names}
        for k, v in values.items():
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"model config field {k} must be a positive integer, got {v!r}")
        return cls(**values)
