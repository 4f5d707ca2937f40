"""Helpers every loss shares: the step mask of a padded batch, masked means, discounted returns, and the
imitation term (weighted behaviour cloning).

Pure functions over padded batches [B, T] (learner.batch.Batch). A step t of an episode of length L is
valid when t < L. The last valid step bootstraps from V(s_L) when the episode was truncated (step limit)
and not when it ended in a terminal state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.batch import Batch


def step_mask(length: jax.Array, num_steps: int) -> jax.Array:
    """[B] lengths -> [B, T] bool, True on real steps."""
    return jnp.arange(num_steps)[None, :] < length[:, None]


def masked_mean(length: jax.Array, num_steps: int):
    """mean(x) over the real steps of a padded batch."""
    mask = step_mask(length, num_steps).astype(jnp.float32)
    count = jnp.maximum(mask.sum(), 1.0)
    return lambda x: jnp.sum(mask * x) / count


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


def behavior_cloning(logp: jax.Array, batch: Batch) -> jax.Array:
    """-sum(w log pi(a_demo|s)) / sum(w) over real steps, w = exp(behavior_logp).

    Each step's imitation term is weighted by the demonstrator's probability of the recorded action: a
    noisy demonstrator's own choices (probability >= 1 - noise) dominate and the random actions mixed in
    (noise / number of actions) barely count, so the policy imitates the oracle rather than its noise.
    Clean demonstrations (log-prob 0) give the plain mean."""
    w = step_mask(batch.length, logp.shape[1]) * jnp.exp(batch.behavior_logp)
    return -jnp.sum(w * logp) / jnp.maximum(jnp.sum(w), 1e-6)
