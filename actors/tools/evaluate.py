"""`python -m actors eval`: the environment half of `python -m learner eval`, and the benchmarks'
evaluator of many snapshots. Runs a policy greedily on SimPhone tasks and writes the outcomes as JSON;
the learner restores the checkpoint, hands the parameters over as a file (common/params_file.py), starts
this as a subprocess and prints the table, so the learner never imports actor code.

Several parameter files and splits run in one process: the policy is built (and compiled) once and only
its parameters are swapped, which on a small CPU saves the JAX start-up and compiles of a process each."""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym

from actors.envs.factory import make_env, task_name
from actors.policy_runner import PolicyRunner, stack
from common import params_file
from common.config import ModelConfig
from common.types import Action, ActionType, Observation


@dataclass
class EvalRunConfig:
    """Run a policy greedily on SimPhone tasks and write each episode's outcome."""

    params: tuple[Path, ...]
    """The policies: one or more parameters files of common/params_file.py (flat arrays plus the model
    config), all of the same model config."""
    out: Path
    """Where the outcomes go. One --params file and one --split: JSON {"policy_version": V, "episodes":
    [{"template", "success", "steps", "invalid_actions", and "prompt_tokens" for a family with prompts},
    ...]} (what `python -m learner eval` reads). Otherwise one JSON
    {"results": [{"params": path, "split": s, "policy_version": V, "episodes": n, "success": rate,
    "by_template": {template: rate}, "episodes_per_template": {template: n}, "outcomes": [episodes as
    above]}, ...]}, one entry per (file, split), files in the order given and each file's splits in the
    order given."""
    tasks: str = "general"
    """A shipped suite, a task .json file, or a folder of them."""
    split: tuple[str, ...] = ("test",)
    """One or more of "test" (held-out parameter values and templates) and "train"."""
    episodes: int = 200
    """Episodes to run per (file, split)."""
    num_envs: int = 16
    """Environments stepped together with one batched policy call."""
    seed: int = 0
    """Seed of task sampling and layouts: every (file, split) runs on the same seeds, so files compare
    on identical episodes."""
    max_steps: int = 20
    """Step limit per episode (the training run's --max-steps)."""
    policy_version: tuple[int, ...] = (0,)
    """Each file's snapshot version (one per --params file, or one for all), passed through to the
    outcomes."""


@dataclass
class Setup:
    """A greedy policy and its environments, each reset to its first episode."""

    runner: PolicyRunner
    envs: list[gym.Env]
    obs: list[Observation]
    """The current observation of each environment."""
    seeds: Iterator[int]
    """The reset seeds still to use, one stream for all environments."""


def start(cfg: EvalRunConfig, runner: PolicyRunner, split: str) -> Setup:
    """Fresh environments of `split` after their first reset, on the seeds of `cfg.seed`; ValueError for
    an unknown task set or split, or a split without templates."""
    count = min(cfg.num_envs, cfg.episodes)
    envs = [make_env("simphone", cfg.max_steps, cfg.tasks, split) for _ in range(count)]
    seeds = iter(range(cfg.seed * 1_000_003, cfg.seed * 1_000_003 + 10 * cfg.episodes + count))
    return Setup(runner, envs, [env.reset(seed=next(seeds))[0] for env in envs], seeds)


PROGRESS_S = 30.0
"""Seconds between progress lines on stderr (a 200-episode run of a decoder takes an hour on a CPU)."""


class Progress:
    """Progress lines on stderr, `eval: DONE/TOTAL episodes, success S, T s per episode`: every PROGRESS_S
    seconds and once at the end (the learner's `eval` passes them through)."""

    def __init__(self, total: int, label: str):
        self.total, self.label = total, label
        self.start = self.last = time.monotonic()

    def update(self, done: list[dict], final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_S:
            return
        self.last = now
        n = len(done)
        success = sum(ep["success"] for ep in done) / n if n else 0.0
        pace = f", {(now - self.start) / n:.1f} s per episode" if n else ""
        print(
            f"eval: {self.label}{n}/{self.total} episodes, success {success:.2f}{pace}",
            file=sys.stderr,
            flush=True,
        )


def run_episodes(cfg: EvalRunConfig, setup: Setup, label: str = "") -> list[dict]:
    """Greedy episodes in the order they end: an environment whose episode ended resets with the next
    seed of one stream, and every step is one batched policy call over the environments still running
    (so results depend only on the parameters, the seed and the task set)."""
    runner, envs, obs = setup.runner, setup.envs, setup.obs
    history: list[list[Action]] = [[] for _ in envs]
    prompt_tokens = [0] * len(envs)
    done: list[dict] = []
    started = len(envs)
    active = [*range(len(envs))]
    progress = Progress(cfg.episodes, label)
    while active:
        progress.update(done)
        features = [runner.featurize(obs[i], history[i]) for i in active]
        choices = runner.act(stack(features)).choices
        still = []
        for i, choice, row in zip(active, choices, features, strict=True):
            name = task_name(envs[i])
            action = runner.to_action(obs[i], choice)
            obs[i], _, terminated, truncated, info = envs[i].step(action)
            history[i].append(action)
            prompt_tokens[i] += int(row.get("prompt_length", 0))
            if not (terminated or truncated):
                still.append(i)
                continue
            done.append(_outcome(name, info, history[i], prompt_tokens[i]))
            if started < cfg.episodes:
                started += 1
                obs[i], history[i], prompt_tokens[i] = envs[i].reset(seed=next(setup.seeds))[0], [], 0
                still.append(i)
        active = still
    progress.update(done, final=True)
    return done


def _outcome(template: str, info: dict, actions: list[Action], prompt_tokens: int) -> dict:
    """One episode's outcome: template, success, steps, the actions that did not parse (NOOPs, the `lm`
    family without constraints) and, for a family with prompts, their mean length in tokens."""
    out = {"template": template, "success": bool(info["success"]), "steps": len(actions)}
    out["invalid_actions"] = sum(a.type == ActionType.NOOP for a in actions)
    if prompt_tokens:
        out["prompt_tokens"] = prompt_tokens / len(actions)
    return out


def summarize(path: Path, split: str, version: int, outcomes: list[dict]) -> dict:
    """One (file, split) entry of the several-file output: success in total and per template."""
    by_template: dict[str, list[bool]] = defaultdict(list)
    for ep in outcomes:
        by_template[ep["template"]].append(bool(ep["success"]))
    return {
        "params": str(path),
        "split": split,
        "policy_version": version,
        "episodes": len(outcomes),
        "success": sum(ep["success"] for ep in outcomes) / max(len(outcomes), 1),
        "by_template": {k: sum(v) / len(v) for k, v in sorted(by_template.items())},
        "episodes_per_template": {k: len(v) for k, v in sorted(by_template.items())},
        "outcomes": outcomes,
    }


def check(cfg: EvalRunConfig) -> ModelConfig:
    """The files' common model config, before anything runs; ValueError for counts that cannot run, a
    version list that does not match the files, an unknown task set or split, an unreadable file or
    files of different model configs."""
    for name in ("episodes", "num_envs", "max_steps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if not cfg.params or not cfg.split:
        raise ValueError("--params and --split each need at least one value")
    if len(cfg.policy_version) not in (1, len(cfg.params)):
        raise ValueError(
            f"--policy-version takes one version or one per --params file ({len(cfg.params)}), "
            f"got {len(cfg.policy_version)}"
        )
    for split in cfg.split:  # a first episode of each: an unknown split or one without templates fails
        env = make_env("simphone", cfg.max_steps, cfg.tasks, split)
        env.reset(seed=cfg.seed)
        env.close()
    first, _ = params_file.read(cfg.params[0])
    for path in cfg.params[1:]:
        model_cfg, _ = params_file.read(path)
        if model_cfg != first:
            raise ValueError(
                f"{path}: its model config differs from {cfg.params[0]}'s; one evaluation builds one "
                f"policy, so evaluate files of other models in another call"
            )
    return first


def evaluate_all(cfg: EvalRunConfig, runner: PolicyRunner) -> list[dict]:
    """Every (file, split) entry, each file's parameters swapped into the one greedy policy; SystemExit
    naming the file whose parameters do not fit the model."""
    results = []
    for k, path in enumerate(cfg.params):
        version = cfg.policy_version[k if len(cfg.policy_version) > 1 else 0]
        try:
            runner.load(version, params_file.read(path)[1])
        except ValueError as e:
            raise SystemExit(f"{path}: {e}") from None
        for split in cfg.split:
            label = f"{path.name} {split}: " if len(cfg.params) * len(cfg.split) > 1 else ""
            episodes = run_episodes(cfg, start(cfg, runner, split), label)
            results.append(summarize(path, split, version, episodes))
    return results


def run_eval(cfg: EvalRunConfig) -> None:
    """Check the input, run the episodes, write the outcomes; bad input ends the process with one clean
    line (SystemExit), which the learner shows as it is."""
    try:
        runner = PolicyRunner(check(cfg), cfg.seed, greedy=True)  # greedy: the key does not matter
    except (ValueError, OSError) as e:  # bad task set or split, unreadable or mismatched files
        raise SystemExit(str(e)) from None
    results = evaluate_all(cfg, runner)
    if len(results) == 1:  # the form `python -m learner eval` reads
        out = {"policy_version": results[0]["policy_version"], "episodes": results[0]["outcomes"]}
    else:
        out = {"results": results}
    cfg.out.write_text(json.dumps(out))
