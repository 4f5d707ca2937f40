"""`python -m benchmarks actor_loss [--quick]`: which binarized actor weighting A-RIDE uses by default
(learner/losses/actor_weighting.py: "binary" ignores the importance ratio, "binary_ratio" weights by the
truncated ratio, "vmpo" is the V-MPO/AWR-style candidate), and the off-policy correction's ablation under
each.

The runs are `python -m benchmarks paper`'s async cell (benchmarks/paper/plan.py: the real learner and its
local actors behind the emulator latency model, the learner pinned where the machine allows, greedy
evaluation of wall-clock snapshots), with --actor-weighting set per variant. The choice rule, fixed before
measuring: the highest mean area under the greedy curve on general/train (training templates, evaluation
episodes unseen in training); general/test is reported but takes no part in the choice.
Resumable like the paper benchmark: results in runs/paper-actor-loss-{full,quick}/.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from benchmarks import pinning
from benchmarks.paper.benchmark import _one
from benchmarks.paper.plan import QUICK, Recipe, plain_run

VARIANTS: dict[str, tuple[str, ...]] = {
    "binary": ("--actor-weighting", "binary"),
    "binary_ratio": ("--actor-weighting", "binary_ratio"),
    "vmpo": ("--actor-weighting", "vmpo"),
    "binary_no_correction": ("--actor-weighting", "binary", "--no-off-policy-correction"),
    "binary_ratio_no_correction": ("--actor-weighting", "binary_ratio", "--no-off-policy-correction"),
    "vmpo_no_correction": ("--actor-weighting", "vmpo", "--no-off-policy-correction"),
}

FULL = dataclasses.replace(
    QUICK, name="actor-loss-full", seeds=(0, 1, 2), seconds=240, snapshot_every=60, eval_episodes=100,
    warmup_updates=30, warmup_demos=400, cells=("async",),
)  # fmt: skip
SHORT = dataclasses.replace(
    FULL, name="actor-loss-quick", seeds=(0,), seconds=100, snapshot_every=50, eval_episodes=30
)


def run(quick: bool, variants: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """`variants`: the names to run (default all; from Python, e.g. the ablation under the choice only)."""
    recipe = SHORT if quick else FULL
    names = variants or tuple(VARIANTS)
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"actor_loss: unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    pinned = pinning.available()
    rows = [_variant(recipe, name, seed, pinned) for name in names for seed in recipe.seeds]
    return rows, _summary(rows, names)


def _variant(recipe: Recipe, name: str, seed: int, pinned: bool) -> dict:
    spec = plain_run(recipe, "async", recipe.envs[0], seed)
    run_dir = recipe.out_dir() / name / f"s{seed}"
    return {"variant": name, **_one(recipe, run_dir, spec, pinned, VARIANTS[name])}


def _summary(rows: list[dict], names: tuple[str, ...]) -> dict:
    """Mean and range per variant of the train AUC (the choice), final train and test success."""
    out: dict = {}
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        for key in ("auc_train", "final_train", "auc_test", "final_test", "updates"):
            values = [r[key] for r in mine]
            out[f"{name}/{key}"] = f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"
    choice = max(names, key=lambda n: np.mean([r["auc_train"] for r in rows if r["variant"] == n]))
    return out | {"choice_by_auc_train": choice}
