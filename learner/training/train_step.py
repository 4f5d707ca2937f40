"""One jitted update: the policy family's evaluation of the padded Batch, the loss it is given
(learner/losses), optax AdamW with clipping; a non-finite update is skipped, not applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from common.backbones.decoder.lora import split_trained
from common.policies import Evaluation
from learner.batch import Batch
from learner.losses.base import LossFn, LossParams, PriorityTerms


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


def path_names(path: tuple) -> tuple[str, ...]:
    """A jax key path into the parameters as names, e.g. ("text", "encoder", "layers", "0", ...)."""
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _is_one(scale) -> bool:
    """A scale known, at trace time, to be exactly 1 (no multiply in the program); a traced one is not."""
    return isinstance(scale, int | float) and scale == 1.0


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    loss_params: LossParams,
    evaluate: Callable[..., Evaluation],
    update_scale: float = 1.0,
    encoder_update_scale: float = 1.0,
    scaled_param: Callable[[tuple[str, ...]], bool] | None = None,
    *,
    shardings: tuple[Any, Any] | None = None,
) -> Callable[[Any, Any, Batch], tuple[Any, Any, dict, PriorityTerms | None]]:
    """Returns jitted step(params, opt_state, batch) -> (params, opt_state, metrics, priority terms);
    params are donated. `shardings`, (in_shardings, out_shardings), lay the one jit out on a device mesh
    (learner/training/sharded_step.py gives them); None: it runs where its arguments are.

    `evaluate` is the policy family's pass over the batch (common.policies: `policy.evaluate`), `loss_fn`
    one of a `Loss`'s functions (learner/losses: reinforcement learning or imitation) with its numbers
    `loss_params`. `update_scale` multiplies the optimizer's update before it is applied (the learning
    rate of this step only: reinforcement-learning and imitation updates share one Adam state but may step
    apart). `encoder_update_scale` further multiplies the update of the parameters the family's
    `scaled_param` names (common/policies/family.py:ScaledParams; the pointer policy's fine-tuned text
    encoder, `text/encoder/...`; None: no parameter): their own, smaller learning rate. When the
    parameters hold LoRA adapters, only the adapters are differentiated and updated, and `opt_state`
    covers them alone (`split_trained`).

    The two scales are constants folded into the program. A caller may pass `scales=(update_scale,
    encoder_update_scale)` to the unsharded step instead: they are then traced, so one compile serves
    every scale (tests compare scales without compiling a step per scale).
    """

    def objective(trained, frozen, batch: Batch):
        params = trained if frozen is None else nnx.merge_state(trained, frozen)
        evaluation = evaluate(graphdef, params, batch.obs, batch.choice, batch.acted_obs)
        out = loss_fn(evaluation, batch, loss_params)
        return out.loss, (out.metrics, out.priority_terms)

    def step(params, opt_state, batch, scales=(update_scale, encoder_update_scale)):
        trained, frozen = split_trained(params)  # frozen: a traced argument, never a folded constant
        grads, (metrics, priorities) = jax.grad(objective, has_aux=True)(trained, frozen, batch)
        updates, new_opt_state = optimizer.update(grads, opt_state, trained)
        scale, encoder_scale = scales
        if not _is_one(scale):
            updates = jax.tree.map(lambda u: u * scale, updates)
        if not _is_one(encoder_scale) and scaled_param is not None:
            updates = jax.tree_util.tree_map_with_path(
                lambda path, u: u * encoder_scale if scaled_param(path_names(path)) else u, updates
            )
        new_params = optax.apply_updates(trained, updates)
        new_params = new_params if frozen is None else nnx.merge_state(new_params, frozen)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        # A non-finite loss or gradient must not poison the parameters: keep the old ones, report it.
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        metrics["skipped_nonfinite"] = (~ok).astype(jnp.int32)
        new_params = jax.tree.map(keep, new_params, params)
        metrics["param_norm"] = optax.tree.norm(new_params)
        return new_params, jax.tree.map(keep, new_opt_state, opt_state), metrics, priorities

    if shardings is None:
        return jax.jit(step, donate_argnums=(0, 1))
    return jax.jit(step, in_shardings=shardings[0], out_shardings=shardings[1], donate_argnums=(0, 1))
