"""The loss seam: what a loss takes and returns, and the one set of numbers every loss reads.

A loss is a pure function `(evaluation, batch, params) -> LossOutput`: `evaluation` is the policy
family's pass over the batch (log-probs of the taken choices, exact entropies, values; common.policies),
`batch` the padded episodes (learner.batch.Batch), `params` the LossParams below. The train step
(learner/training/train_step.py) receives the function, as Acme's learners receive theirs; learner/losses/__init__.py
maps `--algorithm` to one `Loss`, a pair of such functions (reinforcement learning and imitation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple, get_args

import jax

_NUMBERS = (
    "gamma", "lambda_", "rho_clip", "c_clip", "pg_rho_clip", "entropy_coef", "value_coef",
    "vmpo_eta", "vmpo_kl_coef",
)  # fmt: skip

ActorWeighting = Literal["binary", "binary_ratio", "vmpo"]
ACTOR_WEIGHTINGS: tuple[str, ...] = get_args(ActorWeighting)
"""How A-RIDE's actor weighs its steps when the advantage is binarized (learner/losses/actor_weighting.py)."""


class PriorityTerms(NamedTuple):
    """Per-trajectory terms of the replay priority (DPER), each [B], over real steps (0 when empty):
    w1 * delta + w2 * rho_clipped + w3 * entropy (learner/replay/prioritized.py:trajectory_priority)."""

    delta: jax.Array
    """mean |delta_t|, the rho_bar-clipped TD error."""
    rho_clipped: jax.Array
    """mean min(rho_clip, rho_t)."""
    entropy: jax.Array
    """mean H(pi(.|s_t)), the exact entropy of the current policy on the states visited."""


class LossOutput(NamedTuple):
    """What a loss returns: the scalar to minimise, scalar metrics by name, and the replay priority terms
    (None when the loss has none: imitation, the plain actor-critic)."""

    loss: jax.Array
    metrics: dict[str, jax.Array]
    priority_terms: PriorityTerms | None


@partial(
    jax.tree_util.register_dataclass,
    data_fields=[*_NUMBERS, "advantage_threshold"],
    meta_fields=["binarize_advantage", "actor_weighting", "off_policy_correction"],
)
@dataclass(frozen=True)
class LossParams:
    """The numbers of every loss, each default defined here once (learner/config.py's flags take theirs
    from these). The plain actor-critic reads gamma, rho_clip, entropy_coef and value_coef.

    A JAX pytree: pass it to a jitted function like any argument (the numbers are traced, so changing
    them does not recompile; switching binarization, the actor weighting, or the threshold between None
    and a number, does),
    or close over it. It is also hashable, so `static_argnames` works too.
    """

    gamma: float = 0.95
    """Discount."""
    lambda_: float = 0.95
    """Trace decay of Retrace / V-trace: c_t = lambda * min(c_clip, rho_t). 0 gives one-step TD targets."""
    rho_clip: float = 1.0
    """rho_bar = min(rho_clip, rho) weighs each TD error (V-trace rho-bar; infinity gives Retrace)."""
    c_clip: float = 1.0
    """Traces are cut at c = lambda * min(c_clip, rho) (V-trace c-bar, Retrace's min(1, rho))."""
    pg_rho_clip: float = 1.0
    """The policy-gradient advantage is weighted by min(pg_rho_clip, rho)."""
    entropy_coef: float = 0.01
    """Weight beta of the exact entropy bonus."""
    value_coef: float = 0.5
    """Weight of the critic loss in the total."""
    advantage_threshold: float | None = None
    """If set, only steps with advantage > this train the actor (DigiRL-style filtering uses 0)."""
    binarize_advantage: bool = False
    """The actor never pushes a sampled action down: instead of the signed advantage A it weighs steps
    with A > 0 (or, for "vmpo", the better half) by non-negative weights that `actor_weighting` picks
    (DigiRL-style binarization). False: the signed A, and `actor_weighting` is not read."""
    actor_weighting: ActorWeighting = "binary"
    """With binarize_advantage, the actor's weight of step t (learner/losses/actor_weighting.py):
    "binary": 1[A_t > 0], DigiRL's form; since rho_t > 0 it ignores the importance ratio (the actor is
    not off-policy corrected; the critic's Retrace targets still are). The default, by measurement: over
    3 seeds of 240 s it had the highest greedy train AUC, 0.613 against 0.552 for "binary_ratio" and
    0.514 for "vmpo" (`python -m benchmarks actor_loss`, BENCHMARKS.md);
    "binary_ratio": min(pg_rho_clip, rho_t) * 1[A_t > 0], the truncated-IS form of the same;
    "vmpo": V-MPO / AWR: the better half of the steps by advantage, weighted by
    min(pg_rho_clip, rho_t) * exp(A_t / vmpo_eta) normalised to sum 1, plus a KL penalty to mu."""
    vmpo_eta: float = 0.5
    """"vmpo": temperature eta of exp(A / eta), fixed (V-MPO learns it). SimPhone advantages lie in about
    [-1, 1] (success rewards 0 / 1), so among the kept steps the largest weight is at most about
    e^(1 / 0.5) ~ 7x the smallest: the best steps count more, no single step takes the whole batch."""
    vmpo_kl_coef: float = 1.0
    """"vmpo": weight of the KL(mu || pi) penalty (mean k3 = rho - 1 - log rho over real steps). At V-MPO's
    trust-region scale (a KL of 0.01) it costs 0.01 against an actor term of order 1, so it is silent
    while pi stays near mu and pulls back (gradient (rho - 1) / count per step) once pi has moved far."""
    off_policy_correction: bool = True
    """False sets every ratio rho (so rho_bar, c and the policy-gradient weight) to 1: the data is
    treated as on-policy however stale it is (the ablation of the correction)."""

    def __post_init__(self):
        # Only plain Python numbers are checked: JAX rebuilds the params with tracers inside jit.
        def number(name):
            x = getattr(self, name)
            return x if isinstance(x, int | float) and not isinstance(x, bool) else None

        gamma, lam, rho, c, pg, ent, val, eta, kl = (number(n) for n in _NUMBERS)
        threshold = number("advantage_threshold")
        checks = {
            "gamma must be in [0, 1]": gamma is None or 0.0 <= gamma <= 1.0,
            "lambda must be in [0, 1]": lam is None or 0.0 <= lam <= 1.0,
            "rho_clip must be > 0": rho is None or rho > 0,
            "c_clip must be > 0": c is None or c > 0,
            "pg_rho_clip must be > 0": pg is None or pg > 0,
            "entropy_coef must be >= 0": ent is None or ent >= 0,
            "value_coef must be >= 0": val is None or val >= 0,
            "advantage_threshold must be finite or None": threshold is None or math.isfinite(threshold),
            "vmpo_eta must be > 0": eta is None or eta > 0,
            "vmpo_kl_coef must be >= 0": kl is None or kl >= 0,
            f"actor_weighting must be one of {ACTOR_WEIGHTINGS}": self.actor_weighting in ACTOR_WEIGHTINGS,
        }
        bad = [msg for msg, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"LossParams: {'; '.join(bad)} (got {self})")


DEFAULTS = LossParams()
"""The default of every loss setting (learner/config.py's flags default to these)."""

LossFn = Callable[[Any, Any, LossParams], LossOutput]
"""(evaluation, batch, params) -> LossOutput; evaluation is a common.policies.Evaluation."""


@dataclass(frozen=True)
class Loss:
    """One `--algorithm`: its reinforcement-learning loss and its imitation loss (demonstration updates)."""

    name: str
    rl: LossFn
    imitation: LossFn
    has_priorities: bool
    """Whether `rl` returns priority terms for the replay."""
