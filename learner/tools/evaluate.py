"""`python -m learner eval`: run a checkpoint's policy greedily on SimPhone tasks and report success
per template and in total.

Stepping environments is actor work: the learner restores the checkpoint, writes its parameters and model
config to a file in a temporary folder (common/params_file.py) and starts `python -m actors eval` on it
as a subprocess (the way it starts the demonstration writer), then prints the episodes' outcomes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from common import params_file
from common.backbones.decoder.lora import split_trained
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy, resolved_config
from learner.training.checkpoint import Checkpointer, TrainState, rng_state
from learner.training.train_step import make_optimizer


@dataclass
class EvalConfig:
    """Evaluate a trained policy greedily on SimPhone tasks."""

    checkpoint: Path | None = None
    """A run dir, or its `checkpoints` folder; the newest checkpoint is used. Not read with --init."""
    update: int | None = None
    """Evaluate the checkpoint saved at this update instead of the newest (the run's
    `checkpoints/` folder names them)."""
    params: Path | None = None
    """Evaluate a parameters file instead of a checkpoint: RUN_DIR/snapshots/warmup-end.safetensors (the
    parameters a run's imitation warm-up ended with) or a --snapshot-every file. Its run's step limit
    comes with the warm-up's file; other files use --max-steps."""
    init: bool = False
    """Evaluate the untrained policy of --model.* instead of a checkpoint: for --model.kind lm the
    pretrained decoder as it comes (its zero-shot score), for the pointer policy random weights."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy to build with --init (a checkpoint brings its own)."""
    max_steps: int = 16
    """Step limit per episode with --init or a --params file without one (a checkpoint's run brings its
    own)."""
    tasks: str = "general"
    """A shipped suite, a task .json file, or a folder of them."""
    split: str = "test"
    """"test" (held-out parameter values and templates), "train", "dev", "validation" (the training
    templates set aside for development choices, with training values: held out when the run trained on
    --split dev) or "heldout" (the held-out templates alone, with test values)."""
    episodes: int = 200
    """Episodes to run."""
    num_envs: int = 16
    """Environments stepped together with one batched policy call."""
    seed: int = 0
    """Seed of task sampling and layouts."""
    json: Path | None = None
    """Also write the results here as JSON."""


@dataclass
class Restored:
    """What evaluation needs of a checkpoint."""

    directory: Path
    """The checkpoints folder it came from."""
    state: TrainState
    """Its parameters, update and policy version."""
    model_cfg: ModelConfig
    """The run's model config."""
    max_steps: int
    """The run's step limit per episode."""


def restore(checkpoint: Path, update: int | None = None) -> Restored:
    """Checkpoint `update` (default: the newest) of a run dir or checkpoints folder (SystemExit with the
    reason if there is none)."""
    directory = checkpoint / "checkpoints" if (checkpoint / "checkpoints").is_dir() else checkpoint
    if not directory.is_dir():
        raise SystemExit(f"{checkpoint}: no such checkpoint directory")
    ckpt = Checkpointer(directory)
    if ckpt.latest_update() is None:
        raise SystemExit(f"{directory}: holds no checkpoint")
    if update is not None and update not in ckpt.updates():
        saved = ", ".join(map(str, ckpt.updates()))
        raise SystemExit(f"{directory}: no checkpoint at update {update} (saved: {saved})")
    run_cfg = ckpt.config(update)
    model_cfg = ModelConfig.from_dict(run_cfg["model"])
    _, params = make_policy(model_cfg).create(0)
    optimizer = make_optimizer(run_cfg["learning_rate"], run_cfg["max_grad_norm"])
    opt_state = optimizer.init(split_trained(params)[0])  # with LoRA adapters, only they have Adam moments
    try:
        state = ckpt.restore(
            TrainState(params, opt_state, 0, 0, rng_state(np.random.default_rng())),
            model_cfg.to_dict(),
            update,
        )
    except ValueError as e:
        raise SystemExit(str(e)) from e
    finally:
        ckpt.close()
    return Restored(directory, state, model_cfg, int(run_cfg["max_steps"]))


def initial(cfg: EvalConfig) -> Restored:
    """--init: the untrained policy of cfg.model (seed 0), as if restored at update 0."""
    model_cfg = resolved_config(cfg.model)
    _, params = make_policy(model_cfg).create(0)
    state = TrainState(params, None, 0, 0, rng_state(np.random.default_rng()))
    return Restored(Path("(untrained)"), state, model_cfg, cfg.max_steps)


def from_file(cfg: EvalConfig) -> tuple[Restored, dict[str, np.ndarray]]:
    """--params: the file's parameters (as actors receive them) and what it says of its run; SystemExit
    with the reason for a missing or unreadable file."""
    path = cfg.params
    try:
        model_cfg, flat = params_file.read(path)
        fields = params_file.fields(path)
    except ValueError as e:
        raise SystemExit(f"eval: {e}") from None
    state = TrainState(None, None, int(fields.get("update", 0)), int(fields.get("version", 0)), None)
    return Restored(path, state, model_cfg, int(fields.get("max_steps", cfg.max_steps))), flat


def run_episodes(
    cfg: EvalConfig, model_cfg: ModelConfig, flat: dict[str, np.ndarray], version: int, max_steps: int
) -> list[dict]:
    """Each episode's {"template", "success", "steps"}, in the order they ended, from `python -m actors
    eval` run on these parameters; SystemExit with the evaluator's own message if it fails."""
    with tempfile.TemporaryDirectory(prefix="learner-eval-") as tmp:
        params, out = Path(tmp) / "params.safetensors", Path(tmp) / "outcomes.json"
        params_file.write(params, flat, model_cfg)
        cmd = [
            sys.executable, "-m", "actors", "eval", "--params", str(params), "--out", str(out),
            "--tasks", cfg.tasks, "--split", cfg.split, "--episodes", str(cfg.episodes),
            "--num-envs", str(cfg.num_envs), "--seed", str(cfg.seed), "--max-steps", str(max_steps),
            "--policy-version", str(version),
        ]  # fmt: skip
        env = {**os.environ}
        env.setdefault("JAX_PLATFORMS", "cpu")  # actors infer on the CPU (the learner may hold the GPU)
        done = _run_showing_progress(cmd, env, Path(tmp) / "stdout.txt")
        if done.returncode != 0:
            raise SystemExit(f"eval: {_failure(done)}")
        return json.loads(out.read_text())["episodes"]


def _run_showing_progress(cmd: list[str], env: dict, stdout: Path) -> subprocess.CompletedProcess:
    """Run the evaluator, passing its progress lines (`eval: ...`) through to stderr as they come; its
    whole output is kept for an error message."""
    lines = []
    with (
        stdout.open("w+") as out,
        subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env) as proc,
    ):
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("eval: ") and " episodes, success " in line:
                print(line.rstrip(), file=sys.stderr, flush=True)
        proc.wait()
        out.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), "".join(lines))


def _failure(done: subprocess.CompletedProcess) -> str:
    """The evaluator's error: its one-line message, or all of its output when it crashed (a bug)."""
    text = (done.stderr or "").strip()
    if "Traceback (most recent call last)" in text:
        return f"python -m actors eval crashed (exit status {done.returncode}):\n{done.stdout}{text}"
    lines = text.splitlines()
    return lines[-1] if lines else f"python -m actors eval failed (exit status {done.returncode})"


def summarize(cfg: EvalConfig, restored: Restored, episodes: list[dict]) -> dict:
    """The report: success in total and per template, as printed and written to --json."""
    results: dict[str, list[bool]] = defaultdict(list)
    for ep in episodes:
        results[ep["template"]].append(bool(ep["success"]))
    prompts = [ep["prompt_tokens"] for ep in episodes if "prompt_tokens" in ep]
    return {
        "checkpoint": str(restored.directory),
        "update": restored.state.update,
        "policy_version": restored.state.policy_version,
        "tasks": cfg.tasks,
        "split": cfg.split,
        "episodes": sum(len(v) for v in results.values()),
        "success": float(np.mean([s for v in results.values() for s in v])),
        "per_template": {k: float(np.mean(v)) for k, v in sorted(results.items())},
        "episodes_per_template": {k: len(v) for k, v in sorted(results.items())},
        "invalid_actions": int(sum(ep.get("invalid_actions", 0) for ep in episodes)),
        "steps": int(sum(ep["steps"] for ep in episodes)),
        **({"mean_prompt_tokens": float(np.mean(prompts))} if prompts else {}),
    }


def table(report: dict) -> Table:
    title = f"{report['tasks']}/{report['split']}: success {report['success']:.3f} over "
    extra = f", {report['invalid_actions']} invalid actions in {report['steps']} steps"
    if "mean_prompt_tokens" in report:
        extra += f", prompts of {report['mean_prompt_tokens']:.0f} tokens on average"
    out = Table(title=f"{title}{report['episodes']} episodes (update {report['update']}{extra})")
    out.add_column("template")
    out.add_column("episodes")
    out.add_column("success")
    for name, rate in report["per_template"].items():
        out.add_row(name, str(report["episodes_per_template"][name]), f"{rate:.2f}")
    return out


def evaluate(cfg: EvalConfig, console: Console | None = None) -> dict:
    console = console or Console()
    if cfg.params is not None and (cfg.init or cfg.checkpoint is not None):
        raise SystemExit("eval: --params evaluates a parameters file: give it without --checkpoint or --init")
    if cfg.params is None and not cfg.init and cfg.checkpoint is None:
        raise SystemExit(
            "eval: give --checkpoint RUN_DIR, --params FILE, or --init to evaluate an untrained policy"
        )
    if cfg.params is not None:
        restored, flat = from_file(cfg)
    else:
        restored = initial(cfg) if cfg.init else restore(cfg.checkpoint, cfg.update)
        # What actors receive: with LoRA adapters only they (and heads); the evaluator reads its own base.
        flat = params_to_flat(split_trained(restored.state.params)[0])
    episodes = run_episodes(cfg, restored.model_cfg, flat, restored.state.policy_version, restored.max_steps)
    report = summarize(cfg, restored, episodes)
    console.print(table(report))
    if cfg.json:
        cfg.json.write_text(json.dumps(report, indent=2))
    return report
