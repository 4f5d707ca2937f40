"""The whole system: `python -m learner --local-actors 2` trains the real model from two real actor processes."""

from __future__ import annotations

import re

import pytest


@pytest.mark.timeout(240)
def test_learner_and_two_actors_train_and_success_rises(learner_process):
    learner = learner_process(
        *("--local-actors", "2", "--envs-per-actor", "8"),
        *("--max-updates", "200", "--log-every", "1", "--seed", "3"),
    )
    rc = learner.proc.wait(timeout=220)
    log = learner.log()
    assert rc == 0, log
    metrics = learner.metrics()
    final = metrics[-1]
    assert final["stopped"] == "update limit"
    assert final["update"] == 200
    # Trajectories flowed from both actors.
    assert final["episodes"] > 500 and final["env_steps"] > final["episodes"]
    assert max(m["actors"] for m in metrics) == 2
    assert final["rejected"] == 0
    # The actors swapped to newer parameters: the learner received steps taken with late versions.
    assert final["policy_version"] == 100
    assert final["behavior_version_max"] >= 30
    for i in range(2):
        actor_log = (learner.run_dir / f"actor-{i}.log").read_text()
        swaps = [int(n) for n in re.findall(r"'param_swaps': (\d+)", actor_log)]
        assert swaps and max(swaps) >= 10, actor_log
        assert "stopped (SIGTERM)" in actor_log
    # Success rose clearly above where it started.
    started = next(m["success_rate"] for m in metrics if m["episodes"] >= 100)
    assert started < 0.15, metrics[:5]
    # Thresholds leave room for run-to-run spread (asynchrony makes runs differ). At 130 updates runs
    # reached 0.22 to 0.6, but once 0.03 under a loaded clean-clone CI (with small word-vector init),
    # so the run now has 200 updates.
    assert final["success_rate"] >= max(0.15, started + 0.1), [m["success_rate"] for m in metrics]
    # The easiest family (tap the named app's icon, after going home if needed) is all but solved.
    assert final["success_by_task"]["open_app"] >= 0.6, final["success_by_task"]
    # Nothing left behind: the local actors were stopped and reaped by the learner.
    assert learner.proc.returncode == 0


@pytest.mark.timeout(300)
def test_default_simphone_run_warms_up_then_success_rises(learner_process):
    learner = learner_process(
        *("--env", "simphone", "--max-steps", "12", "--warmup-demos", "600", "--warmup-updates", "100"),
        *("--demo-update-every", "4"),
        *(
            "--local-actors",
            "2",
            "--envs-per-actor",
            "8",
            "--max-updates",
            "180",
            "--log-every",
            "1",
            "--seed",
            "1",
        ),
    )
    rc = learner.proc.wait(timeout=280)
    log = learner.log()
    assert rc == 0, log
    assert "600 demonstrations (success" in log and "for warm-up for 100 updates and the replay" in log
    assert "600 demonstrations added to the replay" in log
    metrics = learner.metrics()
    final = metrics[-1]
    assert final["update"] == 180 and final["phase"] == "rl"
    assert "and one in 4 updates after the warm-up" in log
    assert final["imitation_updates"] == 100 + 80 // 4  # the warm-up, then every 4th update
    assert any(m["phase"] == "warmup" and m["update"] > 0 for m in metrics)
    assert all(
        name.split(".")[0]
        in {"app", "browser", "calendar", "clock", "contacts", "messages", "notes", "settings"}
        for name in final["success_by_task"]
    )
    started = next(m["success_rate"] for m in metrics if m["episodes"] >= 100)
    assert started < 0.1, [m["success_rate"] for m in metrics]
    # Observed in development: 0.3 to 0.5 at this point; the policy starts at about 0.01.
    assert final["success_rate"] >= max(0.12, started + 0.1), [m["success_rate"] for m in metrics]
    app = [v for k, v in final["success_by_task"].items() if k.startswith("app.")]
    assert app and sum(app) / len(app) >= 0.3, final["success_by_task"]
