"""Reading a Hugging Face checkpoint folder: config.json and model.safetensors, with clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used; the message names the folder and what is wrong."""


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a dict (CheckpointError if the folder or the file is missing or bad)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder (a Hugging Face checkpoint folder is needed)")
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's model.safetensors as numpy arrays (CheckpointError if it is missing,
    truncated or not a safetensors file)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no model.safetensors")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from None


class TensorSource:
    """Tensors by name, with a prefix some checkpoints add (`bert.` in BertFor* models) removed, handed out
    with their expected shape checked."""

    def __init__(self, folder: Path, tensors: dict[str, np.ndarray], strip_prefixes: tuple[str, ...] = ()):
        self.folder = Path(folder)
        self._tensors = {}
        for name, value in tensors.items():
            for prefix in strip_prefixes:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            self._tensors[name] = value

    def take(self, name: str, shape: tuple[int, ...], *alternatives: str) -> np.ndarray:
        """The tensor `name` (or the first of `alternatives` present, for renamed layouts) as float32."""
        for candidate in (name, *alternatives):
            if candidate in self._tensors:
                value = self._tensors[candidate]
                if tuple(value.shape) != tuple(shape):
                    raise CheckpointError(
                        f"{self.folder}: tensor {candidate} has shape {tuple(value.shape)}, "
                        f"config.json implies {tuple(shape)}"
                    )
                return np.asarray(value, np.float32)
        raise CheckpointError(f"{self.folder}: model.safetensors has no tensor {name}")
