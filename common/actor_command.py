"""The command lines of `python -m actors` processes, spelled once for every side that starts one.

The learner starts local actors and the demo writer (learner/launch/local_actors.py, learner/setup/demos.py), the Ray
launcher places actors on its nodes (learner/launch/cluster.py), and the learner checks the actor-side flags
first with `python -m actors check-args` (actors/tools/check_args.py). This module lives in common/ so the
learner can build an actor's argv without importing actor code; tests parse what it builds with the
actor's own configs, so a renamed flag fails there, not in a launched process.

Every keyword is one flag; None (or "") leaves the flag out, so the actor's own default holds.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from common.config import EmulatorModelConfig, ModelConfig, cli_args

ACTORS = ("-m", "actors")
"""What follows the Python executable in every actor-side command."""
DEMOS = "demos"
"""The demo writer's subcommand (`python -m actors demos`)."""
CHECK_ARGS = "check-args"
"""The hidden subcommand that checks an actor's or the demo writer's flags and starts nothing."""

Value = str | int | float | None


def _flags(pairs: dict[str, Value]) -> list[str]:
    return [word for flag, value in pairs.items() if value not in (None, "") for word in (flag, str(value))]


def actor_command(
    *,
    host: str | None = None,
    ingest_port: int | str | None = None,
    params_port: int | str | None = None,
    params_endpoint: str = "",
    name: str = "",
    seed: int | None = None,
    parent_pid: int | str | None = None,
    num_envs: int | None = None,
    flush_timeout: float | None = None,
    env: str | None = None,
    tasks: str | None = None,
    split: str | None = None,
    emulator: EmulatorModelConfig | None = None,
    extra: Sequence[str] = (),
    python: str | None = sys.executable,
) -> list[str]:
    """`python -m actors ...` as an argv list. Ports and the parent pid may be placeholders such as
    "{pid}" (learner/launch/process_host.py fills them in on the node); `emulator` adds only the fields that
    differ from the defaults; `extra` (further flags, e.g. the launcher's --actor-args or CURVE key
    flags) comes last, so it wins over the flags before it. `python=None` leaves the executable out
    (a Ray ProcessHost prepends its own node's)."""
    flags = _flags(
        {
            "--host": host,
            "--ingest-port": ingest_port,
            "--params-port": params_port,
            "--params-endpoint": params_endpoint,
            "--name": name,
            "--seed": seed,
            "--parent-pid": parent_pid,
            "--num-envs": num_envs,
            "--flush-timeout": flush_timeout,
            "--env": env,
            "--tasks": tasks,
            "--split": split,
        }
    )
    flags += cli_args(emulator, "--emulator") if emulator is not None else ()
    return [*([python] if python else []), *ACTORS, *flags, *extra]


def demos_command(
    *,
    out: Path | str,
    episodes: int,
    tasks: str | None = None,
    split: str | None = None,
    noise: float | None = None,
    max_steps: int | None = None,
    seed: int | None = None,
    model: ModelConfig | None = None,
    python: str = sys.executable,
) -> list[str]:
    """`python -m actors demos ...` (the SimPhone oracle's demonstrations) as an argv list; `model` adds
    only the fields that differ from the defaults."""
    flags = _flags(
        {
            "--out": str(out),
            "--tasks": tasks,
            "--split": split,
            "--episodes": episodes,
            "--noise": noise,
            "--max-steps": max_steps,
            "--seed": seed,
        }
    )
    flags += cli_args(model, "--model") if model is not None else ()
    return [python, *ACTORS, DEMOS, *flags]


def check_command(command: Sequence[str]) -> list[str]:
    """The command that checks the flags of `command` (built by `actor_command` or `demos_command`, with
    its executable) and starts nothing: `python -m actors check-args [demos] FLAGS...`."""
    python, rest = command[0], list(command[1:])
    if rest[: len(ACTORS)] != list(ACTORS):
        raise ValueError(f"not an actor-side command: {' '.join(command)}")
    return [python, *ACTORS, CHECK_ARGS, *rest[len(ACTORS) :]]
