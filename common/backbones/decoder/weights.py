"""Hugging Face tensor names <-> the decoder's parameters: building a Decoder from host tensors or a
checkpoint folder (optionally straight onto a device mesh), and the tensors of an export (`merge_lora` folds
LoRA adapters into the kernels first).

One table (`checkpoint_layout`) maps each parameter path to its stored name and shape, and serves every
direction: `from_tensors` (host tensors: the GGUF reader's), `load_folder` (model.safetensors or a sharded
model.safetensors.index.json, memory-mapped) and `to_tensors` (its inverse). With a mesh, each parameter is
created as a jax.Array laid out by the logical-axis rules (common/backbones/axes.py), every device's block
read by itself, so a checkpoint larger than one device is never whole anywhere. Every tensor's name and
shape is checked before anything is placed, with the same CheckpointError messages on and off a mesh.
LoRA adapters are not in checkpoints: they are initialised (B = 0) by the module itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from common.backbones.axes import block_reader, partition_specs
from common.backbones.checkpoint import LazyTensorSource, TensorSource, read_tensors, weights_name
from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.llama import Decoder
from common.backbones.decoder.lora import ADAPTERS, BASE, LoraConfig

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Stored:
    """Where one parameter lives in a Hugging Face checkpoint."""

    name: str
    """Tensor name, e.g. model.layers.0.self_attn.q_proj.weight."""
    shape: tuple[int, ...]
    """As stored (torch's Linear weights are [out, in]: the transpose of the module's kernel)."""
    transpose: bool = False
    """The module holds the transpose of the stored tensor."""


def checkpoint_layout(cfg: DecoderConfig) -> dict[Path_, Stored]:
    """Decoder parameter path (as nnx.to_flat_state spells it) -> stored tensor, in the order they are
    checked; exactly the base parameters of Decoder(cfg)."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    layout: dict[Path_, Stored] = {
        ("embed_tokens", "embedding"): Stored("model.embed_tokens.weight", (cfg.vocab_size, h))
    }

    def linear(at: Path_, name: str, d_in: int, d_out: int, bias: bool = False) -> None:
        layout[(*at, "kernel")] = Stored(f"{name}.weight", (d_out, d_in), transpose=True)
        if bias:
            layout[(*at, "bias")] = Stored(f"{name}.bias", (d_out,))

    for n in range(cfg.num_hidden_layers):
        p, at = f"model.layers.{n}", ("layers", n)
        layout[(*at, "input_layernorm", "weight")] = Stored(f"{p}.input_layernorm.weight", (h,))
        for proj, d_out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            linear((*at, "self_attn", proj), f"{p}.self_attn.{proj}", h, d_out, cfg.attention_bias)
        linear((*at, "self_attn", "o_proj"), f"{p}.self_attn.o_proj", q, h, cfg.o_proj_bias)
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                layout[(*at, "self_attn", norm, "weight")] = Stored(f"{p}.self_attn.{norm}.weight", (d,))
        layout[(*at, "post_attention_layernorm", "weight")] = Stored(
            f"{p}.post_attention_layernorm.weight", (h,)
        )
        linear((*at, "mlp", "gate_proj"), f"{p}.mlp.gate_proj", h, i)
        linear((*at, "mlp", "up_proj"), f"{p}.mlp.up_proj", h, i)
        linear((*at, "mlp", "down_proj"), f"{p}.mlp.down_proj", i, h)
    layout[("norm", "weight")] = Stored("model.norm.weight", (h,))
    if not cfg.tie_word_embeddings:
        linear(("lm_head",), "lm_head", h, cfg.vocab_size)
    return layout


def from_tensors(
    cfg: DecoderConfig,
    tensors: Mapping[str, np.ndarray],
    *,
    where: str,
    param_dtype: Any = jnp.float32,
    lora: LoraConfig | None = None,
    mesh: Mesh | None = None,
    seed: int = 0,
) -> Decoder:
    """A Decoder filled from host tensors by Hugging Face name (CheckpointError naming `where` and the
    tensor for a missing or misshapen one; tensors it does not use, such as lm_head.weight of a tied model
    or rotary inv_freq, are ignored). LoRA adapters, when asked for, start fresh from `seed` (B = 0)."""
    source = TensorSource(Path(where), dict(tensors), label="the checkpoint")
    return _build(cfg, source, param_dtype, lora, mesh, seed)


def load_folder(
    folder: str | Path,
    *,
    param_dtype: Any = jnp.float32,
    lora: LoraConfig | None = None,
    mesh: Mesh | None = None,
    seed: int = 0,
) -> tuple[DecoderConfig, Decoder]:
    """The config and decoder of a Hugging Face folder: config.json plus model.safetensors or the shards of
    model.safetensors.index.json. With a `mesh` (axes 'data' and 'model'), each device's block of each
    weight is read from the memory-mapped files by itself; the result equals the unsharded load exactly,
    and a bad checkpoint gets the same message either way."""
    folder = Path(folder)
    cfg = DecoderConfig.from_folder(folder)
    if mesh is None:
        source = TensorSource(folder, read_tensors(folder), label=weights_name(folder))
        return cfg, _build(cfg, source, param_dtype, lora, None, seed)
    with LazyTensorSource(folder) as lazy:
        return cfg, _build(cfg, lazy, param_dtype, lora, mesh, seed)


def merge_lora(model: Decoder) -> Decoder:
    """A new Decoder without adapters whose kernels are W + (alpha / rank) * A @ B (summed in float32, then
    stored in the parameter dtype): the same outputs as `model`, as a plain checkpoint. A model without
    adapters is returned as is."""
    if model.lora is None:
        return model
    plain = nnx.eval_shape(lambda: type(model)(model.cfg, rngs=nnx.Rngs(0), param_dtype=model.param_dtype))
    graphdef, abstract = nnx.split(plain)
    base = {path: v.get_value() for path, v in nnx.to_flat_state(nnx.state(model, BASE))}
    adapters = {path: v.get_value() for path, v in nnx.to_flat_state(nnx.state(model, ADAPTERS))}
    merged = []
    for path, variable in nnx.to_flat_state(abstract):
        value = base[path]
        a = adapters.get((*path[:-1], "lora_a")) if path[-1] == "kernel" else None
        if a is not None:
            b = adapters[(*path[:-1], "lora_b")]
            delta = (a.astype(jnp.float32) @ b.astype(jnp.float32)) * model.lora.scale
            value = (value.astype(jnp.float32) + delta).astype(value.dtype)
        merged.append((path, variable.replace(value)))
    return nnx.merge(graphdef, nnx.from_flat_state(merged))


def to_tensors(model: Decoder) -> dict[str, np.ndarray]:
    """Hugging Face name -> float32 array of every weight (adapters merged first): the inverse of
    `from_tensors`, for safetensors.numpy.save_file."""
    model = merge_lora(model)
    values = {path: v.get_value() for path, v in nnx.to_flat_state(nnx.state(model))}
    out = {}
    for path, stored in checkpoint_layout(model.cfg).items():
        value = np.asarray(jax.device_get(values[path]), np.float32)
        out[stored.name] = np.ascontiguousarray(value.T if stored.transpose else value)
    return out


def _build(
    cfg: DecoderConfig, source: Any, param_dtype: Any, lora: LoraConfig | None, mesh, seed: int
) -> Decoder:
    """Every base parameter read from `source` (TensorSource or LazyTensorSource; all names and shapes
    checked first), placed whole or by `mesh`; adapters initialised by the module."""

    def create() -> Decoder:
        return Decoder(cfg, rngs=nnx.Rngs(seed), param_dtype=param_dtype, lora=lora)

    graphdef, abstract = nnx.split(nnx.eval_shape(create))
    layout = checkpoint_layout(cfg)
    keys = {path: source.find(s.name, s.shape) for path, s in layout.items()}
    specs = dict(nnx.to_flat_state(partition_specs(abstract, mesh))) if mesh is not None else {}
    adapters = dict(nnx.to_flat_state(_fresh_adapters(create, lora, mesh)))
    placed = []
    for path, variable in nnx.to_flat_state(abstract):
        if path in adapters:
            placed.append((path, adapters[path]))
            continue
        stored, shape = layout[path], variable.get_value().shape
        if mesh is None:
            block = source.read(keys[path], ())
            array = jnp.asarray(block.T if stored.transpose else block, param_dtype)
        else:
            sharding = NamedSharding(mesh, specs[path].get_value())
            reader = block_reader(source, keys[path], stored.transpose, sharding, shape)
            array = jax.make_array_from_callback(
                shape, sharding, lambda i, r=reader: r(i).astype(param_dtype)
            )
        placed.append((path, variable.replace(array)))
    return nnx.merge(graphdef, nnx.from_flat_state(placed))


def _fresh_adapters(create, lora: LoraConfig | None, mesh: Mesh | None) -> nnx.State:
    """The LoRA adapters a fresh Decoder gets (an empty State without LoRA). Built under jit, so the base
    weights the constructor would also initialise are never computed; placed by the rules with a mesh."""
    if lora is None:
        return nnx.State({})
    state = jax.jit(lambda: nnx.state(create(), ADAPTERS))()
    if mesh is None:
        return state
    return jax.tree.map(
        lambda v, s: v.replace(jax.device_put(v.get_value(), NamedSharding(mesh, s.get_value()))),
        state,
        partition_specs(state, mesh),
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
