"""One jitted update: forward over the padded Batch, the loss (A-RIDE, the plain actor-critic, or the
warm-up's behavior cloning), optax AdamW with clipping; a non-finite update is skipped, not applied."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from common import distribution, model
from learner.algorithm import LossConfig, actor_critic_loss, warmup_loss
from learner.aride import ARideConfig, aride_loss, aride_warmup_loss
from learner.batch import Batch


def make_optimizer(
    learning_rate: float,
    max_grad_norm: float,
    weight_decay: float = 0.0,
    decay_updates: int = 0,
    final_fraction: float = 0.1,
) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with a learning-rate schedule: constant when decay_updates is 0,
    else a cosine decay from learning_rate to final_fraction * learning_rate over decay_updates updates,
    constant after that (SGDR, Loshchilov & Hutter 2017, without restarts). The schedule counts every
    applied update (warm-up included). Both forms keep the same state layout, so checkpoints and
    evaluation need not know which one trained them."""
    if decay_updates < 0 or not 0.0 <= final_fraction <= 1.0:
        raise ValueError("need decay_updates >= 0 and final_fraction in [0, 1]")
    schedule = (
        optax.cosine_decay_schedule(learning_rate, decay_updates, alpha=final_fraction)
        if decay_updates
        else optax.constant_schedule(learning_rate)
    )
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(schedule, weight_decay=weight_decay),
    )


def forward(graphdef: nnx.GraphDef, params: Any, batch: Batch) -> tuple[Any, Any, Any, Any]:
    """The model over a batch -> (logp, entropy, values, ratio_logp).

    logp / entropy [B, T]: log pi of the actions taken and the exact entropy, on `batch.obs` (what the
    gradient trains on); values [B, T + 1]. ratio_logp [B, T] is log pi on the observations the behaviour
    policy saw (`batch.acted_obs`, a second forward pass without gradient when the learner renamed words),
    so that importance ratios compare pi and mu on the same input: rho = 1 exactly at zero policy lag.
    """
    obs = model.encode_text(graphdef, params, batch.obs)  # a fine-tuned text encoder runs once, here
    logits, values = model.apply(graphdef, params, obs)
    step_logits = {k: v[:, :-1] for k, v in logits.items()}
    logp = distribution.log_prob(step_logits, batch.choice())
    entropy = distribution.entropy(step_logits)
    if batch.acted_obs is None:
        return logp, entropy, values, logp
    # A fine-tuned encoder encodes the acted observations again (apply does, without gradient): renaming may
    # have given the trained ones other WordPiece ids (learner/augment.py).
    acted_logits, _ = model.apply(graphdef, jax.lax.stop_gradient(params), batch.acted_obs)
    ratio_logp = distribution.log_prob({k: v[:, :-1] for k, v in acted_logits.items()}, batch.choice())
    return logp, entropy, values, jax.lax.stop_gradient(ratio_logp)


def is_text_encoder(path: tuple) -> bool:
    """Whether a parameter's tree path lies in the fine-tuned text encoder (`text/encoder/...`)."""
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return any(a == "text" and b == "encoder" for a, b in itertools.pairwise(names))


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_cfg: LossConfig | ARideConfig,
    warmup: bool = False,
    update_scale: float = 1.0,
    encoder_update_scale: float = 1.0,
) -> Callable[[Any, Any, Batch], tuple[Any, Any, dict]]:
    """Returns jitted step(params, opt_state, batch) -> (params, opt_state, metrics); params are donated.

    `update_scale` multiplies the optimizer's update before it is applied (the learning rate of this
    step only: reinforcement-learning and imitation updates share one Adam state but may step apart).
    `encoder_update_scale` further multiplies the update of a fine-tuned text encoder's parameters
    (`text/encoder/...`): its own, smaller learning rate.

    `loss_cfg` picks the loss: an `ARideConfig` (Retrace targets, replay weights, priorities out) or a
    `LossConfig` (the plain actor-critic). `warmup=True` trains on demonstrations instead: behavior
    cloning, and the critic on Retrace targets for pi (A-RIDE) or on the demonstrations' returns (a2c).
    """

    def loss_fn(params, batch: Batch):
        if warmup:
            # No second pass for imitation: it slowed the warm-up by about 20% (the README run's), and the
            # demonstrations' ratios pi / mu_oracle are far from 1 anyway, so the renaming's effect on
            # them, unlike on RL data at zero lag, is small next to the policy gap the critic corrects.
            batch = batch._replace(acted_obs=None)
        logp, entropy, values, ratio_logp = forward(graphdef, params, batch)
        if warmup and isinstance(loss_cfg, ARideConfig):
            return aride_warmup_loss(logp, values, batch, loss_cfg, ratio_logp=ratio_logp)
        if warmup:
            return warmup_loss(logp, values, batch, loss_cfg)
        if isinstance(loss_cfg, ARideConfig):
            return aride_loss(logp, entropy, values, batch, loss_cfg, ratio_logp=ratio_logp)
        return actor_critic_loss(logp, entropy, values, batch, loss_cfg, ratio_logp=ratio_logp)

    def step(params, opt_state, batch):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(params, batch)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        if update_scale != 1.0:
            updates = jax.tree.map(lambda u: u * update_scale, updates)
        if encoder_update_scale != 1.0:
            updates = jax.tree_util.tree_map_with_path(
                lambda path, u: u * encoder_update_scale if is_text_encoder(path) else u, updates
            )
        new_params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        # A non-finite loss or gradient must not poison the parameters: keep the old ones, report it.
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        metrics["skipped_nonfinite"] = (~ok).astype(jnp.int32)
        new_params = jax.tree.map(keep, new_params, params)
        metrics["param_norm"] = optax.tree.norm(new_params)
        return new_params, jax.tree.map(keep, new_opt_state, opt_state), metrics

    return jax.jit(step, donate_argnums=(0, 1))
