"""Logical axis names for backbone parameters, and the rules that place them on a ('data', 'model') mesh.

Every parameter of a backbone (the BERT encoder, the Llama-family decoder) carries logical axis names
(flax `out_sharding` metadata: 'vocab', 'embed', 'heads', 'mlp', ...) that say what each dim *is*;
`LOGICAL_AXIS_RULES` says where each name goes on a device mesh with learner.training.mesh's axes ('data', 'model'),
FSDP style: the large dim of every kernel and table over 'data', the attention heads and the MLP hidden dim
over 'model' (tensor parallelism), biases, norms and LoRA ranks replicated. The names live in the modules so
that a layer added later cannot be forgotten by a name-matching rule elsewhere; the rules live in this one
table so the layout changes in one place. `partition_specs` turns the names into PartitionSpecs for a mesh,
and `block_reader` lets a loader create each weight directly as a sharded jax.Array from the slices of a
memory-mapped checkpoint that each device needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA, MODEL = "data", "model"
"""The mesh axes of learner.training.mesh (its AXES), spelled out here because common/ must not import the learner
(tests/test_bert_sharding.py checks that they agree)."""

LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    # Word-embedding rows: the largest table by far (30522 x 384 in MiniLM), split FSDP-style.
    ("vocab", DATA),
    # Position-table rows (512 in MiniLM): split like the vocabulary when the 'data' size divides them.
    ("positions", DATA),
    # Token-type rows (2): too few to split (the table's width then follows 'embed', as in any kernel).
    ("types", None),
    # The hidden width: the FSDP dim of every kernel. In a table it only takes 'data' when the rows could
    # not (an axis is used once per parameter), e.g. MiniLM's 30522-word vocabulary on 4 or 8 devices.
    ("embed", DATA),
    # q/k/v outputs and the attention-output input (heads x head_dim, fused): Megatron column- then
    # row-parallel, so attention needs one reduction over 'model'.
    ("heads", MODEL),
    # A decoder's key/value projections (kv_heads x head_dim, fused; fewer heads than queries under
    # grouped-query attention): split over 'model' like the query heads when the size divides them.
    ("kv_heads", MODEL),
    # The MLP hidden dim: column- then row-parallel, likewise.
    ("mlp", MODEL),
    # Biases, LayerNorm / RMSNorm scales and offsets: tiny, and read by every device.
    ("bias", None),
    ("norm", None),
    # The rank of a LoRA adapter (8 to 64): too small to split; the adapter's other dim follows its kernel.
    ("lora_rank", None),
)
"""Logical axis name -> mesh axis (None: replicated), in flax's rule-table form. A name listed more than
once tries its axes in order. Per parameter, each dim takes the first of its axes that this parameter does
not use yet, whose size is above 1 and divides the dim; otherwise that dim is replicated. Layout never
changes a model's output, only where the weights live and which collectives XLA inserts."""


def names(*logical: str) -> dict[str, Any]:
    """Parameter metadata carrying logical axis names. eager_sharding=False: flax would otherwise try to
    shard each parameter at creation by these names as if they were mesh axes; here `partition_specs`
    maps them to the mesh and the loaders place the arrays."""
    return {"out_sharding": logical, "eager_sharding": False}


def logical_to_mesh_spec(
    logical: Sequence[str], shape: Sequence[int], axis_sizes: Mapping[str, int], rules=LOGICAL_AXIS_RULES
) -> P:
    """The PartitionSpec (one entry per dim) of a parameter with these logical axis names and shape on a
    mesh with these axis sizes, by `rules` (see LOGICAL_AXIS_RULES). ValueError for a name no rule lists,
    so a new parameter cannot silently default to some layout."""
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
    known = {name for name, _ in rules}
    axes: list[str | None] = []
    for name, size in zip(logical, shape, strict=True):
        if name not in known:
            raise ValueError(f"no sharding rule for logical axis {name!r} (rules name {sorted(known)})")
        candidates = [axis for rule, axis in rules if rule == name and axis is not None]
        fits = (
            a for a in candidates if a not in axes and axis_sizes.get(a, 1) > 1 and size % axis_sizes[a] == 0
        )
        axes.append(next(fits, None))
    return P(*axes)


def _variable_spec(variable: nnx.Variable, axis_sizes: Mapping[str, int]) -> P:
    logical = variable.get_metadata().get("out_sharding")
    if logical is None:
        raise ValueError(f"a {type(variable).__name__} without logical axis names (out_sharding metadata)")
    return logical_to_mesh_spec(tuple(logical), variable.get_value().shape, axis_sizes)


def partition_specs(tree: nnx.Module | nnx.State, mesh: Mesh | jax.sharding.AbstractMesh) -> nnx.State:
    """PartitionSpecs of a backbone's parameters on `mesh` (axes 'data' and 'model'): a State with the
    structure of `nnx.state(module)` whose Variables hold a PartitionSpec, for jit in_shardings or
    jax.device_put after `jax.tree.map(lambda s: NamedSharding(mesh, s), ...)`.

    `tree`: a module, its state (or a filtered part of it), or an abstract one (nnx.eval_shape: nothing
    allocated); only the logical axis names and the shapes are read, so a layout can be planned for a model
    that does not fit.
    """
    missing = {DATA, MODEL} - set(mesh.axis_names)
    if missing:
        raise ValueError(f"mesh needs axes ({DATA!r}, {MODEL!r}), got {mesh.axis_names}")
    state = nnx.state(tree) if isinstance(tree, nnx.Module) else tree
    sizes = dict(mesh.shape)
    return jax.tree.map(
        lambda v: v.replace(_variable_spec(v, sizes)), state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )


def block_reader(
    source: Any, key: str, transpose: bool, sharding: NamedSharding, shape: Sequence[int]
) -> Callable[[tuple[slice, ...]], np.ndarray]:
    """make_array_from_callback's callback for one parameter: a device's index into the nnx-shaped array
    -> that block, read by `source.read(key, index)` (checkpoint.LazyTensorSource: from the memory-mapped
    file). A kernel is the transpose of torch's [out, in] weight, so its block [rows, cols] is the
    transpose of the stored block [cols, rows]. Devices holding the same block (replicas over the other
    mesh axis) share one read, dropped once the last of them has it, so the host does not accumulate a
    whole copy of the tensor."""

    def at(index: tuple[slice, ...]) -> tuple:  # slices are unhashable before Python 3.12
        return tuple((s.start, s.stop, s.step) for s in index)

    waiting: dict[tuple, int] = {}
    for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
        waiting[at(index)] = waiting.get(at(index), 0) + 1
    blocks: dict[tuple, np.ndarray] = {}

    def read(index: tuple[slice, ...]) -> np.ndarray:
        where = at(index)
        block = blocks.get(where)
        if block is None:
            block = source.read(key, index[::-1] if transpose else index)
            block = np.ascontiguousarray(block.T if transpose else block)
        waiting[where] = waiting.get(where, 1) - 1
        if waiting[where] > 0:
            blocks[where] = block
        else:
            blocks.pop(where, None)
        return block

    return read
