"""Reading a Hugging Face checkpoint folder: config.json and model.safetensors, with clear errors.

Two ways to get at the tensors, with the same names, shape checks and messages: `TensorSource` holds every
tensor in host memory (`read_tensors`), which is simplest when the model fits on one device;
`LazyTensorSource` opens the file memory-mapped and reads only the slices asked for, so a loader that places
weights directly onto a device mesh hands each device its own shard without ever assembling a whole
tensor.
"""

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

    path = _safetensors_path(folder)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from None


def _safetensors_path(folder: Path) -> Path:
    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no model.safetensors")
    return path


def _strip(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _resolve(
    folder: Path, shapes: dict[str, tuple[int, ...]], name: str, shape: tuple[int, ...], alternatives
) -> str:
    """The first of `name`, *`alternatives` that `shapes` holds, checked to have `shape` (CheckpointError
    naming the folder and the tensor otherwise). Shared by both sources so their messages cannot drift."""
    for candidate in (name, *alternatives):
        if candidate in shapes:
            if tuple(shapes[candidate]) != tuple(shape):
                raise CheckpointError(
                    f"{folder}: tensor {candidate} has shape {tuple(shapes[candidate])}, "
                    f"config.json implies {tuple(shape)}"
                )
            return candidate
    raise CheckpointError(f"{folder}: model.safetensors has no tensor {name}")


class TensorSource:
    """Tensors by name, with a prefix some checkpoints add (`bert.` in BertFor* models) removed, handed out
    with their expected shape checked."""

    def __init__(self, folder: Path, tensors: dict[str, np.ndarray], strip_prefixes: tuple[str, ...] = ()):
        self.folder = Path(folder)
        self._tensors = {_strip(name, strip_prefixes): value for name, value in tensors.items()}
        self._shapes = {name: tuple(value.shape) for name, value in self._tensors.items()}

    def take(self, name: str, shape: tuple[int, ...], *alternatives: str) -> np.ndarray:
        """The tensor `name` (or the first of `alternatives` present, for renamed layouts) as float32."""
        key = _resolve(self.folder, self._shapes, name, shape, alternatives)
        return np.asarray(self._tensors[key], np.float32)


class LazyTensorSource:
    """The tensors of a folder's model.safetensors, opened memory-mapped: names (prefixes stripped as in
    `TensorSource`) and shapes come from the file's header, and `read` copies out only the block asked
    for. A sharded loader uses it to give each device just its slice of a weight, so no tensor is ever
    whole in host or device memory. The same CheckpointError messages as `TensorSource` / `read_tensors`.

    Use as a context manager (or call `close`): the file stays mapped until then.
    """

    def __init__(self, folder: Path, strip_prefixes: tuple[str, ...] = ()):
        from safetensors import SafetensorError, safe_open

        self.folder = Path(folder)
        path = _safetensors_path(self.folder)
        try:  # the header is parsed and checked against the file's length here (a truncated file fails)
            self._file = safe_open(str(path), framework="numpy")
            self._file.__enter__()
            stored = list(self._file.keys())
            self._names = {_strip(name, strip_prefixes): name for name in stored}
            self._shapes = {k: tuple(self._file.get_slice(v).get_shape()) for k, v in self._names.items()}
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from None

    def find(self, name: str, shape: tuple[int, ...], *alternatives: str) -> str:
        """The name (after prefix stripping) under which `name` or the first of `alternatives` present is
        stored, checked to have `shape`; nothing is read. Resolve every tensor first to fail before any
        device allocation."""
        return _resolve(self.folder, self._shapes, name, shape, alternatives)

    def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
        """The block `index` (one slice per dim, step 1 or None) of the tensor `key` (from `find`), as a
        float32 numpy array; only that block is copied out of the file."""
        block = self._file.get_slice(self._names[key])[tuple(index)]
        return np.asarray(block, np.float32)

    def close(self) -> None:
        self._file.__exit__(None, None, None)

    def __enter__(self) -> LazyTensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
