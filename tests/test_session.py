"""The Session's actions on a real, freshly opened session (no local actors, no demonstrations): what the
loop used to change by reaching into the parts (the schedule's update count, the statistics, the
replay's priorities) now happens through one action each."""

from __future__ import annotations

import io
import json
import math
import socket

import numpy as np
import pytest
from rich.console import Console

from actors.envs.standin import StandInPhoneEnv
from actors.policy_runner import stack
from actors.remote_policy import InferenceRefused, RemotePolicy
from common.policies import PointerPolicy
from common.protocol import Episode
from learner.config import parse_args
from learner.inserter import ReplayInserter
from learner.losses.base import PriorityTerms
from learner.observe.run_outputs import reachable_host
from learner.session import Session
from learner.setup.open_session import open_session
from learner.training.trainer import StepResult


def episode(version: int, task: str = "t") -> Episode:
    steps = {"policy_version": np.full(3, version, np.int32), "reward": np.zeros(3, np.float32)}
    return Episode(task, False, False, {}, steps)


def opened(run_dir, *args: str) -> Session:
    """A session on free ports, with the stand-in environments (no demonstrations to write)."""
    ports = ["--ingest-port", "0", "--params-port", "0", "--local-actors", "0", "--env", "standin"]
    cfg = parse_args(["--run-dir", str(run_dir), *ports, "--checkpoint-every", "0", *args])
    return open_session(cfg, Console(file=io.StringIO()))


@pytest.fixture
def session(tmp_path):
    s = opened(tmp_path, "--batch-size", "4")
    yield s
    s.close("test")


def test_opening_writes_the_run_files_and_publishes(session, tmp_path):
    endpoints = json.loads((tmp_path / "endpoints.json").read_text())
    assert endpoints["ingest_port"] == session.server.ingest_port > 0
    assert endpoints["host"] == endpoints["bind"] == "127.0.0.1"  # where actors reach it
    assert json.loads((tmp_path / "config.json").read_text())["batch_size"] == 4
    assert session.schedule.sync is False and not session.demos and not session.prefill_pending
    assert "episodes_at_rl_start" in session.stats.totals  # no warm-up: reinforcement learning from the start


def test_publishing_copies_parameters_for_the_inference_service_only_while_actors_use_it(session):
    service = session.inference
    assert service is not None and service._params is None  # opened: the first version is published...
    held = service._newest
    assert held is not None and held[1] is not None  # ...with its copy
    session.publish()  # no remote actor has asked: the version alone
    assert service._newest[0] == session.trainer.version and service._newest[1] is None
    assert service.metrics()["inference/idle_publishes"] == 1
    # A remote actor asks now: refused (the service has no parameters for the newest version), and the
    # loop's next turn hands them over at once; the next publish might never come while training waits
    # for this actor's data (a restarted learner deadlocked so in test_faults' remote case).
    client = RemotePolicy(session.cfg.model, service.endpoint, actor_id=0, timeout=30)
    features = stack([PointerPolicy(session.cfg.model).featurize(StandInPhoneEnv().reset(seed=0)[0])])
    service.known = lambda _: True
    with pytest.raises(InferenceRefused, match="unavailable"):
        client.act(features)
    session.refresh_inference()
    client.act(features)
    assert client.version == session.trainer.version and not service.behind()
    client.close()


def test_a_replay_update_is_drawn_counted_and_settled_through_the_session(session):
    for v in (0, 0, 0, 0, 0):
        session.replay.add(episode(v), v)
    session.trainer.version = 2  # two versions published since the episodes were acted
    draw = session.draw_replay()
    assert len(draw.episodes) == session.trainer.local_batch == 4 and draw.sample is not None
    assert session.schedule.rl_updates == 1  # the rate limit counts it
    assert (session.stats.lag_mean, session.stats.lag_max) == (2.0, 2)
    steps = sum(ep.length for ep in draw.episodes)
    assert session.record()["policy_lag_trained"] == {"steps": steps, "p50": 2, "p90": 2, "p99": 2, "max": 2}

    ones = np.ones(4, np.float32)
    terms = PriorityTerms(5 * ones, ones, ones)
    session.finish_update(StepResult({"loss": 0.5}, terms, skipped=False), draw, seconds=1.5)
    assert session.replay.priorities[draw.sample.indices].min() > 5  # the step's new priorities
    assert session.stats.train_metrics == {"loss": 0.5} and session.stats.timing["train_s"] == 1.5

    session.finish_update(StepResult({"loss": float("nan")}, None, skipped=True), session.draw_replay(), 0.5)
    assert session.stats.totals["skipped_nonfinite"] == 1 and session.schedule.rl_updates == 2
    record = session.record()
    assert (record["skipped_nonfinite"], record["replay_size"]) == (1, 5) and math.isnan(record["train/loss"])


def test_demonstrations_join_the_replay_at_rl_start_but_buy_no_updates(session):
    session.demos = [episode(0, task=f"demo {i}") for i in range(8)]
    session.prefill_pending = True
    session.start_rl()
    assert len(session.replay) == 8 and not session.prefill_pending
    assert not session.schedule.can_train(len(session.replay))  # the loop's question: no update yet
    inserter = ReplayInserter(
        session.replay, session.schedule, session.stats, 0.9, lambda: session.trainer.version
    )
    inserter([episode(0)])  # one actor episode: 4 samples at --samples-per-insert 4, one update of 4
    assert session.schedule.can_train(len(session.replay))
    session.draw_replay()
    assert not session.schedule.can_train(len(session.replay))


def test_close_writes_the_last_record_with_why_it_stopped(tmp_path):
    last = opened(tmp_path).close("update limit")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["stopped"] == last["stopped"] == "update limit" and "params_digest" in last


def test_a_learner_on_every_interface_records_its_host_name_for_actors():
    assert reachable_host("0.0.0.0") == socket.gethostname() == reachable_host("::")
    assert reachable_host("10.0.0.5") == "10.0.0.5"


def test_a_checkpoint_is_also_saved_once_its_wall_time_interval_has_passed(tmp_path):
    s = opened(tmp_path, "--checkpoint-every", "1000", "--checkpoint-every-s", "60")
    try:
        s.trainer.update = 3  # not a multiple of 1000
        s.save_if_due()
        assert s.checkpointer.latest_update() is None  # the interval has not passed
        s._last_save -= 61  # a minute later
        s.save_if_due()
        assert s.checkpointer.latest_update() == 3 == s.saved_update
        s.trainer.update = 4
        s.save_if_due()
        assert s.checkpointer.latest_update() == 3  # the clock starts again at each save
        s._last_save -= 61  # between updates (waiting for data): due by time once something was trained
        s.save_if_due(updated=False)
        assert (s.checkpointer.updates(), s.saved_update) == ([3, 4], 4)
        s._last_save -= 61
        s.save_if_due(updated=False)  # nothing trained since: no second checkpoint of update 4
        s._last_save += 61
        s.trainer.update = 1000
        s.save_if_due(updated=False)  # a multiple of --checkpoint-every counts only right after an update
        assert s.checkpointer.updates() == [3, 4]
    finally:
        s.close("test")
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint-every-s", "-1"])


def test_every_record_names_the_update_the_run_resumed_from(tmp_path):
    """`resumed_update`: what a restart trained again is its predecessor's last update minus this, even
    when updates came before its first record (the chaos soak's audit read the first record's update and
    judged a restart that redid 93 updates as 80)."""
    s = opened(tmp_path, "--checkpoint-every", "1000")
    try:
        assert s.record()["resumed_update"] == 0
        s.trainer.update = 7
        s.save()
        s.checkpoint_files.wait()
    finally:
        s.close("test")
    again = opened(tmp_path, "--checkpoint-every", "1000")
    try:
        again.trainer.update += 5  # trained before its first record
        assert (again.record()["resumed_update"], again.record()["update"]) == (7, 12)
    finally:
        again.close("test")
