"""The learner forgets an actor only for the actor's own silence, never for its own busy spells.

A learner that is busy on its main thread (a checkpoint save, a publish, a large batch sampled and
collated; it compiles and trains on a helper thread while serving, tests/test_learner_liveness.py) reads
no messages for a while; the actor's heartbeats wait in the socket meanwhile. Those must count as heard
once the learner reads them, however long the learner was away, while an actor that really went silent is
still forgotten after `actor_timeout` of listening."""

from __future__ import annotations

import time

import numpy as np
import zmq

from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from learner.ingest.registry import ActorRegistry
from learner.ingest.server import IngestServer
from learner.ingest.transport import Transport
from learner.setup.ingest import ingest_server

MODEL = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2,
                    d_model=8, num_heads=2, num_layers=1, mlp_dim=8)  # fmt: skip
TIMEOUT_S = 0.5


def _server() -> IngestServer:
    server = ingest_server(
        Transport("127.0.0.1", 0, 0), ActorRegistry(actor_timeout=TIMEOUT_S),
        welcome_fields={"model": MODEL.to_dict(), "max_steps": 4},
        episode_spec=featurize.episode_spec(MODEL, 0), max_steps=4,
        on_episodes=lambda *_: None, heartbeat_every=60.0,
    )  # fmt: skip
    server.publish(0, {"w": np.zeros(3, np.float32)})
    return server


def _poll_until(server: IngestServer, cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        server.poll(10)


def _welcomed_actor(server: IngestServer, ctx: zmq.Context) -> tuple[zmq.Socket, int]:
    """A DEALER that shook hands and sent one heartbeat (an actor is active once it sends after WELCOME)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{server.ingest_port}")
    hello = protocol.Hello("a", 1, "instance-a", 1).to_msg()
    sock.send(wire.encode(hello))
    _poll_until(server, lambda: sock.poll(0), "the WELCOME")
    actor_id = protocol.Welcome.from_msg(protocol.parse(sock.recv())).actor_id
    sock.send(wire.encode(protocol.ActorHeartbeat(actor_id).to_msg()))
    _poll_until(server, lambda: server.connected_actors() == 1, "the actor to count as connected")
    return sock, actor_id


def test_heartbeats_that_waited_while_the_learner_was_busy_keep_the_actor():
    server, ctx = _server(), zmq.Context()
    try:
        sock, actor_id = _welcomed_actor(server, ctx)
        beats = 0
        busy_until = time.monotonic() + 3 * TIMEOUT_S  # the learner reads nothing for 3 timeouts
        while time.monotonic() < busy_until:
            sock.send(wire.encode(protocol.ActorHeartbeat(actor_id).to_msg()))
            beats += 1
            time.sleep(TIMEOUT_S / 5)
        # Back from the long spell, the loop logs (asks the count) before it polls: nobody is forgotten.
        assert server.connected_actors() == 1
        server.poll(0)
        assert server.connected_actors() == 1, "an actor whose heartbeats waited in the socket was forgotten"
        replies = 0
        while sock.poll(1000) and replies < beats:
            assert protocol.parse(sock.recv())["kind"] == protocol.HEARTBEAT
            replies += 1
        assert replies == beats, "every waiting heartbeat is answered"
    finally:
        ctx.destroy(0)
        server.close()


def test_an_actor_silent_while_the_learner_listens_is_forgotten():
    server, ctx = _server(), zmq.Context()
    try:
        _welcomed_actor(server, ctx)
        started = time.monotonic()
        _poll_until(server, lambda: server.connected_actors() == 0, "the silent actor to be forgotten")
        assert time.monotonic() - started >= TIMEOUT_S * 0.9, "forgotten before actor_timeout"
        assert server.actors == {}
    finally:
        ctx.destroy(0)
        server.close()
