"""The demonstrations a run imitates and prefills its replay with: `--demos FILE`, or `--warmup-demos N`
written by the SimPhone oracle in a `python -m actors demos` subprocess (the learner never imports actor
code)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

from common.actor_command import demos_command
from common.protocol import Episode
from common.trajectory_file import load_episodes
from learner.config import LearnerConfig


def demonstrations(
    cfg: LearnerConfig, run_dir: Path, console: Console, resume_update: int | None, warmup_end: int | None
) -> tuple[list[Episode], bool]:
    """The demonstrations of a run starting (`resume_update` None) or resuming at `resume_update`, and
    whether they still have to prefill the replay. A run resumed past its warm-up (--warmup-updates, or
    `warmup_end` when it ended early) needs none (nor their start-up cost) unless it keeps imitating them
    (--demo-update-every); its replay already holds any prefilled ones."""
    im = cfg.imitation
    end = im.warmup_updates if warmup_end is None else min(im.warmup_updates, warmup_end)
    past_warmup = resume_update is not None and resume_update >= end
    if past_warmup and not im.demo_update_every:
        return [], False
    demos = load_warmup_demos(cfg, run_dir, console)
    return demos, im.prefill_demos and bool(demos) and not past_warmup


def load_warmup_demos(cfg: LearnerConfig, run_dir: Path, console: Console) -> list[Episode]:
    """The demonstrations (empty when the run uses none); SystemExit naming the file or the writer's
    output when they cannot be used."""
    im = cfg.imitation
    if not cfg.uses_demonstrations():
        if im.warmup_updates:
            console.print(
                "learner: no warm-up: no demonstrations (pass --demos FILE, or --warmup-demos N with SimPhone)"
            )
        return []
    path = im.demos if im.demos is not None else _write_oracle_demos(cfg, run_dir, console)
    try:
        episodes = load_episodes(path, cfg.model)
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot use demonstrations {path}: {e}") from e
    if not episodes:
        raise SystemExit(f"{path} holds no episodes")
    longest = max(ep.length for ep in episodes)
    if longest > cfg.max_steps:
        raise SystemExit(
            f"{path}: episodes of up to {longest} steps, longer than --max-steps {cfg.max_steps}"
        )
    success = np.mean([ep.success for ep in episodes])
    uses = [f"warm-up for {im.warmup_updates} updates"] if im.warmup_updates else []
    uses += ["the replay when reinforcement learning starts"] if im.prefill_demos else []
    uses += [f"one in {im.demo_update_every} updates after the warm-up"] if im.demo_update_every else []
    console.print(f"learner: {len(episodes)} demonstrations (success {success:.2f}) for {' and '.join(uses)}")
    return episodes


def _write_oracle_demos(cfg: LearnerConfig, run_dir: Path, console: Console) -> Path:
    """SimPhone oracle demonstrations of --tasks/--split, written now to run_dir/demos.msgpack."""
    im = cfg.imitation
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "demos.msgpack"
    cmd = demos_command(
        out=path,
        episodes=im.warmup_demos,
        tasks=cfg.local.tasks,
        split=cfg.local.split,
        noise=im.warmup_noise,
        max_steps=cfg.max_steps,
        seed=cfg.seed + 1000 * jax.process_index(),
        model=cfg.model,
    )
    console.print(f"learner: writing {im.warmup_demos} oracle demonstrations to {path}")
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode != 0:
        raise SystemExit(f"generating demonstrations failed:\n{done.stdout}{done.stderr}")
    return path
