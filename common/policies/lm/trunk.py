"""The lm family's cached frozen trunk: the output of the decoder's blocks below the adapters, kept per
stored step so an update runs only the adapted blocks (issue 46).

With LoRA on the top k blocks (--model.lora-layers), the blocks below carry no trainable weight, so their
output over a row's tokens (`Decoder.trunk`) is a function of the token ids alone: the same at every
update that draws the row. An update used to recompute it every time (with the recipe's 8 of 30 blocks
adapted, most of an update's forward work); `TrunkCache` computes it once per distinct row (prompt +
action ids) when a batch first draws it, keeps it on the learner's host in float32 within a byte budget
(--trunk-cache-mb; the least recently drawn row is evicted first, and recomputed if drawn again), and
gives each batch's rows (`row_states`) to segments.packed_sequences, which lays them out as the update's
`steps_trunk` and `finals_trunk`; `network.score_actions` starts the adapted blocks from them. A fill
packs the missing rows end to end (segments.py) and runs the prompt builder's preamble (63 of a prompt's
mean 187 tokens) once, as one row whose keys and values every row's attention prepends
(`Decoder.trunk_after`).

Exact: a real token's trunk state does not depend on the padding or the other sequences around it
(masked keys are never attended to), so a row's states are kept for its real tokens only and placed
wherever a later batch lays the row; padding reads 0, which no real position attends to and no loss
reads. Float32 only: a reduced-precision cache would change the adapted blocks' inputs, which is not
measured, so not offered. Keyed by the ids, not by the episode: the cache needs no bookkeeping with the
replay, a restore starts it empty, and rows shared by episodes (a demonstration drawn again, a repeated
screen) share an entry.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import jax
import numpy as np
from flax import nnx

from common.policies.lm import segments

EXACT_ROWS = 8
"""Up to this many packed rows a trunk computation runs exactly as many (a fill of the recipe's batch is
4-6 rows of 512: a rung above would be up to a fifth more work); more are rounded up to a rung."""


def _rung(rows: int) -> int:
    """The packed rows of a trunk computation: exact up to EXACT_ROWS, then the next power of two, so few
    shapes compile."""
    return rows if rows <= EXACT_ROWS else 1 << (rows - 1).bit_length()


class TrunkCache:
    """Frozen-trunk states of the rows the learner's updates draw, within `budget_bytes`; see the module
    docstring. Single-threaded: the learner calls it from its update (the helper thread)."""

    def __init__(self, graphdef: Any, budget_bytes: int, quantum: int = 64, prefix: np.ndarray | None = None):
        self.budget_bytes = budget_bytes
        self.quantum = quantum
        """A trunk computation's prompt width is a multiple of this (the family's PROMPT_QUANTUM)."""
        self.prefix = np.asarray(prefix if prefix is not None else [], np.int32)
        """Ids every prompt starts with (the prompt builder's preamble): computed once per fill, not once
        per row, when every missing row starts with them (Decoder.trunk_after)."""
        self._rows: OrderedDict[tuple[bytes, bytes], np.ndarray] = OrderedDict()
        self.bytes = 0
        """Bytes the kept states take now (at most `budget_bytes`)."""
        self.hits = 0
        """Rows an update took from the cache (counted per drawn row)."""
        self.misses = 0
        """Rows computed because the cache did not hold them."""
        self.evicted = 0
        """Rows dropped to stay within the budget."""

        def compute(params, ids, positions, mask, numbered):
            return nnx.merge(graphdef, params).decoder.trunk_after(ids, positions, mask, None, numbered)[0]

        def compute_after(params, ids, positions, mask, numbered, prefix):
            return nnx.merge(graphdef, params).decoder.trunk_after(ids, positions, mask, prefix, numbered)

        self._compute = jax.jit(compute)
        self._compute_after = jax.jit(compute_after)

    def stats(self) -> dict[str, float]:
        """For the update's metrics: the cache's size and this process's totals so far."""
        return {
            "trunk_cache_mb": self.bytes / 2**20,
            "trunk_hits": self.hits,
            "trunk_misses": self.misses,
            "trunk_evicted": self.evicted,
        }

    def row_states(
        self, obs: dict[str, np.ndarray], choice: dict[str, np.ndarray], params: Any
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The trunk states of packed observations' rows (packing.pack), each [its real tokens, hidden]:
        (each used train slot's row, prompt and action; each final row, its prompt). Rows the cache lacks
        are computed with `params` (only its frozen part is read)."""
        prompt, length = obs["prompt_ids"], obs["prompt_length"]
        b, rows, width = prompt.shape
        steps, a = rows - 1, choice["action_tokens"].shape[-1]
        flat_prompt, flat_length = prompt.reshape(b * rows, width), length.reshape(b * rows)
        flat_tokens = choice["action_tokens"].reshape(b * steps, a)
        flat_n = choice["action_length"].reshape(b * steps)

        def key(row: int, step: int | None) -> tuple[bytes, bytes]:
            ids = flat_prompt[row, width - int(flat_length[row]) :].astype(np.int32).tobytes()
            if step is None:
                return ids, b""
            return ids, flat_tokens[step, : int(flat_n[step])].astype(np.int32).tobytes()

        train = np.asarray(obs["train_rows"]).reshape(-1)
        train_keys = [key(int(r), int(r) // rows * steps + int(r) % rows) for r in train[train >= 0]]
        final_keys = [key(int(r), None) for r in np.asarray(obs["final_rows"]).reshape(-1)]
        keys = train_keys + final_keys
        states = {k: self._take(k) for k in dict.fromkeys(keys) if k in self._rows}
        missing = [k for k in dict.fromkeys(keys) if k not in states]
        self.hits += len(keys) - len(missing)
        if missing:
            states.update(self._fill(missing, params))
        return [states[k] for k in train_keys], [states[k] for k in final_keys]

    def clear(self) -> None:
        """Drops every kept row (the counts stay, the compiled trunk too): the next draws compute again."""
        self._rows.clear()
        self.bytes = 0

    def _take(self, key: tuple[bytes, bytes]) -> np.ndarray:
        self._rows.move_to_end(key)
        return self._rows[key]

    def _fill(self, missing: list[tuple[bytes, bytes]], params: Any) -> dict:
        """The trunk of each missing row (prompt + action ids), computed in one call with the rows packed
        end to end (segments.py; the shared prefix once, when every row starts with it), kept while the
        budget allows."""
        self.misses += len(missing)
        prompts = [np.frombuffer(ids, np.int32) for ids, _ in missing]
        cut = len(self.prefix) if segments.all_follow(prompts, self.prefix) else 0
        seqs = [
            np.concatenate([p[cut:], np.frombuffer(action, np.int32)])
            for p, (_, action) in zip(prompts, missing, strict=True)
        ]
        where = segments.layout([len(q) for q in seqs], segments.SEGMENT_WIDTH, self.quantum)
        where = where._replace(rows=_rung(where.rows))
        ids = where.place(seqs, np.int32)
        numbered = where.segments()
        args = (params, ids, where.positions(cut), numbered > 0, numbered)
        if cut:
            states, prefix_states = jax.device_get(self._compute_after(*args, self.prefix))
        else:
            states = jax.device_get(self._compute(*args))
            prefix_states = np.zeros((0, states.shape[-1]), np.float32)
        prefix_states = np.asarray(prefix_states)
        out = {}
        for k, row in zip(missing, where.take(np.asarray(states)), strict=True):
            out[k] = kept = np.concatenate([prefix_states, row])
            self._keep(k, kept)
        return out

    def _keep(self, key: tuple[bytes, bytes], states: np.ndarray) -> None:
        if states.nbytes > self.budget_bytes:
            return
        self._rows[key] = states
        self.bytes += states.nbytes
        while self.bytes > self.budget_bytes:
            _, dropped = self._rows.popitem(last=False)
            self.bytes -= dropped.nbytes
            self.evicted += 1
