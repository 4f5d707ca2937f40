"""What a policy family's pass over a training batch gives the losses."""

from __future__ import annotations

from typing import Any, NamedTuple


class Evaluation(NamedTuple):
    """A policy family's evaluation of the choices taken in a padded batch [B, T] (learner.batch.Batch).

    A family with per-token quantities (a language model) sums them over each step's tokens here: the
    step is the unit of credit, so every loss sees one log-prob and one entropy per step.
    """

    logp: Any
    """[B, T] log pi of the choices taken, on `batch.obs` (what the gradient trains on)."""
    entropy: Any
    """[B, T] the exact entropy of pi at each step."""
    values: Any
    """[B, T + 1] V(s_t) on every observation, the final one included (the bootstrap)."""
    ratio_logp: Any
    """[B, T] log pi on the observations the behaviour policy saw (`batch.acted_obs` when the learner
    augmented `obs`, else `logp`), without gradient: importance ratios compare pi and mu on one input."""
