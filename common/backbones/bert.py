"""A BERT-family text encoder in Flax NNX, filled from a local Hugging Face checkpoint folder.

The architecture of Devlin et al. (2019, "BERT"), as Hugging Face's `BertModel` computes it (post-norm
blocks, exact erf GELU, additive attention mask): MiniLM (Wang et al. 2020) and sentence-transformers'
all-MiniLM-L6-v2 share the layout. `load(folder)` reads `config.json` and `model.safetensors` and
returns the config and the module with the checkpoint's weights; `mean_pool` turns token states into a
sentence embedding as sentence-transformers does (the mean over unpadded tokens). Nothing is downloaded.

Sharding. Every parameter carries logical axis names (flax `out_sharding` metadata: 'vocab', 'embed',
'heads', 'mlp', ...) that say what each dim *is*; `LOGICAL_AXIS_RULES` (common/backbones/axes.py, shared
with the decoder and re-exported here) says where each name goes on a device mesh with learner.training.mesh's axes ('data', 'model'), FSDP style: the large dim of every kernel and
table over 'data', the attention heads and the MLP hidden dim over 'model' (tensor parallelism), biases
and LayerNorms replicated. The names live in the module so that a layer added later cannot be forgotten
by a name-matching rule elsewhere; the rules live in one table so the layout changes in one place.
`partition_specs` turns the names into PartitionSpecs for a given mesh, and `load(folder, mesh)` creates
each weight directly as a sharded jax.Array from the slices of model.safetensors that each device needs,
so a checkpoint larger than one device's memory never has to be whole anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from common.backbones.axes import (  # noqa: F401 (DATA, MODEL, LOGICAL_AXIS_RULES re-exported)
    DATA,
    LOGICAL_AXIS_RULES,
    MODEL,
    block_reader,
    logical_to_mesh_spec,
    partition_specs,
)
from common.backbones.axes import names as _names
from common.backbones.checkpoint import (
    CheckpointError,
    LazyTensorSource,
    TensorSource,
    read_config,
    read_tensors,
)

_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT config.json that shape the encoder."""

    vocab_size: int
    """Rows of the word-embedding table (WordPiece vocabulary)."""
    hidden_size: int
    """Width of every token state."""
    num_hidden_layers: int
    """Transformer blocks."""
    num_attention_heads: int
    """Attention heads per block (hidden_size must be a multiple)."""
    intermediate_size: int
    """Hidden width of each block's MLP."""
    max_position_embeddings: int
    """Longest input, in tokens."""
    type_vocab_size: int = 2
    """Rows of the token-type (segment) table."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""

    @classmethod
    def from_folder(cls, folder: Path) -> BertConfig:
        """The config of a checkpoint folder (CheckpointError naming the folder for another architecture
        or a missing or bad field)."""
        raw = read_config(folder)
        model_type = raw.get("model_type")
        if model_type != "bert":
            raise CheckpointError(
                f"{folder}: config.json has model_type {model_type!r}; this encoder reads 'bert'"
            )
        act = raw.get("hidden_act", "gelu")
        if act != "gelu":
            raise CheckpointError(f"{folder}: config.json has hidden_act {act!r}; only 'gelu' is supported")
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise CheckpointError(f"{folder}: config.json lacks {', '.join(missing)}")
        fields = {k: raw[k] for k in _REQUIRED}
        bad = [k for k, v in fields.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            raise CheckpointError(f"{folder}: config.json needs positive integers for {', '.join(bad)}")
        if fields["hidden_size"] % fields["num_attention_heads"]:
            raise CheckpointError(
                f"{folder}: hidden_size {fields['hidden_size']} is not a multiple of "
                f"num_attention_heads {fields['num_attention_heads']}"
            )
        return cls(
            **fields,
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        )


# ---- the encoder ------------------------------------------------------------------------------------------


def _linear(d_in: int, d_out: int, logical_in: str, logical_out: str, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        d_in, d_out, kernel_metadata=_names(logical_in, logical_out), bias_metadata=_names("bias"), rngs=rngs
    )


def _layer_norm(h: int, eps: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(
        h, epsilon=eps, scale_metadata=_names("norm"), bias_metadata=_names("norm"), rngs=rngs
    )


class BertLayer(nnx.Module):
    """One post-norm block: x = LN(x + Attn(x)); x = LN(x + MLP(x))."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.heads = cfg.num_attention_heads
        self.query = _linear(h, h, "embed", "heads", rngs)
        self.key = _linear(h, h, "embed", "heads", rngs)
        self.value = _linear(h, h, "embed", "heads", rngs)
        self.attention_out = _linear(h, h, "heads", "embed", rngs)
        self.attention_norm = _layer_norm(h, eps, rngs)
        self.intermediate = _linear(h, cfg.intermediate_size, "embed", "mlp", rngs)
        self.output = _linear(cfg.intermediate_size, h, "mlp", "embed", rngs)
        self.output_norm = _layer_norm(h, eps, rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        b, n, h = x.shape
        split = lambda t: t.reshape(b, n, self.heads, h // self.heads)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(h // self.heads)
        # Hugging Face adds the dtype's minimum at padded keys; a fully padded row then attends uniformly.
        scores = scores + jnp.where(mask[:, None, None, :], 0.0, jnp.finfo(scores.dtype).min)
        context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, n, h)
        x = self.attention_norm(x + self.attention_out(context))
        return self.output_norm(x + self.output(jax.nn.gelu(self.intermediate(x), approximate=False)))


class BertEncoder(nnx.Module):
    """Token ids [B, L] and their mask [B, L] (True on real tokens) -> token states [B, L, hidden]."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        h = cfg.hidden_size
        self.cfg = cfg
        table = lambda rows, logical: nnx.Embed(  # noqa: E731
            rows, h, embedding_metadata=_names(logical, "embed"), rngs=rngs
        )
        self.word_embeddings = table(cfg.vocab_size, "vocab")
        self.position_embeddings = table(cfg.max_position_embeddings, "positions")
        self.token_type_embeddings = table(cfg.type_vocab_size, "types")
        self.embedding_norm = _layer_norm(h, cfg.layer_norm_eps, rngs)
        self.layers = nnx.List([BertLayer(cfg, rngs) for _ in range(cfg.num_hidden_layers)])

    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array | None = None
    ) -> jax.Array:
        n = input_ids.shape[1]
        if n > self.cfg.max_position_embeddings:
            raise ValueError(
                f"{n} tokens, more than max_position_embeddings {self.cfg.max_position_embeddings}"
            )
        types = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(jnp.arange(n))[None]
        x = self.embedding_norm(x + self.token_type_embeddings(types))
        mask = jnp.asarray(attention_mask, bool)
        for layer in self.layers:
            x = layer(x, mask)
        return x


def mean_pool(states: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """[B, L, H] token states -> [B, H]: the mean over real tokens (0 for an empty row), as
    sentence-transformers pools all-MiniLM-L6-v2."""
    m = jnp.asarray(attention_mask, states.dtype)[..., None]
    return (states * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1e-9)


@dataclass(frozen=True)
class _Stored:
    """Where one parameter comes from in model.safetensors."""

    name: str
    shape: tuple[int, ...]
    """As stored (torch's Linear weights are [out, in]: the transpose of an nnx kernel)."""
    transpose: bool = False
    alternatives: tuple[str, ...] = ()
    """Older names of the same tensor (LayerNorm gamma / beta)."""


def _checkpoint_layout(cfg: BertConfig) -> dict[tuple[str | int, ...], _Stored]:
    """Encoder state path (as nnx.to_flat_state spells it) -> stored tensor, in the order they are checked.
    One table for both loaders, so the sharded one cannot read a different tensor than the plain one."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    layout: dict[tuple[str | int, ...], _Stored] = {}

    def embed(path: str, name: str, rows: int) -> None:
        layout[(path, "embedding")] = _Stored(name, (rows, h))

    def norm(path: tuple[str | int, ...], name: str) -> None:  # old checkpoints say gamma / beta
        layout[(*path, "scale")] = _Stored(f"{name}.weight", (h,), alternatives=(f"{name}.gamma",))
        layout[(*path, "bias")] = _Stored(f"{name}.bias", (h,), alternatives=(f"{name}.beta",))

    def linear(path: tuple[str | int, ...], name: str, d_in: int, d_out: int) -> None:
        layout[(*path, "kernel")] = _Stored(f"{name}.weight", (d_out, d_in), transpose=True)
        layout[(*path, "bias")] = _Stored(f"{name}.bias", (d_out,))

    embed("word_embeddings", "embeddings.word_embeddings.weight", cfg.vocab_size)
    embed("position_embeddings", "embeddings.position_embeddings.weight", cfg.max_position_embeddings)
    embed("token_type_embeddings", "embeddings.token_type_embeddings.weight", cfg.type_vocab_size)
    norm(("embedding_norm",), "embeddings.LayerNorm")
    for n in range(cfg.num_hidden_layers):
        p, at = f"encoder.layer.{n}", ("layers", n)
        linear((*at, "query"), f"{p}.attention.self.query", h, h)
        linear((*at, "key"), f"{p}.attention.self.key", h, h)
        linear((*at, "value"), f"{p}.attention.self.value", h, h)
        linear((*at, "attention_out"), f"{p}.attention.output.dense", h, h)
        norm((*at, "attention_norm"), f"{p}.attention.output.LayerNorm")
        linear((*at, "intermediate"), f"{p}.intermediate.dense", h, i)
        linear((*at, "output"), f"{p}.output.dense", i, h)
        norm((*at, "output_norm"), f"{p}.output.LayerNorm")
    return layout


def load(folder: str | Path, mesh: Mesh | None = None) -> tuple[BertConfig, BertEncoder]:
    """The encoder of a Hugging Face BERT checkpoint folder, with its weights (CheckpointError naming the
    folder and the tensor for anything missing or mismatched; tensors it does not use, such as a pooler
    or a masked-LM head, are ignored).

    With a `mesh` (axes 'data' and 'model', e.g. learner.training.mesh.make_mesh), every parameter is created as a
    jax.Array laid out by `partition_specs`: each device's block is read from the memory-mapped file by
    itself, so a split weight is never whole in host or device memory, and the result equals the
    unsharded encoder exactly. Every tensor's name and shape is checked against the file's header before anything
    is read, with the same messages as without a mesh.
    """
    folder = Path(folder)
    cfg = BertConfig.from_folder(folder)
    if mesh is not None:
        return cfg, _load_sharded(folder, cfg, mesh)
    source = TensorSource(folder, read_tensors(folder), strip_prefixes=("bert.",))
    encoder = BertEncoder(cfg, nnx.Rngs(0))
    for path, stored in _checkpoint_layout(cfg).items():
        value = source.take(stored.name, stored.shape, *stored.alternatives)
        target: Any = encoder
        for key in path:
            target = target[key] if isinstance(key, int) else getattr(target, key)
        target[...] = jnp.asarray(value.T if stored.transpose else value)
    return cfg, encoder


def _load_sharded(folder: Path, cfg: BertConfig, mesh: Mesh) -> BertEncoder:
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: BertEncoder(cfg, nnx.Rngs(0))))
    specs = dict(nnx.to_flat_state(partition_specs(abstract, mesh)))
    layout = _checkpoint_layout(cfg)
    with LazyTensorSource(folder, strip_prefixes=("bert.",)) as source:
        keys = {path: source.find(s.name, s.shape, *s.alternatives) for path, s in layout.items()}
        placed = []
        for path, variable in nnx.to_flat_state(abstract):
            stored, spec = layout[path], specs[path].get_value()
            shape, sharding = variable.get_value().shape, NamedSharding(mesh, spec)
            reader = block_reader(source, keys[path], stored.transpose, sharding, shape)
            array = jax.make_array_from_callback(shape, sharding, reader)
            placed.append((path, variable.replace(array)))
    return nnx.merge(graphdef, nnx.from_flat_state(placed))
