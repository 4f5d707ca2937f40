"""Build an actor's environments by name, so `--env` picks the backend without the actor loop caring."""

from __future__ import annotations

import gymnasium as gym

ENVS = ("standin", "simphone")


def make_env(name: str, max_steps: int, tasks: str = "general", split: str = "train") -> gym.Env:
    """One environment whose episodes end within `max_steps` (the learner's limit, from WELCOME)."""
    if name == "standin":
        from actors.envs.standin import StandInPhoneEnv

        return StandInPhoneEnv(max_steps=max_steps)
    if name == "simphone":
        from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv

        return SimPhoneEnv(SimPhoneConfig(tasks=tasks, split=split, max_steps=max_steps))
    raise ValueError(f"unknown environment {name!r}; choose from {ENVS}")


def task_name(env: gym.Env) -> str:
    """The task family or template id of the current episode, for per-task success metrics."""
    task = getattr(env, "task", None)
    if hasattr(task, "template"):
        return task.template.id
    return getattr(task, "family", "unknown")
