"""The losses, picked once by `--algorithm` from LOSSES and passed to the train step.

Each `Loss` pairs a reinforcement-learning loss with the imitation loss of demonstration updates; both
take `(evaluation, batch, params)` (learner/losses/base.py) and return a LossOutput. The maths lives in
pure functions over loose arrays (learner/losses/aride.py, learner/losses/a2c.py), tested against slow
references; the adapters here only unpack the policy family's Evaluation for them.
"""

from __future__ import annotations

from common.policies.evaluation import Evaluation
from learner.batch import Batch
from learner.losses import a2c, aride
from learner.losses.base import (
    ACTOR_WEIGHTINGS,
    DEFAULTS,
    ActorWeighting,
    Loss,
    LossOutput,
    LossParams,
    PriorityTerms,
)

__all__ = [
    "ACTOR_WEIGHTINGS",
    "DEFAULTS",
    "LOSSES",
    "ActorWeighting",
    "Loss",
    "LossOutput",
    "LossParams",
    "PriorityTerms",
    "get_loss",
]


def _aride_rl(ev: Evaluation, batch: Batch, params: LossParams) -> LossOutput:
    return aride.aride_loss(ev.logp, ev.entropy, ev.values, batch, params, ratio_logp=ev.ratio_logp)


def _aride_imitation(ev: Evaluation, batch: Batch, params: LossParams) -> LossOutput:
    return aride.imitation_loss(ev.logp, ev.values, batch, params, ratio_logp=ev.ratio_logp)


def _a2c_rl(ev: Evaluation, batch: Batch, params: LossParams) -> LossOutput:
    return a2c.actor_critic_loss(ev.logp, ev.entropy, ev.values, batch, params, ratio_logp=ev.ratio_logp)


def _a2c_imitation(ev: Evaluation, batch: Batch, params: LossParams) -> LossOutput:
    return a2c.imitation_loss(ev.logp, ev.values, batch, params)


LOSSES: dict[str, Loss] = {
    "aride": Loss("aride", _aride_rl, _aride_imitation, has_priorities=True),
    "a2c": Loss("a2c", _a2c_rl, _a2c_imitation, has_priorities=False),
}
"""--algorithm -> its losses: "aride" (Retrace targets, replay weights and priorities; DistRL), "a2c" (the
plain actor-critic, an ablation)."""


def get_loss(name: str) -> Loss:
    """The Loss of `--algorithm name`; ValueError naming the known ones."""
    if name not in LOSSES:
        raise ValueError(f"--algorithm must be one of {sorted(LOSSES)}, got {name!r}")
    return LOSSES[name]
