"""Refuse bad actor-side flags (--tasks, --split, --env, --emulator.*) before the learner starts any process.

The learner may not import actor code, so it asks the actor's own check in a subprocess
(`python -m actors check-args`, actors/tools/check_args.py): the same parser and task loader the actors and
the demo writer will use, so the two can never disagree about what is valid.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from common.actor_command import actor_command, check_command
from learner.config import LearnerConfig

CHECK_TIMEOUT_S = 120.0
"""Generous: the check imports the actor package and reads the task files, a few seconds on a busy machine."""


def check_actor_flags(command: Sequence[str]) -> None:
    """When `command` (from common.actor_command's `actor_command` or `demos_command`) has a flag its
    process would refuse: its one line on stderr, then SystemExit(2) (the status of a bad flag).
    Nothing when it would start."""
    try:
        done = subprocess.run(
            check_command(command),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"could not check the actor flags ({type(e).__name__}: {e})") from None
    if done.returncode == 0:
        return
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    if done.returncode == 2 and len(lines) == 1:
        print(lines[0], file=sys.stderr, flush=True)
        raise SystemExit(2)
    last = lines[-1] if lines else "no output"
    raise SystemExit(f"checking the actor flags failed (status {done.returncode}): {last}")


def check_local_flags(cfg: LearnerConfig) -> None:
    """Check the flags this learner hands its local actors and its demo writer (--env, --tasks, --split,
    --emulator.*, --local-actor-args), when it will start either; see `check_actor_flags`. The demo writer plays the same
    SimPhone --tasks and --split (only with --env simphone), so the actors' check covers it."""
    local = cfg.local
    writes_demos = cfg.uses_demonstrations() and cfg.imitation.demos is None
    if local.local_actors or writes_demos:
        extra = shlex.split(local.local_actor_args) if local.local_actors else ()
        check_actor_flags(
            actor_command(
                env=local.env, tasks=local.tasks, split=local.split, emulator=cfg.emulator, extra=extra
            )
        )
