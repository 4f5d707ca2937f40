"""Learner defaults that depend on the run: whether demonstrations are used, and the entropy bonus."""

from __future__ import annotations

from pathlib import Path

from learner.config import LearnerConfig


def test_demonstrations_are_used_when_a_warm_up_or_prefill_can_get_them():
    assert LearnerConfig().uses_demonstrations()  # SimPhone writes oracle demonstrations at start-up
    assert not LearnerConfig(env="standin").uses_demonstrations()  # no oracle demonstrations there
    assert LearnerConfig(env="standin", demos=Path("d.msgpack")).uses_demonstrations()
    assert not LearnerConfig(warmup_demos=0).uses_demonstrations()
    assert not LearnerConfig(warmup_updates=0, prefill_demos=False, demo_update_every=0).uses_demonstrations()
    assert LearnerConfig(warmup_updates=0).uses_demonstrations()  # prefill alone
    assert LearnerConfig(warmup_updates=0, prefill_demos=False, demo_update_every=4).uses_demonstrations()


def test_entropy_default_explores_from_scratch_and_keeps_imitation():
    assert LearnerConfig(env="standin").entropy() == 0.01
    assert LearnerConfig().entropy() == 0.001
    assert LearnerConfig(entropy_coef=0.0).entropy() == 0.0  # an explicit value always wins
    assert LearnerConfig(env="standin", entropy_coef=0.2).entropy() == 0.2
