"""A policy's parameters as one safetensors file: the flat arrays of `model.params_to_flat` plus the model
config in the file's metadata, so a reader can rebuild the policy without any other input. How
`python -m learner eval` hands a restored checkpoint to the actor-side evaluator (`python -m actors eval`)
without the learner importing actor code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.config import ModelConfig

MODEL_KEY = "model"
"""Metadata entry holding the model config as JSON (ModelConfig.to_dict)."""


def write(path: Path, flat: dict[str, np.ndarray], model_cfg: ModelConfig) -> None:
    from safetensors.numpy import save_file

    save_file(flat, str(path), metadata={MODEL_KEY: json.dumps(model_cfg.to_dict())})


def read(path: Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """The model config and flat parameters of a file `write` made; ValueError if it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            metadata = f.metadata() or {}
            flat = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable parameters file ({e})") from None
    if MODEL_KEY not in metadata:
        raise ValueError(f"{path}: no model config in its metadata (not written by common.params_file)")
    return ModelConfig.from_dict(json.loads(metadata[MODEL_KEY])), flat
