"""The whole system: `python -m learner --local-actors 2` trains the real model from two real actor processes.

The learning tests assert what the learner guarantees, not a snapshot of a noisy process: with
`--stop-at-success TARGET --max-updates BUDGET` the learner stops on "success target" as soon as the
last 100 episodes (all collected after any warm-up) reach TARGET, and on "update limit" at BUDGET if
they never do. A learning run must stop on the target within the budget. The same run with a learning
rate of 0 (the sabotaged twin) ended on the update limit, never near the target, in every suite run from
issue 8 to issue 31; it then left the suite, whose 15 minutes it cost 100 s (its assertions, for a rerun:
`--learning-rate 0` gives stopped == "update limit" at BUDGET and a highest success below TARGET). The
learning test itself asserts that the first 100 episodes succeed below half the target.
Targets and budgets come from repeated runs (the spread is in each test's docstring): the budget is
about twice the slowest run seen, the target well under what runs reach by then.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ACTOR_ENV, ROOT

# The plain RL run on the stand-in phone (no demonstrations).
STANDIN = ("--local-actors", "2", "--envs-per-actor", "8", "--log-every", "1", "--seed", "3")
STANDIN_TARGET = 0.3
STANDIN_BUDGET = 120
# The default SimPhone run: a behavior-cloning warm-up on oracle demonstrations, then RL.
SIMPHONE_WARMUP = 40
SIMPHONE = (
    *("--env", "simphone", "--max-steps", "12", "--warmup-demos", "600"),
    *("--warmup-updates", str(SIMPHONE_WARMUP)),
    *("--demo-update-every", "4", "--local-actors", "2", "--envs-per-actor", "8", "--log-every", "1"),
    *("--seed", "1"),
)
SIMPHONE_BUDGET = 60
SIMPHONE_GREEDY = 0.1
# An actor is silent while it first builds its policy (tens of seconds on a loaded CPU, before it
# starts heartbeating); the learner's default 15 s would forget it, and its next messages would be
# refused (not_welcomed) until it joins again. The tests assert that nothing is refused, so they give
# slow start-ups room.
PATIENT = ("--actor-timeout", "60")


def _run(learner_process, *args: str, timeout: float):
    learner = learner_process(*args, *PATIENT)
    rc = learner.proc.wait(timeout=timeout)
    assert rc == 0, learner.log()
    return learner, learner.metrics()


def _assert_two_actors_delivered_and_stopped(learner, metrics: list[dict], remote: bool = False) -> None:
    """Plumbing every run must show, however early it stops: trajectories from both actors, none
    refused, actors acting with published parameters (swapped in, or with `remote` the learner's
    inference service acting with them), and both actors stopped by the learner."""
    final = metrics[-1]
    assert final["episodes"] > 500 and final["env_steps"] > final["episodes"]
    assert max(m["actors"] for m in metrics) == 2
    assert final["rejected"] == 0, final["rejected_by_reason"]
    # A version every 2 updates (--publish-every 2), and the actors swapped to newer ones: the learner
    # received steps taken with late versions.
    assert final["policy_version"] == final["update"] // 2
    assert final["policy_version"] // 2 <= final["behavior_version_max"] <= final["policy_version"]
    for i in range(2):
        actor_log = (learner.run_dir / f"actor-{i}.log").read_text()
        swaps = [int(n) for n in re.findall(r"'param_swaps': (\d+)", actor_log)]
        if remote:  # no snapshot is ever loaded: every step was the service's
            requests = [int(n) for n in re.findall(r"'inference_requests': (\d+)", actor_log)]
            assert (
                not swaps
                and requests
                and requests == [int(n) for n in re.findall(r"'act_calls': (\d+)", actor_log)]
            )
        else:
            assert swaps and max(swaps) >= max(3, final["policy_version"] // 4), actor_log
        assert "stopped (SIGTERM)" in actor_log
    assert final["local_actors_killed"] == 0  # each stopped on the learner's SIGTERM within its grace
    # Nothing left behind: the local actors were stopped and reaped by the learner.
    assert learner.proc.returncode == 0


@pytest.mark.long
@pytest.mark.timeout(800)
def test_learner_and_two_remote_actors_reach_a_success_target(learner_process):
    """Plain RL from scratch on the stand-in phone reaches a sampled success rate of 0.3 over 100
    episodes (the initial policy: about 0.02) within 120 updates, with both actors acting through the
    learner's inference service (`--inference remote`, learner/serving/inference.py): training improves as it
    does with actor-side inference, which this test used until issue 33 (the calibration below is from
    then; one remote actor of 8 environments reached the target within the budget too). Actor-side
    inference keeps its learning test in the SimPhone run below.

    Calibration (seeds 3-7 twice, this configuration, on the 2-core machine loaded by two other test
    runs): n=10, stopped on the target at update min 25 / median 52 / max 86 (wall 108 s to 170 s); two
    more runs with the default --actor-timeout stopped at 55 and 65. With the A-RIDE of issue 15 (ratios
    on the acted observations, initial priorities from the actors, exact-entropy priorities), seeds 3-5
    on an idle machine: 48, 36, 28. The budget is 1.4x the slowest run seen."""
    learner, metrics = _run(
        learner_process,
        *STANDIN,
        *("--max-updates", str(STANDIN_BUDGET), "--stop-at-success", str(STANDIN_TARGET)),
        "--local-actor-args=--inference remote",
        timeout=760,
    )
    final = metrics[-1]
    assert final["stopped"] == "success target", [(m["update"], m["success_rate"]) for m in metrics]
    assert final["update"] <= STANDIN_BUDGET
    started = next(m["success_rate"] for m in metrics if m["episodes"] >= 100)
    assert started < 0.15, metrics[:5]
    _assert_two_actors_delivered_and_stopped(learner, metrics, remote=True)
    # Every episode came with the actor's own estimates and entered the replay at their priority.
    assert final["replay/added"] > 0 and final["replay/added_at_max"] == 0
    # Every step was the service's, each request answered, none refused.
    assert final["inference/rejected_by_reason"] == {} and final["inference/rows"] >= final["env_steps"]


@pytest.mark.long
@pytest.mark.timeout(1000)
def test_default_simphone_run_warms_up_then_trains_a_policy_that_succeeds_greedily(learner_process, tmp_path):
    """The default SimPhone configuration (warm-up on 600 oracle demonstrations for 40 updates, then
    RL with one imitation update in 4) trains, in 60 updates, a policy whose greedy success on 100
    training-split episodes (`python -m learner eval`) is at least 0.1 (the initial policy: about 0).

    Greedy success of the final checkpoint, not a sampled rate: the warm-up alone lifts the sampled
    success to 0.47-0.59, so a sampled target says little about this short run; the greedy policy is
    what the run produced.

    Calibration (seeds 1-3 twice, on the loaded 2-core machine): n=6, greedy train success 0.33 / 0.35 /
    0.45 / 0.45 / 0.46 / 0.565 (held-out test split: 0.215 to 0.40), wall 275 s to 434 s. With issue 15's
    A-RIDE, two runs at a time (seeds 1-6): 0.25 / 0.265 / 0.275 / 0.48 / 0.51 / 0.56 (test 0.17 to
    0.395), wall 198 s to 258 s; one clean-clone CI run on two xdist workers: 0.185. The bar, 0.1, is about
    half the lowest of these n=13 (measured on 200 episodes; 100 since issue 31, for the suite's time: at
    0.185 the chance of fewer than 10 successes in 100 is 0.7%, at 0.25 it is 0.004%).

    Until 2026-12-06 the run was 100 warm-up updates in a budget of 140; shortened for the suite's time
    (a third less CPU), recalibrated the same way: 40 warm-up updates in 60, seeds 1-4, two runs at a
    time on the idle 2-core machine, each with a cold compilation cache: greedy train success 0.26 / 0.37 /
    0.22 / 0.43 (seed 1: 0.26), wall 113-115 s, so the bar is still under half the lowest run; 60 in 90
    reached 0.35 to 0.58 (n=7) in 145-152 s. With --learning-rate 0 (the sabotaged twin) the same run's
    greedy success is 0.00."""
    learner, metrics = _run(learner_process, *SIMPHONE, "--max-updates", str(SIMPHONE_BUDGET), timeout=840)
    log = learner.log()
    assert (
        "600 demonstrations (success" in log and f"for warm-up for {SIMPHONE_WARMUP} updates and the" in log
    )
    assert "and one in 4 updates after the warm-up" in log
    assert "600 demonstrations added to the replay" in log
    final = metrics[-1]
    assert final["stopped"] == "update limit"
    assert final["update"] == SIMPHONE_BUDGET and final["phase"] == "rl"
    assert any(m["phase"] == "warmup" and m["update"] > 0 for m in metrics)
    # The warm-up, then every 4th update imitates.
    assert final["imitation_updates"] == SIMPHONE_WARMUP + (SIMPHONE_BUDGET - SIMPHONE_WARMUP) // 4
    assert all(
        name.split(".")[0]
        in {"app", "browser", "calendar", "clock", "contacts", "messages", "notes", "settings"}
        for name in final["success_by_task"]
    )
    started = next(m["success_rate"] for m in metrics if m["episodes"] >= 100)
    assert started < 0.1, [m["success_rate"] for m in metrics]
    _assert_two_actors_delivered_and_stopped(learner, metrics)
    # The last checkpoint (saved at exit), run greedily on the tasks it trained on.
    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(learner.run_dir), "--split", "train"]
    cmd += ["--episodes", "100", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=ACTOR_ENV, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["update"] == SIMPHONE_BUDGET and report["episodes"] == 100
    assert report["success"] >= SIMPHONE_GREEDY, report["per_template"]
