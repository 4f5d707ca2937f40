"""A learner.batch.Batch holding only what the losses read, for tests of the losses on loose arrays."""

from __future__ import annotations

import jax.numpy as jnp

from learner.batch import Batch


def loss_batch(behavior_logp, rewards, length, terminal, weights=None, keep=None) -> Batch:
    """Batch(behavior_logp, reward, length, terminal, weights (default 1), keep (default all True)); the
    observation and action fields, which no loss reads, are empty / zero."""
    behavior_logp = jnp.asarray(behavior_logp)
    b = behavior_logp.shape[0]
    zeros = jnp.zeros(behavior_logp.shape, jnp.int32)
    return Batch(
        obs={},
        choice={},
        behavior_logp=behavior_logp,
        reward=jnp.asarray(rewards),
        policy_version=zeros,
        length=jnp.asarray(length),
        terminal=jnp.asarray(terminal),
        weights=jnp.ones(b, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32),
        keep=jnp.ones(b, bool) if keep is None else jnp.asarray(keep, bool),
    )
