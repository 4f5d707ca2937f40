"""`python -m actors eval`: the environment half of `python -m learner eval`. Runs a policy greedily on
SimPhone tasks and writes each episode's outcome as JSON; the learner restores the checkpoint, hands the
parameters over as a file (common/params_file.py), starts this as a subprocess and prints the table, so
the learner never imports actor code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from actors.envs.factory import make_env, task_name
from actors.policy_runner import PolicyRunner, stack
from common import params_file
from common.config import ModelConfig
from common.types import Action, Observation


@dataclass
class EvalRunConfig:
    """Run a policy greedily on SimPhone tasks and write each episode's outcome."""

    params: Path
    """The policy: a parameters file of common/params_file.py (flat arrays plus the model config)."""
    out: Path
    """Where the outcomes go: JSON {"policy_version": V, "episodes": [{"template", "success", "steps"}]}."""
    tasks: str = "general"
    """A shipped suite, a task .json file, or a folder of them."""
    split: str = "test"
    """"test" (held-out parameter values and templates) or "train"."""
    episodes: int = 200
    """Episodes to run."""
    num_envs: int = 16
    """Environments stepped together with one batched policy call."""
    seed: int = 0
    """Seed of task sampling and layouts."""
    max_steps: int = 20
    """Step limit per episode (the training run's --max-steps)."""
    policy_version: int = 0
    """The snapshot's version, passed through to the outcomes."""


@dataclass
class Setup:
    """A greedy policy and its environments, each reset to its first episode."""

    runner: PolicyRunner
    envs: list[gym.Env]
    obs: list[Observation]
    """The current observation of each environment."""
    seeds: Iterator[int]
    """The reset seeds still to use, one stream for all environments."""


def build(cfg: EvalRunConfig, model_cfg: ModelConfig, flat: dict[str, np.ndarray]) -> Setup:
    """The policy and the environments after their first reset; ValueError for parameters that do not
    fit the model, an unknown task set or split, or a split without templates."""
    runner = PolicyRunner(model_cfg, cfg.seed, greedy=True)
    runner.load(cfg.policy_version, flat)
    count = min(cfg.num_envs, cfg.episodes)
    envs = [make_env("simphone", cfg.max_steps, cfg.tasks, cfg.split) for _ in range(count)]
    seeds = iter(range(cfg.seed * 1_000_003, cfg.seed * 1_000_003 + 10 * cfg.episodes + count))
    return Setup(runner, envs, [env.reset(seed=next(seeds))[0] for env in envs], seeds)


def run_episodes(cfg: EvalRunConfig, setup: Setup) -> list[dict]:
    """Greedy episodes in the order they end: an environment whose episode ended resets with the next
    seed of one stream, and every step is one batched policy call over the environments still running
    (so results depend only on the parameters, the seed and the task set)."""
    runner, envs, obs = setup.runner, setup.envs, setup.obs
    history: list[list[Action]] = [[] for _ in envs]
    done: list[dict] = []
    started = len(envs)
    active = [*range(len(envs))]
    while active:
        choices = runner.act(stack([runner.featurize(obs[i], history[i]) for i in active])).choices
        still = []
        for i, choice in zip(active, choices, strict=True):
            name = task_name(envs[i])
            action = runner.to_action(obs[i], choice)
            obs[i], _, terminated, truncated, info = envs[i].step(action)
            history[i].append(action)
            if not (terminated or truncated):
                still.append(i)
                continue
            done.append({"template": name, "success": bool(info["success"]), "steps": len(history[i])})
            if started < cfg.episodes:
                started += 1
                obs[i], history[i] = envs[i].reset(seed=next(setup.seeds))[0], []
                still.append(i)
        active = still
    return done


def check(cfg: EvalRunConfig) -> None:
    """ValueError for counts that cannot run (the task set and split are checked as the envs are made)."""
    for name in ("episodes", "num_envs", "max_steps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")


def run_eval(cfg: EvalRunConfig) -> None:
    """Load the parameters, run the episodes, write the outcomes; bad input ends the process with one
    clean line (SystemExit), which the learner shows as it is."""
    try:
        check(cfg)
        model_cfg, flat = params_file.read(cfg.params)
        setup = build(cfg, model_cfg, flat)
    except (ValueError, OSError) as e:  # bad task set or split, unreadable or unfitting parameters
        raise SystemExit(str(e)) from None
    episodes = run_episodes(cfg, setup)
    cfg.out.write_text(json.dumps({"policy_version": cfg.policy_version, "episodes": episodes}))
