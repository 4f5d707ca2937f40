"""The results file of `python -m benchmarks paper`: every run with its greedy curve, and the claims and
ablations judged by benchmarks/paper/verdict.py, as data a reader can recompute the claims from
(benchmarks/results/paper-standard.json for the standard size; the out dir for the others).

Per run: its cell, seed, N and environments, env steps/s, updates and the rest of its row (eval.py's
run_rates and curve_summary), its measured duration, and every snapshot's grid time `t`, exact `wall`
seconds, update, episodes, env steps and greedy success per split. From those alone: collection is
async's env_steps_per_s over sync's per seed; the time to target is the first snapshot's `t` whose
`train` is at least the recipe's target (never: censored at the recipe's `seconds`); final success is
the last snapshot's `train` and `test`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from benchmarks.collection import ROOT
from benchmarks.paper.plan import STANDARD, Recipe
from benchmarks.paper.verdict import HOLD_FRACTION, MIN_SEEDS, PAPER

SNAPSHOT_KEYS = ("t", "wall", "update", "episodes", "env_steps", "train", "test")
"""What each snapshot keeps: eval.py's points without the learner's phase."""
HOW = (
    "collection: async env_steps_per_s / sync's, per seed; time to target: the first snapshot whose train "
    "success >= recipe.target, its t (never: censored at recipe.seconds); training efficiency: sync's time "
    "to target / async's; final success: the last snapshot's train and test; verdicts: "
    "benchmarks/paper/verdict.py (rules fixed before the run); null bound: none that way"
)
"""How a reader recomputes the claims from the runs, stored in the file itself."""


def published_paths(recipe: Recipe, out: Path, extra: tuple[str, ...]) -> tuple[Path, Path]:
    """(results JSON, figure folder): the committed places for the standard size with the default
    flags; the run's out dir for other sizes and for extra learner flags, which must not overwrite them."""
    if recipe == STANDARD and not extra:
        return ROOT / "benchmarks" / "results" / "paper-standard.json", ROOT / "docs" / "paper-standard"
    return out / f"paper-{recipe.name}.json", out / "figures"


def read_curve(run_dir: Path) -> list[dict]:
    """A finished run's greedy points (eval.py's greedy.jsonl), reduced to SNAPSHOT_KEYS."""
    path = run_dir / "greedy.jsonl"
    points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: p.get(k) for k in SNAPSHOT_KEYS} for p in points]


def document(
    recipe: Recipe, rows: list[dict], curves: dict[str, list[dict]], judged: dict, meta: dict
) -> dict:
    """The whole file: recipe, rules, runs with their snapshots (`curves` by run key), claims, ablations."""
    runs = [{"key": run_key(row), **row, "snapshots": curves[run_key(row)]} for row in rows]
    return {
        "benchmark": "paper",
        **meta,
        "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "recipe": {
            **recipe.__dict__,
            "grid": list(range(recipe.snapshot_every, recipe.seconds + 1, recipe.snapshot_every)),
        },
        "rules": {"paper": PAPER, "hold_fraction": HOLD_FRACTION, "min_seeds": MIN_SEEDS, "how": HOW},
        "evidence": recipe.name != "quick",
        "runs": runs,
        "claims": {n: j["claims"] for n, j in judged.items()},
        "ablations": {n: j["ablations"] for n, j in judged.items()},
    }


def run_key(row: dict) -> str:
    """The run's key as plan.Run names it (N{base_envs}/{cell}/s{seed}), also its folder under the out dir."""
    return f"N{row['base_envs']}/{row['cell']}/s{row['seed']}"


def write(path: Path, doc: dict) -> Path:
    """The file, its folder made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
