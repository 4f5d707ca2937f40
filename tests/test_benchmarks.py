"""Benchmarks stay runnable: the quick wire benchmark runs and writes the JSON fields BENCHMARKS.md uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.fake_adbd import find_adb

BENCH_S = 900
"""A quick benchmark takes a minute or two on an idle machine; several times that on a busy one."""
pytestmark = pytest.mark.timeout(BENCH_S + 60)


def test_wire_benchmark_writes_json(tmp_path):
    out = tmp_path / "wire.json"
    cmd = [sys.executable, "-m", "benchmarks", "wire", "--quick", "--json", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BENCH_S)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "wire"
    payloads = {row["payload"]: row for row in report["rows"]}
    assert set(payloads) == {"traj_batch", "traj_batch_full", "params_snapshot"}
    for row in payloads.values():
        assert row["bytes"] > 0
        for key in ("encode_gbps", "decode_gbps", "memcpy_gbps"):
            assert row[key] > 0, (key, row)


@pytest.mark.long
def test_train_scaling_quick_has_1_and_8_devices(tmp_path):
    out = tmp_path / "train_scaling.json"
    cmd = [sys.executable, "-m", "benchmarks", "train_scaling", "--quick", "--json", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # forced host devices, whatever accelerator is present
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BENCH_S)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "train_scaling"
    rows = report["rows"]
    assert {row["devices"] for row in rows} == {1, 8}
    for row in rows:
        for key in ("ms_per_step", "traj_per_s", "env_steps_per_s", "gflop_per_step", "utilization"):
            assert row[key] > 0, (key, row)
        assert row["loss_finite"], row
    (single,) = [row for row in rows if row["devices"] == 1]
    eight = [row for row in rows if row["devices"] == 8]
    assert {(row["mesh"], row["param_sharding"]) for row in eight} == {("8x1", "replicated"), ("4x2", "fsdp")}
    # The same global batch: total FLOPs per step barely depend on the layout (replicated work is counted
    # once per device). A per-device count taken as the total would be 8x too small.
    for row in eight:
        assert 0.7 < row["gflop_per_step"] / single["gflop_per_step"] < 1.5, (row, single)


def test_adb_step_benchmark_compares_with_stock_adbutils(tmp_path):
    out = tmp_path / "adb_step.json"
    cmd = [sys.executable, "-m", "benchmarks", "adb_step", "--quick", "--json", str(out)]
    env = {**os.environ, "ADBUTILS_ADB_PATH": "/bin/false"}
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BENCH_S, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    names = ["command", "observation", "env step", "env step"]
    # The same rows through the real adb server and a fake adbd, where adb is installed (else a note).
    via_adb = [f"{name} via adb" for name in names] if find_adb() else []
    assert [r["row"] for r in rows] == names + via_adb
    assert bool(via_adb) != ("rows are skipped" in result.stdout)
    for row in rows[:2] + rows[4:6]:
        assert row["stock_ms"] > 0 and row["ours_ms"] > 0 and row["connections_ours"] == 1
        assert abs(row["speedup"] - row["stock_ms"] / row["ours_ms"]) < 0.05 * row["speedup"]  # rounding
    assert all(r["ours_ms"] > 0 for r in rows)
    for fake, real in zip(rows, rows[4:], strict=False):
        assert real["fake_server_ms"] == fake["ours_ms"]
        assert abs(real["overhead_ms"] - (real["ours_ms"] - fake["ours_ms"])) < 0.01


def test_learner_args_reach_only_benchmarks_that_take_them():
    cmd = [sys.executable, "-m", "benchmarks", "wire", "--quick", "--learner-args=--max-policy-lag 5"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "wire takes no --learner-args" in done.stderr


def test_emit_prints_a_table_per_kind_of_row(tmp_path, capsys):
    """Consecutive rows with the same fields share a table; the JSON keeps every row, in order."""
    from benchmarks.report import emit

    rows = [{"path": "act", "ms": 1.5}, {"path": "act", "ms": 2.5}, {"path": "update", "gflop": 3.0}]
    out = tmp_path / "r.json"
    emit("kinds", rows, str(out), {"headline": 1.0})
    printed = capsys.readouterr().out
    assert printed.count("┏") == 2 and "headline 1" in printed  # two tables: act's, update's
    assert "gflop" not in printed.split("┏")[1]  # the act table has no column of the update row
    assert json.loads(out.read_text())["rows"] == rows


def test_the_gpu_benchmark_knows_its_peaks():
    from benchmarks.gpu import peak_tflops

    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("cpu") is None  # no MFU where the peak is not known


@pytest.mark.long
def test_gpu_benchmark_dry_run_measures_the_train_step_and_runs_the_recipe(tmp_path):
    """`python -m benchmarks gpu --dry-run` (issue 47, item 4): every part at tiny sizes on CPU, so the
    script a GPU machine runs is known to work: the train step's four rows (bfloat16 and float32, LoRA and
    full fine-tuning) with their throughput, and the lm recipe with 2 local actors whose checkpoint the
    greedy evaluation scored."""
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "-m", "benchmarks", "gpu", "--dry-run", "--json", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BENCH_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = json.loads(out.read_text())["rows"]
    steps = [r for r in rows if r["kind"] == "train step"]
    assert {(r["dtype"], r["lora_rank"]) for r in steps} == {
        (d, r) for d in ("bfloat16", "float32") for r in (8, 0)
    }
    assert all(r["tokens_per_s"] > 0 and r["xla_tflops"] > 0 and r["mfu"] is None for r in steps), steps
    run = next(r for r in rows if r["kind"] == "recipe run")
    assert run["actors"] == 2 and run["updates"] == 3 and run["eval_episodes"] == 8, run
    assert 0.0 <= run["greedy_train_success"] <= 1.0
