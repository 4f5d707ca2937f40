"""Word renaming: train the policy to act on words it has never seen.

A phone agent must type and tap values that were not in its training data (a new contact name, a new
search query). With a few values per task template, a policy learns to point at *which word* ("Paris")
rather than *where the word sits* ("the words after 'Search for'"), and fails on every new value.

`rename_words` renames a random share of the distinct words of each episode to random vocabulary ids,
consistently: the same word gets the same new id in the instruction and on every screen of the episode,
at every step. Everything the featurizer derives from word identity (an instruction word is visible on
screen, an element's label overlaps the instruction) therefore stays true, and the renamed episode is a
valid episode of the same task with unseen values. The words an episode types (found in a text field at
some step) have their own rate: they are the values. The other words are renamed too, so the policy
also learns not to depend on any single word. This is word dropout (Iyyer et al. 2015) and
entity anonymization (Hermann et al. 2015), done so that the episode stays consistent.

The randomness comes from a seed per batch, so a resumed run renames exactly as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from learner.batch import Batch

TOKEN_KEYS = ("instr_tokens", "elem_tokens")
"""Featurized arrays that hold hashed word ids (0 is padding)."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective, well-mixed 64-bit hash (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def rename_words(
    obs: dict[str, np.ndarray],
    rate: float,
    vocab_size: int,
    seed: int | Sequence[int],
    typed_rate: float | None = None,
) -> dict[str, np.ndarray]:
    """Copy of `obs` (featurized observations with a leading episode axis) with words renamed.

    Each distinct word id of episode b is renamed with probability `rate` (`typed_rate` for the words
    the episode types: instruction words that are in a text field at some step, instr_feats[..., 1]),
    independently per episode, to `1 + h % (vocab_size - 1)` for a hash h of (id, episode seed); padding
    (0) stays 0. Arrays other than TOKEN_KEYS are shared, not copied.
    """
    typed_rate = rate if typed_rate is None else typed_rate
    for name, value in (("rate", rate), ("typed rate", typed_rate)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"word rename {name} must be in [0, 1], got {value}")
    if rate == 0.0 and typed_rate == 0.0:
        return obs
    episodes = obs[TOKEN_KEYS[0]].shape[0]
    episode_seed = np.random.default_rng(seed).integers(0, 2**63, size=episodes, dtype=np.uint64)
    typed = _typed_ids(obs) if typed_rate != rate else None
    out = dict(obs)
    with np.errstate(over="ignore"):
        for key in TOKEN_KEYS:
            ids = np.asarray(obs[key])
            salt = episode_seed.reshape((episodes,) + (1,) * (ids.ndim - 1))
            h = _mix(ids.astype(np.uint64) * _GOLDEN ^ salt)
            renamed = (1 + _mix(h) % np.uint64(vocab_size - 1)).astype(ids.dtype)
            threshold = _threshold(rate)
            if typed is not None:
                is_typed = np.stack([np.isin(ids[b], typed[b]) for b in range(episodes)])
                threshold = np.where(is_typed, _threshold(typed_rate), threshold)
            chosen = (h < threshold) & (ids != 0)
            out[key] = np.where(chosen, renamed, ids)
    return out


def _threshold(rate: float) -> np.uint64:
    """h < _threshold(rate) has probability `rate` for a uniform 64-bit h."""
    return np.uint64(min(int(rate * 2.0**64), 2**64 - 1))


def _typed_ids(obs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Per episode, the ids of instruction words that are in a text field at some step."""
    tokens, in_field = np.asarray(obs["instr_tokens"]), np.asarray(obs["instr_feats"])[..., 1] > 0
    return [np.unique(tokens[b][in_field[b] & (tokens[b] != 0)]) for b in range(tokens.shape[0])]


def rename_batch(
    batch: Batch, rate: float, typed_rate: float, vocab_size: int, seed: int | Sequence[int]
) -> Batch:
    """`batch` with its observations renamed (`rename_words`), the originals kept as `acted_obs`: the
    behaviour policy saw those, so the importance ratios are computed on them (learner/train_step.py)."""
    if rate == 0.0 and typed_rate == 0.0:
        return batch
    obs = rename_words(batch.obs, rate, vocab_size, seed=seed, typed_rate=typed_rate)
    return batch._replace(obs=obs, acted_obs=batch.obs)
