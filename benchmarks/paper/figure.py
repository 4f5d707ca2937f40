"""The pictures of `python -m benchmarks paper`, drawn from its results file (benchmarks/paper/results.py)
so they show exactly the data the claims are judged on: greedy success of sync and async against wall
time and against env steps, each seed a thin line and the mean over seeds a thick one (train and test
split), and each cell's collection rate per seed with the mean.

The mean against wall time is taken on the recipe's grid (eval.py grid_points: the snapshot at or after
each grid time, so a seed whose snapshot was skipped during the compile still counts); against env
steps, seeds differ in steps at a given time, so the mean curve joins each grid time's mean env steps to
its mean success. Drawn on `matplotlib.figure.Figure` (Agg, no pyplot), like learner/observe/report.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from benchmarks.paper.eval import SPLITS, grid_points

MODES = ("sync", "async")
"""The cells whose curves are drawn: the claims compare these two."""
AXES = (("wall", "wall-clock seconds since learner start"), ("env_steps", "environment steps"))
"""x axes of the success figure: each snapshot's exact wall seconds, its env steps."""
COLOR = {"sync": "tab:blue", "async": "tab:orange"}

Series = tuple[list[float], list[float]]


def success_series(runs: list[dict], recipe: dict, split: str, x_key: str) -> dict[str, dict]:
    """For each mode: {"seeds": {seed: (x, y)}, "mean": (x, y)}, what the success figure plots on one
    axis (y the greedy success on `split`, x the snapshots' `x_key`)."""
    out: dict[str, dict] = {}
    for mode in MODES:
        mine = sorted((r for r in runs if r["cell"] == mode), key=lambda r: r["seed"])
        if not mine:
            continue
        seeds = {r["seed"]: _xy(r["snapshots"], x_key, split) for r in mine}
        grids = [grid_points(r["snapshots"], recipe["seconds"], recipe["snapshot_every"]) for r in mine]
        ys = np.mean([[p[split] for p in g] for g in grids], axis=0)
        if x_key == "wall":
            xs = recipe_grid(recipe)
        else:
            xs = np.mean([[p[x_key] for p in g] for g in grids], axis=0)
        out[mode] = {"seeds": seeds, "mean": ([float(x) for x in xs], [float(y) for y in ys])}
    return out


def recipe_grid(recipe: dict) -> list[float]:
    """The grid times every, 2 every, ..., seconds."""
    return [
        float(t) for t in range(recipe["snapshot_every"], recipe["seconds"] + 1, recipe["snapshot_every"])
    ]


def collection_series(runs: list[dict]) -> dict[str, dict[int, float]]:
    """Each cell's env steps/s by seed, cells in the order of the runs."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        out.setdefault(r["cell"], {})[r["seed"]] = r["env_steps_per_s"]
    return out


def draw(results: dict, out_dir: Path) -> dict:
    """Both figures for every N of the results, as PNGs in `out_dir` (made if needed). Returns what was
    plotted, {"N16": {"success": {split: {x_key: success_series}}, "collection": ..., "files": [...]}},
    so a test can check the curves come from the right series."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recipe = results["recipe"]
    drawn: dict[str, dict] = {}
    for n in sorted({r["base_envs"] for r in results["runs"]}):
        runs = [r for r in results["runs"] if r["base_envs"] == n]
        success = {s: {x: success_series(runs, recipe, s, x) for x, _ in AXES} for s in SPLITS}
        collection = collection_series(runs)
        files = [
            _save(plot_success(success, recipe["target"], n), out_dir / f"greedy_success_N{n}.png"),
            _save(plot_collection(collection, n), out_dir / f"collection_N{n}.png"),
        ]
        drawn[f"N{n}"] = {"success": success, "collection": collection, "files": files}
    return drawn


def plot_success(success: dict, target: float, n: int) -> Figure:
    """Rows: the splits; columns: wall time and env steps; thin lines per seed, thick the mean."""
    fig = Figure(figsize=(12, 9))
    axes = fig.subplots(len(SPLITS), len(AXES), squeeze=False)
    for row, split in enumerate(SPLITS):
        for col, (x_key, words) in enumerate(AXES):
            ax = axes[row][col]
            for mode, series in success[split][x_key].items():
                for seed, (x, y) in series["seeds"].items():
                    ax.plot(x, y, color=COLOR[mode], linewidth=0.8, alpha=0.5, label=f"{mode} s{seed}")
                ax.plot(*series["mean"], color=COLOR[mode], linewidth=2.5, marker="o", label=f"{mode} mean")
            ax.axhline(target, color="gray", linestyle=":", linewidth=1)
            ax.set(xlabel=words, ylabel=f"greedy success, general/{split}", ylim=(-0.02, 1.02))
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle(
        f"N = {n}: greedy success of sync and async (thin: seeds, thick: mean; dotted: target {target:g})"
    )
    return fig


def plot_collection(collection: dict[str, dict[int, float]], n: int) -> Figure:
    """Env steps/s per cell: a bar at the mean, a dot per seed; dashed, the paper's 2.4x over sync."""
    fig = Figure(figsize=(10, 5))
    ax = fig.add_subplot()
    for i, (cell, by_seed) in enumerate(collection.items()):
        rates = list(by_seed.values())
        ax.bar(i, float(np.mean(rates)), color="lightgray", edgecolor="black")
        ax.plot([i] * len(rates), rates, "o", color=COLOR.get(cell, "black"))
    if "sync" in collection:
        paper = 2.4 * float(np.mean(list(collection["sync"].values())))
        ax.axhline(paper, color="tab:red", linestyle="--", linewidth=1, label="the paper's 2.4x over sync")
        ax.legend()
    ax.set_xticks(range(len(collection)), list(collection), rotation=20)
    ax.set(ylabel="environment steps/s", title=f"N = {n}: collection rate per cell (bar: mean, dots: seeds)")
    ax.grid(axis="y", alpha=0.3)
    return fig


def _xy(snapshots: list[dict], x_key: str, split: str) -> Series:
    return [float(p[x_key]) for p in snapshots], [float(p[split]) for p in snapshots]


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
