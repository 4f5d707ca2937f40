"""`python -m learner report`: plots and summary.md from synthetic metrics.jsonl files whose numbers are
known by hand, the ratios of two runs, and clear failures on unusable run dirs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from learner.observe.report import ReportConfig, load_run, report
from tests.conftest import ROOT

PLOTS = ("success_vs_time.png", "success_vs_steps.png", "throughput.png", "policy_lag.png")


def line(wall: float, update: int, env_steps: int, episodes: int, success: float, **extra) -> dict:
    """A metrics.jsonl line with the fields the report reads (as learner/loop.py's record() writes them)."""
    return {
        "run_id": "r1",
        "wall": wall,
        "update": update,
        "phase": "rl",
        "env_steps": env_steps,
        "episodes": episodes,
        "success_rate": success,
        "success_by_task": {},
        "policy_version": update,
        "policy_lag_mean": 2.0 if update else 0.0,
        "policy_lag_max": 4 if update else 0,
        "actors": 1,
        "replay_size": 10,
        "rejected": 3,
        "dropped_episodes": 7,
        "time/ingest_s": wall / 2,
        **extra,
    }


def write_run(path: Path, lines: list, config: dict | None = None) -> Path:
    """Lines are dicts (written as JSON) or raw strings (written as they are, e.g. corrupt ones)."""
    path.mkdir(parents=True)
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    (path / "metrics.jsonl").write_text(text + "\n")
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def fast(tmp_path) -> Path:
    """Async (no config.json): 10 lines, 10 s apart; 50 env steps/s, 1.8 updates/s; success crosses 0.5
    at 60 s (3000 env steps); stopped by the time limit."""
    success = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    lines = [line(10.0 * k, 2 * (10 * k - 10), 500 * k, 100 * k, success[k - 1]) for k in range(1, 11)]
    lines[-1]["stopped"] = "time limit"
    return write_run(tmp_path / "fast", lines)


@pytest.fixture
def slow(tmp_path) -> Path:
    """Sync (config.json): 10 lines, 20 s apart; 25 env steps/s, 0.9 updates/s; success crosses 0.5 at
    120 s; two corrupt lines (one in the middle, one cut short at the end); no `stopped`."""
    success = [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.6, 0.7, 0.8, 0.8]
    lines: list = [
        line(20.0 * k, 20 * k - 20, 500 * k, 100 * k, success[k - 1], run_id="r2") for k in range(1, 11)
    ]
    lines.insert(4, "{not json")
    lines.append('{"wall": 210.0, "upda')
    return write_run(tmp_path / "slow", lines, config={"mode": "sync", "learning_rate": 1e-4})


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert path.stat().st_size > 5000, path
    image = imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_two_runs_plots_summary_and_ratios(fast, slow, tmp_path, capsys):
    out = tmp_path / "out"
    result = report(ReportConfig(runs=(fast, slow), out=out))

    for name in (*PLOTS, "comparison.png"):
        assert_png(out / name)
    assert {f.name for f in result["files"]} == {*PLOTS, "comparison.png", "summary.md"}
    printed = capsys.readouterr().out
    assert f"wrote 6 files to {out}" in printed
    assert "sync slow: skipped 2 corrupt line(s)" in printed

    a, b = result["runs"]
    assert (a["label"], b["label"]) == ("async fast", "sync slow")
    assert a["env_steps_per_s"] == pytest.approx(50.0) and b["env_steps_per_s"] == pytest.approx(25.0)
    assert a["updates_per_s"] == pytest.approx(1.8) and b["updates_per_s"] == pytest.approx(0.9)
    assert (a["time_to_target_s"], a["steps_to_target"]) == (60.0, 3000)
    assert b["time_to_target_s"] == 120.0
    assert (a["corrupt"], b["corrupt"]) == (0, 2)
    assert a["policy_lag_mean"] == pytest.approx(2.0) and a["policy_lag_max"] == 4

    summary = (out / "summary.md").read_text()
    for row in [
        "## async fast",
        "| wall time | 100.0 s |",
        "| updates | 180 |",
        "| episodes | 1,000 |",
        "| env steps | 5,000 |",
        "| env steps/s | 50.0 |",
        "| updates/s | 1.80 |",
        "| final success rate | 0.900 |",
        "| best success rate | 0.900 |",
        "| time to 0.5 success | 60.0 s (3,000 env steps) |",
        "| mean policy lag | 2.00 (max 4) |",
        "| rejected messages | 3 |",
        "| dropped episodes | 7 |",
        "| stopped | time limit |",
        "## sync slow",
        "| env steps/s | 25.0 |",
        "| updates/s | 0.90 |",
        "| time to 0.5 success | 120.0 s (3,000 env steps) |",
        "| stopped | not recorded (still running, or killed) |",
        "- note: skipped 2 corrupt line(s)",
        "- async fast vs sync slow: env steps/s ratio 2.00x (50.0 vs 25.0); "
        "time-to-0.5 ratio 0.50x (60.0 s vs 120.0 s)",
        "![success vs time](success_vs_time.png)",
        "![comparison](comparison.png)",
    ]:
        assert row in summary, row


def test_cli_single_run_default_out_and_labels(fast):
    result = subprocess.run(
        [sys.executable, "-m", "learner", "report", str(fast), "--labels", "mine", "--target", "0.95"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = fast / "report"
    assert f"wrote 5 files to {out}" in result.stdout
    for name in PLOTS:
        assert_png(out / name)
    assert not (out / "comparison.png").exists()
    summary = (out / "summary.md").read_text()
    assert "## mine" in summary and "| time to 0.95 success | not reached |" in summary
    assert "## Comparison" not in summary


def test_time_to_target_waits_for_enough_episodes(tmp_path):
    """A lucky first few episodes (success 1.0 over 3 episodes) do not count as reaching the target."""
    run = write_run(
        tmp_path / "run",
        [line(10.0, 0, 30, 3, 1.0), line(20.0, 5, 900, 90, 0.6), line(30.0, 10, 1500, 150, 0.6)],
    )
    stats = report(ReportConfig(runs=(run,), out=tmp_path / "out"))["runs"][0]
    assert (stats["time_to_target_s"], stats["steps_to_target"]) == (30.0, 1500)
    stats = report(ReportConfig(runs=(run,), out=tmp_path / "out", min_episodes=0))["runs"][0]
    assert stats["time_to_target_s"] == 10.0


def test_reused_run_dir_reports_the_last_run(tmp_path):
    first = [line(10.0, 0, 100, 10, 0.1), line(20.0, 4, 400, 40, 0.2)]
    second = [line(5.0, 4, 0, 0, 0.0, run_id="r2"), line(15.0, 9, 300, 30, 0.3, run_id="r2")]
    run = load_run(write_run(tmp_path / "run", first + second))
    assert [x["wall"] for x in run.lines] == [5.0, 15.0]
    assert run.earlier_runs == 1 and "last of 2 runs" in run.notes[0]
    # Without run_id, a wall clock going back separates the runs.
    bare = [{k: v for k, v in x.items() if k != "run_id"} for x in first + second]
    assert [x["wall"] for x in load_run(write_run(tmp_path / "bare", bare)).lines] == [5.0, 15.0]


def test_warmup_only_run_is_reported_with_a_note(tmp_path):
    run = write_run(tmp_path / "bc", [line(10.0 * k, 5 * k, 0, 0, 0.0, phase="warmup") for k in range(1, 4)])
    stats = report(ReportConfig(runs=(run,), out=tmp_path / "out"))["runs"][0]
    assert any("only warm-up" in note for note in stats["notes"])
    assert stats["policy_lag_mean"] is None
    assert "| mean policy lag | n/a (no RL update) |" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d, "no such run directory"),
        (lambda d: (d.mkdir(), d)[1], "no metrics.jsonl"),
        (lambda d: write_run(d, [""]), "empty"),
        (lambda d: write_run(d, ["{oops", "[1, 2]", '{"wall": 1}']), "no valid line (3 corrupt)"),
        (lambda d: write_run(d, [line(5.0, 0, 0, 0, 0.0), line(7.0, 0, 0, 0, 0.0)]), "only start-up lines"),
        (lambda d: _bad_config(write_run(d, [line(5.0, 1, 10, 1, 0.0)])), "config.json: not valid JSON"),
    ],
    ids=["missing-dir", "no-metrics", "empty", "all-corrupt", "start-up-only", "bad-config"],
)
def test_unusable_run_dirs_fail_clearly(tmp_path, make, message):
    run = make(tmp_path / "run")
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        report(ReportConfig(runs=(run,), out=tmp_path / "out"))
    assert str(tmp_path / "run") in str(e.value)
    assert not (tmp_path / "out").exists()


def test_every_bad_run_is_listed_and_labels_must_match(fast, tmp_path):
    with pytest.raises(SystemExit) as e:
        report(ReportConfig(runs=(tmp_path / "a", fast, tmp_path / "b"), out=tmp_path / "out"))
    assert f"{tmp_path / 'a'}: no such run directory" in str(e.value)
    assert f"{tmp_path / 'b'}: no such run directory" in str(e.value)
    with pytest.raises(SystemExit, match="--labels has 2 names for 1 run dirs"):
        report(ReportConfig(runs=(fast,), labels=("x", "y")))


def _bad_config(run: Path) -> Path:
    (run / "config.json").write_text("{mode: sync")
    return run


def test_greedy_curves_are_plotted_when_a_run_has_them(fast, slow, tmp_path):
    """A run dir with greedy.jsonl (benchmarks/paper/benchmark.py) gets greedy_success.png; one without does not
    stop the report; a corrupt one is a clear error."""
    points = [
        {"t": 25 * i, "update": 10 * i, "env_steps": 100 * i, "train": 0.1 * i, "test": 0.05 * i}
        for i in (1, 2)
    ]
    (fast / "greedy.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    got = report(ReportConfig(runs=(fast, slow), out=tmp_path / "out"))
    assert_png(tmp_path / "out" / "greedy_success.png")
    assert "greedy_success.png" in [f.name for f in got["files"]]
    (fast / "greedy.jsonl").write_text('{"t": 1}\n')
    with pytest.raises(SystemExit, match=r"greedy\.jsonl: points without"):
        report(ReportConfig(runs=(fast,), out=tmp_path / "out2"))


def test_validation_curves_and_numbers_come_from_the_validation_fields(fast, tmp_path):
    """A run whose lines carry `validation/*` (learner/warmup.py) gets validation.png and its first, lowest
    and last validation loss in summary.md, one point per validation however many lines repeat it; a run
    without them gets neither."""
    fit = {5: (5.6, 0.03, 0.9), 50: (2.3, 0.21, 0.0), 100: (1.9, 0.31, -0.3), 120: (2.1, 0.34, 0.0)}
    lines = []
    for k, update in enumerate((5, 5, 50, 100, 100, 100, 120)):
        nll, rho, gap = fit[update]
        phase = "warmup" if k < 5 else "rl"
        v = {
            "validation/nll": nll,
            "validation/rho": rho,
            "validation/value_gap": gap,
            "validation/update": update,
        }
        lines.append(line(10.0 * (k + 1), update + k, 10 * k, k, 0.0, phase=phase, **v))
    run = write_run(tmp_path / "warm", lines)
    got = report(ReportConfig(runs=(run, fast), out=tmp_path / "out"))
    assert [p["nll"] for p in got["runs"][0]["validation"]] == [5.6, 2.3, 1.9, 2.1]
    assert [p["wall"] for p in got["runs"][0]["validation"]] == [10.0, 30.0, 40.0, 70.0]
    assert got["runs"][0]["warmup_end_s"] == 60.0 and got["runs"][1]["validation"] == []
    assert_png(tmp_path / "out" / "validation.png")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert (
        "| validation loss (first, lowest, last) | 5.600 (update 5), 1.900 (update 100), 2.100 (update 120) |"
        in summary
    )
    assert summary.count("validation loss (first") == 1
    report(ReportConfig(runs=(fast,), out=tmp_path / "plain"))
    assert not (tmp_path / "plain" / "validation.png").exists()
