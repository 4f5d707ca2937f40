"""`python -m benchmarks paper`'s arithmetic on made-up runs, and the learner commands it builds (the runs
themselves take minutes to hours: they are a benchmark, not a test)."""

from __future__ import annotations

import shlex

import pytest
import tyro

from benchmarks.paper.eval import curve_summary, run_rates
from benchmarks.paper.plan import FULL, QUICK, learner_command, matched_run, plain_run, throttled_run
from benchmarks.paper.summary import compare, predicted_speedup, summarize, verdict
from learner.config import LearnerConfig


def _points(train: list[float], test: list[float], every: int = 25) -> list[dict]:
    return [
        {"t": every * (i + 1), "update": 10 * (i + 1), "env_steps": 100 * (i + 1), "train": a, "test": b}
        for i, (a, b) in enumerate(zip(train, test, strict=True))
    ]


def test_curve_summary_is_final_value_grid_mean_and_first_crossing():
    got = curve_summary(
        _points([0.1, 0.35, 0.2, 0.5], [0.0, 0.2, 0.2, 0.4]), target=0.3, seconds=100, every=25
    )
    assert got["final_train"] == 0.5 and got["final_test"] == 0.4
    assert got["auc_train"] == pytest.approx(0.2875) and got["auc_test"] == pytest.approx(0.2)
    assert (
        got["time_to_target"] == 50 and got["updates_to_target"] == 20 and got["env_steps_to_target"] == 200
    )
    never = curve_summary(_points([0.1, 0.2], [0.0, 0.1], every=50), target=0.3, seconds=100, every=50)
    assert never["time_to_target"] is None and never["time_to_target_bound"] == 100


def test_a_grid_time_without_its_own_snapshot_takes_the_next_one():
    """t=25 passed during the compile: no file; the AUC still averages over the whole grid."""
    points = [p for p in _points([0.0, 0.2, 0.4, 0.6], [0.0, 0.1, 0.2, 0.3]) if p["t"] != 25]
    got = curve_summary(points, target=0.9, seconds=100, every=25)
    assert got["snapshots"] == 3
    assert got["auc_train"] == pytest.approx((0.2 + 0.2 + 0.4 + 0.6) / 4)


def test_run_rates_are_slopes_after_the_first_episode_and_the_replay_ratio():
    lines = [{"wall": 1.0, "env_steps": 0, "episodes": 0, "update": 0}]
    lines += [
        {"wall": 1.0 + t, "env_steps": 20 * t, "episodes": 2 * t, "update": 3 * t} for t in range(1, 11)
    ]
    lines[-1] |= {"imitation_updates": 10, "time/train_s": 6.0, "policy_lag_mean": 2.0}
    got = run_rates(lines, batch_size=32)
    assert got["env_steps_per_s"] == pytest.approx(20.0) and got["episodes_per_s"] == pytest.approx(2.0)
    assert got["updates"] == 30 and got["rl_updates"] == 20
    assert got["alone_updates_per_s"] == pytest.approx(5.0)  # 30 updates in 6 s of training
    assert got["replay_ratio"] == pytest.approx(20 * 32 / 20)  # RL samples per episode received


def _row(cell: str, seed: int, **kw) -> dict:
    base = {"cell": cell, "base_envs": 16, "seed": seed, "env_steps_per_s": 10.0, "updates_per_s": 0.5,
            "alone_updates_per_s": 2.0, "time_to_target": 100, "time_to_target_bound": 100,
            "auc_test": 0.2, "final_test": 0.4, "final_train": 0.5}  # fmt: skip
    return base | kw


def test_compare_pairs_seeds_and_marks_a_bound_when_the_baseline_never_arrives():
    a = {
        0: _row("async", 0, env_steps_per_s=24.0, time_to_target=50, time_to_target_bound=50, final_test=0.6),
        1: _row("async", 1, env_steps_per_s=20.0, time_to_target=40, time_to_target_bound=40, final_test=0.4),
    }
    s = {0: _row("sync", 0), 1: _row("sync", 1, time_to_target=None, time_to_target_bound=300, final_test=0.2)}  # fmt: skip
    got = compare(a, s)
    assert got["collection"] == {"mean": 2.2, "min": 2.0, "max": 2.4, "seeds": 2}
    assert got["training_efficiency"]["min"] == 2.0 and got["training_efficiency"]["max"] == 7.5
    assert got["efficiency_bound"] == "lower"  # sync missed the target in seed 1: 300 s is its bound
    assert got["final_success_test"]["relative"] == pytest.approx(0.5 / 0.3 - 1, abs=1e-3)
    assert got["final_success_test"]["per_seed"]["max"] == 1.0  # seed 1: 0.4 against 0.2


def test_predicted_speedup_is_the_smaller_of_straggler_factor_and_headroom():
    a = {0: _row("async", 0, env_steps_per_s=30.0, alone_updates_per_s=1.0)}
    s = {0: _row("sync", 0, env_steps_per_s=10.0, updates_per_s=0.5)}
    assert predicted_speedup(a, s)["mean"] == 2.0  # headroom 2 < straggler factor 3
    a[0]["alone_updates_per_s"] = 5.0
    assert predicted_speedup(a, s)["mean"] == 3.0


def test_verdicts_and_a_summary_with_missing_cells():
    assert verdict("collection", 2.5, quick=False) == "reproduced"
    assert verdict("training_efficiency", 1.4, quick=False) == "same direction, smaller"
    assert verdict("final_success_test", -0.1, quick=False) == "not reproduced"
    assert "not evidence" in verdict("collection", 2.5, quick=True)
    rows = [_row("async", 0, env_steps_per_s=25.0), _row("sync", 0)]
    out = summarize(rows, (16,), quick=True)["N16"]
    assert out["claims"]["collection"]["mean"] == 2.5 and out["verdicts"]["collection"].startswith(
        "reproduced"
    )
    assert out["straggler_cost"] == {} and out["correction_vs_none"] == {}  # cells not run


def test_controls_are_sized_from_the_measured_rates():
    throttled = throttled_run(QUICK, 16, 0, sync_episodes_per_s=1.0)
    assert throttled.actors == 2 and throttled.episode_rate_per_actor == 0.5
    matched = matched_run(QUICK, 16, 0, async_rate=30.0, sync_rate=10.0)
    assert matched.envs == 48 and matched.base_envs == 16 and matched.key == "N16/sync_matched/s0"
    assert matched_run(QUICK, 16, 0, async_rate=100.0, sync_rate=1.0).envs == 64  # at most 4N


@pytest.mark.parametrize("cell", ["sync", "async", "async_uniform", "async_no_correction"])
def test_every_cell_command_parses(tmp_path, cell):
    cmd = learner_command(FULL, plain_run(FULL, cell, 64, 3), tmp_path, ("--publish-every", "2"))
    cfg = tyro.cli(LearnerConfig, args=cmd[3:])
    assert cfg.mode == ("sync" if cell == "sync" else "async") and cfg.seed == 3
    assert cfg.local.local_actors * cfg.local.envs_per_actor == 64 and cfg.publish_every == 2
    assert cfg.emulator.enabled and cfg.emulator.time_scale == 1.0
    assert (cfg.buffer.replay == "uniform") == (cell == "async_uniform")
    assert cfg.loss.off_policy_correction == (cell != "async_no_correction")


def test_the_throttled_command_caps_each_local_actor(tmp_path):
    from actors.config import ActorConfig

    cmd = learner_command(QUICK, throttled_run(QUICK, 16, 0, 1.0), tmp_path)
    cfg = tyro.cli(LearnerConfig, args=cmd[3:])
    actor = tyro.cli(ActorConfig, args=["--host", "127.0.0.1", *shlex.split(cfg.local.local_actor_args)])
    assert actor.max_episode_rate == 0.5


def test_a_seed_where_neither_run_reaches_the_target_says_nothing_about_efficiency():
    a = {
        0: _row("async", 0, time_to_target=None, time_to_target_bound=100),
        1: _row("async", 1, time_to_target=50, time_to_target_bound=50),
    }
    s = {0: _row("sync", 0, time_to_target=None, time_to_target_bound=100), 1: _row("sync", 1)}
    got = compare(a, s)
    assert got["training_efficiency"] == {"mean": 2.0, "min": 2.0, "max": 2.0, "seeds": 1}
    assert got["efficiency_bound"] == "exact"
    a[1] |= {"time_to_target": None, "time_to_target_bound": 100}
    s[1] |= {"time_to_target": None, "time_to_target_bound": 100}
    got = compare(a, s)
    assert got["training_efficiency"]["mean"] is None and got["efficiency_bound"].startswith("neither")
