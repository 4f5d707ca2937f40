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
    keep = min(width, -(-longest // quantum) * quantum)
    return {
        **obs,
        "prompt_ids": obs["prompt_ids"][..., width - keep :],
        "train_rows": train.reshape(b, slots),
        "final_rows": (np.arange(b) * rows + present - 1).astype(np.int32),
    }
