"""A protocol version 3 actor and today's learner: a pointer-family run serves it (version 4 left the pointer
family's episodes as they were), every reply in version 3, which is all such an actor reads; a run whose
family or model needs version 4 refuses it with `bad_version` and says why. The version 3 HELLO and TRAJ
are recorded bytes (tests/data/README.md says how)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zmq

from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from common.protocol import compat
from learner.ingest.peer_versions import PeerVersions
from learner.ingest.registry import ActorRegistry
from learner.ingest.transport import Transport
from learner.setup.ingest import ingest_server

DATA = Path(__file__).parent / "data"
HELLO_V3 = (DATA / "v3_pointer_hello.bin").read_bytes()
TRAJ_V3 = (DATA / "v3_pointer_traj.bin").read_bytes()
MODEL = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=32, max_element_tokens=2,
                    d_model=8, num_heads=2, num_layers=1, mlp_dim=8)  # fmt: skip
"""The model the recording's actor was told (tests/data/README.md)."""
MAX_STEPS = 4
SHAPED_SPEC = protocol.EpisodeSpec(
    observations={"prompt_ids": ((6,), "<i4")},
    choices={"action_tokens": ("<i4", 50)},
    choice_shapes={"action_tokens": (3,)},
    step_logps={"token_logp": (3,)},
)
"""A family with version 4's layout: per-step arrays with a row shape and step log-probs (as the lm one)."""


class Learner:
    """Today's learner ingest on loopback, polled on the test's thread, and one actor's DEALER."""

    def __init__(self, spec: protocol.EpisodeSpec, model: ModelConfig = MODEL):
        self.stored: list[protocol.Episode] = []
        self.server = ingest_server(
            Transport("127.0.0.1", 0, 0, peers=PeerVersions(spec, model)), ActorRegistry(actor_timeout=3600),
            welcome_fields={"model": model.to_dict(), "max_steps": MAX_STEPS}, episode_spec=spec,
            max_steps=MAX_STEPS, on_episodes=lambda eps, _record: self.stored.extend(eps),
            credit=1000, heartbeat_every=3600,
        )  # fmt: skip
        self.server.publish(0, {"w": np.arange(3, dtype=np.float32)})
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{self.server.ingest_port}")

    def receive(self) -> list[bytes]:
        for _ in range(500):
            if self.sock.poll(0):
                return self.sock.recv_multipart()
            self.server.poll(10)
        raise AssertionError("the learner did not answer")

    def ask(self, data: bytes) -> list[bytes]:
        self.sock.send(data)
        return self.receive()

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
        self.server.close()


def as_v3(frame: bytes) -> dict:
    """A reply as a version 3 actor parses it: its envelope accepts `v` = 3 only."""
    return protocol.parse(frame, (3,))


@pytest.fixture
def pointer_learner():
    learner = Learner(featurize.episode_spec(MODEL, 0))
    yield learner
    learner.close()


def test_the_recordings_are_version_3_pointer_messages():
    hello, traj = wire.decode(HELLO_V3), wire.decode(TRAJ_V3)
    assert (hello["v"], hello["kind"], traj["v"], traj["kind"]) == (3, "HELLO", 3, "TRAJ")
    assert traj["episodes"]["task"] == ["contacts.edit_number", "settings.wifi_off_airplane_on"]
    with pytest.raises(protocol.ProtocolError, match="bad_version"):
        protocol.parse(HELLO_V3)  # outside the learner's ingest, this side speaks 4 only


def test_a_version_3_pointer_actor_is_served_in_version_3(pointer_learner):
    learner = pointer_learner
    welcome = as_v3(learner.ask(HELLO_V3)[0])
    assert welcome["kind"] == "WELCOME" and welcome["actor_id"] == 1
    assert set(welcome["model"]) <= compat.V3_MODEL_FIELDS  # a version 3 actor refuses unknown fields
    assert ModelConfig.from_dict(welcome["model"]) == MODEL  # the others are at their defaults
    assert protocol.Welcome.from_msg(welcome).max_steps == MAX_STEPS

    ack = protocol.Ack.from_msg(as_v3(learner.ask(TRAJ_V3)[0]))
    assert (ack.seq, ack.accepted, ack.duplicate) == (1, 2, False)
    assert [ep.task for ep in learner.stored] == ["contacts.edit_number", "settings.wifi_off_airplane_on"]
    packed = protocol.unpack_episodes(wire.decode(TRAJ_V3)["episodes"]).arrays
    for name in protocol.STEP_ARRAYS:
        np.testing.assert_array_equal(np.concatenate([ep.steps[name] for ep in learner.stored]), packed[name])
    again = protocol.Ack.from_msg(as_v3(learner.ask(TRAJ_V3)[0]))
    assert (again.seq, again.accepted, again.duplicate) == (1, 0, True)
    assert len(learner.stored) == 2 and learner.server.rejected == {}

    beat = as_v3(learner.ask(wire.encode({"v": 3, "kind": "HEARTBEAT", "actor_id": 1}))[0])
    assert protocol.Heartbeat.from_msg(beat).policy_version == 0
    frames = learner.ask(wire.encode({"v": 3, "kind": "PARAM_REQ", "actor_id": 1, "have_version": -1}))
    assert_params_v3(frames, 0, np.arange(3, dtype=np.float32))
    learner.server.publish(1, {"w": np.ones(3, np.float32)})  # the PUB's is version 4: pushed on the ROUTER
    assert_params_v3(learner.receive(), 1, np.ones(3, np.float32))


def assert_params_v3(frames: list[bytes], version: int, w: np.ndarray) -> None:
    head = as_v3(frames[0])
    assert (head["kind"], head["version"], head["names"]) == ("PARAMS", version, ["w"])
    assert head["crc32"] == protocol.snapshot_crc32(frames[1:])
    np.testing.assert_array_equal(np.frombuffer(frames[1], np.float32), w)


def test_a_version_4_actor_beside_it_is_served_in_version_4(pointer_learner):
    learner = pointer_learner
    as_v3(learner.ask(HELLO_V3)[0])
    as_v3(learner.ask(wire.encode({"v": 3, "kind": "HEARTBEAT", "actor_id": 1}))[0])  # live after WELCOME
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{learner.server.ingest_port}")
        sock.send(wire.encode(protocol.Hello("v4", 1, "v4-instance", 1).to_msg()))
        while not sock.poll(0):
            learner.server.poll(10)
        welcome = protocol.Welcome.from_msg(protocol.parse(sock.recv()))
        assert welcome.actor_id == 2 and welcome.model == MODEL
        learner.server.publish(1, {"w": np.ones(3, np.float32)})
        assert_params_v3(learner.receive(), 1, np.ones(3, np.float32))
        assert not sock.poll(200)  # a version 4 actor takes its snapshots from the PUB only
    finally:
        sock.close(0)
        ctx.term()


@pytest.mark.parametrize(
    ("spec", "model", "why"),
    [
        (SHAPED_SPEC, MODEL, "per-step arrays ['action_tokens', 'token_logp']"),
        (featurize.episode_spec(MODEL, 0), ModelConfig(**{**MODEL.to_dict(), "history": 2}), "['history']"),
    ],
    ids=["a family with version 4's layout", "a model with fields version 3 does not know"],
)
def test_a_version_3_peer_that_the_run_cannot_serve_gets_bad_version(spec, model, why):
    learner = Learner(spec, model)
    try:
        refusal = protocol.Error.from_msg(as_v3(learner.ask(HELLO_V3)[0]))  # in a form it reads
        assert refusal.code == "bad_version" and why in refusal.reason and "needs version 4" in refusal.reason
        refusal = protocol.Error.from_msg(as_v3(learner.ask(TRAJ_V3)[0]))
        assert (refusal.code, refusal.seq) == ("bad_version", 1)
        assert learner.stored == [] and learner.server.rejected == {"bad_version": 2}
        assert learner.server.connected_actors() == 0
    finally:
        learner.close()


def test_a_version_2_peer_gets_bad_version_in_version_4(pointer_learner):
    v2 = wire.encode({**wire.decode(HELLO_V3), "v": 2})
    refusal = protocol.Error.from_msg(protocol.parse(pointer_learner.ask(v2)[0]))
    assert refusal.code == "bad_version" and refusal.reason == "protocol version 2, this side speaks 3 or 4"
