"""Collate validated episodes into one fixed-shape padded batch, so the train step compiles once."""

from __future__ import annotations

import numpy as np

from common.protocol import STEP_ARRAYS, Episode


def collate(
    episodes: list[Episode], max_steps: int, weights: np.ndarray | None = None
) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
    """Episodes -> {"obs": {name: [B, T + 1, ...]}, step arrays [B, T], "length" [B], "terminal" [B],
    "weights" [B] (replay importance weights, default 1), "keep" [B] (the instruction-level filter on the
    actor, default all True)}.

    T is max_steps; padding is zeros (padded observations have empty masks, padded steps are masked
    out of the loss by `length`).
    """
    b = len(episodes)
    first = episodes[0]
    obs = {k: np.zeros((b, max_steps + 1, *v.shape[1:]), v.dtype) for k, v in first.obs.items()}
    steps = {k: np.zeros((b, max_steps), np.dtype(dt)) for k, dt in STEP_ARRAYS.items()}
    for i, ep in enumerate(episodes):
        n = ep.length
        for k, v in ep.obs.items():
            obs[k][i, : n + 1] = v
        for k, v in ep.steps.items():
            steps[k][i, :n] = v
    return {
        "obs": obs,
        **steps,
        "length": np.array([ep.length for ep in episodes], np.int32),
        "terminal": np.array([not ep.truncated for ep in episodes], bool),
        "weights": np.ones(b, np.float32) if weights is None else np.asarray(weights, np.float32),
        "keep": np.ones(b, bool),
    }


def example_batch(
    feature_spec: dict[str, tuple[tuple[int, ...], str]], batch_size: int, max_steps: int
) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
    """A batch of the exact shapes and dtypes `collate` produces (all zeros), to compile ahead of data."""
    obs = {
        k: np.zeros((batch_size, max_steps + 1, *shape), np.dtype(dt))
        for k, (shape, dt) in feature_spec.items()
    }
    return {
        "obs": obs,
        **{k: np.zeros((batch_size, max_steps), np.dtype(dt)) for k, dt in STEP_ARRAYS.items()},
        "length": np.ones(batch_size, np.int32),
        "terminal": np.ones(batch_size, bool),
        "weights": np.ones(batch_size, np.float32),
        "keep": np.ones(batch_size, bool),
    }
