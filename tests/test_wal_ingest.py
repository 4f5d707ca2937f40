"""The write-ahead log under the learner's real ingest: what an ACK promises in each durability mode.

A real IngestServer on loopback takes TRAJ batches from a DEALER speaking the protocol. "A crash" is a
second IngestServer started on the same log directory from a checkpoint taken part-way (its replay
and ledger state), while the first one is abandoned without closing: what the second one recovers
must equal what the first one held. Disk failures are real write errors (the process's file size
limit, RLIMIT_FSIZE), not a mock."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import zmq

from benchmarks.ingest import random_episode
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from learner.ingest import settler
from learner.ingest.audit import AuditLog
from learner.ingest.registry import ActorRegistry
from learner.ingest.transport import Transport
from learner.ingest.wal import WriteAheadLog
from learner.replay.prioritized import PrioritizedReplay, initial_priority_terms, oldest_version
from learner.setup.ingest import ingest_server

MODEL = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2,
                    d_model=8, num_heads=2, num_layers=1, mlp_dim=8)  # fmt: skip
MAX_STEPS = 4
CREDIT = 4


class _Learner:
    """An IngestServer with a write-ahead log storing into a real prioritized replay, as learner/setup/open_session.py does."""

    def __init__(
        self, wal_dir, durability: str, replay_state=None, ledger_state=None, start_lsn=None, audit=False
    ):
        self.replay: PrioritizedReplay = PrioritizedReplay(64, seed=0)
        if replay_state is not None:
            self.replay.load_state_dict(*replay_state)
        self.logged: list[str] = []
        self.server = ingest_server(
            Transport("127.0.0.1", 0, 0), ActorRegistry(),
            welcome_fields={"model": MODEL.to_dict(), "max_steps": MAX_STEPS},
            episode_spec=featurize.episode_spec(MODEL, 0), max_steps=MAX_STEPS,
            on_episodes=self._store, credit=CREDIT, heartbeat_every=60.0,
            wal=WriteAheadLog(wal_dir, durability), log=self.logged.append,
            audit=AuditLog(wal_dir / "audit.jsonl", durability == "fsync") if audit else None,
        )  # fmt: skip
        if ledger_state is not None:
            self.server.ledger.load_state(ledger_state)
        self.recovered = self.server.recover(start_lsn or 0, newest_version=0)
        self.server.publish(0, {"w": np.zeros(3, np.float32)})

    def _store(self, episodes, record: int) -> None:
        for i, ep in enumerate(episodes):
            self.replay.add(ep, oldest_version(ep), initial_priority_terms(ep, 0.99), (record, i))

    def checkpoint(self) -> tuple:
        """What Session.save keeps: the replay, the ledger and the log position (no batch waits for a sync)."""
        return copy.deepcopy(self.replay.state_dict()), self.server.ledger.state(), self.server.wal.next_lsn


class _Actor:
    """One actor instance: HELLO, then TRAJ batches of random valid episodes, each kept until its ACK."""

    def __init__(self, learner: _Learner, ctx: zmq.Context, instance: str = "inst-a", seed: int = 0):
        self.learner, self.rng = learner, np.random.default_rng(seed)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{learner.server.ingest_port}")
        self.sock.send(wire.encode(protocol.Hello("a", 1, instance, 1).to_msg()))
        welcome = protocol.Welcome.from_msg(self._reply())
        self.actor_id, self.grant, self.seq = welcome.actor_id, welcome.grant, 0

    def _reply(self, timeout_s: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while not self.sock.poll(0):
            assert time.monotonic() < deadline, "no reply from the learner"
            self.learner.server.poll(10)
        return protocol.parse(self.sock.recv())

    def send(self, episodes: int = 2) -> dict:
        """One new batch; returns the learner's reply (ACK or ERROR), as a map."""
        self.seq += 1
        eps = [
            random_episode(self.rng, MODEL, int(self.rng.integers(1, MAX_STEPS + 1))) for _ in range(episodes)
        ]
        self.sock.send(wire.encode(protocol.Traj(self.actor_id, self.seq, eps).to_msg()))
        return self.resend_reply()

    def resend(self) -> dict:
        """The last batch again (as after a refusal), same seq."""
        self.seq -= 1
        return self.send()

    def resend_reply(self) -> dict:
        reply = self._reply()
        while reply["kind"] == protocol.HEARTBEAT:
            reply = self._reply()
        if reply["kind"] == protocol.ACK:
            self.grant = max(self.grant, reply["grant"])
        return reply


def _stored(learner: _Learner) -> dict:
    """The ledger's record of stored batches per instance (watermark, stored above it)."""
    return {k: v[:2] for k, v in learner.server.ledger.state()["streams"].items()}


def _same_replay(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    items_a, state_a = a.state_dict()
    items_b, state_b = b.state_dict()
    assert len(items_a) == len(items_b) > 0
    for x, y in zip(items_a, items_b, strict=True):
        assert (x.task, x.success, x.truncated) == (y.task, y.success, y.truncated)
        for name in x.obs:
            np.testing.assert_array_equal(x.obs[name], y.obs[name])
        for name in x.steps:
            np.testing.assert_array_equal(x.steps[name], y.steps[name])
    for key in ("priorities", "versions", "leaves", "slots"):
        np.testing.assert_array_equal(state_a[key], state_b[key], err_msg=key)
    assert state_a["counts"] == state_b["counts"]


@pytest.fixture
def world(tmp_path):
    """Factories for learners on one log directory and actors, all closed at teardown."""

    class World:
        def __init__(self):
            self.ctx, self.learners = zmq.Context(), []

        def learner(self, durability: str, *checkpoint, audit: bool = False) -> _Learner:
            self.learners.append(_Learner(tmp_path, durability, *checkpoint, audit=audit))
            return self.learners[-1]

        def actor(self, learner: _Learner, seed: int = 0) -> _Actor:
            return _Actor(learner, self.ctx, seed=seed)

    w = World()
    yield w
    for learner in w.learners:
        learner.server.close()
    w.ctx.destroy(0)


@pytest.mark.parametrize("durability", ["os", "fsync"])
def test_a_crashed_learner_recovers_every_acknowledged_batch_from_its_checkpoint_and_log(world, durability):
    first = world.learner(durability)
    actor = world.actor(first)
    for _ in range(5):
        assert actor.send()["kind"] == protocol.ACK
    saved = first.checkpoint()
    acked = 0
    for i in range(9):
        reply = actor.send(episodes=1 + i % 3)
        assert reply["kind"] == protocol.ACK and reply["accepted"] == 1 + i % 3
        acked += reply["accepted"]
    assert first.server.wal.stats["records"] == 14
    if durability == "fsync":
        assert first.server.wal.stats["syncs"] == 14  # one batch per loop turn here: one sync each
    # The learner dies here (no close, nothing flushed by Python); a new process starts from the checkpoint.
    second = world.learner(durability, *saved)
    assert second.recovered["batches"] == 9 and second.recovered["episodes"] == acked
    assert second.recovered["skipped"] == 0 == second.recovered["unreadable"]
    _same_replay(first.replay, second.replay)
    assert _stored(second) == _stored(first)  # the grants are each process's own
    assert second.server.wal.next_lsn == first.server.wal.next_lsn
    # A batch the dead learner had stored comes again from the actor: acknowledged, stored once.
    again = world.actor(second, seed=99)
    assert again.grant >= 14
    again.seq = 14
    assert again.resend()["duplicate"] is True
    assert len(second.replay) == len(first.replay)


def test_a_log_record_already_in_the_checkpoint_is_skipped_on_recovery(world):
    """The ledger decides: a record below the checkpoint's ledger (e.g. a checkpoint without a log position)
    is not stored twice."""
    first = world.learner("os")
    actor = world.actor(first)
    for _ in range(4):
        actor.send()
    replay_state, ledger, _ = first.checkpoint()
    second = world.learner("os", replay_state, ledger, 0)
    assert second.recovered["skipped"] == 4 and second.recovered["batches"] == 0
    assert len(second.replay) == len(first.replay)


@pytest.mark.parametrize("durability", ["os", "fsync"])
def test_a_full_disk_stops_acknowledging_and_writing_again_resumes(
    world, durability, file_size_limit, monkeypatch
):
    monkeypatch.setattr(settler, "STORAGE_RETRY_S", 0.2)
    learner = world.learner(durability)
    actor = world.actor(learner)
    assert actor.send()["kind"] == protocol.ACK
    stored = len(learner.replay)
    size = sum(p.stat().st_size for _, p in learner.server.wal.segments())
    file_size_limit(size + 10)  # the disk is "full": no further record fits
    refused = actor.send()
    assert refused["kind"] == protocol.ERROR and refused["code"] == "unavailable"
    assert refused["seq"] == actor.seq  # the actor keeps that batch (actors/actor.py KEEP_ON_ERROR)
    assert learner.server.rejected["unavailable"] == 1
    assert len(learner.replay) == stored and not learner.server.ledger.stored("inst-a", actor.seq)
    assert learner.server.storage_error
    grant = learner.server.ledger.grant("inst-a", open_=True)
    assert grant == actor.grant, "grants must not grow while nothing can be stored"
    again = actor.resend()  # within the retry pause: refused without touching the disk
    assert again["code"] == "unavailable" and learner.server.wal.stats["write_errors"] == 1
    assert len(learner.logged) == 1 and "cannot write the log" in learner.logged[0]
    file_size_limit(None)  # space again
    time.sleep(0.25)
    ack = actor.resend()
    assert ack["kind"] == protocol.ACK and ack["accepted"] == 2 and not ack["duplicate"]
    assert learner.server.storage_error == "" and "again" in learner.logged[-1]
    assert len(learner.replay) == stored + 2
    # What the log holds is exactly what was acknowledged: a restart recovers both batches once.
    restarted = world.learner(durability)
    assert restarted.recovered["batches"] == 2 and restarted.server.wal.stats["corrupt_records"] == 0
