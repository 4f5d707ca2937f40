"""The real `python -m actors --backend adb` process on two fake phones, streaming to a fake learner:
a device that leaves mid-run costs its own episodes (sent truncated, counted), never the other's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from common import protocol
from common.policies.pointer import featurize
from tests.conftest import ACTOR_ENV, ROOT, START_S
from tests.fake_adb import FakeAdbServer
from tests.test_adb_env import TASKS, make_world_phone
from tests.test_fake_learner import MAX_STEPS, TINY, FakeLearner, stop_and_read

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def phones(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    first, second = make_world_phone(), make_world_phone()
    second.serial = "emulator-5556"
    with FakeAdbServer(first, second) as server:
        yield server, first, second


def test_actor_streams_from_two_devices_and_survives_one_leaving(phones, tmp_path):
    server, first, second = phones
    tasks = tmp_path / "world.json"
    tasks.write_text(json.dumps(TASKS))
    learner = FakeLearner()
    cmd = [
        sys.executable, "-m", "actors", "--host", "127.0.0.1", "--ingest-port", str(learner.ingest_port),
        "--params-port", str(learner.params_port), "--backend", "adb", "--tasks", str(tasks),
        "--adb.port", str(server.port), "--adb.serials", first.serial, second.serial,
        "--adb.settle-interval", "0", "--adb.settle-max", "0.5", "--adb.command-timeout", "2",
        "--adb.reset-timeout", "3", "--adb.restart-backoff", "0.2", "--heartbeat-every", "0.5",
        "--max-batch-episodes", "2", "--status-every", "1000",
    ]  # fmt: skip
    env = {**ACTOR_ENV, "ADBUTILS_ADB_PATH": "/bin/false"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    spec = featurize.episode_spec(TINY, text_vocab_size=0)
    try:
        identity, hello = learner.recv_kind(protocol.HELLO)
        assert hello["num_envs"] == 2  # one environment per device (--num-envs is for in-process phones)
        learner.welcome(identity)
        learner.recv_kind(protocol.PARAM_REQ)
        learner.router.send_multipart([identity, *learner.params_frames(0)])

        def receive(n_batches: int) -> list:
            episodes = []
            for _ in range(n_batches):
                _, traj = learner.recv_kind(protocol.TRAJ)
                eps = protocol.validate_episodes(traj, spec, MAX_STEPS, 0)
                learner.reply(
                    identity, protocol.ACK, seq=traj["seq"], accepted=len(eps), grant=traj["seq"] + 8
                )
                episodes += eps
            return episodes

        episodes = receive(3)
        assert {ep.task for ep in episodes} == {"airplane_on"}
        assert all(ep.length <= MAX_STEPS for ep in episodes)
        # an episode ends at the step limit (truncated), at STATUS_COMPLETE, or when the switch is on
        assert all(not ep.truncated or (ep.length == MAX_STEPS and not ep.success) for ep in episodes)
        assert len(first.commands) > 10 and len(second.commands) > 10  # both devices are driven

        # The first phone leaves: its episode ends truncated and its resets fail, but the second keeps going.
        first.faults.gone = True
        gone_at = len(first.commands)
        second_before = len(second.commands)
        receive(4)
        assert len(first.commands) == gone_at  # nothing reached the vanished device
        assert len(second.commands) > second_before + 20
        first.faults.gone = False  # it returns: the next reset retry recovers it
        returned_at = len(first.commands)
        # The retry backoff doubles per failed reset (up to a minute): the longer the device was gone
        # (a busy machine is slow to deliver those 4 batches), the longer until the next retry.
        deadline = time.monotonic() + START_S
        while len(first.commands) < returned_at + 20 and time.monotonic() < deadline:
            receive(1)
        assert len(first.commands) >= returned_at + 20, "the returned device was never used again"
    finally:
        rc, out = stop_and_read(proc)
        learner.close()
    assert rc == 0, out
    stats = re.search(r"stopped \(SIGTERM\); (\{.*\})", out)
    assert stats, out
    counts = eval(stats.group(1), {"Counter": dict})  # the actor prints its stats dict
    # The device left during a step (the episode is sent truncated) or between episodes (the reset
    # failed and was retried): either way the fault is counted, and only that device was recovered.
    assert counts.get("device_disconnect", 0) + counts.get("reset_disconnect", 0) >= 1, out
    assert counts["episodes_finished"] > 7 and "emulator-5556: recover" not in out
    assert "2 device(s) ready: emulator-5554, emulator-5556" in out


def test_a_bad_device_setup_stops_the_actor_before_it_joins(phones, tmp_path):
    server, first, _ = phones
    first.state = "unauthorized"
    learner = FakeLearner()
    base = [
        sys.executable, "-m", "actors", "--ingest-port", str(learner.ingest_port),
        "--params-port", str(learner.params_port), "--backend", "adb", "--adb.port", str(server.port),
    ]  # fmt: skip
    env = {**ACTOR_ENV, "ADBUTILS_ADB_PATH": "/bin/false"}
    bad_tasks = tmp_path / "bad.json"
    bad_tasks.write_text('{"suite": "x", "templates": [{"id": "t"}]}')
    try:
        cases = [
            (["--adb.serials", first.serial, "R58M"], ["USB debugging", "R58M", "missing"]),
            (["--adb.serials", "emulator-5556", "--tasks", str(bad_tasks)], [str(bad_tasks), "instruction"]),
            (["--adb.serials", "emulator-5556", "--adb.evaluator", "judge"], ["--adb.judge.url"]),
        ]
        for args, expected in cases:
            done = subprocess.run(
                [*base, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode != 0
            assert all(text in done.stderr + done.stdout for text in expected), done.stderr + done.stdout
            assert "Traceback" not in done.stderr, done.stderr
        assert not learner.router.poll(100)  # none of them said HELLO
    finally:
        learner.close()
