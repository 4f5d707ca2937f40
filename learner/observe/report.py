"""`python -m learner report RUN_DIR [RUN_DIR ...]`: plots and a markdown summary of finished (or running)
training runs from their `metrics.jsonl`, several runs on the same axes, e.g. async against sync.

Everything is measured from the learner's own lines, from learner start (start-up and compilation
included), so runs are compared by what a user waits for. A run dir reused by several learner processes
holds several runs (one `run_id` each, or a `wall` that starts again): only the last one is reported,
since counters such as `env_steps` and `wall` restart with each process.

The plots are drawn on `matplotlib.figure.Figure` objects, which render with Agg without pyplot: no
display, no global backend switch for whoever imports this module.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import tyro
from matplotlib.figure import Figure

from learner.observe.report_greedy import plot_greedy, read_points
from learner.observe.report_validation import plot_validation, validation_points, warmup_end

REQUIRED = ("wall", "update", "env_steps", "episodes", "success_rate")
"""Fields a line needs to be used; a line without them is counted as corrupt."""


@dataclass
class ReportConfig:
    """Plot and summarize training runs from RUN_DIR/metrics.jsonl (several runs are compared)."""

    runs: Annotated[tuple[Path, ...], tyro.conf.Positional]
    """Run dirs (the learner's --run-dir), one or more."""
    out: Path | None = None
    """Where to write the PNGs and summary.md; default FIRST_RUN_DIR/report."""
    labels: tuple[str, ...] = ()
    """A name per run for legends and tables; default "MODE DIRNAME" (mode from RUN_DIR/config.json)."""
    target: float = 0.5
    """Success rate whose first crossing gives "time to target"."""
    min_episodes: int = 100
    """Lines with fewer finished episodes do not count for "time to target": success_rate is a mean over
    the last 100 episodes, and a handful of lucky early episodes would cross any target."""


@dataclass
class Run:
    """The last run in one run dir: its valid lines in order, and what was skipped on the way."""

    path: Path
    label: str
    mode: str
    lines: list[dict[str, Any]]
    corrupt: int = 0
    earlier_runs: int = 0
    notes: list[str] = field(default_factory=list)

    def column(self, key: str) -> np.ndarray:
        """One field over the lines as floats (NaN where missing or null)."""
        return np.array([_float(line.get(key)) for line in self.lines], dtype=float)


def report(cfg: ReportConfig) -> dict[str, Any]:
    """Write the plots and summary.md; return the output dir, the files written and each run's stats."""
    if not cfg.runs:
        raise SystemExit("report: give at least one run dir")
    if cfg.labels and len(cfg.labels) != len(cfg.runs):
        raise SystemExit(f"report: --labels has {len(cfg.labels)} names for {len(cfg.runs)} run dirs")
    if not 0 <= cfg.target <= 1:
        raise SystemExit(f"report: --target is a success rate in [0, 1], got {cfg.target}")
    runs, problems = [], []
    for i, path in enumerate(cfg.runs):
        try:
            runs.append(load_run(path, cfg.labels[i] if cfg.labels else None))
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise SystemExit("report: cannot report on:\n  " + "\n  ".join(problems))

    out = cfg.out if cfg.out is not None else cfg.runs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    stats = [summarize(run, cfg.target, cfg.min_episodes) for run in runs]
    files = [
        _save(
            plot_success(runs, "wall", "wall-clock seconds since learner start", cfg.target),
            out / "success_vs_time.png",
        ),
        _save(plot_success(runs, "env_steps", "environment steps", cfg.target), out / "success_vs_steps.png"),
        _save(plot_throughput(runs), out / "throughput.png"),
        _save(plot_policy_lag(runs), out / "policy_lag.png"),
    ]
    if len(runs) > 1:
        files.append(_save(plot_comparison(stats, cfg.target), out / "comparison.png"))
    try:
        greedy = [(run.label, read_points(run.path)) for run in runs]
    except ValueError as e:
        raise SystemExit(f"report: {e}") from None
    if any(points for _, points in greedy):
        files.append(_save(plot_greedy([g for g in greedy if g[1]], cfg.target), out / "greedy_success.png"))
    validated = [(s["label"], s["validation"], s["warmup_end_s"]) for s in stats if s["validation"]]
    if validated:
        files.append(_save(plot_validation(validated), out / "validation.png"))
    summary = out / "summary.md"
    summary.write_text(summary_markdown(stats, cfg.target, [f.name for f in files]), encoding="utf-8")
    files.append(summary)

    for s in stats:
        for note in s["notes"]:
            print(f"report: {s['label']}: {note}")
    print(f"report: wrote {len(files)} files to {out}: " + ", ".join(f.name for f in files))
    return {"out": out, "files": files, "runs": stats}


def load_run(path: Path, label: str | None = None) -> Run:
    """Read RUN_DIR/metrics.jsonl and RUN_DIR/config.json; ValueError with a plain reason if unusable."""
    if not path.is_dir():
        raise ValueError(f"{path}: no such run directory")
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{path}: no metrics.jsonl (is this a learner --run-dir?)")
    text = metrics.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"{metrics}: empty (the learner writes its first line after --log-every seconds)")

    segments: list[list[dict[str, Any]]] = []
    corrupt = 0
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            corrupt += 1
            continue
        if not isinstance(line, dict) or not all(math.isfinite(_float(line.get(k))) for k in REQUIRED):
            corrupt += 1
            continue
        if not segments or _starts_new_run(segments[-1][-1], line):
            segments.append([])
        segments[-1].append(line)
    if not segments:
        raise ValueError(f"{metrics}: no valid line ({corrupt} corrupt)")

    lines = segments[-1]
    if not any(line["env_steps"] > 0 or line["update"] > lines[0]["update"] for line in lines):
        raise ValueError(
            f"{metrics}: only start-up lines ({len(lines)}, {lines[-1]['wall']:.0f} s): "
            "no environment step and no update recorded"
        )
    mode = read_mode(path)
    run = Run(path, label or f"{mode} {path.resolve().name}", mode, lines, corrupt, len(segments) - 1)
    if corrupt:
        run.notes.append(f"skipped {corrupt} corrupt line(s) in {metrics}")
    if run.earlier_runs:
        run.notes.append(
            f"reporting the last of {len(segments)} runs in {metrics} (run_id {lines[0].get('run_id', '?')})"
        )
    if all(line.get("phase") == "warmup" for line in lines):
        run.notes.append("only warm-up (behavior cloning) lines: no reinforcement-learning phase yet")
    return run


def read_mode(path: Path) -> str:
    """ "async" or "sync" from RUN_DIR/config.json's "mode"; "async" without the file or the key (runs made
    before the file existed were all asynchronous). Nothing else in the file is relied on."""
    config = path / "config.json"
    if not config.is_file():
        return "async"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        # Guessing would mislabel a sync run as async in a comparison: refuse instead.
        raise ValueError(f"{config}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{config}: expected a JSON object")
    return str(data.get("mode") or "async")


def summarize(run: Run, target: float, min_episodes: int = 100) -> dict[str, Any]:
    """The numbers of one run's table. Rates are averages from learner start to its last line."""
    first, last = run.lines[0], run.lines[-1]
    wall = float(last["wall"])
    reached = next(
        (line for line in run.lines if line["success_rate"] >= target and line["episodes"] >= min_episodes),
        None,
    )
    # Lag is only meaningful on lines after a reinforcement-learning update (warm-up updates use demos).
    rl = [line for line in run.lines if line.get("phase", "rl") == "rl" and line["update"] > 0]
    lag_mean = [_float(line.get("policy_lag_mean")) for line in rl]
    lag_mean = [x for x in lag_mean if math.isfinite(x)]
    lag_max = [_float(line.get("policy_lag_max")) for line in rl]
    lag_max = [x for x in lag_max if math.isfinite(x)]
    return {
        "label": run.label,
        "path": str(run.path),
        "mode": run.mode,
        "run_id": last.get("run_id"),
        "lines": len(run.lines),
        "corrupt": run.corrupt,
        "earlier_runs": run.earlier_runs,
        "notes": list(run.notes),
        "wall_s": wall,
        "updates": int(last["update"]),
        "episodes": int(last["episodes"]),
        "env_steps": int(last["env_steps"]),
        "env_steps_per_s": last["env_steps"] / wall if wall > 0 else math.nan,
        "updates_per_s": (last["update"] - first["update"]) / wall if wall > 0 else math.nan,
        "final_success": float(last["success_rate"]),
        "best_success": max(float(line["success_rate"]) for line in run.lines),
        "time_to_target_s": float(reached["wall"]) if reached else None,
        "steps_to_target": int(reached["env_steps"]) if reached else None,
        "policy_lag_mean": float(np.mean(lag_mean)) if lag_mean else None,
        "policy_lag_max": max(lag_max) if lag_max else None,
        "rejected": _count(last.get("rejected")),
        "dropped_episodes": _count(last.get("dropped_episodes")),
        "warmup_end_s": warmup_end(run.lines),
        "validation": validation_points(run.lines),
        "stopped": last.get("stopped") or "not recorded (still running, or killed)",
    }


def summary_markdown(stats: list[dict[str, Any]], target: float, images: list[str]) -> str:
    """summary.md: a table per run, the ratios of every later run against the first, the plots."""
    out = ["# Training run report", ""]
    out.append(
        f"Rates are averages from learner start (start-up and compilation included) to the last line; "
        f"time to target is the first line with success rate >= {target:g} (a mean over the last 100 "
        "training episodes)."
    )
    for s in stats:
        out += [
            "",
            f"## {s['label']}",
            "",
            f"`{s['path']}`: mode {s['mode']}, run_id {s['run_id']}, {s['lines']} lines",
        ]
        out += ["", "| metric | value |", "|---|---|"]
        rows = [
            ("wall time", f"{s['wall_s']:.1f} s"),
            ("updates", f"{s['updates']:,}"),
            ("episodes", f"{s['episodes']:,}"),
            ("env steps", f"{s['env_steps']:,}"),
            ("env steps/s", f"{s['env_steps_per_s']:.1f}"),
            ("updates/s", f"{s['updates_per_s']:.2f}"),
            ("final success rate", f"{s['final_success']:.3f}"),
            ("best success rate", f"{s['best_success']:.3f}"),
            (f"time to {target:g} success", _time_to_target(s)),
            ("mean policy lag", _lag(s)),
            ("rejected messages", f"{s['rejected']:,}"),
            ("dropped episodes", f"{s['dropped_episodes']:,}"),
            ("stopped", str(s["stopped"])),
        ]
        if s["warmup_end_s"] is not None:
            rows.insert(1, ("warm-up ended at", f"{s['warmup_end_s']:.1f} s"))
        if s["validation"]:
            rows.insert(2, ("validation loss (first, lowest, last)", _validation(s["validation"])))
        out += [f"| {name} | {value} |" for name, value in rows]
        if s["notes"]:
            out += ["", *(f"- note: {note}" for note in s["notes"])]
    if len(stats) > 1:
        out += ["", "## Comparison", ""]
        base = stats[0]
        for other in stats[1:]:
            out.append(f"- {base['label']} vs {other['label']}: " + "; ".join(_ratios(base, other, target)))
    out += ["", "## Plots", ""]
    out += [f"![{name.removesuffix('.png').replace('_', ' ')}]({name})" for name in images]
    return "\n".join(out) + "\n"


def _validation(points: list[dict[str, float]]) -> str:
    first, last = points[0], points[-1]
    lowest = min(points, key=lambda p: p["nll"])
    return ", ".join(f"{p['nll']:.3f} (update {p['update']:.0f})" for p in (first, lowest, last))


def _ratios(a: dict[str, Any], b: dict[str, Any], target: float) -> list[str]:
    """a's numbers over b's, with both values, so "2.00x" cannot be read the wrong way round."""
    steps = _ratio(a["env_steps_per_s"], b["env_steps_per_s"])
    parts = [f"env steps/s ratio {steps} ({a['env_steps_per_s']:.1f} vs {b['env_steps_per_s']:.1f})"]
    ta, tb = a["time_to_target_s"], b["time_to_target_s"]
    if ta is not None and tb is not None:
        parts.append(f"time-to-{target:g} ratio {_ratio(ta, tb)} ({ta:.1f} s vs {tb:.1f} s)")
    else:
        parts.append(f"time-to-{target:g} ratio n/a ({_seconds_or_not(ta)} vs {_seconds_or_not(tb)})")
    return parts


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and math.isfinite(a) and math.isfinite(b) else "n/a"


def _seconds_or_not(t: float | None) -> str:
    return "not reached" if t is None else f"{t:.1f} s"


def _time_to_target(s: dict[str, Any]) -> str:
    if s["time_to_target_s"] is None:
        return "not reached"
    return f"{s['time_to_target_s']:.1f} s ({s['steps_to_target']:,} env steps)"


def _lag(s: dict[str, Any]) -> str:
    if s["policy_lag_mean"] is None:
        return "n/a (no RL update)"
    return f"{s['policy_lag_mean']:.2f} (max {s['policy_lag_max']:.0f})"


def plot_success(runs: list[Run], x_key: str, x_label: str, target: float) -> Figure:
    """Training success rate of every run against `x_key`; dotted verticals where a warm-up ended."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for i, run in enumerate(runs):
        x = run.column(x_key)
        ax.plot(x, run.column("success_rate"), color=f"C{i}", label=run.label)
        phases = [line.get("phase") for line in run.lines]
        if "warmup" in phases and "rl" in phases:
            ax.axvline(x[phases.index("rl")], color=f"C{i}", linestyle=":", linewidth=1)
    ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set(xlabel=x_label, ylabel="success rate (last 100 episodes)", ylim=(-0.02, 1.02))
    ax.set_title("Training success rate (dotted: end of warm-up)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def plot_throughput(runs: list[Run]) -> Figure:
    """Environment steps/s and updates/s between consecutive lines (faint), and a 5-line moving average."""
    fig = Figure(figsize=(8, 7))
    axes = fig.subplots(2, 1, sharex=True)
    for i, run in enumerate(runs):
        wall = run.column("wall")
        for ax, key in zip(axes, ("env_steps", "update"), strict=True):
            t, rate = _rates(wall, run.column(key))
            ax.plot(t, rate, color=f"C{i}", alpha=0.25, linewidth=1)
            ts, smooth = _moving_average(t, rate, 5)
            ax.plot(ts, smooth, color=f"C{i}", label=run.label)
    axes[0].set(ylabel="environment steps/s", title="Throughput (faint: per logging interval)")
    axes[1].set(ylabel="updates/s", xlabel="wall-clock seconds since learner start")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def plot_policy_lag(runs: list[Run]) -> Figure:
    """Histogram over lines after an RL update of policy_lag_mean (top) and policy_lag_max (bottom)."""
    fig = Figure(figsize=(8, 7))
    axes = fig.subplots(2, 1)
    for ax, key in zip(axes, ("policy_lag_mean", "policy_lag_max"), strict=True):
        values = [_lag_values(run, key) for run in runs]
        top = max((v.max() for v in values if v.size), default=0.0)
        bins = np.linspace(0, max(top, 1.0), 31)
        for i, (run, v) in enumerate(zip(runs, values, strict=True)):
            if v.size:
                # Fractions, not counts: runs of different lengths stay comparable.
                weights = np.full(v.size, 1 / v.size)
                ax.hist(
                    v,
                    bins=bins,
                    weights=weights,
                    color=f"C{i}",
                    alpha=0.5,
                    label=f"{run.label} ({v.size} lines)",
                )
        if not any(v.size for v in values):
            ax.text(0.5, 0.5, "no RL update recorded", transform=ax.transAxes, ha="center")
        else:
            ax.legend()
        ax.set(xlabel=f"{key} (policy versions)", ylabel="fraction of lines")
        ax.grid(alpha=0.3)
    axes[0].set_title("Policy lag per metrics line")
    return fig


def plot_comparison(stats: list[dict[str, Any]], target: float) -> Figure:
    """Bars: mean environment steps/s, and time to the target success rate ("not reached" written)."""
    fig = Figure(figsize=(max(8, 2.5 * len(stats)), 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    names = [s["label"] for s in stats]
    colors = [f"C{i}" for i in range(len(stats))]
    x = np.arange(len(stats))
    left.bar_label(left.bar(x, [s["env_steps_per_s"] for s in stats], color=colors), fmt="%.1f")
    left.set(ylabel="environment steps/s", title="Mean throughput")
    times = [s["time_to_target_s"] for s in stats]
    bars = right.bar(x, [t if t is not None else 0.0 for t in times], color=colors)
    right.bar_label(bars, labels=[f"{t:.1f} s" if t is not None else "" for t in times])
    for xi, t in zip(x, times, strict=True):
        if t is None:
            right.text(xi, 0, "not reached", ha="center", va="bottom", rotation=90)
    right.set(ylabel="seconds", title=f"Time to success rate {target:g}")
    for ax in (left, right):
        ax.set_xticks(x, names, rotation=15, ha="right")
        ax.grid(axis="y", alpha=0.3)
    return fig


def _rates(wall: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-interval rates, placed at each interval's end; intervals without elapsed time are skipped."""
    dt, dc = np.diff(wall), np.diff(counter)
    ok = dt > 0
    return wall[1:][ok], dc[ok] / dt[ok]


def _moving_average(t: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    k = max(1, min(k, y.size))
    if y.size == 0:
        return t, y
    return t[k - 1 :], np.convolve(y, np.ones(k) / k, mode="valid")


def _lag_values(run: Run, key: str) -> np.ndarray:
    values = [
        _float(line.get(key)) for line in run.lines if line.get("phase", "rl") == "rl" and line["update"] > 0
    ]
    return np.array([v for v in values if math.isfinite(v)], dtype=float)


def _starts_new_run(previous: dict[str, Any], line: dict[str, Any]) -> bool:
    """Another learner process appended to the file: a new run_id, or (lines without one) a wall clock
    that went back."""
    a, b = previous.get("run_id"), line.get("run_id")
    if a is not None and b is not None:
        return a != b
    return line["wall"] < previous["wall"]


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _count(value: Any) -> int:
    """A counter that older learners did not write (or wrote as null) counts as 0."""
    x = _float(value)
    return int(x) if math.isfinite(x) else 0


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
