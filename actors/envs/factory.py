"""Build an actor's environments by name, so `--env` picks the backend without the actor loop caring."""

from __future__ import annotations

import gymnasium as gym

from actors.envs.simphone.emulator import EmulatorModelConfig, maybe_wrap

ENVS = ("standin", "simphone")


def make_env(
    name: str,
    max_steps: int,
    tasks: str = "general",
    split: str = "train",
    emulator: EmulatorModelConfig | None = None,
    index: int = 0,
) -> gym.Env:
    """One environment whose episodes end within `max_steps` (the learner's limit, from WELCOME),
    behind the emulator latency/fault model when `emulator.enabled`."""
    if name == "standin":
        from actors.envs.standin import StandInPhoneEnv

        env = StandInPhoneEnv(max_steps=max_steps)
    elif name == "simphone":
        from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv

        env = SimPhoneEnv(SimPhoneConfig(tasks=tasks, split=split, max_steps=max_steps))
    else:
        raise ValueError(f"unknown environment {name!r}; choose from {ENVS}")
    return maybe_wrap(env, emulator or EmulatorModelConfig(), index=index)


def task_name(env: gym.Env) -> str:
    """The task family or template id of the current episode, for per-task success metrics."""
    task = getattr(env.unwrapped, "task", None)
    if hasattr(task, "template"):
        return task.template.id
    return getattr(task, "family", "unknown")
