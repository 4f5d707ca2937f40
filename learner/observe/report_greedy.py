"""The greedy-evaluation curves of `python -m learner report`: RUN_DIR/greedy.jsonl, written by
`python -m benchmarks paper` (benchmarks/paper/eval.py) after evaluating a run's wall-clock parameter
snapshots greedily, one line per snapshot {"t", "update", "env_steps", "train", "test", ...}. Unlike the
training success rate these are not a window over the episodes the run happened to sample."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

AXES = (
    ("t", "wall-clock seconds since learner start"),
    ("env_steps", "environment steps"),
    ("update", "updates"),
)


def read_points(run_dir: Path) -> list[dict]:
    """The run's greedy points in time order; [] without a greedy.jsonl. ValueError for an unreadable one."""
    path = run_dir / "greedy.jsonl"
    if not path.is_file():
        return []
    try:
        points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON lines ({e})") from None
    missing = [k for k in ("t", "env_steps", "update", "train", "test") if any(k not in p for p in points)]
    if missing:
        raise ValueError(f"{path}: points without {', '.join(missing)}")
    return sorted(points, key=lambda p: p["t"])


def plot_greedy(curves: list[tuple[str, list[dict]]], target: float) -> Figure:
    """Greedy success of each labelled run against wall time, env steps and updates: general/train solid,
    general/test (held out) dashed."""
    fig = Figure(figsize=(8, 10))
    axes = fig.subplots(len(AXES), 1)
    for ax, (key, words) in zip(axes, AXES, strict=True):
        for i, (label, points) in enumerate(curves):
            x = [p[key] for p in points]
            ax.plot(x, [p["train"] for p in points], color=f"C{i}", marker="o", label=f"{label} train")
            ax.plot(
                x,
                [p["test"] for p in points],
                color=f"C{i}",
                linestyle="--",
                marker="x",
                label=f"{label} test",
            )
        ax.axhline(target, color="gray", linestyle=":", linewidth=1)
        ax.set(xlabel=words, ylabel="greedy success", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    axes[0].set_title("Greedy success of wall-clock snapshots (solid: train split, dashed: test split)")
    axes[0].legend(fontsize=7, ncol=2)
    return fig
