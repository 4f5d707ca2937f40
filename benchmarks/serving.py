"""What the inference benchmarks share (benchmarks/inference.py, benchmarks/serving_cost.py): featurized
first screens per policy family, and an in-process inference service with every padded size compiled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from actors.envs.standin import StandInPhoneEnv
from actors.policy_runner import stack
from actors.remote_policy import RemotePolicy
from common.config import ModelConfig
from common.policies import make_policy
from learner.serving.inference import InferenceConfig, InferenceService


def features(policy: Any, cfg: ModelConfig, rows: int) -> dict[str, np.ndarray]:
    """`rows` first screens featurized: the stand-in phone's for the pointer family, SimPhone's general
    training tasks for lm (whose prompts need real screen text)."""
    if cfg.kind == "lm":
        from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv

        env = SimPhoneEnv(SimPhoneConfig(tasks="general", split="train", max_steps=10))
    else:
        env = StandInPhoneEnv()
    return stack([policy.featurize(env.reset(seed=i)[0]) for i in range(rows)])


def warm_service(
    cfg: ModelConfig, graphdef: Any, params: Any, max_rows: int, ctx: zmq.Context, log: Callable[[str], None]
) -> InferenceService:
    """A started service (own family object, `params` published as version 0, batches of at most
    `max_rows`, a 2 ms deadline) whose act is compiled for every padded size up to `max_rows`."""
    service = InferenceService(
        make_policy(cfg), graphdef, ctx, "tcp://127.0.0.1:*", lambda _: True,
        InferenceConfig(max_rows=max_rows, deadline_ms=2),
    ).start()  # fmt: skip
    service.publish(0, params)
    one = features(make_policy(cfg), cfg, 1)
    warm = RemotePolicy(cfg, service.endpoint, 1, timeout=1800)
    size = 1
    while size <= max_rows:
        log(f"inference: compiling the {cfg.kind} service's act for {size} rows")
        warm.act({k: np.repeat(v, size, axis=0) for k, v in one.items()})
        size *= 2
    warm.close()
    return service
