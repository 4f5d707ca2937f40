"""Build an actor's environments by name, so `--env` picks the backend without the actor loop caring."""

from __future__ import annotations

import gymnasium as gym

from actors.envs.simphone.emulator import maybe_wrap
from common.config import EmulatorModelConfig

ENVS = ("standin", "simphone", "adb")


def make_env(
    name: str,
    max_steps: int,
    tasks: str = "general",
    split: str = "train",
    emulator: EmulatorModelConfig | None = None,
    index: int = 0,
    compose_rate: float = 0.0,
) -> gym.Env:
    """One environment whose episodes end within `max_steps` (the learner's limit, from WELCOME),
    behind the emulator latency/fault model when `emulator.enabled`."""
    if name == "standin":
        from actors.envs.standin import StandInPhoneEnv

        env = StandInPhoneEnv(max_steps=max_steps)
    elif name == "simphone":
        from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv

        env = SimPhoneEnv(
            SimPhoneConfig(tasks=tasks, split=split, max_steps=max_steps, compose_rate=compose_rate)
        )
    else:
        raise ValueError(f"unknown environment {name!r}; choose from {ENVS}")
    return maybe_wrap(env, emulator or EmulatorModelConfig(), index=index)


def build_envs(cfg, max_steps: int, log=print) -> tuple[list[gym.Env], bool]:
    """The actor's environments for `cfg` (an ActorConfig) and whether to step them on threads.

    SimPhone and the stand-in run in-process: `--num-envs` of them, stepped inline unless the emulator
    model makes them wait like devices. The ADB backend makes one environment per device of its pool and
    always steps them on threads.
    """
    if cfg.env == "adb":
        from actors.envs.adb.env import make_adb_envs
        from actors.envs.adb.pool import DevicePoolError
        from actors.envs.simphone.tasks import TaskFileError

        if cfg.num_envs != 16:
            log("actor: --backend adb makes one environment per device; --num-envs is ignored")
        try:
            return make_adb_envs(cfg.adb, cfg.tasks, cfg.split, max_steps, log), True
        except (DevicePoolError, TaskFileError, ValueError) as e:
            raise SystemExit(f"--backend adb: {e}") from e
    envs = [
        make_env(cfg.env, max_steps, cfg.tasks, cfg.split, cfg.emulator, i, cfg.compose_rate)
        for i in range(cfg.num_envs)
    ]
    threaded = {"on": True, "off": False}.get(cfg.threads, cfg.emulator.enabled)
    return envs, threaded


def task_name(env: gym.Env) -> str:
    """The task family or template id of the current episode, for per-task success metrics."""
    task = getattr(env.unwrapped, "task", None)
    if hasattr(task, "template"):
        return task.template.id
    return getattr(task, "family", "unknown")
