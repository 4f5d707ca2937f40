"""The lm family's update on the rows that matter (the learner's host step before each update).

A collated batch is B episodes padded to T + 1 observation rows of `--model.lm-prompt-tokens` prompts,
and the decoder's cost is per token slot: rows past an episode's end, the final row's backward pass and
the prompts' common left padding were most of an update (issue 46: 13% of its compute was useful). `pack`
names, for `network.score_actions`, the step rows to score with their gradient (`train_rows`) and each
episode's final row, whose value only a bootstrap target reads (`final_rows`: forward only), and trims
the left padding every prompt of the batch shares. The losses see the same values: a row not computed
reads 0, and every loss masks those rows (tests/test_lm_packing.py compares both layouts).

Shapes stay few, so few updates compile: the step rows are laid out [B, slots], `slots` a rung of
ROW_RUNGS (at most T), and the prompt width a multiple of PROMPT_QUANTUM; `bound` counts them.
"""

from __future__ import annotations

import numpy as np

ROW_RUNGS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Step rows per episode slot an update is compiled for: the batch's step rows over B, rounded up to the
next rung (at most a third more slots than rows), and to T past the last rung below it."""


def quantized(n: int, quantum: int) -> int:
    """`n` rounded up to a multiple of `quantum`: a prompt width, so few shapes compile."""
    return -(-n // quantum) * quantum


def row_slots(rows: int, episodes: int, max_steps: int) -> int:
    """Slots per episode for `rows` step rows of `episodes` episodes: the next rung, at most max_steps."""
    need = -(-rows // episodes)
    return min(max_steps, next((r for r in ROW_RUNGS if r >= need), max_steps))


def bound(max_steps: int, prompt_tokens: int, quantum: int) -> int:
    """How many update shapes packing can compile, at most: row rungs times prompt widths."""
    rungs = {min(max_steps, r) for r in ROW_RUNGS} | {max_steps}
    return len(rungs) * -(-prompt_tokens // quantum)


def pack(obs: dict[str, np.ndarray], quantum: int) -> dict[str, np.ndarray]:
    """A collated batch's observations [B, T + 1, ...] -> the same with `train_rows` [B, slots] (flat
    b * (T + 1) + t indices of the step rows, -1 in unused slots), `final_rows` [B] (each episode's final
    observation) and `prompt_ids` trimmed to the batch's longest prompt, rounded up to `quantum`.

    An episode's rows are those with a prompt (collate zeroes the rest; every prompt has a token), its
    last one the final observation."""
    prompt_length = obs["prompt_length"]
    b, rows = prompt_length.shape
    present = np.maximum((prompt_length > 0).sum(axis=1), 1)  # L + 1 observation rows per episode
    steps = [np.arange(n - 1) + i * rows for i, n in enumerate(present)]
    flat = np.concatenate(steps).astype(np.int32)
    slots = row_slots(max(len(flat), 1), b, rows - 1)
    train = np.full(b * slots, -1, np.int32)
    train[: len(flat)] = flat
    width = obs["prompt_ids"].shape[-1]
    longest = int(prompt_length.max(initial=1))
    keep = min(width, quantized(longest, quantum))
    return {
        **obs,
        "prompt_ids": obs["prompt_ids"][..., width - keep :],
        "train_rows": train.reshape(b, slots),
        "final_rows": (np.arange(b) * rows + present - 1).astype(np.int32),
    }


def share_prefix(obs: dict[str, np.ndarray], prefix: np.ndarray, quantum: int) -> dict[str, np.ndarray]:
    """Packed observations with `prefix` (the prompt builder's preamble, which every prompt starts with)
    cut from every prompt (`cut_prefix`), the prefix itself as `prefix_ids` [B, P] (the same in every row;
    network.score_actions runs it once for all), and with the cached trunk its states as `trunk_prefix`
    [B, P, hidden] and the rows' trunk states cut the same way. Unchanged when some present row does not
    start with `prefix` (prompts from another builder): the update then computes every row whole."""
    ids, length = obs["prompt_ids"], obs["prompt_length"]
    cut = cut_prefix(ids, length, prefix, quantum)
    if cut is None:
        return obs
    rest_ids, rest = cut
    width, keep, p = ids.shape[-1], rest_ids.shape[-1], len(prefix)
    out = {
        **obs,
        "prompt_ids": rest_ids,
        "prompt_length": rest,
        "prefix_ids": np.broadcast_to(np.asarray(prefix, ids.dtype), (ids.shape[0], p)).copy(),
    }
    if "trunk_rows" in obs:
        real = np.arange(width) >= (width - rest[..., None])  # [B, T + 1, width] slots after the cut
        out.update(_cut_trunk(obs, real, width, keep, p))
    return out


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


def _cut_trunk(obs: dict[str, np.ndarray], real: np.ndarray, width: int, keep: int, p: int) -> dict:
    """`share_prefix`'s cut of the cached trunk states: each row's prompt part to the `keep` slots after
    the prefix (padding 0), the action part as it was, and the prefix's own states from a final row."""
    flat_real = real.reshape(-1, width)
    train, final = obs["train_rows"].reshape(-1), obs["final_rows"].reshape(-1)
    rows = obs["trunk_rows"]
    b, slots = rows.shape[:2]
    rows = rows.reshape(b * slots, *rows.shape[2:])
    prompt_part = rows[:, :width] * flat_real[np.maximum(train, 0)][..., None]
    cut_rows = np.concatenate([prompt_part[:, width - keep :], rows[:, width:]], axis=1)
    finals = obs["trunk_final"] * flat_real[final][..., None]
    first = int(obs["prompt_length"].reshape(-1)[final[0]])
    prefix_states = obs["trunk_final"][0, width - first : width - first + p]
    return {
        "trunk_rows": cut_rows.reshape(b, slots, *cut_rows.shape[1:]),
        "trunk_final": finals[:, width - keep :],
        "trunk_prefix": np.broadcast_to(prefix_states, (b, *prefix_states.shape)).copy(),
    }
