"""The held-back demonstrations' curves of `python -m learner report`: the imitation validation loss, rho
on demonstration steps and the critic's value gap (`validation/*` in metrics.jsonl, learner/warmup.py),
against wall time, with each run's switch from the warm-up to reinforcement learning marked. They show
what a warm start taught and whether reinforcement learning keeps it, where the training success rate of
a few sampled episodes cannot."""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure

PANELS = (
    ("nll", "validation loss (nats per action)"),
    ("rho", "rho on demonstration steps"),
    ("value_gap", "value gap G - V"),
)


def validation_points(lines: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One point per validation of a run's metrics lines, at the wall time of the first line that holds
    it: {"wall", "update", "nll", "rho", "value_gap"}; [] if the run never validated."""
    points: list[dict[str, float]] = []
    for line in lines:
        update = line.get("validation/update")
        if not isinstance(update, (int, float)) or (points and points[-1]["update"] == update):
            continue
        values = [line.get(f"validation/{key}") for key, _ in PANELS]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            continue
        points.append({"wall": float(line["wall"]), "update": float(update)})
        points[-1].update({key: float(v) for (key, _), v in zip(PANELS, values, strict=True)})
    return points


def warmup_end(lines: list[dict[str, Any]]) -> float | None:
    """Wall time of a run's first reinforcement-learning line after a warm-up line, or None."""
    warmed = False
    for line in lines:
        warmed = warmed or line.get("phase") == "warmup"
        if warmed and line.get("phase") == "rl":
            return float(line["wall"])
    return None


def plot_validation(curves: list[tuple[str, list[dict[str, float]], float | None]]) -> Figure:
    """Each labelled run's validation points (and its warm-up's end, dotted) on three panels."""
    fig = Figure(figsize=(8, 10))
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    for ax, (key, words) in zip(axes, PANELS, strict=True):
        for i, (label, points, end) in enumerate(curves):
            ax.plot(
                [p["wall"] for p in points], [p[key] for p in points], color=f"C{i}", marker="o", label=label
            )
            if end is not None:
                ax.axvline(end, color=f"C{i}", linestyle=":", linewidth=1)
        ax.set(ylabel=words)
        ax.grid(alpha=0.3)
    axes[-1].set(xlabel="wall-clock seconds since learner start")
    axes[0].set_title("Held-back demonstrations (dotted: the warm-up's end)")
    axes[0].legend(fontsize=7)
    return fig
