"""`python -m actors --inference remote` through a real learner killed with SIGKILL and restarted: the
actor holds no parameters and acts through the learner's inference service (learner/inference.py).

That remote actors learn is tests/test_end_to_end.py's stand-in success-target test; the service itself,
with fake peers and hostile requests, is tests/test_inference_service.py."""

from __future__ import annotations

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
