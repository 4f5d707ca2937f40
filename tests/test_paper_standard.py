"""`python -m benchmarks paper --standard` without running it (it takes two hours): the recipe's size and its
own estimate, the progress lines, the figures drawn from the right series, and the whole pipeline (runs,
resume, verdicts, results file, figures) on a fake learner and evaluator at a tiny size."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tyro

from benchmarks.paper import benchmark
from benchmarks.paper.figure import draw, plot_success
from benchmarks.paper.plan import CELLS, QUICK, STANDARD, learner_command, plain_run
from benchmarks.paper.progress import (
    ASSUMED,
    Progress,
    estimate_s,
    estimate_words,
    remaining_s,
    run_estimate_s,
)
from benchmarks.paper.results import published_paths
from learner.config import LearnerConfig
from tests.conftest import ROOT


def test_the_standard_recipe_is_the_issue_48_size():
    assert STANDARD.cells == tuple(CELLS) and len(STANDARD.cells) == 6
    assert STANDARD.seeds == (0, 1, 2) and STANDARD.envs == (16,) and STANDARD.runs == 18
    assert STANDARD.time_scale == 0.25 and STANDARD.eval_episodes == 100
    assert STANDARD.seconds % STANDARD.snapshot_every == 0 and STANDARD.snapshots >= 5
    assert STANDARD.target == 0.5


def test_the_standard_estimate_is_under_150_minutes_by_its_own_arithmetic():
    # 360 s + 25 s + 9 snapshots x 2 splits x 100 episodes x 0.025 s = 430 s a run; 18 runs + 60 s
    assert run_estimate_s(STANDARD) == pytest.approx(430.0)
    assert estimate_s(STANDARD) == pytest.approx(18 * 430 + 60) and estimate_s(STANDARD) < 150 * 60
    slow_eval = dataclasses.replace(ASSUMED, eval_episode_s=0.05)
    assert estimate_s(STANDARD, costs=slow_eval) < 150 * 60  # evaluation twice as slow still fits
    assert estimate_s(STANDARD, done=6) == pytest.approx(12 * 430 + 60)  # kept runs are not counted again
    words = estimate_words(STANDARD, done=6)
    assert f"estimate {(12 * 430 + 60) / 60:.1f} min = 12 x (360 s + 25 s + 1800 evaluation episodes" in words
    assert "6 kept" in words


def test_the_time_left_uses_the_measured_runs_once_there_are_some():
    assert remaining_s([], left=2, recipe=STANDARD) == pytest.approx(2 * 430 + 60)
    assert remaining_s([400.0, 500.0], left=2, recipe=STANDARD) == pytest.approx(2 * 450 + 60)
    now = iter([0.0, 600.0, 1200.0])
    progress = Progress(STANDARD, clock=lambda: next(now))
    progress.started = progress.clock()
    progress.finished({"duration_s": 500.0})
    line = progress.finished({})  # a kept run without a recorded duration: counted, not measured
    assert line.startswith("paper: 2/18 runs done, 20.0 min elapsed")
    assert f"about {(16 * 500 + 60) / 60:.1f} min left (1 runs measured)" in line


@pytest.mark.parametrize("cell", list(CELLS))
def test_every_standard_cell_command_parses(tmp_path, cell):
    cmd = learner_command(STANDARD, plain_run(STANDARD, cell, 16, 2), tmp_path)
    cfg = tyro.cli(LearnerConfig, args=cmd[3:])
    assert cfg.time_limit == 363 and cfg.snapshot_every == 40 and cfg.seed == 2
    assert cfg.emulator.time_scale == 0.25 and cfg.imitation.warmup_updates == 30


def test_only_the_standard_size_with_default_flags_publishes_to_the_committed_places(tmp_path):
    assert published_paths(STANDARD, tmp_path, ()) == (
        ROOT / "benchmarks" / "results" / "paper-standard.json",
        ROOT / "docs" / "paper-standard",
    )
    assert published_paths(STANDARD, tmp_path, ("--replay", "uniform"))[0].parent == tmp_path
    assert published_paths(QUICK, tmp_path, ()) == (tmp_path / "paper-quick.json", tmp_path / "figures")


def test_quick_and_standard_together_is_refused_and_other_benchmarks_refuse_standard():
    with pytest.raises(SystemExit, match="two sizes"):
        benchmark.run(quick=True, standard=True)
    cmd = [sys.executable, "-m", "benchmarks", "wire", "--standard"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "wire takes no --standard" in done.stderr


def _snapshots(train: list[float], test: list[float], steps_per_s: float, every: int = 25) -> list[dict]:
    """One point per grid time, its wall 2 s late and its env steps from the rate."""
    return [
        {"t": every * (i + 1), "wall": every * (i + 1) + 2.0, "update": 5 * (i + 1), "episodes": 10 * (i + 1),
         "env_steps": steps_per_s * every * (i + 1), "train": a, "test": b}
        for i, (a, b) in enumerate(zip(train, test, strict=True))
    ]  # fmt: skip


def _results(runs: list[dict]) -> dict:
    return {"recipe": {"seconds": 100, "snapshot_every": 25, "target": 0.5}, "runs": runs}


def _run(cell: str, seed: int, rate: float, train: list[float], test: list[float]) -> dict:
    return {"cell": cell, "seed": seed, "base_envs": 16, "env_steps_per_s": rate,
            "snapshots": _snapshots(train, test, rate)}  # fmt: skip


def test_the_figures_draw_each_seed_and_the_mean_from_the_right_series(tmp_path):
    runs = [
        _run("sync", 0, 10.0, [0.1, 0.2, 0.3, 0.4], [0.0, 0.1, 0.1, 0.2]),
        _run("sync", 1, 12.0, [0.1, 0.3, 0.3, 0.5], [0.1, 0.1, 0.2, 0.3]),
        _run("async", 0, 40.0, [0.3, 0.5, 0.7, 0.8], [0.2, 0.4, 0.5, 0.6]),
        _run("async", 1, 44.0, [0.2, 0.6, 0.6, 0.9], [0.2, 0.3, 0.6, 0.7]),
        _run("async_throttled", 0, 11.0, [0.1, 0.2, 0.2, 0.3], [0.1, 0.1, 0.1, 0.2]),
    ]
    drawn = draw(_results(runs), tmp_path / "fig")["N16"]
    assert all(Path(f).stat().st_size > 1000 for f in drawn["files"])
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [
        "collection_N16.png",
        "greedy_success_N16.png",
    ]
    test_wall = drawn["success"]["test"]["wall"]
    assert set(test_wall) == {"sync", "async"}  # the controls are not success curves
    assert test_wall["async"]["seeds"][1] == ([27.0, 52.0, 77.0, 102.0], [0.2, 0.3, 0.6, 0.7])  # wall, test
    assert test_wall["async"]["mean"][0] == [25.0, 50.0, 75.0, 100.0]  # the grid
    assert np.allclose(test_wall["async"]["mean"][1], [0.2, 0.35, 0.55, 0.65])
    train_steps = drawn["success"]["train"]["env_steps"]["sync"]
    assert train_steps["seeds"][0] == ([250.0, 500.0, 750.0, 1000.0], [0.1, 0.2, 0.3, 0.4])
    assert np.allclose(train_steps["mean"][0], [275.0, 550.0, 825.0, 1100.0])  # mean of 10 and 12 steps/s
    assert np.allclose(train_steps["mean"][1], [0.1, 0.25, 0.3, 0.45])
    assert drawn["collection"] == {
        "sync": {0: 10.0, 1: 12.0},
        "async": {0: 40.0, 1: 44.0},
        "async_throttled": {0: 11.0},
    }
    fig = plot_success(drawn["success"], 0.5, 16)  # what lands on the axes is those series
    test_wall_axis = fig.axes[2]  # row test, column wall time
    first = test_wall_axis.lines[0]
    assert list(first.get_xdata()) == [27.0, 52.0, 77.0, 102.0] and list(first.get_ydata()) == [
        0.0,
        0.1,
        0.1,
        0.2,
    ]


def test_a_snapshot_skipped_during_the_compile_takes_the_next_one_in_the_mean(tmp_path):
    skipped = _run("async", 0, 40.0, [0.3, 0.5, 0.7, 0.8], [0.2, 0.4, 0.5, 0.6])
    skipped["snapshots"] = skipped["snapshots"][1:]  # no t = 25
    full = _run("async", 1, 40.0, [0.1, 0.5, 0.7, 0.8], [0.2, 0.4, 0.5, 0.6])
    mean = draw(_results([skipped, full]), tmp_path)["N16"]["success"]["train"]["wall"]["async"]["mean"]
    assert np.allclose(mean[1], [(0.5 + 0.1) / 2, 0.5, 0.7, 0.8])


TINY = dataclasses.replace(QUICK, name="tiny", seeds=(0, 1), cells=tuple(CELLS), eval_episodes=10, target=0.5)
RATE = {"sync": 10.0, "async": 40.0, "async_throttled": 12.0, "sync_matched": 30.0, "async_uniform": 38.0,
        "async_no_correction": 39.0}  # fmt: skip
TRAIN = {"sync": [0.1, 0.2, 0.3, 0.35], "async": [0.2, 0.4, 0.6, 0.7]}


class FakeRuns:
    """The learner and the evaluator of benchmark.py, replaced: metrics at the cell's rate, a greedy curve per
    cell (async's reaches 0.5 at 75 s, sync's never), and a count of the runs trained."""

    def __init__(self):
        self.trained = 0

    def learner(self, cmd: list[str], run_dir: Path, timeout: float, pinned: bool) -> list[dict]:
        self.trained += 1
        rate = RATE[run_dir.parent.name]
        return [{"wall": 1.0 + t, "env_steps": rate * t, "episodes": t, "update": 2 * t} for t in range(10)]

    def evaluate(self, recipe, run_dir: Path) -> list[dict]:
        train = TRAIN.get(run_dir.parent.name, TRAIN["async"])
        points = [{**p, "phase": "rl"} for p in _snapshots(train, [x / 2 for x in train], 10.0)]
        (run_dir / "greedy.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
        return points


def test_the_pipeline_judges_publishes_and_resumes_on_fake_runs(tmp_path, monkeypatch, capsys):
    fake = FakeRuns()
    monkeypatch.setattr(benchmark, "run_learner", fake.learner)
    monkeypatch.setattr(benchmark, "evaluate_snapshots", fake.evaluate)
    monkeypatch.setattr(benchmark, "_plots", lambda *a: None)  # `learner report` subprocesses
    monkeypatch.setattr(benchmark.pinning, "available", lambda: False)
    rows, summary = benchmark.experiment(TINY, out=tmp_path)
    printed = capsys.readouterr().out
    assert fake.trained == 12 and len(rows) == 12
    assert "paper: tiny: 12 runs, 0 kept from earlier sittings; estimate" in printed
    assert "paper: 12/12 runs done" in printed and "(12 runs measured)" in printed
    doc = json.loads((tmp_path / "paper-tiny.json").read_text())
    assert len(doc["runs"]) == 12 and {r["cell"] for r in doc["runs"]} == set(CELLS)
    assert doc["recipe"]["grid"] == [25, 50, 75, 100] and doc["recipe"]["target"] == 0.5
    first = doc["runs"][0]
    assert first["key"] == "N16/sync/s0" and [p["train"] for p in first["snapshots"]] == TRAIN["sync"]
    assert {"env_steps_per_s", "updates", "envs", "seed", "duration_s"} <= set(first)
    assert set(first["snapshots"][0]) == {"t", "wall", "update", "episodes", "env_steps", "train", "test"}
    claims = doc["claims"]["N16"]
    assert claims["collection"]["verdict"] == "holds" and claims["collection"]["min"] == 4.0
    # async at 75 s, sync censored at 100 s: a lower bound of 1.33 that cannot settle 2.25
    assert claims["training_efficiency"]["per_seed"]["0"] == {
        "low": 1.3333,
        "high": None,
        "kind": "lower bound",
    }
    assert claims["training_efficiency"]["verdict"] == "not measurable"
    assert doc["ablations"]["N16"]["replay"]["decision"] == "keep prioritized replay"
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "collection_N16.png",
        "greedy_success_N16.png",
    ]
    markdown = (tmp_path / "summary.md").read_text()
    assert "Verdicts by the rules fixed before the run" in markdown
    assert (
        "| training_efficiency | s0: 1.3333 to inf (lower bound); s1: 1.3333 to inf (lower bound) |"
        in markdown
    )
    assert summary["verdicts_by_rule"]["N16"]["claims"] == claims

    benchmark.experiment(TINY, out=tmp_path)  # a second sitting trains nothing
    printed = capsys.readouterr().out
    assert fake.trained == 12 and "12 runs, 12 kept from earlier sittings; estimate 1.0 min" in printed
