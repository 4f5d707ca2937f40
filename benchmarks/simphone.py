"""SimPhone steps per second on one core (emulator model off), screenshot off and on, against the
stand-in phone measured in the same process; then with featurizing, without and with the text encoder's
cached states (benchmarks/encoder_rows.py)."""

from __future__ import annotations

import time

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from actors.envs.simphone.spaces import ActionSpace
from actors.envs.standin import StandInPhoneEnv
from benchmarks import encoder_rows
from common.types import Action


def _steps_per_second(env, policy: str, seconds: float) -> float:
    space = ActionSpace(seed=0)
    obs, _ = env.reset(seed=0)
    oracle = Oracle(env.task.plan) if policy == "oracle" else None
    steps, episode = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        action: Action = oracle.act(obs) if oracle else space.sample()
        obs, _, terminated, truncated, _ = env.step(action)
        steps += 1
        if terminated or truncated:
            episode += 1
            obs, _ = env.reset(seed=episode)
            oracle = Oracle(env.task.plan) if policy == "oracle" else None
    return steps / (time.perf_counter() - start)


def run(quick: bool) -> list[dict]:
    seconds = 1.0 if quick else 4.0
    reference = _steps_per_second(StandInPhoneEnv(), "random", seconds)
    rows = [
        {
            "env": "stand-in phone (reference)",
            "policy": "random",
            "screenshot": "off",
            "steps_per_s": reference,
            "vs_reference": 1.0,
        }
    ]
    for suite in ("general", "webshop"):
        for shot in (None, (108, 240)):
            for policy in ("random", "oracle"):
                env = SimPhoneEnv(SimPhoneConfig(tasks=suite, screenshot=shot))
                rate = _steps_per_second(env, policy, seconds)
                rows.append(
                    {
                        "env": f"SimPhone {suite}",
                        "policy": policy,
                        "screenshot": "off" if shot is None else f"{shot[0]}x{shot[1]}",
                        "steps_per_s": rate,
                        "vs_reference": rate / reference,
                    }
                )
    if encoder_rows.available():  # an actor's per-step text work, with and without the encoder
        rows.extend(encoder_rows.actor_rows(seconds, reference))
    return rows
