"""The training state and the replay it trains from: the device mesh, the Trainer on it (model, optimizer,
compiled updates) and this process's prioritized replay."""

from __future__ import annotations

from typing import NamedTuple

import jax

from common.protocol import Episode
from learner.config import LearnerConfig
from learner.replay.prioritized import PrioritizedReplay
from learner.training.mesh import make_mesh
from learner.training.trainer import Trainer


class Training(NamedTuple):
    mesh: jax.sharding.Mesh
    trainer: Trainer
    replay: PrioritizedReplay[Episode]


def build_training(cfg: LearnerConfig, rank: int) -> Training:
    """The mesh (the batch split over 'data', parameters laid out per --mesh.param-sharding), the Trainer
    and an empty replay seeded per process; SystemExit naming the flag when the devices do not fit."""
    try:
        mesh = make_mesh(cfg.mesh)
    except ValueError as e:
        raise SystemExit(f"--mesh: {e}") from e
    data_devices = dict(mesh.shape)["data"]
    if cfg.batch_size % data_devices:
        raise SystemExit(
            f"--batch-size {cfg.batch_size} must be a multiple of the mesh's 'data' axis ({data_devices} devices)"
        )
    buf = cfg.buffer
    replay: PrioritizedReplay[Episode] = PrioritizedReplay(
        buf.replay_capacity,
        alpha=buf.alpha,
        beta_start=buf.beta_start,
        beta_steps=buf.beta_steps,
        priority_weights=buf.priority_weights,
        max_policy_lag=buf.max_policy_lag,
        uniform=buf.replay == "uniform",
        seed=cfg.seed + rank,
    )
    return Training(mesh, Trainer(cfg, mesh, rank), replay)
