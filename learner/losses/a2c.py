"""The plain actor-critic (the `--algorithm a2c` ablation) and its imitation loss.

Pure functions over padded batches [B, T] (learner.batch.Batch); learner/losses/shared.py has the step
mask and the discounted returns. The default algorithm, A-RIDE (Retrace targets, prioritized replay
weights and priorities), is learner/losses/aride.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.batch import Batch
from learner.losses.base import LossOutput, LossParams
from learner.losses.shared import behavior_cloning, discounted_returns, masked_mean


def actor_critic_loss(
    logp: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    batch: Batch,
    cfg: LossParams,
    ratio_logp: jax.Array | None = None,
) -> LossOutput:
    """Total loss and its parts. logp / entropy [B, T] (log pi of the actions taken, exact H(pi));
    values [B, T + 1]; ratio_logp log pi on the observations mu saw (defaults to logp; see
    common.policies.Evaluation); the batch's behavior_logp, reward, length and terminal (not its replay
    weights). Reads gamma, rho_clip, value_coef and entropy_coef of `cfg`."""
    rewards, length = batch.reward, batch.length
    mean = masked_mean(length, rewards.shape[1])
    returns = discounted_returns(rewards, jax.lax.stop_gradient(values), length, batch.terminal, cfg.gamma)
    v = values[:, :-1]
    advantage = jax.lax.stop_gradient(returns - v)
    acted_logp = logp if ratio_logp is None else ratio_logp
    rho = jax.lax.stop_gradient(jnp.minimum(cfg.rho_clip, jnp.exp(acted_logp - batch.behavior_logp)))
    policy_loss = -mean(rho * advantage * logp)
    value_loss = 0.5 * mean((returns - v) ** 2)
    mean_entropy = mean(entropy)
    total = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * mean_entropy
    metrics = {
        "loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        "advantage_mean": mean(advantage),
        "rho_mean": mean(rho),
    }
    return LossOutput(total, metrics, None)


def imitation_loss(logp: jax.Array, values: jax.Array, batch: Batch, cfg: LossParams) -> LossOutput:
    """Behavior cloning on demonstrations (learner.losses.shared.behavior_cloning), plus the critic
    regressed on their returns (A-RIDE's imitation loss, learner/losses/aride.py, corrects the critic's
    targets towards the learner's policy instead).

    `-mean(log pi(a_demo | s))` over real steps warms the policy up from an oracle; fitting V to the
    demonstrations' discounted returns warms the critic up, so the first actor-critic advantages after
    the warm-up are not pure noise."""
    rewards, length = batch.reward, batch.length
    mean = masked_mean(length, rewards.shape[1])
    returns = discounted_returns(rewards, jax.lax.stop_gradient(values), length, batch.terminal, cfg.gamma)
    bc = behavior_cloning(logp, batch)
    value_loss = 0.5 * mean((returns - values[:, :-1]) ** 2)
    total = bc + cfg.value_coef * value_loss
    return LossOutput(total, {"loss": total, "bc_loss": bc, "value_loss": value_loss}, None)
