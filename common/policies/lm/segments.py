"""Sequences packed end to end into rows of one width: the lm family's update and trunk fill compute real
tokens, not padding (issue 46).

A packed row (`packing.pack`) is one step: its prompt, left-padded to the batch's longest, then the action's
24 slots. The prompts after the shared preamble run from about 100 to 200 tokens and actions are about 7,
so about half of a row's slots were padding, and the decoder's cost is per slot. Here each row's real
tokens are one *sequence*, and sequences are laid end to end into rows of `width` slots (first fit, the
longest first); the decoder (`Decoder.states(segments=)`) lets a token attend only to its own sequence's
keys and the shared prefix, at the positions it has alone, so every sequence scores exactly as its own row
did (tests/test_lm_segments.py).

Shapes stay few: the width is SEGMENT_WIDTH unless a sequence is longer (then that, rounded up to the
quantum), and the rows are a multiple of `groups` (the batch's episodes, so the learner can lay the rows
out [B, rows / B, width] like every observation).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SEGMENT_WIDTH = 512
"""Slots per packed row: about three of the recipe's sequences (a prompt after the preamble and its
action). Wider rows waste less at a row's end but each token attends over more keys (attention grows with
the row's width, the rest of the decoder does not); 512 measured faster than 384 for the recipe's update
(BENCHMARKS.md "LM update on packed sequences")."""


class Layout(NamedTuple):
    """Where each sequence goes: row `row[i]`, slots `col[i]` .. `col[i] + lengths[i] - 1`."""

    lengths: np.ndarray
    """[N] tokens per sequence."""
    row: np.ndarray
    """[N] the packed row each sequence is in."""
    col: np.ndarray
    """[N] its first slot in that row."""
    rows: int
    """Packed rows (a multiple of the groups asked for; some may be empty)."""
    width: int
    """Slots per row."""

    @property
    def starts(self) -> np.ndarray:
        """[N] each sequence's first token as a flat index into [rows * width]."""
        return self.row * self.width + self.col

    def place(self, sequences: list[np.ndarray], dtype, tail: tuple[int, ...] = ()) -> np.ndarray:
        """[rows, width, *tail] with each sequence [len, *tail] at its slots, 0 elsewhere."""
        out = np.zeros((self.rows, self.width, *tail), dtype)
        for seq, r, c in zip(sequences, self.row, self.col, strict=True):
            out[r, c : c + len(seq)] = seq
        return out

    def segments(self) -> np.ndarray:
        """[rows, width] int32: 1, 2, ... for the sequences of each row in order, 0 on padding."""
        out = np.zeros((self.rows, self.width), np.int32)
        for i, (n, r, c) in enumerate(zip(self.lengths, self.row, self.col, strict=True)):
            out[r, c : c + n] = i + 1  # unique over the batch: equal only within one sequence
        return out

    def positions(self, offset: int) -> np.ndarray:
        """[rows, width] int32: each token's position in its sequence plus `offset` (a shared prefix's
        length), 0 on padding."""
        out = np.zeros((self.rows, self.width), np.int32)
        for n, r, c in zip(self.lengths, self.row, self.col, strict=True):
            out[r, c : c + n] = offset + np.arange(n)
        return out

    def take(self, flat: np.ndarray) -> list[np.ndarray]:
        """Each sequence's part of [rows, width, ...] outputs."""
        return [flat[r, c : c + n] for n, r, c in zip(self.lengths, self.row, self.col, strict=True)]


def layout(lengths, width: int, quantum: int, groups: int = 1) -> Layout:
    """Sequences of `lengths` laid into rows of max(`width`, the longest rounded up to `quantum`) slots,
    first fit in order of decreasing length, the rows rounded up to a multiple of `groups` (at least one
    row per group)."""
    lengths = np.asarray(lengths, np.int64)
    longest = int(lengths.max(initial=1))
    width = max(width, -(-longest // quantum) * quantum)
    row, col = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    filled: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        r = next((r for r, used in enumerate(filled) if used + lengths[i] <= width), len(filled))
        if r == len(filled):
            filled.append(0)
        row[i], col[i] = r, filled[r]
        filled[r] += int(lengths[i])
    rows = max(groups, -(-len(filled) // groups) * groups)
    return Layout(lengths, row, col, rows, width)


def final_width(longest: int, budget: int, quantum: int) -> int:
    """The final rows' width: they run forward only, about one per episode, so as wide as the longest
    rather than SEGMENT_WIDTH; rounded up to `quantum` times a power of two (at most the prompt budget
    rounded up to it), so their widths add few shapes (`final_widths`)."""
    wide = quantum
    while wide < longest:
        wide *= 2
    return min(wide, -(-budget // quantum) * quantum)


def final_widths(budget: int, quantum: int) -> int:
    """How many widths `final_width` gives for prompts of at most `budget` tokens."""
    return len({final_width(n, budget, quantum) for n in range(1, budget + 1)})


def bound(longest: int, width: int, quantum: int, per_group: int) -> int:
    """How many shapes `layout` gives for sequences of at most `longest` tokens and at most `per_group`
    rows per group: one width when the longest fits SEGMENT_WIDTH, times the row counts."""
    widths = 1 + max(0, -(-longest // quantum) * quantum - width) // quantum
    return widths * per_group


def packed_sequences(
    obs: dict[str, np.ndarray],
    choice: dict[str, np.ndarray],
    prefix: np.ndarray,
    quantum: int,
    states: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
) -> dict[str, np.ndarray]:
    """Packed observations (`packing.pack`) with their rows as sequences packed end to end: the step rows
    (prompt + action) as `steps_ids`, `steps_positions`, `steps_segments` [B, r, width] and `steps_at`
    [B, slots] (the flat index of each train slot's last prompt token, 0 in an unused slot), the final rows
    (prompt alone, computed forward only) as `finals_*` and `finals_at` [B]. With `prefix` (the preamble)
    cut from every prompt when each starts with it: `prefix_ids` [B, P], run once for all. `states`: the
    cached trunk's states of each used train slot's row and each final row, whole (`TrunkCache.row_states`),
    laid out the same as `steps_trunk` and `finals_trunk` [B, r, width, hidden] (and `trunk_prefix`)."""
    b, rows, width = obs["prompt_ids"].shape
    steps = rows - 1
    flat_prompt = obs["prompt_ids"].reshape(b * rows, width)
    flat_length = obs["prompt_length"].reshape(b * rows)
    train = obs["train_rows"].reshape(-1)
    used = np.flatnonzero(train >= 0)
    step_of = train[used] // rows * steps + train[used] % rows
    finals = obs["final_rows"].reshape(-1)
    prompts = [flat_prompt[f, width - int(flat_length[f]) :] for f in (*train[used], *finals)]
    p = len(prefix) if all_follow(prompts, prefix) else 0
    tokens = choice["action_tokens"].reshape(b * steps, -1)
    length = choice["action_length"].reshape(-1)
    step_prompts, final_prompts = prompts[: len(used)], prompts[len(used) :]
    step_seqs = [
        np.concatenate([q[p:], tokens[s, : int(length[s])]])
        for q, s in zip(step_prompts, step_of, strict=True)
    ]
    final_seqs = [q[p:] for q in final_prompts]
    out = {**obs}
    laid = {}
    for name, seqs, prompt_ends in (
        ("steps", step_seqs, [len(q) - p for q in step_prompts]),
        ("finals", final_seqs, [len(q) for q in final_seqs]),
    ):
        lengths = [len(q) for q in seqs]
        wide = SEGMENT_WIDTH if name == "steps" else final_width(max(lengths), width, quantum)
        where = layout(lengths, wide, quantum, b)
        shape = (b, where.rows // b, where.width)
        out[f"{name}_ids"] = where.place(seqs, np.int32).reshape(shape)
        out[f"{name}_positions"] = where.positions(p).reshape(shape)
        out[f"{name}_segments"] = where.segments().reshape(shape)
        laid[name] = (where, where.starts + np.asarray(prompt_ends, np.int64) - 1)
    at = np.zeros(train.size, np.int32)
    at[used] = laid["steps"][1]
    out["steps_at"] = at.reshape(obs["train_rows"].shape)
    out["finals_at"] = laid["finals"][1].astype(np.int32)
    if p:
        out["prefix_ids"] = np.broadcast_to(np.asarray(prefix, flat_prompt.dtype), (b, p)).copy()
    if states is not None:
        hidden = states[1][0].shape[-1]  # every episode has a final row
        for name, kept in zip(("steps", "finals"), states, strict=True):
            where = laid[name][0]
            placed = where.place([s[p:] for s in kept], np.float32, (hidden,))
            out[f"{name}_trunk"] = placed.reshape(b, -1, where.width, hidden)
        if p:
            first = states[1][0][:p]  # every row's first p states are the preamble's
            out["trunk_prefix"] = np.broadcast_to(first, (b, *first.shape)).copy()
    return out


def all_follow(prompts: list[np.ndarray], prefix: np.ndarray) -> bool:
    """Whether every prompt starts with `prefix` and has ids after it."""
    p = len(prefix)
    return p > 0 and all(len(ids) > p and np.array_equal(ids[:p], prefix) for ids in prompts)
