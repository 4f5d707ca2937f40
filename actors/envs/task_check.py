"""Whether `--tasks` and `--split` name usable tasks for an environment backend, checked without building
one (no phone, no device): what `python -m actors check-args` (actors/tools/check_args.py) and the demo
writer (actors/tools/demos.py) refuse with one line."""

from __future__ import annotations

from actors.envs.simphone.tasks import SPLITS, TaskFileError, available, load_templates


def task_problem(env: str, tasks: str, split: str) -> str | None:
    """What is wrong with `--tasks` and `--split` for backend `env`, or None: the check the environments
    make when they are built, made without building one (no phone, no device)."""
    if split not in SPLITS:
        return f"--split must be one of {', '.join(SPLITS)}, got {split!r}"
    if env == "standin":
        return None  # its four task families are built in: --tasks does not apply
    try:
        if env == "adb":
            from actors.envs.adb import tasks as device_tasks  # when asked: it loads the device layer

            found = device_tasks.load_device_templates("stock" if tasks == "general" else tasks)
            usable = any(device_tasks.available(t, split) for t in found)
        else:
            usable = any(available(t, split) for t in load_templates(tasks))
    except TaskFileError as e:
        return f"--tasks {e}"
    if not usable:
        return f"--tasks {tasks}: no task of this suite is in --split {split}"
    return None
