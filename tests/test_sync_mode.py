"""--mode sync, DigiRL's loop: the learner trains and publishes only once every environment has delivered
its episode of the round, and an actor runs exactly one episode per environment per policy version."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from common import protocol
from common.policies.pointer import featurize
from tests.conftest import ACTOR_ENV, ROOT, START_S
from tests.test_fake_actor import fake_actor, read_metrics, wait_for_metrics  # noqa: F401 (a fixture)
from tests.test_fake_learner import MAX_STEPS, TINY, FakeLearner, stop_and_read

pytestmark = pytest.mark.timeout(900)


def test_learner_waits_for_every_environment_then_trains_and_publishes(learner_process, fake_actor):  # noqa: F811
    learner = learner_process(
        "--mode", "sync", "--batch-size", "4", "--samples-per-insert", "1", "--log-every", "0.3",
        "--actor-timeout", "600",  # the fake actor does not heartbeat while the first step compiles
    )  # fmt: skip
    actor = fake_actor(learner)  # says num_envs=4 in its HELLO: a round is 4 episodes
    assert actor.hello()["mode"] == "sync"
    rng = np.random.default_rng(0)
    actor.traj(actor.episodes(3, rng, version=0))
    line = wait_for_metrics(learner, lambda m: m["episodes"] == 3, what="3 episodes")
    time.sleep(2.0)  # a learner that trained now would have done so (its step is compiled by now or soon)
    line = read_metrics(learner.run_dir)[-1]
    assert (line["update"], line["policy_version"], line["sync_rounds"]) == (0, 0, 0), line
    assert not actor.sub.poll(0) or actor.next_snapshot(newer_than=-1, timeout=1)[0] == 0

    assert actor.traj(actor.episodes(1, rng, version=0))[1]["kind"] == "ACK"  # the round's last env
    version, _ = actor.next_snapshot(newer_than=0)
    assert version == 1
    line = wait_for_metrics(learner, lambda m: m["sync_rounds"] == 1, what="round 1 done")
    # 4 episodes allow one update of 4 at one sample per insert; then the round's data is used up
    assert (line["update"], line["policy_version"], line["mode"]) == (1, 1, "sync")
    assert line["policy_lag_mean"] == 0.0  # every step of the update was collected by the trained version

    assert actor.traj(actor.episodes(4, rng, version=1))[1]["kind"] == "ACK"
    assert actor.next_snapshot(newer_than=1)[0] == 2
    line = wait_for_metrics(learner, lambda m: m["sync_rounds"] == 2, what="round 2 done")
    assert (line["update"], line["policy_version"], line["sync_rounds_timed_out"]) == (2, 2, 0)


def test_a_round_missing_an_environment_ends_at_the_timeout(learner_process, fake_actor):  # noqa: F811
    learner = learner_process(
        "--mode", "sync", "--batch-size", "2", "--samples-per-insert", "1", "--sync-round-timeout", "3",
        "--log-every", "0.3", "--actor-timeout", "600",
    )  # fmt: skip
    actor = fake_actor(learner)
    actor.hello()
    actor.traj(actor.episodes(2, np.random.default_rng(1), version=0))  # 2 of the 4 environments
    assert actor.next_snapshot(newer_than=0)[0] == 1
    line = wait_for_metrics(learner, lambda m: m["sync_rounds"] == 1, what="a timed-out round")
    assert line["sync_rounds_timed_out"] == 1 and line["update"] == 1


def test_actor_runs_one_episode_per_environment_per_version():
    learner = FakeLearner()
    cmd = [
        sys.executable, "-m", "actors", "--ingest-port", str(learner.ingest_port),
        "--params-port", str(learner.params_port), "--env", "standin", "--num-envs", "3", "--seed", "4",
        "--heartbeat-every", "0.5", "--max-batch-episodes", "1", "--learner-timeout", "600",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ACTOR_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    spec = featurize.episode_spec(TINY, text_vocab_size=0)
    try:
        identity, _ = learner.recv_kind(protocol.HELLO)
        learner.welcome(identity, actor_id=1, run_id="sync", mode="sync")
        learner.recv_kind(protocol.PARAM_REQ)
        learner.router.send_multipart([identity, *learner.params_frames(0)])

        def round_of(version: int) -> list:
            episodes = []
            while len(episodes) < 3:
                _, traj = learner.recv_kind(protocol.TRAJ)
                got = protocol.validate_episodes(traj, spec, MAX_STEPS, version)
                learner.reply(identity, protocol.ACK, seq=traj["seq"], accepted=len(got), grant=1000)
                episodes += got
            return episodes

        for version in (0, 1, 2):
            if version:
                learner.pub.send_multipart(learner.params_frames(version))
            episodes = round_of(version)
            assert len(episodes) == 3  # one per environment
            assert all((ep.steps["policy_version"] == version).all() for ep in episodes)
            # ... and nothing more until the next version: only heartbeats for 2 s
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if learner.router.poll(100):
                    _, msg = learner.recv(1)
                    assert msg["kind"] == protocol.HEARTBEAT, f"{msg['kind']} before a new version"
    finally:
        rc, out = stop_and_read(proc)
        learner.close()
    assert rc == 0, out


def test_stop_at_success_counts_only_episodes_after_the_warmup(learner_process, fake_actor):  # noqa: F811
    learner = learner_process("--stop-at-success", "0.5", "--actor-timeout", "600", "--log-every", "0.3")
    actor = fake_actor(learner)
    actor.hello()
    rng = np.random.default_rng(3)
    for _ in range(4):  # 99 successes: not yet 100 episodes
        actor.traj(actor.episodes(24, rng, success=True))
    actor.traj(actor.episodes(3, rng, success=True))
    time.sleep(1.0)
    assert learner.proc.poll() is None, "stopped before 100 episodes"
    actor.traj(actor.episodes(1, rng, success=True))
    assert learner.proc.wait(timeout=START_S) == 0
    assert read_metrics(learner.run_dir)[-1]["stopped"] == "success target"
