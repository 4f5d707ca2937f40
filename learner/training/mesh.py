"""The device mesh of the learner's training: axes ('data', 'model') over the devices (`make_mesh`).

Where each parameter, optimizer state and batch goes on it is learner/training/sharding.py; the train step
sharded over it, learner/training/sharded_step.py. Typical use:

    mesh = make_mesh(MeshConfig(data=-1, model=2, param_sharding="model"))
    policy = make_policy(model_cfg)
    graphdef, params = policy.create(seed)
    specs = param_specs(params, mesh, "model")
    params = shard_params(params, mesh, specs)
    opt_state = init_opt_state(optimizer, params, mesh, specs)
    loss = get_loss("aride")
    step = make_sharded_train_step(graphdef, optimizer, loss.rl, LossParams(), policy.evaluate, mesh, specs)
    params, opt_state, metrics, priorities = step(params, opt_state, shard_batch(batch, mesh))
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from learner.config import PARAM_SHARDINGS, MeshConfig, ParamSharding  # noqa: F401 (re-exported)

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh of shape (data, model) over `devices` (default: all of jax.devices()).

    data * model must divide the device count; when it is smaller, the first data * model devices are
    used. Axes are AxisType.Auto: sharding propagates through the (unannotated) model code.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if cfg.model > n or n % cfg.model:
        raise ValueError(f"mesh model axis {cfg.model} does not divide the {n} available devices")
    data = n // cfg.model if cfg.data == -1 else cfg.data
    size = data * cfg.model
    if size > n or n % size:
        raise ValueError(
            f"mesh shape data={data} x model={cfg.model} ({size} devices) does not divide the {n} "
            f"available devices; use data=-1 to take all devices not used by 'model'"
        )
    return jax.make_mesh((data, cfg.model), AXES, axis_types=(AxisType.Auto,) * 2, devices=devices[:size])
