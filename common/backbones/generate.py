"""Batched generation from a decoder: one prefill, then KV-cached decoding, both jitted with static shapes.

Prompts of a batch are left-padded to a length bucket, so every row's last prompt token sits in the same
column and one decode step serves all rows; the batch is padded to a size bucket with empty rows. Shapes
therefore take few distinct values, and each (batch, prompt, cache) bucket compiles once per Generator.

Each generated token comes with its log-probability under the exact distribution it was drawn from:
the model's logits, with the token mask applied (disallowed tokens get probability 0), divided by the
temperature. Greedy decoding (temperature 0) takes the argmax and reports the log-probability at
temperature 1 with the same mask. An importance ratio built from these numbers is exact, with no
drift between what the actor sampled and what it recorded.

The decode loop runs on the host, one jitted step per token, so a token mask can be any Python callable
(the LM agent's action grammar keeps its state on the host). A step's dispatch costs well under a
millisecond, against tens of milliseconds for the step itself on a CPU (benchmarks/decoder_speed.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.backbones.decoder.llama import Decoder, init_cache

TokenMask = Callable[[int, np.ndarray], np.ndarray | None]
"""(step, generated [B, step] int32 so far) -> allowed tokens [B, vocab] bool for the next token, or
None for no constraint. Rows past their end of sequence may get anything."""

PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
"""Prompt lengths a batch is left-padded to (the smallest that fits)."""
NEW_TOKEN_QUANTUM = 16
"""The cache holds the prompt bucket plus max_new_tokens rounded up to this, so nearby lengths share a
compilation."""


@dataclass(frozen=True)
class Completion:
    """One prompt's generation."""

    prompt_ids: list[int]
    """The prompt exactly as given."""
    tokens: list[int]
    """Generated ids, the end-of-sequence token included when one ended it."""
    logprobs: list[float]
    """Log-probability of each generated token under the distribution it was drawn from."""
    stop: str
    """'eos' (an end-of-sequence id was generated) or 'length' (max_new_tokens reached)."""


def _bucket(n: int, buckets: Sequence[int]) -> int:
    fits = [b for b in buckets if b >= n]
    if not fits:
        raise ValueError(f"a prompt of {n} tokens is longer than the largest bucket {max(buckets)}")
    return fits[0]


def _batch_bucket(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def left_pad(prompts: Sequence[Sequence[int]], length: int, rows: int) -> tuple[np.ndarray, ...]:
    """(tokens, positions, mask) [rows, length]: each prompt right-aligned, positions counting its real
    tokens from 0; rows past len(prompts) are empty (all masked)."""
    tokens = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length), bool)
    for i, prompt in enumerate(prompts):
        if len(prompt):
            tokens[i, length - len(prompt) :] = prompt
            mask[i, length - len(prompt) :] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, mask


def _choose(logits: jax.Array, allowed: jax.Array, key: jax.Array, temperature: jax.Array, greedy: bool):
    """The next token per row [B] and its log-probability under the masked, tempered distribution."""
    logits = jnp.where(allowed, logits.astype(jnp.float32), -jnp.inf)
    scaled = logits if greedy else logits / temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    token = jnp.argmax(logits, axis=-1) if greedy else jax.random.categorical(key, scaled, axis=-1)
    return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


class Generator:
    """Compiled prefill and decode steps for one decoder (reuse it: compilations are kept per shape).

    `model` is read once (nnx.split); after the caller changes its parameters, call `update(model)`.
    """

    def __init__(self, model: Decoder, prompt_buckets: Sequence[int] = PROMPT_BUCKETS):
        self.graphdef, self.state = nnx.split(model)
        self.cfg = model.cfg
        self.prompt_buckets = tuple(sorted(prompt_buckets))
        self._prefill = jax.jit(self._prefill_fn, static_argnames=("greedy",), donate_argnames=("cache",))
        self._decode = jax.jit(self._decode_fn, static_argnames=("greedy",), donate_argnames=("cache",))

    def update(self, model: Decoder) -> None:
        """Take new parameters (same architecture: nothing recompiles)."""
        self.state = nnx.state(model)

    def _last_logits(self, state, tokens, positions, mask, cache):
        model = nnx.merge(self.graphdef, state)
        logits, cache = model(tokens, positions, mask, cache, last_only=True)
        return logits[:, -1], cache

    def _prefill_fn(self, state, tokens, positions, mask, cache, allowed, key, temperature, greedy):
        logits, cache = self._last_logits(state, tokens, positions, mask, cache)
        return (*_choose(logits, allowed, key, temperature, greedy), cache)

    def _decode_fn(self, state, token, position, cache, allowed, key, temperature, greedy):
        mask = jnp.ones_like(token, bool)
        logits, cache = self._last_logits(state, token[:, None], position[:, None], mask[:, None], cache)
        return (*_choose(logits, allowed, key, temperature, greedy), cache)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        eos_ids: Sequence[int] = (),
        seed: int = 0,
        token_mask: TokenMask | None = None,
    ) -> list[Completion]:
        """Continue every prompt by up to `max_new_tokens` tokens (fewer when an `eos_ids` token ends it);
        greedy at temperature 0, else sampled from the tempered distribution with `seed`."""
        self._check(prompts, max_new_tokens, temperature)
        n, greedy = len(prompts), temperature == 0.0
        length = _bucket(max(len(p) for p in prompts), self.prompt_buckets)
        rows = _batch_bucket(n)
        tokens, positions, mask = left_pad(prompts, length, rows)
        span = length + -(-max_new_tokens // NEW_TOKEN_QUANTUM) * NEW_TOKEN_QUANTUM
        cache = init_cache(self.cfg, rows, span, self._compute_dtype())
        temp = jnp.float32(max(temperature, 1e-6))
        keys = jax.random.split(jax.random.key(seed), max_new_tokens)
        out = np.zeros((rows, max_new_tokens), np.int32)
        logps = np.zeros((rows, max_new_tokens), np.float32)
        done = np.zeros(rows, bool)
        done[n:] = True
        next_pos = positions[:, -1] + 1
        for t in range(max_new_tokens):
            allowed = self._allowed(token_mask, t, out[:, :t], rows)
            if t == 0:
                step = self._prefill(
                    self.state, tokens, positions, mask, cache, allowed, keys[t], temp, greedy
                )
            else:
                step = self._decode(
                    self.state, out[:, t - 1], next_pos, cache, allowed, keys[t], temp, greedy
                )
                next_pos = next_pos + 1
            token, logp, cache = step
            out[:, t], logps[:, t] = np.asarray(token), np.asarray(logp)
            done |= np.isin(out[:, t], list(eos_ids)) if eos_ids else False
            if done.all():
                break
        return [self._completion(p, out[i], logps[i], eos_ids) for i, p in enumerate(prompts)]

    def _check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        vocab = self.cfg.vocab_size
        bad = [t for p in prompts for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")

    def _allowed(self, token_mask: TokenMask | None, t: int, generated: np.ndarray, rows: int) -> np.ndarray:
        allowed = None if token_mask is None else token_mask(t, generated)
        if allowed is None:
            return np.ones((rows, self.cfg.vocab_size), bool)
        allowed = np.asarray(allowed, bool)
        if allowed.shape[1:] != (self.cfg.vocab_size,) or allowed.shape[0] > rows:
            raise ValueError(f"token mask has shape {allowed.shape}, expected [batch, {self.cfg.vocab_size}]")
        if allowed.shape[0] < rows:  # the padding rows of the batch bucket: anything goes
            allowed = np.concatenate([allowed, np.ones((rows - len(allowed), allowed.shape[1]), bool)])
        if not allowed.any(axis=1).all():
            raise ValueError(f"token mask allows no token at all for some row at step {t}")
        return allowed

    def _compute_dtype(self):
        leaves = jax.tree.leaves(self.state)
        return leaves[0].dtype if leaves else jnp.float32

    @staticmethod
    def _completion(prompt, tokens: np.ndarray, logps: np.ndarray, eos_ids: Sequence[int]) -> Completion:
        ends = [i for i, t in enumerate(tokens) if t in set(eos_ids)]
        stop = ends[0] + 1 if ends else len(tokens)
        return Completion(
            prompt_ids=[int(t) for t in prompt],
            tokens=[int(t) for t in tokens[:stop]],
            logprobs=[float(x) for x in logps[:stop]],
            stop="eos" if ends else "length",
        )
