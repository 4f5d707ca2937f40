"""The collection benchmark's arithmetic and the learner command they build (the
runs themselves take minutes: they are benchmarks, not tests)."""

from __future__ import annotations

import os
import sys

import pytest
import tyro

from benchmarks import pinning
from benchmarks.collection import LATENCY, learner_command, mean_step_latency, steps_per_second
from learner.config import LearnerConfig


def test_mean_step_latency_is_lognormal_mean_plus_expected_stall():
    assert mean_step_latency(1.0) == pytest.approx(1.0 + 0.01 * 5.0)
    assert mean_step_latency(0.2) == pytest.approx(0.21)


def test_steps_per_second_is_the_slope_after_the_first_episode():
    lines = [{"wall": w, "env_steps": 0} for w in (1.0, 2.0, 3.0)]  # start-up: not in the window
    lines += [{"wall": 3.0 + t, "env_steps": 10 + 50 * t} for t in range(1, 11)]
    lines.append({"wall": 14.0, "env_steps": 560, "stopped": "time limit"})
    rate, window = steps_per_second(lines)
    assert rate == pytest.approx(50.0) and window == pytest.approx(9.0)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_learner_command_parses_with_the_latency_model(tmp_path, mode):
    cmd = learner_command(mode, tmp_path, 60.0, 0.2, ("--batch-size", "32"))
    assert cmd[1:3] == ["-m", "learner"]
    cfg = tyro.cli(LearnerConfig, args=cmd[3:])
    assert cfg.mode == mode and cfg.local.local_actors == 2 and cfg.local.envs_per_actor == 8
    assert cfg.emulator.enabled and cfg.emulator.time_scale == 0.2 and cfg.batch_size == 32  # later wins
    assert cfg.emulator.step_latency_sigma == LATENCY["step-latency-sigma"] and cfg.emulator.hang_prob == 0
    assert cfg.imitation.warmup_demos == 0 and cfg.time_limit == 60.0


def test_emulator_flags_reach_the_local_actors_unchanged():
    from actors.config import ActorConfig
    from common.config import EmulatorModelConfig, cli_args

    cfg = EmulatorModelConfig(enabled=True, time_scale=0.05, step_latency_sigma=1.0, hang_prob=0.0, seed=7)
    actor = tyro.cli(ActorConfig, args=list(cli_args(cfg, "--emulator")))
    assert actor.emulator == cfg
    assert cli_args(EmulatorModelConfig(), "--emulator") == ()  # defaults add no flags


@pytest.mark.skipif(not pinning.available(), reason="needs Linux sched_setaffinity and 2+ cores")
def test_pinning_puts_the_learner_on_one_core_and_its_children_on_the_others():
    """What benchmarks/paper/benchmark.py relies on to mimic a separate learner machine."""
    child = "import os, time; time.sleep(2.5); print(sorted(os.sched_getaffinity(0)))"
    parent = (
        "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)), flush=True); "
        f"subprocess.run([sys.executable, '-c', {child!r}])"
    )
    done = pinning.run_pinned([sys.executable, "-c", parent], timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cores = sorted(os.sched_getaffinity(0))
    assert done.stdout.split("\n")[:2] == [str(cores[:1]), str(cores[1:])]
