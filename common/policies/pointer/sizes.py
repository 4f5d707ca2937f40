"""The pointer model's size presets, and its size without building it.

`large_model_config` is the preset of `--model-size large` (learner/config.py), at which parameter sharding
over a mesh (learner/training/sharding.py) starts to matter; `abstract_params` and `count_params` size a
config's parameters without allocating them.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from common.config import ModelConfig
from common.policies.pointer import network as model


def large_model_config() -> ModelConfig:
    """A ~134M-parameter preset (vocabulary 32768 x 1024 embedding + 8 blocks of width 1024, MLP 4096),
    the scale at which "model"/"fsdp" parameter sharding starts to matter."""
    return ModelConfig(vocab_size=32768, d_model=1024, num_heads=16, num_layers=8, mlp_dim=4096)


def abstract_params(cfg: ModelConfig, seed: int = 0) -> Any:
    """The parameter state of common.policies.pointer.network.create as ShapeDtypeStructs (jax.eval_shape:
    nothing allocated)."""
    return jax.eval_shape(lambda: model.create(cfg, seed)[1])


def count_params(params: Any) -> int:
    """Number of parameter elements in a state (concrete or abstract)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))
