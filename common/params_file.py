"""A policy's parameters as flat arrays by name (`params_to_flat`, the form snapshots travel in, and its
inverse), and as one safetensors file: those arrays plus the model
config in the file's metadata, so a reader can rebuild the policy without any other input. How
`python -m learner eval` hands a restored checkpoint to the actor-side evaluator (`python -m actors eval`)
without the learner importing actor code."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.config import ModelConfig

MODEL_KEY = "model"
"""Metadata entry holding the model config as JSON (ModelConfig.to_dict)."""
FIELDS_KEY = "fields"
"""Metadata entry holding where the parameters came from as JSON (a run's update, version, step limit)."""


def write(
    path: Path, flat: dict[str, np.ndarray], model_cfg: ModelConfig, fields: dict | None = None
) -> None:
    """`flat` and the model config, and `fields` (JSON-able) when given, to one safetensors file."""
    from safetensors.numpy import save_file

    metadata = {MODEL_KEY: json.dumps(model_cfg.to_dict())}
    if fields is not None:
        metadata[FIELDS_KEY] = json.dumps(fields)
    save_file(flat, str(path), metadata=metadata)


def fields(path: Path) -> dict:
    """The `fields` a file was written with ({} when none); ValueError if it is not a readable file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return json.loads((f.metadata() or {}).get(FIELDS_KEY, "{}"))
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable parameters file ({e})") from None


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


def params_to_flat(params: nnx.State) -> dict[str, np.ndarray]:
    """Parameter state -> {"blocks/0/attn/query/kernel": array}, the form snapshots travel in."""
    flat: dict[str, np.ndarray] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for key in sorted(node, key=str):
                walk(node[key], f"{prefix}/{key}" if prefix else str(key))
        else:
            # A private host copy: snapshots are sent zero-copy by a ZeroMQ I/O thread while the next
            # train step may already reuse (donate) the device buffers.
            flat[prefix] = np.array(node, copy=True)

    walk(nnx.to_pure_dict(params), "")
    return flat


def flat_to_params(template: nnx.State, flat: dict[str, np.ndarray]) -> nnx.State:
    """Inverse of params_to_flat, checked against the template's names, shapes and dtypes (the template
    may be `abstract`: only its structure is used)."""
    expected = _shapes(template)
    if set(flat) != set(expected):
        missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
        raise ValueError(f"parameter names differ: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, ref in expected.items():
        got = flat[name]
        if got.shape != ref.shape or got.dtype != ref.dtype:
            raise ValueError(f"parameter {name}: got {got.dtype}{got.shape}, expected {ref.dtype}{ref.shape}")

    def build(node, prefix: str):
        if isinstance(node, dict):
            return {k: build(v, f"{prefix}/{k}" if prefix else str(k)) for k, v in node.items()}
        return jnp.asarray(flat[prefix])

    state = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(state, build(nnx.to_pure_dict(template), ""))
    return state


def _shapes(params: nnx.State) -> dict[str, jax.ShapeDtypeStruct]:
    """{"blocks/0/attn/query/kernel": its shape and dtype}, the names params_to_flat gives, for arrays and
    abstract values alike."""
    shapes: dict[str, jax.ShapeDtypeStruct] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for key in node:
                walk(node[key], f"{prefix}/{key}" if prefix else str(key))
        else:
            shapes[prefix] = jax.ShapeDtypeStruct(tuple(node.shape), np.dtype(node.dtype))

    walk(nnx.to_pure_dict(params), "")
    return shapes
