"""The plain actor-critic (the `--algorithm a2c` ablation), the warm-up loss on demonstrations, and the
padding helpers every loss shares.

Pure functions over padded batches [B, T] (learner.batch.Batch). A step t of an episode of length L is
valid when t < L. The last valid step bootstraps from V(s_L) when the episode was truncated (step limit)
and not when it ended in a terminal state. The default algorithm, A-RIDE (Retrace targets, prioritized
replay weights and priorities), is learner/aride.py.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.batch import Batch


class LossConfig(NamedTuple):
    gamma: float = 0.95
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    rho_clip: float = 1.0
    """Importance ratios pi/mu are clipped here for the policy gradient (stale actors)."""


def step_mask(length: jax.Array, num_steps: int) -> jax.Array:
    """[B] lengths -> [B, T] bool, True on real steps."""
    return jnp.arange(num_steps)[None, :] < length[:, None]


def discounted_returns(
    rewards: jax.Array, values: jax.Array, length: jax.Array, terminal: jax.Array, gamma: float
) -> jax.Array:
    """Returns G_t = r_t + gamma * G_{t+1}, with G_L = V(s_L) for a truncated episode and 0 for a terminal one.

    rewards [B, T], values [B, T + 1] (critic on every observation, including the final one),
    length [B] int, terminal [B] bool. Padded steps get 0.
    """
    rewards, values = jnp.asarray(rewards), jnp.asarray(values)  # also callable on host arrays
    num_steps = rewards.shape[1]
    bootstrap = jnp.where(terminal, 0.0, jnp.take_along_axis(values, length[:, None], axis=1)[:, 0])

    def back(carry, t):
        g = jnp.where(t == length - 1, rewards[:, t] + gamma * bootstrap, rewards[:, t] + gamma * carry)
        g = jnp.where(t < length, g, 0.0)
        return g, g

    _, out = jax.lax.scan(back, jnp.zeros(rewards.shape[0]), jnp.arange(num_steps), reverse=True)
    return out.T


def _masked_mean(length: jax.Array, num_steps: int):
    """mean(x) over the real steps of a padded batch."""
    mask = step_mask(length, num_steps).astype(jnp.float32)
    count = jnp.maximum(mask.sum(), 1.0)
    return lambda x: jnp.sum(mask * x) / count


def actor_critic_loss(
    logp: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    batch: Batch,
    cfg: LossConfig,
    ratio_logp: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total loss and its parts. logp / entropy [B, T] (log pi of the actions taken, exact H(pi));
    values [B, T + 1]; ratio_logp log pi on the observations mu saw (defaults to logp; see
    learner.train_step.forward); the batch's behavior_logp, reward, length and terminal (not its replay
    weights)."""
    rewards, length = batch.reward, batch.length
    mean = _masked_mean(length, rewards.shape[1])
    returns = discounted_returns(rewards, jax.lax.stop_gradient(values), length, batch.terminal, cfg.gamma)
    v = values[:, :-1]
    advantage = jax.lax.stop_gradient(returns - v)
    acted_logp = logp if ratio_logp is None else ratio_logp
    rho = jax.lax.stop_gradient(jnp.minimum(cfg.rho_clip, jnp.exp(acted_logp - batch.behavior_logp)))
    policy_loss = -mean(rho * advantage * logp)
    value_loss = 0.5 * mean((returns - v) ** 2)
    mean_entropy = mean(entropy)
    total = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * mean_entropy
    return total, {
        "loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        "advantage_mean": mean(advantage),
        "rho_mean": mean(rho),
    }


def behavior_cloning(logp: jax.Array, batch: Batch) -> jax.Array:
    """-sum(w log pi(a_demo|s)) / sum(w) over real steps, w = exp(behavior_logp): see warmup_loss."""
    w = step_mask(batch.length, logp.shape[1]) * jnp.exp(batch.behavior_logp)
    return -jnp.sum(w * logp) / jnp.maximum(jnp.sum(w), 1e-6)


def warmup_loss(
    logp: jax.Array, values: jax.Array, batch: Batch, cfg: LossConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Behavior cloning on demonstrations, plus the critic regressed on their returns (the plain
    actor-critic's warm-up; A-RIDE's, learner/aride.py:aride_warmup_loss, corrects the critic's targets
    towards the learner's policy instead).

    `-mean(log pi(a_demo | s))` over real steps warms the policy up from an oracle; fitting V to the
    demonstrations' discounted returns warms the critic up, so the first actor-critic advantages after
    warm-up are not pure noise.

    Each step's imitation term is weighted by the demonstrator's probability of the recorded action,
    mean_w = sum(w x) / sum(w), w = exp(behavior_logp): a noisy demonstrator's own choices (probability
    >= 1 - noise) dominate and the random actions mixed in (noise / number of actions) barely count, so the
    policy imitates the oracle rather than its noise. Clean demonstrations (log-prob 0) give the plain mean.
    """
    rewards, length = batch.reward, batch.length
    mean = _masked_mean(length, rewards.shape[1])
    returns = discounted_returns(rewards, jax.lax.stop_gradient(values), length, batch.terminal, cfg.gamma)
    bc = behavior_cloning(logp, batch)
    value_loss = 0.5 * mean((returns - values[:, :-1]) ** 2)
    total = bc + cfg.value_coef * value_loss
    return total, {"loss": total, "bc_loss": bc, "value_loss": value_loss}
