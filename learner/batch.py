"""The training batch: one typed layout of B padded episodes, built here and taken by every loss.

Episodes are padded to T = max_steps so the train step compiles once. Observations carry T + 1 rows per
episode (one per step, then the observation after the last step: the critic's bootstrap); per-step
arrays carry T rows of their row shape. Padding is zeros: padded observations have empty masks, and padded steps are masked
out of every loss by `length`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from common.policies.family import Augmentation, PolicyFamily, augments
from common.protocol import BASE_STEP_ARRAYS, Episode


class Batch(NamedTuple):
    """B padded episodes (a JAX pytree: it is jitted, sharded and placed like a dict of arrays).

    Shapes are [B, T + 1, ...] for observations, [B, T, *row shape] per step, [B] per episode. The
    per-step fields have their wire dtypes.
    """

    obs: dict[str, Any]
    """Featurized observations {name: [B, T + 1, ...]} (the policy family's episode spec)."""
    choice: dict[str, Any]
    """The choices taken {name: [B, T, *row shape]} as its `evaluate` takes them: the policy family's choice
    arrays (for the pointer policy action_type, element, word, direction, int32 [B, T] each), then its
    `EpisodeSpec.step_logps` arrays (float32), the behaviour policy's own log-probabilities (e.g. per
    generated token), which a family's evaluate may read. The losses read only `behavior_logp`."""
    behavior_logp: Any
    """[B, T] float32: log mu(a_t | s_t), the behaviour policy's log-probability of the action taken."""
    reward: Any
    """[B, T] float32."""
    policy_version: Any
    """[B, T] int32: the policy version that chose each action (its lag is the learner's version minus it)."""
    length: Any
    """[B] int32: real steps of each episode (steps t < length are real)."""
    terminal: Any
    """[B] bool: ended in a terminal state (no bootstrap); False when truncated (bootstrap from V(s_L))."""
    weights: Any
    """[B] float32: prioritized-replay importance weights (1 for uniform sampling and demonstrations)."""
    keep: Any
    """[B] bool: the instruction-level filter on the actor loss (all True when it is off)."""
    acted_obs: dict[str, Any] | None = None
    """The observations as the behaviour policy saw them, when `obs` was augmented after acting (word
    renaming, common/policies/pointer/augment.py): the importance ratios are computed on these, so that rho = pi / mu is
    exactly 1 on-policy. None when `obs` is what the actor saw."""


assert Batch._fields[-1] == "acted_obs", "the optional field comes last (NamedTuple defaults)"


def collate(episodes: list[Episode], max_steps: int, weights: np.ndarray | None = None) -> Batch:
    """Validated episodes -> one padded host Batch (weights default to 1, keep to all True); every array
    keeps its row shape and dtype, zeros past each episode's length."""
    b = len(episodes)
    first = episodes[0]
    obs = {k: np.zeros((b, max_steps + 1, *v.shape[1:]), v.dtype) for k, v in first.obs.items()}
    steps = {k: np.zeros((b, max_steps, *v.shape[1:]), v.dtype) for k, v in first.steps.items()}
    for i, ep in enumerate(episodes):
        n = ep.length
        for k, v in ep.obs.items():
            obs[k][i, : n + 1] = v
        for k, v in ep.steps.items():
            steps[k][i, :n] = v
    return Batch(
        obs=obs,
        choice={k: v for k, v in steps.items() if k not in BASE_STEP_ARRAYS},
        **{k: steps[k] for k in BASE_STEP_ARRAYS},
        length=np.array([ep.length for ep in episodes], np.int32),
        terminal=np.array([not ep.truncated for ep in episodes], bool),
        weights=np.ones(b, np.float32) if weights is None else np.asarray(weights, np.float32),
        keep=np.ones(b, bool),
    )


def example_batch(
    feature_spec: dict[str, tuple[tuple[int, ...], str]],
    batch_size: int,
    max_steps: int,
    acted_obs: bool = False,
    *,
    choices: Mapping[str, tuple[tuple[int, ...], str]],
) -> Batch:
    """A Batch of the exact shapes and dtypes `collate` produces (all zeros), to compile ahead of data;
    `acted_obs` adds the un-augmented observations that a renaming learner passes (Batch.acted_obs);
    `choices` gives the family's Batch.choice arrays, name -> (row shape, dtype str)
    (`EpisodeSpec.choice_arrays()`)."""
    obs = {
        k: np.zeros((batch_size, max_steps + 1, *shape), np.dtype(dt))
        for k, (shape, dt) in feature_spec.items()
    }
    return Batch(
        acted_obs={k: v.copy() for k, v in obs.items()} if acted_obs else None,
        obs=obs,
        choice={
            k: np.zeros((batch_size, max_steps, *shape), np.dtype(dt)) for k, (shape, dt) in choices.items()
        },
        **{k: np.zeros((batch_size, max_steps), np.dtype(dt)) for k, dt in BASE_STEP_ARRAYS.items()},
        length=np.ones(batch_size, np.int32),
        terminal=np.ones(batch_size, bool),
        weights=np.ones(batch_size, np.float32),
        keep=np.ones(batch_size, bool),
    )


def augmented(
    batch: Batch, policy: PolicyFamily, augmentation: Augmentation, seed: int | Sequence[int]
) -> Batch:
    """`batch` with its observations augmented by the family (common/policies/family.py:Augments; the
    pointer policy renames words), the originals kept as `acted_obs`: the behaviour policy saw those, so
    the importance ratios are computed on them (learner/training/train_step.py). `batch` itself when the
    family augments nothing under these settings."""
    if not augments(policy, augmentation):
        return batch
    return batch._replace(obs=policy.augment(batch.obs, augmentation, seed), acted_obs=batch.obs)
