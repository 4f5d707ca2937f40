"""A batch refused for good settles its seq: the actor's grant keeps rising past it, a rejoin does not count
it as lost in a restart, and neither a resend nor a learner restart stores it.

A real IngestServer on loopback (with or without its write-ahead log) and a DEALER speaking the protocol
as the reference actor does: it drops a batch refused with a code other than no_credit / not_welcomed /
unavailable, and never sends a seq beyond its grant."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from benchmarks.ingest import random_episode
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from learner.ingest.registry import ActorRegistry
from learner.ingest.server import IngestServer
from learner.ingest.transport import Transport
from learner.ingest.wal import WriteAheadLog
from learner.setup.ingest import ingest_server

MODEL = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2,
                    d_model=8, num_heads=2, num_layers=1, mlp_dim=8)  # fmt: skip
MAX_STEPS = 4
CREDIT = 4


def _server(durability: str, wal_dir) -> tuple[IngestServer, list]:
    stored: list[protocol.Episode] = []
    wal = WriteAheadLog(wal_dir, durability) if durability != "none" else None
    server = ingest_server(
        Transport("127.0.0.1", 0, 0), ActorRegistry(),
        welcome_fields={"model": MODEL.to_dict(), "max_steps": MAX_STEPS},
        episode_spec=featurize.episode_spec(MODEL, 0), max_steps=MAX_STEPS,
        on_episodes=lambda eps, _record: stored.extend(eps), credit=CREDIT, heartbeat_every=60.0, wal=wal, log=lambda _: None,
    )  # fmt: skip
    if wal is not None:
        server.recover(0, newest_version=0)
    server.publish(0, {"w": np.zeros(3, np.float32)})
    return server, stored


class _Actor:
    """One actor instance on its own DEALER: HELLO, then numbered batches, as the reference actor sends them."""

    def __init__(self, server: IngestServer, ctx: zmq.Context, first_unacked: int = 1):
        self.server, self.rng = server, np.random.default_rng(0)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{server.ingest_port}")
        self.sock.send(wire.encode(protocol.Hello("a", 1, "inst", first_unacked).to_msg()))
        self.welcome = protocol.Welcome.from_msg(self.reply())
        self.grant = self.welcome.grant

    def reply(self) -> dict:
        deadline = time.monotonic() + 10
        while True:
            while not self.sock.poll(0):
                assert time.monotonic() < deadline, "no reply from the learner"
                self.server.poll(10)
            msg = protocol.parse(self.sock.recv())
            if msg["kind"] != protocol.HEARTBEAT:
                return msg

    def send(self, seq: int, valid: bool = True) -> dict:
        """Batch `seq` (one episode; with `valid` False its behavior_logp is positive: `bad_array`)."""
        episode = random_episode(self.rng, MODEL, 2)
        if not valid:
            episode["behavior_logp"] = np.abs(episode["behavior_logp"]) + 1.0
        self.sock.send(wire.encode(protocol.Traj(self.welcome.actor_id, seq, [episode]).to_msg()))
        reply = self.reply()
        if reply["kind"] == protocol.ACK:
            self.grant = max(self.grant, reply["grant"])
        return reply

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)  # closes the sockets a failed test left open


def _refuse_2_then_send_past_the_first_grant(actor: _Actor) -> int:
    """Seq 1 stored, seq 2 refused for good, then batches up to twice the first grant, each acknowledged
    (the actor never sends past its grant). Returns the last seq sent."""
    assert actor.send(1)["kind"] == protocol.ACK
    refused = actor.send(2, valid=False)
    assert (refused["kind"], refused["code"], refused["seq"]) == ("ERROR", "bad_array", 2)
    last = 2 * actor.welcome.grant + 1
    for seq in range(3, last + 1):
        assert seq <= actor.grant, f"the grant froze at {actor.grant}: seq {seq} cannot be sent"
        ack = actor.send(seq)
        assert (ack["kind"], ack["seq"], ack["accepted"], ack["duplicate"]) == ("ACK", seq, 1, False), ack
    return last


@pytest.mark.parametrize("durability", ["none", "os", "fsync"])
def test_a_refused_batch_does_not_freeze_the_grant(durability, tmp_path, ctx):
    server, stored = _server(durability, tmp_path)
    actor = _Actor(server, ctx)
    try:
        last = _refuse_2_then_send_past_the_first_grant(actor)
        assert actor.grant >= last + CREDIT - 1
        assert len(stored) == last - 1 and server.rejected == {"bad_array": 1}
        resent = actor.send(2)  # a refused batch sent again (its ERROR was lost): settled, never stored
        assert (resent["kind"], resent["accepted"], resent["duplicate"]) == ("ACK", 0, True)
        assert len(stored) == last - 1
    finally:
        actor.close()
        server.close()


@pytest.mark.parametrize("durability", ["none", "fsync"])
def test_a_rejoin_after_a_refusal_counts_nothing_lost(durability, tmp_path, ctx):
    server, _ = _server(durability, tmp_path)
    actor = _Actor(server, ctx)
    try:
        assert actor.send(1)["kind"] == protocol.ACK
        assert actor.send(2, valid=False)["code"] == "bad_array"  # the actor drops seq 2
        last = actor.welcome.grant  # (within the first grant: this holds even where a refusal froze it)
        for seq in range(3, last + 1):
            assert actor.send(seq)["kind"] == protocol.ACK
        again = _Actor(server, ctx, first_unacked=last + 1)  # a new connection, holding nothing
        assert again.welcome.acked_upto == last
        assert server.ledger.lost_in_restart == 0, "no learner restarted: nothing was lost in one"
        again.close()
    finally:
        actor.close()
        server.close()


@pytest.mark.parametrize("durability", ["os", "fsync"])
def test_a_refusal_is_logged_and_stays_settled_after_a_restart(durability, tmp_path, ctx):
    first, _ = _server(durability, tmp_path)
    actor = _Actor(first, ctx)
    assert actor.send(1)["kind"] == protocol.ACK
    assert actor.send(2, valid=False)["code"] == "bad_array"
    actor.close()  # the learner dies here, with no checkpoint: the log is all the next one has
    second, stored = _server(durability, tmp_path)
    try:
        assert second.ledger.state()["streams"]["inst"][:2] == [2, []]
        survivor = _Actor(second, ctx, first_unacked=2)  # an actor that never got its ERROR still holds 2
        assert survivor.welcome.acked_upto == 2 and second.ledger.lost_in_restart == 0
        resent = survivor.send(2)
        assert (resent["kind"], resent["accepted"], resent["duplicate"]) == ("ACK", 0, True)
        assert len(stored) == 1, "only seq 1's episode is stored, once"
        assert survivor.send(3)["accepted"] == 1
        survivor.close()
    finally:
        second.close()
        first.close()
