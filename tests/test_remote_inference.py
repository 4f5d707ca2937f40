"""`python -m actors --inference remote` through a real learner: the actor holds no parameters and acts
through the learner's inference service (learner/inference.py), and training improves as it does with
actor-side inference (the stand-in success-target pattern of tests/test_end_to_end.py).

The service itself, with fake peers and hostile requests, is tests/test_inference_service.py."""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import START_S
from tests.test_faults import (  # noqa: F401 (start_actor is a fixture)
    FAST_LEARNER,
    RESUMED,
    assert_rejoined_and_delivered,
    final_metrics,
    free_ports,
    latest,
    start_actor,
    wait_for,
)

# The stand-in RL run of tests/test_end_to_end.py (its calibration: stopped on the 0.3 target at updates
# 25-86 with two actors of 8 environments), here with one remote actor of 8 environments.
RUN = (
    "--local-actors",
    "1",
    "--envs-per-actor",
    "8",
    "--log-every",
    "1",
    "--seed",
    "3",
    "--actor-timeout",
    "60",
)
TARGET, BUDGET = 0.3, 120


@pytest.mark.long
@pytest.mark.timeout(800)
def test_a_remote_actor_trains_through_the_inference_service(learner_process):
    learner = learner_process(
        *RUN, "--local-actor-args=--inference remote", "--max-updates", str(BUDGET), "--stop-at-success",
        str(TARGET),
    )  # fmt: skip
    assert learner.proc.wait(timeout=760) == 0, learner.log()
    metrics = learner.metrics()
    final = metrics[-1]
    assert final["stopped"] == "success target", [(m["update"], m["success_rate"]) for m in metrics]
    assert next(m["success_rate"] for m in metrics if m["episodes"] >= 100) < 0.15
    assert final["rejected"] == 0 and final["inference/rejected_by_reason"] == {}, final
    # Every step was chosen by the service, with parameters it was given as they were published.
    assert final["inference/answered"] > 0 and final["inference/rows"] >= final["env_steps"]
    assert final["policy_version"] // 2 <= final["behavior_version_max"] <= final["policy_version"]
    assert re.search(r"inference tcp://127\.0\.0\.1:\d+", learner.log())
    actor_log = (learner.run_dir / "actor-0.log").read_text()
    stopped = re.findall(r"actor: stopped \(SIGTERM\); (\{.*\})", actor_log)
    assert stopped, actor_log
    stats = ast.literal_eval(stopped[0])
    assert stats["inference_requests"] == stats["act_calls"] > 0
    assert "param_swaps" not in stats  # no snapshot was ever loaded: the actor holds no parameters


@pytest.mark.long
@pytest.mark.timeout(900)
def test_a_killed_learner_restarts_and_its_remote_actor_loses_no_acknowledged_episode(
    learner_process,
    start_actor,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    """tests/test_faults.py's kill -9 of the learner, with an actor that acts through the learner's inference
    service: the service dies with the learner and comes back (on another port) with the restarted one; the
    actor, which holds no model, waits (`no_answer`), joins again, takes the new port from WELCOME and
    delivers every episode it finished exactly once."""
    ingest, params = free_ports(2)
    run_dir = tmp_path / "restarted"
    args = (*FAST_LEARNER, "--actor-timeout", "5", "--checkpoint-every", "5", "--batch-size", "4")
    args += ("--max-policy-lag", "0", "--ingest-port", str(ingest), "--params-port", str(params))
    first = learner_process(*args, run_dir=run_dir)
    wait_for(lambda: "train step compiled" in first.log(), START_S, "the learner's compiled step")
    actor = start_actor(
        ingest, params, "--max-episodes", "400", "--seed", "6", "--flush-timeout", "120",
        "--max-batch-episodes", "1", "--max-pending-episodes", "16", "--inference", "remote",
        "--inference-timeout", "3",
    )  # fmt: skip
    wait_for(lambda: latest(first).get("update", 0) >= 12, START_S, "two checkpoints")
    assert actor.proc.poll() is None, actor.log()
    first.proc.kill()
    first.proc.wait()
    second = learner_process(*args, run_dir=run_dir)
    resumed = RESUMED.search(second.log())
    assert resumed, second.log()
    kept = int(resumed[3] or 0)
    stats = assert_rejoined_and_delivered(actor, START_S)
    final = final_metrics(second)
    assert final["batches_lost_in_restart"] == 0 and final["duplicates"] >= 0
    assert stats["episodes_finished"] == kept + final["episodes"], (kept, final, stats)
    assert stats["inference_reconnects"] >= 1 and "param_swaps" not in stats, stats
    assert final["inference/answered"] > 0
