"""The lm family's update on the rows that matter (the learner's host step before each update, first half).

A collated batch is B episodes padded to T + 1 observation rows of `--model.lm-prompt-tokens` prompts,
and the decoder's cost is per token slot: rows past an episode's end, the final row's backward pass and
the prompts' left padding were most of an update (issue 46: 13% of its compute was useful). `pack`
names, for `network.score_actions`, the step rows to score with their gradient (`train_rows`, [B, T])
and each episode's final row, whose value only a bootstrap target reads
(`final_rows`: forward only); segments.py then lays their real tokens end to end. The losses see the
same values: a row not computed reads 0, and every loss masks those rows (tests/test_lm_packing.py
compares the layouts). `cut_prefix` takes the preamble every prompt shares out of them (the actor's
prefill and segments.py run it once).
"""

from __future__ import annotations

import numpy as np


def quantized(n: int, quantum: int) -> int:
    """`n` rounded up to a multiple of `quantum`: a prompt width, so few shapes compile."""
    return -(-n // quantum) * quantum


def pack(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A collated batch's observations [B, T + 1, ...] -> the same with `train_rows` [B, T] (flat
    b * (T + 1) + t indices of the step rows, in order, then -1 in unused slots) and `final_rows` [B] (each
    episode's final observation). T slots per episode whatever the lengths: the slots only index (the
    decoder runs on the packed sequences), and one shape compiles fewer updates than a rung per batch.

    An episode's rows are those with a prompt (collate zeroes the rest; every prompt has a token), its
    last one the final observation."""
    prompt_length = obs["prompt_length"]
    b, rows = prompt_length.shape
    present = np.maximum((prompt_length > 0).sum(axis=1), 1)  # L + 1 observation rows per episode
    steps = [np.arange(n - 1) + i * rows for i, n in enumerate(present)]
    flat = np.concatenate(steps).astype(np.int32)
    train = np.full(b * (rows - 1), -1, np.int32)
    train[: len(flat)] = flat
    return {
        **obs,
        "train_rows": train.reshape(b, rows - 1),
        "final_rows": (np.arange(b) * rows + present - 1).astype(np.int32),
    }


def cut_prefix(
    ids: np.ndarray, length: np.ndarray, prefix: np.ndarray, quantum: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Left-padded prompts [..., W] of `length` real ids (0: no prompt) without their first len(prefix)
    ids: (the rest, left-padded and trimmed to the longest rounded up to `quantum`; the rest's lengths),
    or None when `prefix` is empty or some prompt does not start with it."""
    width, p = ids.shape[-1], len(prefix)
    present = length > 0
    if p == 0 or np.any(present & (length <= p)):
        return None
    starts = width - length[..., None] + np.arange(p)  # [..., P] columns of each prompt's first P ids
    heads = np.take_along_axis(ids, np.clip(starts, 0, width - 1), axis=-1)
    if not np.all((heads == prefix) | ~present[..., None]):
        return None
    rest = np.where(present, length - p, 0).astype(length.dtype)
    keep = min(width, quantized(int(rest.max(initial=1)), quantum))
    real = np.arange(width) >= (width - rest[..., None])
    return np.where(real, ids, 0)[..., width - keep :], rest
