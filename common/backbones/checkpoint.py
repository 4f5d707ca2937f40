"""Reading a Hugging Face checkpoint folder: config.json and model.safetensors (or the shards that a
model.safetensors.index.json names), with clear errors.

Two ways to get at the tensors, with the same names, shape checks and messages: `TensorSource` holds every
tensor in host memory (`read_tensors`), which is simplest when the model fits on one device;
`LazyTensorSource` opens the files memory-mapped and reads only the slices asked for, so a loader that
places weights directly onto a device mesh hands each device its own shard without ever assembling a whole
tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
"""The two ways a Hugging Face folder stores its weights: one file, or shards listed by an index."""


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
    return read_json_object(path)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint's file (CheckpointError naming the file when it is not one)."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's model.safetensors (or of all the shards its model.safetensors.index.json
    names) as numpy arrays (CheckpointError if a file is missing, truncated or not a safetensors file)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for path in safetensors_files(folder):
        try:
            tensors.update(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from None
    return tensors


def weights_name(folder: Path) -> str:
    """Which of SINGLE or INDEX holds the folder's weights (SINGLE when both are there), for messages;
    CheckpointError when neither is."""
    folder = Path(folder)
    if (folder / SINGLE).is_file():
        return SINGLE
    if (folder / INDEX).is_file():
        return INDEX
    raise CheckpointError(f"{folder}: no {SINGLE} (nor a sharded {INDEX})")


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: model.safetensors, or each shard that model.safetensors.index.json's
    weight_map (tensor name -> file name) names. CheckpointError for a bad index, or naming the index, the
    shard and a tensor stored there when a shard is missing."""
    folder = Path(folder)
    if weights_name(folder) == SINGLE:
        return [folder / SINGLE]
    index = folder / INDEX
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise CheckpointError(f"{index}: not a readable index ({err})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{index}: needs a weight_map object (tensor name -> shard file name)")
    files: dict[str, str] = {}  # shard file -> the first tensor the index puts there
    for name, file in weight_map.items():
        files.setdefault(file, name)
    for file, name in files.items():
        if Path(file).name != file or not (folder / file).is_file():
            raise CheckpointError(f"{index}: tensor {name} is in shard {file}, which is not in {folder}")
    return [folder / file for file in files]


def _strip(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _resolve(
    folder: Path,
    shapes: dict[str, tuple[int, ...]],
    name: str,
    shape: tuple[int, ...],
    alternatives,
    label: str = SINGLE,
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
    raise CheckpointError(f"{folder}: {label} has no tensor {name}")


class TensorSource:
    """Tensors by name, with a prefix some checkpoints add (`bert.` in BertFor* models) removed, handed out
    with their expected shape checked. `label` says where they came from in messages (model.safetensors,
    the index, or another container such as a GGUF file)."""

    def __init__(
        self,
        folder: Path,
        tensors: dict[str, np.ndarray],
        strip_prefixes: tuple[str, ...] = (),
        label: str = SINGLE,
    ):
        self.folder = Path(folder)
        self.label = label
        self._tensors = {_strip(name, strip_prefixes): value for name, value in tensors.items()}
        self._shapes = {name: tuple(value.shape) for name, value in self._tensors.items()}

    def take(self, name: str, shape: tuple[int, ...], *alternatives: str) -> np.ndarray:
        """The tensor `name` (or the first of `alternatives` present, for renamed layouts) as float32."""
        return self.read(self.find(name, shape, *alternatives), ())

    def find(self, name: str, shape: tuple[int, ...], *alternatives: str) -> str:
        """As LazyTensorSource.find: the key under which the tensor is held, its shape checked."""
        return _resolve(self.folder, self._shapes, name, shape, alternatives, self.label)

    def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
        """As LazyTensorSource.read: the block `index` of the tensor `key` (from `find`), as float32."""
        return np.asarray(self._tensors[key][tuple(index)], np.float32)


class LazyTensorSource:
    """The tensors of a folder's model.safetensors (or of its index's shards), opened memory-mapped: names
    (prefixes stripped as in `TensorSource`) and shapes come from the files' headers, and `read` copies out
    only the block asked for. A sharded loader uses it to give each device just its slice of a weight, so
    no tensor is ever whole in host or device memory. The same CheckpointError messages as `TensorSource`
    / `read_tensors`.

    Use as a context manager (or call `close`): the files stay mapped until then.
    """

    def __init__(self, folder: Path, strip_prefixes: tuple[str, ...] = ()):
        self.folder = Path(folder)
        self.label = weights_name(self.folder)
        self._files: list[Any] = []
        self._where: dict[str, tuple[Any, str]] = {}  # stripped name -> (open file, stored name)
        self._shapes: dict[str, tuple[int, ...]] = {}
        try:
            for path in safetensors_files(self.folder):
                self._open(path, strip_prefixes)
        except CheckpointError:
            self.close()
            raise

    def _open(self, path: Path, strip_prefixes: tuple[str, ...]) -> None:
        from safetensors import SafetensorError, safe_open

        try:  # the header is parsed and checked against the file's length here (a truncated file fails)
            file = safe_open(str(path), framework="numpy")
            file.__enter__()
            self._files.append(file)
            stored_names = list(file.keys())  # a safe_open handle is not iterable
            for stored in stored_names:
                name = _strip(stored, strip_prefixes)
                self._where[name] = (file, stored)
                self._shapes[name] = tuple(file.get_slice(stored).get_shape())
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from None

    def find(self, name: str, shape: tuple[int, ...], *alternatives: str) -> str:
        """The name (after prefix stripping) under which `name` or the first of `alternatives` present is
        stored, checked to have `shape`; nothing is read. Resolve every tensor first to fail before any
        device allocation."""
        return _resolve(self.folder, self._shapes, name, shape, alternatives, self.label)

    def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
        """The block `index` (one slice per dim, step 1 or None) of the tensor `key` (from `find`), as a
        float32 numpy array; only that block is copied out of the file."""
        file, stored = self._where[key]
        return np.asarray(file.get_slice(stored)[tuple(index)], np.float32)

    def close(self) -> None:
        while self._files:
            self._files.pop().__exit__(None, None, None)

    def __enter__(self) -> LazyTensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
