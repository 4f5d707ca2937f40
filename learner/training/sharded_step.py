"""The train step sharded over a device mesh with axes ('data', 'model') (learner/training/mesh.py).

The one `jax.jit` of `learner.training.train_step.make_train_step`'s step (the very same loss and optimizer
update), given explicit `in_shardings` / `out_shardings` (learner/training/sharding.py):

- the batch is split over 'data' along its leading (episode) axis;
- parameters follow `param_specs` (replicated, FSDP over 'data', or tensor-parallel over 'model');
- the optimizer state follows the parameter shardings leaf for leaf (`opt_state_shardings`);
- metrics come back replicated; params and optimizer state are donated.

XLA's sharding propagation (GSPMD / Shardy) partitions everything in between and inserts the
collectives (gradient all-reduce over 'data', all-gathers of FSDP shards, the tensor-parallel
reductions over 'model'), so the result equals the unsharded step up to float summation order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.backbones.decoder.lora import split_trained
from learner.batch import Batch
from learner.losses.base import LossFn, LossParams
from learner.training.sharding import batch_sharding, named_shardings, opt_state_shardings
from learner.training.train_step import make_train_step


def make_sharded_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    loss_params: LossParams,
    evaluate: Callable[..., Any],
    mesh: Mesh,
    param_shardings: Any,
    *,
    update_scale: float = 1.0,
    encoder_update_scale: float = 1.0,
    scaled_param: Callable[[tuple[str, ...]], bool] | None = None,
) -> Callable[[Any, Any, Batch], tuple[Any, Any, dict, Any]]:
    """step(params, opt_state, batch) -> (params, opt_state, metrics, priority terms), as
    learner.training.train_step's step.

    learner.training.train_step.make_train_step's step (the same loss and update, its one jit), given
    in_shardings (params and optimizer state per `param_shardings`, the batch over 'data') and
    out_shardings (the same for params and state; metrics replicated).
    `loss_fn`, `loss_params`, `evaluate`, `update_scale`, `encoder_update_scale` and `scaled_param` are
    passed to make_train_step as they are, so every loss is sharded the same way; metrics (scalars) and
    the [B] replay priority terms come back replicated on every device. params and opt_state are donated.
    `param_shardings`: PartitionSpec or NamedSharding leaves, e.g. from `param_specs`. Inputs placed with
    `shard_params`, `init_opt_state` and `shard_batch` are used in place; host arrays are transferred (the
    batch's size must be a multiple of the 'data' axis size).
    """
    params_sh = named_shardings(param_shardings, mesh)
    opt_sh = opt_state_shardings(optimizer, split_trained(params_sh)[0], mesh)
    replicated = NamedSharding(mesh, P())
    return make_train_step(
        graphdef,
        optimizer,
        loss_fn,
        loss_params,
        evaluate,
        update_scale=update_scale,
        encoder_update_scale=encoder_update_scale,
        scaled_param=scaled_param,
        shardings=(
            (params_sh, opt_sh, batch_sharding(mesh)),
            (params_sh, opt_sh, replicated, replicated),
        ),
    )
