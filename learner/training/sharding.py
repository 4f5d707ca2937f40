"""Where the learner's training state lies on the device mesh (learner/training/mesh.py): parameters,
optimizer state and batches.

Parameter shardings of the policy are derived from parameter names and shapes (`param_specs`: replicated,
FSDP over 'data', or tensor-parallel over 'model'), because the policy carries no sharding annotations; a
pretrained backbone inside it (a fine-tuned text encoder, a decoder) carries logical axis names, and its
layout comes from those (common/backbones/axes.py). The optimizer state follows the parameter shardings
leaf for leaf (`opt_state_shardings`); a batch is split over 'data' along its leading (episode) axis.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.backbones import axes
from common.backbones.decoder.lora import split_trained
from learner.batch import Batch
from learner.config import PARAM_SHARDINGS
from learner.training.mesh import AXES, DATA, MODEL

FSDP_MIN_SIZE = 4096
"""Parameters with fewer elements than this stay replicated over 'data' under FSDP (not worth a gather)."""
GENERIC_MIN_DIM = 128
"""A kernel no rule names is split over 'model' only if all its dims are at least this (not a small head)."""

# Tensor-parallel rules for the 'model' axis: (regex on the parameter name, dim to split). The name is the
# one params_to_flat uses, e.g. "blocks/0/attn/query/kernel". "largest" = the larger dim that divides.
MODEL_RULES: tuple[tuple[str, int | str], ...] = (
    # nnx.Embed [vocab, d]: the vocabulary (the larger dim) is split; lookups become a masked local gather
    # plus an all-reduce.
    (r"(^|/)embedding$", "largest"),
    # nnx.MultiHeadAttention q/k/v kernels [d, heads, head_dim]: split the heads (Megatron column-parallel).
    (r"(^|/)attn/(query|key|value)/kernel$", 1),
    # ...and the output projection [heads, head_dim, d]: split the heads (row-parallel; one all-reduce).
    (r"(^|/)attn/out/kernel$", 0),
    # MLP [d, mlp] then [mlp, d]: split the hidden dim in both (column- then row-parallel).
    (r"(^|/)mlp_in/kernel$", -1),
    (r"(^|/)mlp_out/kernel$", 0),
)


def param_name(path: tuple[Any, ...]) -> str:
    """A jax key path into an nnx.State -> "blocks/0/attn/query/kernel" (the params_to_flat name)."""
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    if parts and parts[-1] == "value":  # the nnx.Variable's payload
        parts.pop()
    return "/".join(parts)


def _model_dim(name: str, shape: tuple[int, ...], m: int) -> int | None:
    """Which dim of a parameter to split over 'model' (of size m), or None to replicate it."""
    if m == 1 or len(shape) < 2:  # biases, norms, the summary token: replicated
        return None
    for pattern, dim in MODEL_RULES:
        if re.search(pattern, name):
            if dim == "largest":
                order = sorted(range(len(shape)), key=lambda i: -shape[i])
                return next((i for i in order if shape[i] % m == 0), None)
            dim = dim % len(shape)
            return dim if shape[dim] % m == 0 else None
    # A kernel no rule names (a layer added later): split its largest dim when it is a big square-ish
    # matrix; heads projecting to a handful of outputs and projections of a few input features stay whole.
    if name.endswith("kernel") and min(shape) >= GENERIC_MIN_DIM:
        order = sorted(range(len(shape)), key=lambda i: -shape[i])
        return next((i for i in order if shape[i] % m == 0), None)
    return None


def _spec_for(name: str, shape: tuple[int, ...], mesh_shape: dict[str, int], mode: str, min_size: int) -> P:
    axes: list[str | None] = [None] * len(shape)
    if mode in ("model", "fsdp"):
        dim = _model_dim(name, shape, mesh_shape[MODEL])
        if dim is not None:
            axes[dim] = MODEL
    d = mesh_shape[DATA]
    if mode == "fsdp" and d > 1 and math.prod(shape) >= min_size:
        free = sorted((i for i in range(len(shape)) if axes[i] is None), key=lambda i: -shape[i])
        dim = next((i for i in free if shape[i] % d == 0), None)
        if dim is not None:
            axes[dim] = DATA
    while axes and axes[-1] is None:  # P('model', None) -> P('model'); P(None) -> P()
        axes.pop()
    return P(*axes)


def param_specs(params_state: Any, mesh: Mesh | AbstractMesh, mode: str, *, min_size: int = FSDP_MIN_SIZE):
    """A pytree of PartitionSpec with the structure of `params_state` (concrete or from jax.eval_shape).

    Rules, by parameter name (as in common.policies.pointer.network.params_to_flat) and shape:

    - "replicated": P() everywhere.
    - "model" (tensor parallelism over the 'model' axis, replicated over 'data'): embeddings split their
      larger (vocabulary) dim; attention q/k/v kernels [d, heads, head_dim] and the output kernel
      [heads, head_dim, d] split the heads; MLP kernels split their hidden dim (mlp_in's output, mlp_out's
      input); any other kernel whose dims are all >= GENERIC_MIN_DIM splits its largest dim. Biases, norm
      scales, position tables, the summary token and small heads (type/direction/value/pointers, the
      feature projections) stay replicated. A dim is only split when the axis size divides it; otherwise
      the parameter stays replicated (layout never changes the result, only memory and speed).
    - "fsdp": the "model" split (when the 'model' axis is > 1), then every parameter of at least
      `min_size` elements also splits its largest remaining dim that the 'data' axis size divides over
      'data'.
    """
    if mode not in PARAM_SHARDINGS:
        raise ValueError(f"param sharding mode must be one of {PARAM_SHARDINGS}, got {mode!r}")
    missing = set(AXES) - set(mesh.axis_names)
    if missing:
        raise ValueError(f"mesh needs axes {AXES}, got {mesh.axis_names}")
    mesh_shape = dict(mesh.shape)
    specs = jax.tree_util.tree_map_with_path(
        lambda path, x: _spec_for(param_name(path), tuple(x.shape), mesh_shape, mode, min_size), params_state
    )
    return _with_logical_specs(params_state, specs, mesh, mode)


def _with_logical_specs(params_state: Any, specs: Any, mesh: Mesh | AbstractMesh, mode: str) -> Any:
    """`specs` with every parameter that names its logical axes (the `out_sharding` metadata of the
    pretrained backbones in common/backbones/: a fine-tuned text encoder, a decoder) laid out by those
    names and axes.LOGICAL_AXIS_RULES (FSDP over 'data', heads and MLP over 'model') instead of by name
    patterns; "model" keeps only the 'model' splits, "replicated" none."""
    if mode == "replicated":
        return specs
    sizes = dict(mesh.shape)

    def pick(variable: Any, spec: Any) -> Any:
        logical = variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Variable) else None
        if logical is None:
            return spec
        by_axes = axes.logical_to_mesh_spec(tuple(logical), variable.get_value().shape, sizes)
        if mode == "model":
            by_axes = P(*(a if a == MODEL else None for a in by_axes))
        return spec.replace(by_axes) if isinstance(spec, nnx.Variable) else by_axes

    return jax.tree.map(pick, params_state, specs, is_leaf=lambda x: isinstance(x, nnx.Variable))


def named_shardings(specs: Any, mesh: Mesh) -> Any:
    """PartitionSpec leaves -> NamedSharding on `mesh` (NamedSharding leaves pass through)."""
    return jax.tree.map(
        lambda s: s if isinstance(s, NamedSharding) else NamedSharding(mesh, s),
        specs,
        is_leaf=lambda x: isinstance(x, P | NamedSharding),
    )


def shard_params(params: Any, mesh: Mesh, specs: Any) -> Any:
    """Place parameters on the mesh per `specs` (PartitionSpec or NamedSharding leaves).

    An array already laid out that way is returned as is (no copy), so the sharded step's donation then
    also invalidates the caller's original: keep a copy (e.g. model.params_to_flat) if it is still needed.
    """
    return jax.device_put(params, named_shardings(specs, mesh))


def opt_state_shardings(optimizer: optax.GradientTransformation, param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings of `optimizer`'s state: leaves that mirror a parameter (Adam's mu and nu, momentum, ...)
    get that parameter's sharding; everything else (step counts, hyperparameters) is replicated.

    Uses optax.tree_map_params, which finds the parameter-shaped subtrees of the state by calling
    `optimizer.init` on a placeholder. Only the tree structure is needed, so the state is traced
    abstractly from scalar stand-ins for the parameters (no shapes, no allocation). Optimizers whose state
    is not a per-parameter mirror (e.g. factored Adafactor) need their own rule.
    """
    shardings = named_shardings(param_shardings, mesh)
    is_sharding = lambda x: isinstance(x, NamedSharding)  # noqa: E731
    scalars = jax.tree.map(lambda _: jax.ShapeDtypeStruct((), jnp.float32), shardings, is_leaf=is_sharding)
    abstract_state = jax.eval_shape(optimizer.init, scalars)
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_state,
        shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct | NamedSharding),
    )


def init_opt_state(optimizer: optax.GradientTransformation, params: Any, mesh: Mesh, param_shardings: Any):
    """optimizer.init of what trains (all of `params`, or their LoRA adapters alone: train_step's
    `split_trained`), created directly in the shardings of `opt_state_shardings` (jit out_shardings), so an
    FSDP/tensor-parallel state is never materialized whole on one device."""
    out = opt_state_shardings(optimizer, split_trained(param_shardings)[0], mesh)
    return jax.jit(optimizer.init, out_shardings=out)(split_trained(params)[0])


# ---- batches -----------------------------------------------------------------------------------------


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Every batch array is split over 'data' along its leading (episode) axis, replicated over 'model'."""
    return NamedSharding(mesh, P(DATA))


def shard_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Place one process's host Batch (learner.batch.collate) on the mesh, split over 'data': each device
    receives only its slice. Multi-host training builds its global batch from every process's rows with
    learner.training.multihost.global_batch instead."""
    d = dict(mesh.shape)[DATA]
    sizes = {
        jax.tree_util.keystr(path): np.shape(x)[0] if np.ndim(x) else None
        for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]
    }
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise ValueError(f"batch arrays must share one leading batch axis, got sizes {sizes}")
    size = next(iter(sizes.values()))
    if size % d:
        raise ValueError(
            f"batch size {size} is not divisible by the mesh's 'data' axis ({d} devices); "
            f"use a batch size that is a multiple of {d}"
        )
    return jax.device_put(batch, batch_sharding(mesh))
