"""Importance ratios are exactly 1 on-policy, whatever augmentation the learner applies after acting.

The learner renames words in its training batches (common/policies/pointer/augment.py); the behaviour log-probs were
computed by the actor on the original words. If pi were evaluated on the renamed observations, rho would
differ from 1 at zero policy lag and clipping at 1 would make that error one-sided. The update therefore
computes the ratios on `Batch.acted_obs` (common/policies/pointer/family.py: PointerPolicy.evaluate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.config import ModelConfig
from common.policies import PointerPolicy
from common.policies.family import Augmentation
from learner.batch import augmented
from learner.losses import LOSSES, LossParams
from learner.losses.aride import importance_ratios
from learner.losses.shared import step_mask
from learner.training.train_step import make_optimizer, make_train_step
from tests.mesh_check import random_batch

CFG = ModelConfig(vocab_size=512, d_model=32, num_heads=4, num_layers=1, mlp_dim=64)
POLICY = PointerPolicy(CFG)


def forward(graphdef, params, batch):
    """The pointer policy's evaluation of a batch (jitted)."""
    return jax.jit(POLICY.evaluate, static_argnums=0)(
        graphdef, params, batch.obs, batch.choice, batch.acted_obs
    )


def _on_policy_batch(seed: int):
    """A random batch whose behaviour log-probs are the current policy's own, on the original words."""
    graphdef, params = POLICY.create(seed)
    batch = random_batch(CFG, seed)
    behavior_logp, *_ = forward(graphdef, params, batch)
    return graphdef, params, batch._replace(behavior_logp=np.asarray(behavior_logp))


def _real(batch, x) -> np.ndarray:
    return np.asarray(x)[np.asarray(step_mask(batch.length, batch.reward.shape[1]))]


@pytest.mark.parametrize("rates", [(0.5, 0.5), (0.0, 1.0), (1.0, 0.0)])
def test_every_ratio_is_one_at_zero_lag_with_renaming_on(rates):
    graphdef, params, batch = _on_policy_batch(1)
    renamed = augmented(batch, POLICY, Augmentation(*rates), seed=[0, 3, 0])
    assert any(not np.array_equal(renamed.obs[k], batch.obs[k]) for k in batch.obs), "renaming did nothing"
    logp, _, _, ratio_logp = forward(graphdef, params, renamed)
    rho = _real(batch, importance_ratios(ratio_logp, renamed.behavior_logp, renamed.length))
    np.testing.assert_allclose(rho, 1.0, rtol=0, atol=1e-5)
    # The check can fail: the same ratios taken on the renamed words are off by far more than that.
    biased = _real(batch, importance_ratios(logp, renamed.behavior_logp, renamed.length))
    assert np.abs(biased - 1.0).max() > 1e-2


@pytest.mark.parametrize("algorithm", ["aride", "a2c"])
def test_the_update_sees_unit_ratios_on_policy(algorithm):
    """Through the jitted update itself: no ratio clipped, their mean 1 (so each is 1: all are <= 1)."""
    graphdef, params, batch = _on_policy_batch(2)
    optimizer = make_optimizer(1e-3, 1.0)
    step = make_train_step(graphdef, optimizer, LOSSES[algorithm].rl, LossParams(), POLICY.evaluate)
    renamed = augmented(batch, POLICY, Augmentation(0.5, 0.5), seed=[0, 5, 0])
    _, _, metrics, priorities = step(jax.tree.map(jnp.copy, params), optimizer.init(params), renamed)
    assert float(metrics["rho_mean"]) == pytest.approx(1.0, abs=1e-5)
    if algorithm == "aride":
        assert float(metrics["rho_clipped_fraction"]) == 0.0
        priority_rho = np.asarray(priorities.rho_clipped)[np.asarray(batch.length) > 0]
        np.testing.assert_allclose(priority_rho, 1.0, atol=1e-5)


def test_no_renaming_needs_no_second_pass():
    """Without renaming the batch carries no acted_obs and the ratios use the trained-on log-probs."""
    graphdef, params, batch = _on_policy_batch(3)
    assert augmented(batch, POLICY, Augmentation(0.0, 0.0), seed=[0]) is batch
    logp, _, _, ratio_logp = forward(graphdef, params, batch)
    assert ratio_logp is logp or np.array_equal(np.asarray(ratio_logp), np.asarray(logp))
