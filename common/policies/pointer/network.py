"""The default policy: a small transformer over instruction words and UI elements (Flax NNX).

Tokens: one summary token, the instruction words (hashed embedding + position + visibility feature), the
UI elements (mean of their word embeddings + a projection of box and flags) and, with a memory
(ModelConfig.history), the episode's recent actions (mean of the words of what each aimed at + a
projection of its kind and age; the step count goes into the summary token). Heads read the summary
token for the action type, the swipe direction and the value, and point at elements (tap target) and at
instruction words (the text to type). See common.policies.pointer.distribution for the factorized action distribution.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from common.backbones import bert
from common.config import ModelConfig
from common.policies.pointer import text_encoder
from common.policies.pointer.featurize import (
    NUM_ELEMENT_FEATURES,
    NUM_HISTORY_FEATURES,
    NUM_INSTRUCTION_FEATURES,
)
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS

Logits = dict[str, jax.Array]


class Block(nnx.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d = cfg.d_model
        self.norm1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=cfg.num_heads, in_features=d, qkv_features=d, decode=False, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(d, rngs=rngs)
        self.mlp_in = nnx.Linear(d, cfg.mlp_dim, rngs=rngs)
        self.mlp_out = nnx.Linear(cfg.mlp_dim, d, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x), mask=mask)
        return x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x))))


class PhonePolicy(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d = cfg.d_model
        self.cfg = cfg
        # Small initial word vectors (as BERT and GPT-2 use): a word never trained on, such as a value
        # first seen at test time, stays near zero, like the rarely renamed ids of augment.py,
        # instead of a unit-scale random vector that pulls the pointers at random.
        self.embed = nnx.Embed(cfg.vocab_size, d, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.summary = nnx.Param(jax.random.normal(rngs.params(), (d,)) * 0.02)
        self.instr_pos = nnx.Param(jax.random.normal(rngs.params(), (cfg.max_instruction_tokens, d)) * 0.02)
        self.instr_feat = nnx.Linear(NUM_INSTRUCTION_FEATURES, d, rngs=rngs)
        self.elem_feat = nnx.Linear(NUM_ELEMENT_FEATURES, d, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.type_head = nnx.Linear(d, NUM_ACTION_TYPES, rngs=rngs)
        self.direction_head = nnx.Linear(d, NUM_SWIPE_DIRECTIONS, rngs=rngs)
        self.value_head = nnx.Linear(d, 1, rngs=rngs)
        self.element_pointer = nnx.Linear(d, 1, rngs=rngs)
        self.word_pointer = nnx.Linear(d, 1, rngs=rngs)
        if cfg.uses_text_encoder:
            self.text = TextInputs(cfg, rngs)
        if cfg.span_words > 1:
            self.word_end_pointer = nnx.Linear(d, 1, rngs=rngs)
        if cfg.history:
            self.hist_feat = nnx.Linear(NUM_HISTORY_FEATURES, d, rngs=rngs)
            self.step_feat = nnx.Linear(1, d, rngs=rngs)

    def _mean_words(self, tokens: jax.Array) -> jax.Array:
        """[..., L] word ids -> [..., d]: the mean embedding of the words (padding excluded)."""
        mask = (tokens != 0)[..., None]
        return jnp.sum(self.embed(tokens) * mask, axis=-2) / jnp.maximum(mask.sum(-2), 1)

    def __call__(self, f: dict[str, jax.Array]) -> tuple[Logits, jax.Array]:
        """Features with one leading batch axis -> (logits per head, value [B])."""
        li = self.cfg.max_instruction_tokens
        instr = self.embed(f["instr_tokens"]) + self.instr_pos[...] + self.instr_feat(f["instr_feats"])
        elems = self._mean_words(f["elem_tokens"]) + self.elem_feat(f["elem_feats"])
        batch = instr.shape[0]
        summary = jnp.broadcast_to(self.summary[...], (batch, 1, instr.shape[-1]))
        if self.cfg.uses_text_encoder:
            summary, instr, elems = self.text(f, summary, instr, elems)
        tokens, valid = [summary, instr, elems], [jnp.ones((batch, 1), bool), f["instr_mask"], f["elem_mask"]]
        if self.cfg.history:
            summary = summary + self.step_feat(f["episode_step"])[:, None]
            tokens[0] = summary
            tokens.append(self._mean_words(f["hist_tokens"]) + self.hist_feat(f["hist_feats"]))
            valid.append(f["hist_mask"])
        x = jnp.concatenate(tokens, axis=1)
        valid = jnp.concatenate(valid, axis=1)
        attn_mask = nnx.make_attention_mask(jnp.ones_like(valid), valid)
        for block in self.blocks:
            x = block(x, attn_mask)
        x = self.norm(x)
        head = x[:, 0]
        word_logits, word_mask = self._typed_text(x[:, 1 : 1 + li], f["instr_mask"])
        elem_logits = self.element_pointer(x[:, 1 + li : 1 + li + self.cfg.max_elements])[..., 0]
        logits = {
            "type": self.type_head(head),
            "element": _mask_logits(elem_logits, f["elem_mask"]),
            "word": _mask_logits(word_logits, word_mask),
            "direction": self.direction_head(head),
        }
        return logits, self.value_head(head)[..., 0]

    def _typed_text(self, words: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Logits and mask of the typed-text choice from the word tokens [B, Li, d]: one per word, or with
        span_words S > 1 one per (first word i, length l + 1) at i * S + l: a start score of word i plus
        an end score of word i + l, valid while both are real words."""
        start = self.word_pointer(words)[..., 0]
        s = self.cfg.span_words
        if s == 1:
            return start, mask
        li = start.shape[-1]
        end = jnp.pad(self.word_end_pointer(words)[..., 0], ((0, 0), (0, s - 1)))
        ok = jnp.pad(mask, ((0, 0), (0, s - 1)))
        ahead = jnp.arange(li)[:, None] + jnp.arange(s)[None, :]  # [Li, S]: the span's last word
        logits = start[:, :, None] + end[:, ahead]
        valid = mask[:, :, None] & ok[:, ahead]
        return logits.reshape(-1, li * s), valid.reshape(-1, li * s)


class TextInputs(nnx.Module):
    """The frozen text encoder's states (common/policies/pointer/text_encoder.py) added to the tokens: the instruction's
    sentence embedding to the summary token, each word's contextual state to its word token, each label's
    embedding to its element token; and three cosine similarities, the semantic counterparts of the
    word-overlap features: element to instruction, element to its best-matching instruction word, and
    word to its best-matching element. They ground "wireless network" to "Wi-Fi" where no word is shared."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, t = cfg.d_model, cfg.text_dim
        self.sentence = nnx.Linear(t, d, rngs=rngs)
        self.words = nnx.Linear(t, d, rngs=rngs)
        self.labels = nnx.Linear(t, d, rngs=rngs)
        self.elem_similarity = nnx.Linear(2, d, rngs=rngs)
        self.word_similarity = nnx.Linear(1, d, rngs=rngs)
        if cfg.train_text_encoder:
            # Fine-tuned: the encoder is part of the policy (random here; `create` loads the checkpoint).
            folder = text_encoder.folder_of(cfg.text_encoder)
            self.encoder = bert.BertEncoder(bert.BertConfig.from_folder(folder), rngs)

    def __call__(self, f, summary, instr, elems):
        words, sentence, labels = f["instr_text"], f["instr_sentence"], f["elem_text"]
        word_ok, elem_ok = f["instr_mask"][:, None, :], f["elem_mask"][:, :, None]
        cos = jnp.einsum("bed,bwd->bew", labels, words)  # [B, E, Li]; rows are unit vectors (or zero)
        elem_to_word = jnp.max(jnp.where(word_ok, cos, -1.0), axis=-1)
        word_to_elem = jnp.max(jnp.where(elem_ok, cos, -1.0), axis=1)
        elem_to_sentence = jnp.einsum("bed,bd->be", labels, sentence)
        summary = summary + self.sentence(sentence)[:, None]
        instr = instr + self.words(words) + self.word_similarity(word_to_elem[..., None])
        elems = (
            elems
            + self.labels(labels)
            + self.elem_similarity(jnp.stack([elem_to_sentence, elem_to_word], axis=-1))
        )
        return summary, instr, elems


def _mask_logits(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Invalid slots get a very low logit; an all-invalid row keeps slot 0 so the softmax stays defined."""
    mask = jnp.asarray(mask)
    mask = mask.at[..., 0].set(mask[..., 0] | ~mask.any(-1))
    return jnp.where(mask, logits, -1e9)


def create(cfg: ModelConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
    """Build the policy and split it into a static graph and its parameter state (a fine-tuned text
    encoder starts from its checkpoint's weights unless --model.text-encoder-weights random)."""
    graphdef, params = nnx.split(_initialized(cfg, seed))
    if cfg.train_text_encoder and cfg.text_encoder_weights == "pretrained":
        policy = nnx.merge(graphdef, params)
        _, pretrained = bert.load(text_encoder.folder_of(cfg.text_encoder))
        nnx.update(policy.text.encoder, nnx.state(pretrained))
        graphdef, params = nnx.split(policy)
    return graphdef, params


def _initialized(cfg: ModelConfig, seed: int) -> PhonePolicy:
    """The policy with freshly initialized parameters, every initializer in one compiled program, compiled
    once per config in a process (the seed is an argument): op by op, each of some sixty initializer ops
    compiled on first use, it took 5 s of a learner's 11 s start-up on an idle 2-core CPU (and the one
    program lands in the persistent compilation cache)."""
    return _build(cfg, jax.random.key(seed))  # what nnx.Rngs(seed) makes of an int


@functools.partial(nnx.jit, static_argnums=0)
def _build(cfg: ModelConfig, key: jax.Array) -> PhonePolicy:
    return PhonePolicy(cfg, nnx.Rngs(key))


def text_encoder_state(params: nnx.State) -> nnx.State | None:
    """The fine-tuned text encoder's part of the policy's parameters (None when it is frozen or absent)."""
    text = params.get("text") if hasattr(params, "get") else None
    return None if text is None or "encoder" not in text else text["encoder"]


def abstract(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """The policy's static graph and the names, shapes and dtypes of its parameters, computing none of
    them: a template for common.params_file.flat_to_params. `create` runs every initializer op by op, each compiled on
    first use (seconds on an idle CPU, most of a minute on a busy one); this only traces them."""
    return nnx.split(nnx.eval_shape(lambda: PhonePolicy(cfg, nnx.Rngs(0))))


def apply(graphdef: nnx.GraphDef, params: nnx.State, features: dict[str, jax.Array]):
    """Pure forward pass; features may have any number of leading batch axes (a fine-tuned text encoder
    adds its states first, unless they are there already: encode_text)."""
    features = encode_text(graphdef, params, features)
    lead = features["instr_mask"].shape[:-1]
    flat = {k: v.reshape((-1, *v.shape[len(lead) :])) for k, v in features.items()}
    logits, value = nnx.merge(graphdef, params)(flat)
    return (
        {k: v.reshape((*lead, v.shape[-1])) for k, v in logits.items()},
        value.reshape(lead),
    )


def encode_text(graphdef: nnx.GraphDef, params: nnx.State, features: dict[str, jax.Array]) -> dict:
    """`features` plus the fine-tuned text encoder's states (text_encoder.EMBEDDING_KEYS), computed in the
    graph with gradients; unchanged without a fine-tuned encoder or when they are already there. The train
    step calls it for the trained observations, and `apply` for the acted ones of a renamed batch (their
    WordPiece ids may differ: augment.py)."""
    policy = nnx.merge(graphdef, params)
    text = getattr(policy, "text", None)
    if text is None or not hasattr(text, "encoder") or "instr_text" in features:
        return features
    lead = features["instr_mask"].shape[:-1]
    flat = {k: features[k].reshape((-1, *features[k].shape[len(lead) :])) for k in text_encoder.TEXT_KEYS}
    states = text_encoder.embed_features(text.encoder, flat, policy.cfg.max_instruction_tokens)
    return {**features, **{k: v.reshape((*lead, *v.shape[1:])) for k, v in states.items()}}
