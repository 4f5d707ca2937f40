"""Realistic inputs for benchmarks: featurized stand-in phone screens in episode form."""

from __future__ import annotations

import numpy as np

from actors.envs.standin import StandInPhoneEnv
from actors.policy_runner import stack
from common import protocol
from common.config import ModelConfig
from common.policies import make_policy


def episodes(cfg: ModelConfig, count: int, steps: int = 8) -> list[protocol.Episode]:
    """`count` full-length episodes whose observations are real featurized screens."""
    env = StandInPhoneEnv(max_steps=steps)
    policy = make_policy(cfg)
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        obs, _ = env.reset(seed=i)
        feats = stack([policy.featurize(obs)] * (steps + 1))
        arrays = {k: np.zeros(steps, np.dtype(dt)) for k, dt in protocol.STEP_ARRAYS.items()}
        arrays["behavior_logp"] = -rng.random(steps).astype(np.float32)
        out.append(protocol.Episode(env.task.family, False, True, feats, arrays))
    return out
