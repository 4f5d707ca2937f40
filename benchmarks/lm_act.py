"""The LM agent's act per key: `python -m benchmarks lm_act` (issue 46, item 5).

The act of `--model.kind lm` (the packaged SmolLM2-135M, default recipe, constrained decoding) on 1 and 4
SimPhone prompts (benchmarks/lm_agent.py's screens) with keys 0-2, best of 5 after a compile, and the
prefill alone on the same prompts: decode = act - prefill. Per row the longest action's tokens L (a batch
decodes as long as its longest action). Run on two commits to compare decoding changes on the same prompts
and keys (BENCHMARKS.md "LM decoding without the forced end's passes").
"""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks.lm_agent import _features, _screens
from common.config import ModelConfig
from common.policies import make_policy


def _best_ms(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def run(quick: bool) -> list[dict]:
    repeats = 2 if quick else 5
    policy = make_policy(ModelConfig(kind="lm"))
    graphdef, params = policy.create(0)
    act = jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))
    prefill = jax.jit(lambda p, i: policy.prefill(graphdef, p, i))
    screens = _screens(8)
    rows = []
    for n in (1, 4):
        inputs = policy.inputs(_features(policy, screens[:n]))
        prefill_ms = _best_ms(lambda: prefill(params, inputs), repeats)  # noqa: B023
        for seed in range(3):
            key = jax.random.key(seed)
            act_ms = _best_ms(lambda: act(params, inputs, key), repeats)  # noqa: B023
            longest = int(np.max(jax.device_get(act(params, inputs, key)).choice["action_length"]))
            rows.append({
                "envs": n, "key": seed, "longest_action_tokens": longest, "act_ms": act_ms,
                "prefill_ms": prefill_ms, "decode_ms": act_ms - prefill_ms,
            })  # fmt: skip
    return rows
