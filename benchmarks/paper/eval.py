"""One finished run of `python -m benchmarks paper`, measured: its parameter snapshots evaluated greedily
(one `python -m actors eval` process for all of them, on general/train and general/test, the same
episodes for every snapshot), the curve they make, and the run's own rates from its metrics.jsonl.

The curve is greedy success at fixed wall-clock times (the learner's --snapshot-every), so runs of
different cells are compared at equal times, never by the training window's sampled success.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.collection import ROOT, steps_per_second
from benchmarks.paper.plan import EVAL_SEED, Recipe

SPLITS = ("train", "test")
"""general/train (the templates and values trained on) and general/test (held-out values and templates)."""


def evaluate_snapshots(recipe: Recipe, run_dir: Path) -> list[dict]:
    """One point per snapshot: {"t", "wall", "update", "episodes", "env_steps", "phase", "train", "test"}
    (greedy success per split), in time order; also written to run_dir/greedy.jsonl for
    `python -m learner report`."""
    index = [json.loads(line) for line in (run_dir / "snapshots" / "index.jsonl").read_text().splitlines()]
    index = [p for p in index if p["t"] <= recipe.seconds]
    if not index:
        raise RuntimeError(f"{run_dir}: no snapshot within {recipe.seconds} s")
    files = [str(run_dir / "snapshots" / f"t{p['t']:05d}.safetensors") for p in index]
    out = run_dir / "greedy_eval.json"
    cmd = [sys.executable, "-m", "actors", "eval", "--params", *files, "--split", *SPLITS,
           "--episodes", str(recipe.eval_episodes), "--seed", str(EVAL_SEED), "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"eval failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    success = {(r["params"], r["split"]): r["success"] for r in json.loads(out.read_text())["results"]}
    points = [{**p, **{s: success[(f, s)] for s in SPLITS}} for p, f in zip(index, files, strict=True)]
    (run_dir / "greedy.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    return points


def curve_summary(points: list[dict], target: float, seconds: int, every: int) -> dict:
    """Final greedy success (the last snapshot), the area under each split's curve (the mean over the
    recipe's grid every, 2 every, ..., seconds, so equal between runs of one recipe), and the time to
    `target` on train (the first snapshot at or above it; None if never, its resolution the spacing).
    A grid time without a snapshot of its own (it passed during the compile or one long update) takes
    the next snapshot's value: the parameters of that time had at most that much training."""
    out: dict = {"snapshots": len(points), "final_t": points[-1]["t"]}
    on_grid = grid_points(points, seconds, every)
    for split in SPLITS:
        out[f"final_{split}"] = round(points[-1][split], 4)
        out[f"auc_{split}"] = round(float(np.mean([p[split] for p in on_grid])), 4)
    reached = next((p for p in points if p["train"] >= target), None)
    out["time_to_target"] = reached["t"] if reached else None
    out["updates_to_target"] = reached["update"] if reached else None
    out["env_steps_to_target"] = reached["env_steps"] if reached else None
    out["time_to_target_bound"] = reached["t"] if reached else seconds
    return out


def grid_points(points: list[dict], seconds: int, every: int) -> list[dict]:
    """The snapshot standing for each grid time every, 2 every, ..., seconds: the first at or after it
    (the last one past the end), so runs of one recipe line up on the same times."""
    return [next((p for p in points if p["t"] >= t), points[-1]) for t in range(every, seconds + 1, every)]


def run_rates(lines: list[dict], batch_size: int) -> dict:
    """What the run collected and trained, from its metrics.jsonl: env steps and episodes per second
    (slopes after the first episode), updates, and the learner's own rate when it trains, updates per
    second of train time (what it could do alone: the headroom's numerator), and the replay ratio
    (reinforcement-learning samples per episode received)."""
    last = lines[-1]
    steps_rate, window = steps_per_second(lines)
    episode_rate, _ = steps_per_second(lines, "episodes")
    train_s = last.get("time/train_s", 0.0)
    rl_updates = last["update"] - last.get("imitation_updates", 0)
    return {
        "env_steps_per_s": round(steps_rate, 3),
        "episodes_per_s": round(episode_rate, 4),
        "window_s": round(window, 1),
        "updates": last["update"],
        "rl_updates": rl_updates,
        "updates_per_s": round(last["update"] / max(last["wall"], 1e-9), 4),
        "alone_updates_per_s": round(last["update"] / train_s, 4) if train_s else None,
        "episodes": last["episodes"],
        "env_steps": last["env_steps"],
        "replay_ratio": round(rl_updates * batch_size / max(last["episodes"], 1), 3),
        "lag_mean": round(float(np.mean([m.get("policy_lag_mean", 0.0) for m in lines])), 2),
    }
