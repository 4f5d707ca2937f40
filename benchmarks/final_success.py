"""Final greedy success after equal wall time: async A-RIDE against a DigiRL-style synchronous baseline.

DistRL's claim: about 20% higher (relative) final success than DigiRL at equal training time. What runs,
for each seed and variant: the real learner (`python -m learner`) with 16 SimPhone environments
(`general` tasks) in 2 local actors behind the emulator latency model of `benchmarks/collection.py`
(time scale 0.2), the same warm-up in every variant (60 behavior-cloning updates on 400 oracle
demonstrations, the actors collecting with the initial policy meanwhile), then reinforcement learning
until the wall-time limit (`--time-limit`, warm-up included, equal for all variants). Then the last
checkpoint runs greedily on held-out `general`/test episodes (`python -m learner eval`, new parameter
values and templates, evaluation seed EVAL_SEED). As in time_to_success the learner is pinned to one
core and its actors to the others where the machine allows.

Variants (VARIANTS): `aride` is the default configuration in `--mode async`; `digirl_sync` is
`--mode sync` (every environment runs one episode per round on one policy version, then the learner
trains) with DigiRL's actor loss: only positive advantages train (`--advantage-threshold 0`), as
1[A > 0] (`--binarize-advantage True`), on instructions whose recent success is in [0.1, 0.9]
(`--instruction-filter`). The ablations (benchmarks/ablation.py) remove one A-RIDE component each.

Reported per run: greedy test success, updates, episodes. Over the seeds (the JSON's top level), for
each variant: `<variant>_mean`, `_min`, `_max`; for each other variant against `aride`:
`aride_over_<variant>` = mean(aride) / mean(variant) - 1, the relative improvement, and its per-seed
range `aride_over_<variant>_min` / `_max`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import pinning
from benchmarks.collection import ROOT, learner_command, run_learner

SEEDS = (0, 1, 2)
EVAL_SEED = 1234
TIME_SCALE = 0.2
WARMUP = ("--warmup-demos", "400", "--warmup-updates", "60", "--batch-size", "32")
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "aride": ("async", ()),
    "digirl_sync": (
        "sync",
        ("--advantage-threshold", "0", "--binarize-advantage", "True", "--instruction-filter", "0.1", "0.9"),
    ),
    "uniform": ("async", ("--replay", "uniform")),
    "no_correction": ("async", ("--no-off-policy-correction",)),
    "no_entropy": ("async", ("--entropy-coef", "0", "--priority-weights", "1", "0.5", "0")),
}


def run(quick: bool) -> tuple[list[dict], dict]:
    return compare(("aride", "digirl_sync"), quick)


def compare(
    variants: tuple[str, ...], quick: bool, seconds: float | None = None, episodes: int | None = None
) -> tuple[list[dict], dict]:
    """Every variant on every seed at equal wall time (`seconds`, warm-up included; default 120 quick,
    300 otherwise), evaluated on `episodes` (100 / 200); rows and the summary described above."""
    seconds = seconds or (120.0 if quick else 300.0)
    episodes = episodes or (100 if quick else 200)
    pinned = pinning.available()
    rows = []
    for seed in SEEDS:
        for name in variants:
            rows.append(_one(name, seed, seconds, episodes, pinned))
            print(json.dumps(rows[-1]), flush=True)  # progress: a run takes minutes
    return rows, summarize(rows, variants) | {"seconds": seconds, "eval_episodes": episodes, "pinned": pinned}


def summarize(rows: list[dict], variants: tuple[str, ...]) -> dict:
    """Mean and range of success per variant, and A-RIDE's relative improvement over each other one."""
    by = {v: {r["seed"]: r["success"] for r in rows if r["variant"] == v} for v in variants}
    out: dict[str, float] = {}
    for v, runs in by.items():
        values = list(runs.values())
        out |= {
            f"{v}_mean": round(sum(values) / len(values), 3),
            f"{v}_min": min(values),
            f"{v}_max": max(values),
        }
    for v in variants[1:]:
        mean_v = out[f"{v}_mean"]
        out[f"aride_over_{v}"] = round(out["aride_mean"] / mean_v - 1, 3) if mean_v else float("inf")
        per_seed = [by["aride"][s] / by[v][s] - 1 for s in by[v] if by[v][s] and s in by["aride"]]
        if per_seed:
            out[f"aride_over_{v}_min"] = round(min(per_seed), 3)
            out[f"aride_over_{v}_max"] = round(max(per_seed), 3)
    return out


def _one(name: str, seed: int, seconds: float, episodes: int, pinned: bool) -> dict:
    mode, flags = VARIANTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / name
        cmd = learner_command(mode, run_dir, seconds, TIME_SCALE, (*WARMUP, "--seed", str(seed), *flags))
        lines = run_learner(cmd, run_dir, seconds + 300, pinned)
        report = _evaluate(run_dir, episodes, Path(tmp) / "eval.json")
    last = lines[-1]
    return {
        "variant": name,
        "seed": seed,
        "success": report["success"],
        "updates": last["update"],
        "episodes": last["episodes"],
        "train_success": round(last["success_rate"], 3),
    }


def _evaluate(run_dir: Path, episodes: int, out: Path) -> dict:
    """Greedy success of the run's last checkpoint on general/test."""
    cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(run_dir), "--split", "test"]
    cmd += ["--episodes", str(episodes), "--seed", str(EVAL_SEED), "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"eval failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())
