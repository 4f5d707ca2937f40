"""`python -m actors --inference remote` through a real learner: the actor holds no parameters and acts
through the learner's inference service (learner/inference.py), and training improves as it does with
actor-side inference (the stand-in success-target pattern of tests/test_end_to_end.py).

The service itself, with fake peers and hostile requests, is tests/test_inference_service.py."""

from __future__ import annotations

import ast
import re

import pytest

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
