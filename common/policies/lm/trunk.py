"""The lm family's cached frozen trunk: the output of the decoder's blocks below the adapters, kept per
stored step so an update runs only the adapted blocks (issue 46).

With LoRA on the top k blocks (--model.lora-layers), the blocks below carry no trainable weight, so their
output over a row's tokens (`Decoder.trunk`) is a function of the token ids alone: the same at every
update that draws the row. An update used to recompute it every time (with the recipe's 8 of 30 blocks
adapted, most of an update's forward work); `TrunkCache` computes it once per distinct row (prompt +
action ids) when a batch first draws it, keeps it on the learner's host in float32 within a byte budget
(--trunk-cache-mb; the least recently drawn row is evicted first, and recomputed if drawn again), and
adds each batch's rows to the packed observations as `trunk_rows` [train slots, W + A, hidden] and
`trunk_final` [B, W, hidden], which `network.score_actions` starts the adapted blocks from. A fill runs
the prompt builder's preamble (63 of a prompt's mean 187 tokens) once, as one row whose keys and values
every row's attention prepends (`Decoder.trunk_after`), and each row only after it.

Exact: a real token's trunk state does not depend on the padding around it (masked keys are never
attended to), so a row's states are kept for its real tokens only and placed at whatever width a later
batch has; padding positions read 0, which no real position attends to and no loss reads. Float32 only:
a reduced-precision cache would change the adapted blocks' inputs, which is not measured, so not offered.
Keyed by the ids, not by the episode: the cache needs no bookkeeping with the replay, a restore starts
it empty, and rows shared by episodes (a demonstration drawn again, a repeated screen) share an entry.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import jax
import numpy as np
from flax import nnx

from common.policies.lm import network, packing

ROW_BUCKET = 8
"""The fewest rows a trunk computation is padded to (more: the next power of two); with its prompt width
rounded up to the family's quantum, few shapes compile."""


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

        def compute(params, prompt, prompt_length, tokens, length):
            decoder = nnx.merge(graphdef, params).decoder
            return decoder.trunk(*network.row_layout(prompt, prompt_length, tokens, length))

        def compute_after(params, prompt, prompt_length, tokens, length, prefix):
            decoder = nnx.merge(graphdef, params).decoder
            layout = network.row_layout(prompt, prompt_length, tokens, length, offset=prefix.shape[-1])
            return decoder.trunk_after(*layout, prefix)

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

    def add(self, obs: dict[str, np.ndarray], choice: dict[str, np.ndarray], params: Any) -> dict:
        """Packed observations (packing.pack) with `trunk_rows` [B, slots, W + A, hidden] (0 in unused
        slots) and `trunk_final` [B, W, hidden] added; rows the cache lacks are computed with `params` (only
        its frozen part is read)."""
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
        slots = np.flatnonzero(train >= 0)
        train_keys = [key(int(train[s]), int(train[s]) // rows * steps + int(train[s]) % rows) for s in slots]
        final_keys = [key(int(r), None) for r in np.asarray(obs["final_rows"]).reshape(-1)]
        keys = train_keys + final_keys
        states = {k: self._take(k) for k in dict.fromkeys(keys) if k in self._rows}
        missing = [k for k in dict.fromkeys(keys) if k not in states]
        self.hits += len(keys) - len(missing)
        if missing:
            states.update(self._fill(missing, params, a))
        hidden = next(iter(states.values())).shape[-1]
        trunk_rows = np.zeros((train.size, width + a, hidden), np.float32)
        for slot, (ids, action) in zip(slots, train_keys, strict=True):
            n, kept = len(ids) // 4, states[ids, action]
            trunk_rows[slot, width - n : width] = kept[:n]
            trunk_rows[slot, width : width + len(action) // 4] = kept[n:]
        trunk_final = np.zeros((len(final_keys), width, hidden), np.float32)
        for i, k in enumerate(final_keys):
            trunk_final[i, width - len(k[0]) // 4 :] = states[k]
        return {**obs, "trunk_rows": trunk_rows.reshape(b, -1, width + a, hidden), "trunk_final": trunk_final}

    def clear(self) -> None:
        """Drops every kept row (the counts stay, the compiled trunk too): the next draws compute again."""
        self._rows.clear()
        self.bytes = 0

    def _take(self, key: tuple[bytes, bytes]) -> np.ndarray:
        self._rows.move_to_end(key)
        return self._rows[key]

    def _fill(self, missing: list[tuple[bytes, bytes]], params: Any, a: int) -> dict:
        """The trunk of each missing row, computed in one call (rows padded to a bucket; the shared
        prefix once, when every row starts with it), kept while the budget allows."""
        self.misses += len(missing)
        prompts = [np.frombuffer(ids, np.int32) for ids, _ in missing]
        cut = len(self.prefix) if self._all_follow_prefix(prompts) else 0
        prompt, prompt_length, tokens, length = self._layout(missing, [p[cut:] for p in prompts], a)
        width = prompt.shape[-1]
        if cut:
            states, prefix_states = jax.device_get(
                self._compute_after(params, prompt, prompt_length, tokens, length, self.prefix)
            )
        else:
            states = jax.device_get(self._compute(params, prompt, prompt_length, tokens, length))
            prefix_states = np.zeros((0, states.shape[-1]), np.float32)
        states, prefix_states = np.asarray(states), np.asarray(prefix_states)
        out = {}
        for i, (_, action) in enumerate(missing):
            p, t = int(prompt_length[i]), len(action) // 4
            kept = np.concatenate([prefix_states, states[i, width - p : width], states[i, width : width + t]])
            out[missing[i]] = kept
            self._keep(missing[i], kept)
        return out

    def _all_follow_prefix(self, prompts: list[np.ndarray]) -> bool:
        """Whether every prompt starts with the prefix and has ids after it."""
        p = len(self.prefix)
        return p > 0 and all(len(ids) > p and np.array_equal(ids[:p], self.prefix) for ids in prompts)

    def _layout(self, missing: list[tuple[bytes, bytes]], prompts: list[np.ndarray], a: int) -> tuple:
        """(prompt [R, W] left-padded, prompt_length [R], action tokens [R, A], length [R]) of the rows,
        R a bucket (padding rows: one pad id, no action), W the longest rounded up to the quantum."""
        n = len(missing)
        width = packing.quantized(max(max(len(p) for p in prompts), 1), self.quantum)
        size = max(ROW_BUCKET, 1 << (n - 1).bit_length())
        prompt = np.zeros((size, width), np.int32)
        prompt_length = np.ones(size, np.int32)
        tokens = np.zeros((size, a), np.int32)
        length = np.zeros(size, np.int32)
        for i, ((_, action), p) in enumerate(zip(missing, prompts, strict=True)):
            t = np.frombuffer(action, np.int32)
            prompt[i, width - len(p) :], prompt_length[i] = p, len(p)
            tokens[i, : len(t)], length[i] = t, len(t)
        return prompt, prompt_length, tokens, length

    def _keep(self, key: tuple[bytes, bytes], states: np.ndarray) -> None:
        if states.nbytes > self.budget_bytes:
            return
        self._rows[key] = states
        self.bytes += states.nbytes
        while self.bytes > self.budget_bytes:
            _, dropped = self._rows.popitem(last=False)
            self.bytes -= dropped.nbytes
            self.evicted += 1
