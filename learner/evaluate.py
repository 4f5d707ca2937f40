"""`python -m learner eval`: run a checkpoint's policy greedily on SimPhone tasks and report success
per template and in total.

Evaluation is an offline tool, so unlike the training loop it runs environments in-process (through
the actors' environment factory) instead of talking to actors over sockets.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from actors.envs.factory import make_env, task_name
from actors.policy_runner import PolicyRunner, to_action
from common import featurize, model
from common.config import ModelConfig
from learner.checkpoint import Checkpointer, TrainState, rng_state
from learner.train_step import make_optimizer


@dataclass
class EvalConfig:
    """Evaluate a trained policy greedily on SimPhone tasks."""

    checkpoint: Path
    """A run dir, or its `checkpoints` folder; the newest checkpoint is used."""
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
    json: Path | None = None
    """Also write the results here as JSON."""


def evaluate(cfg: EvalConfig, console: Console | None = None) -> dict:
    console = console or Console()
    directory = (
        cfg.checkpoint / "checkpoints" if (cfg.checkpoint / "checkpoints").is_dir() else cfg.checkpoint
    )
    if not directory.is_dir():
        raise SystemExit(f"{cfg.checkpoint}: no such checkpoint directory")
    ckpt = Checkpointer(directory)
    if ckpt.latest_update() is None:
        raise SystemExit(f"{directory}: holds no checkpoint")
    run_cfg = ckpt.config()
    model_cfg = ModelConfig.from_dict(run_cfg["model"])
    _, params = model.create(model_cfg, 0)
    opt_state = make_optimizer(run_cfg["learning_rate"], run_cfg["max_grad_norm"]).init(params)
    try:
        state = ckpt.restore(
            TrainState(params, opt_state, 0, 0, rng_state(np.random.default_rng())), model_cfg.to_dict()
        )
    except ValueError as e:
        raise SystemExit(str(e)) from e
    ckpt.close()
    runner = PolicyRunner(model_cfg, cfg.seed, greedy=True)
    runner.load(state.policy_version, model.params_to_flat(state.params))
    max_steps = int(run_cfg["max_steps"])
    envs = [
        make_env("simphone", max_steps, cfg.tasks, cfg.split) for _ in range(min(cfg.num_envs, cfg.episodes))
    ]
    seeds = iter(range(cfg.seed * 1_000_003, cfg.seed * 1_000_003 + 10 * cfg.episodes + len(envs)))
    obs = [env.reset(seed=next(seeds))[0] for env in envs]
    results: dict[str, list[bool]] = defaultdict(list)
    started = len(envs)
    active = [*range(len(envs))]
    while active:
        feats = featurize.stack([featurize.featurize(obs[i], model_cfg) for i in active])
        choices = runner.act(feats).choices
        still = []
        for i, choice in zip(active, choices, strict=True):
            name = task_name(envs[i])
            obs[i], _, terminated, truncated, info = envs[i].step(to_action(obs[i], choice, model_cfg))
            if terminated or truncated:
                results[name].append(bool(info["success"]))
                if started < cfg.episodes:
                    started += 1
                    obs[i] = envs[i].reset(seed=next(seeds))[0]
                    still.append(i)
            else:
                still.append(i)
        active = still
    per_template = {k: float(np.mean(v)) for k, v in sorted(results.items())}
    total = float(np.mean([s for v in results.values() for s in v]))
    report = {
        "checkpoint": str(directory),
        "update": state.update,
        "policy_version": state.policy_version,
        "tasks": cfg.tasks,
        "split": cfg.split,
        "episodes": sum(len(v) for v in results.values()),
        "success": total,
        "per_template": per_template,
        "episodes_per_template": {k: len(v) for k, v in sorted(results.items())},
    }
    table = Table(
        title=f"{cfg.tasks}/{cfg.split}: success {total:.3f} over {report['episodes']} episodes (update {state.update})"
    )
    table.add_column("template")
    table.add_column("episodes")
    table.add_column("success")
    for name, rate in per_template.items():
        table.add_row(name, str(len(results[name])), f"{rate:.2f}")
    console.print(table)
    if cfg.json:
        cfg.json.write_text(json.dumps(report, indent=2))
    return report
