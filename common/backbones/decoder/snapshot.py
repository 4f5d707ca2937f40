"""A fine-tuned decoder as one safetensors file: the trained parameters plus where the base came from.

With LoRA the file holds only the adapters (a 135M base is ~540 MB in float32, its rank-8 adapters on
every projection ~5 MB), so a snapshot is cheap to publish, keep and copy; without LoRA it holds every
parameter. The metadata names the base checkpoint (as `load_pretrained` spells it) and the LoRA
settings, so `apply` can rebuild the exact model: load the base, add adapters, overwrite the stored
parameters. Tensors are named by their path in the module ("layers/3/self_attn/q_proj/lora_b"), the
same names the learner's flat parameters use.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.backbones.checkpoint import CheckpointError
from common.backbones.decoder.llama import Decoder
from common.backbones.decoder.lora import LoraConfig

META_KEY = "decoder"
"""The safetensors metadata key holding the JSON description."""


def _name(path: tuple[Any, ...]) -> str:
    return "/".join(str(k) for k in path)


def trained_state(model: Decoder, lora: LoraConfig | None) -> nnx.State:
    """What training changes: the adapters with LoRA, every parameter without."""
    return nnx.state(model, nnx.LoRAParam if lora is not None else nnx.Param)


def flat_params(model: Decoder, lora: LoraConfig | None) -> dict[str, np.ndarray]:
    """The trained parameters as name -> host array (float32 for bfloat16 ones: safetensors.numpy has no
    bfloat16)."""
    flat = nnx.to_flat_state(trained_state(model, lora))
    return {_name(path): np.asarray(jnp.asarray(v.get_value(), jnp.float32)) for path, v in flat}


def write(path: Path, model: Decoder, base: str, lora: LoraConfig | None, param_dtype: str) -> int:
    """Write the snapshot; returns its size in bytes."""
    from safetensors.numpy import save_file

    meta = {"base": base, "lora": asdict(lora) if lora else None, "param_dtype": param_dtype}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(flat_params(model, lora), str(tmp), metadata={META_KEY: json.dumps(meta)})
    tmp.replace(path)
    return path.stat().st_size


def read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(description, tensors) of a snapshot file (CheckpointError naming the file otherwise)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = (f.metadata() or {}).get(META_KEY)
            flat = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path}: not a readable decoder snapshot ({err})") from None
    if meta is None:
        raise CheckpointError(
            f"{path}: a safetensors file without the {META_KEY!r} metadata of a decoder snapshot"
        )
    meta = json.loads(meta)
    if meta.get("lora") is not None:
        meta["lora"] = LoraConfig(**{**meta["lora"], "targets": tuple(meta["lora"]["targets"])})
    return meta, flat


def apply(model: Decoder, lora: LoraConfig | None, flat: dict[str, np.ndarray], where: str) -> None:
    """Overwrite the model's trained parameters with the snapshot's (every one must be present, with its
    shape; CheckpointError naming the first that is not)."""
    for path, variable in nnx.to_flat_state(trained_state(model, lora)):
        name, current = _name(path), variable.get_value()
        if name not in flat:
            raise CheckpointError(f"{where}: snapshot has no tensor {name}")
        if tuple(flat[name].shape) != tuple(current.shape):
            raise CheckpointError(
                f"{where}: tensor {name} has shape {tuple(flat[name].shape)}, the model {tuple(current.shape)}"
            )
        variable.set_value(jnp.asarray(flat[name], current.dtype))
