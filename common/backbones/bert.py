"""A BERT-family text encoder in Flax NNX, filled from a local Hugging Face checkpoint folder.

The architecture of Devlin et al. (2019, "BERT"), as Hugging Face's `BertModel` computes it (post-norm
blocks, exact erf GELU, additive attention mask): MiniLM (Wang et al. 2020) and sentence-transformers'
all-MiniLM-L6-v2 share the layout. `load(folder)` reads `config.json` and `model.safetensors` and
returns the config and the module with the checkpoint's weights; `mean_pool` turns token states into a
sentence embedding as sentence-transformers does (the mean over unpadded tokens). Nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.backbones.checkpoint import CheckpointError, TensorSource, read_config, read_tensors

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


class BertLayer(nnx.Module):
    """One post-norm block: x = LN(x + Attn(x)); x = LN(x + MLP(x))."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.heads = cfg.num_attention_heads
        self.query = nnx.Linear(h, h, rngs=rngs)
        self.key = nnx.Linear(h, h, rngs=rngs)
        self.value = nnx.Linear(h, h, rngs=rngs)
        self.attention_out = nnx.Linear(h, h, rngs=rngs)
        self.attention_norm = nnx.LayerNorm(h, epsilon=eps, rngs=rngs)
        self.intermediate = nnx.Linear(h, cfg.intermediate_size, rngs=rngs)
        self.output = nnx.Linear(cfg.intermediate_size, h, rngs=rngs)
        self.output_norm = nnx.LayerNorm(h, epsilon=eps, rngs=rngs)

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
        self.word_embeddings = nnx.Embed(cfg.vocab_size, h, rngs=rngs)
        self.position_embeddings = nnx.Embed(cfg.max_position_embeddings, h, rngs=rngs)
        self.token_type_embeddings = nnx.Embed(cfg.type_vocab_size, h, rngs=rngs)
        self.embedding_norm = nnx.LayerNorm(h, epsilon=cfg.layer_norm_eps, rngs=rngs)
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


def load(folder: str | Path) -> tuple[BertConfig, BertEncoder]:
    """The encoder of a Hugging Face BERT checkpoint folder, with its weights (CheckpointError naming the
    folder and the tensor for anything missing or mismatched; tensors it does not use, such as a pooler
    or a masked-LM head, are ignored)."""
    folder = Path(folder)
    cfg = BertConfig.from_folder(folder)
    source = TensorSource(folder, read_tensors(folder), strip_prefixes=("bert.",))
    encoder = BertEncoder(cfg, nnx.Rngs(0))
    h, i = cfg.hidden_size, cfg.intermediate_size

    def embed(module: nnx.Embed, name: str, rows: int) -> None:
        module.embedding[...] = jnp.asarray(source.take(name, (rows, h)))

    def norm(module: nnx.LayerNorm, name: str) -> None:  # old checkpoints say gamma / beta
        module.scale[...] = jnp.asarray(source.take(f"{name}.weight", (h,), f"{name}.gamma"))
        module.bias[...] = jnp.asarray(source.take(f"{name}.bias", (h,), f"{name}.beta"))

    def linear(module: nnx.Linear, name: str, d_in: int, d_out: int) -> None:  # torch stores [out, in]
        module.kernel[...] = jnp.asarray(source.take(f"{name}.weight", (d_out, d_in)).T)
        module.bias[...] = jnp.asarray(source.take(f"{name}.bias", (d_out,)))

    embed(encoder.word_embeddings, "embeddings.word_embeddings.weight", cfg.vocab_size)
    embed(encoder.position_embeddings, "embeddings.position_embeddings.weight", cfg.max_position_embeddings)
    embed(encoder.token_type_embeddings, "embeddings.token_type_embeddings.weight", cfg.type_vocab_size)
    norm(encoder.embedding_norm, "embeddings.LayerNorm")
    for n, layer in enumerate(encoder.layers):
        p = f"encoder.layer.{n}"
        linear(layer.query, f"{p}.attention.self.query", h, h)
        linear(layer.key, f"{p}.attention.self.key", h, h)
        linear(layer.value, f"{p}.attention.self.value", h, h)
        linear(layer.attention_out, f"{p}.attention.output.dense", h, h)
        norm(layer.attention_norm, f"{p}.attention.output.LayerNorm")
        linear(layer.intermediate, f"{p}.intermediate.dense", h, i)
        linear(layer.output, f"{p}.output.dense", i, h)
        norm(layer.output_norm, f"{p}.output.LayerNorm")
    return cfg, encoder
