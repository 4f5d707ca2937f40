"""The message dataclasses of common/protocol/messages.py: each parser refuses every bad field with the code the
learner counts, each `to_msg` is byte for byte what both sides sent before, and the actor's connection
turns malformed replies into `bad_replies` instead of acting on them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from actors.connection import LearnerConnection
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from common.protocol import ProtocolError
from tests.test_fake_actor import make_episode
from tests.test_fuzz_ingest import MODEL, Peer, RunningIngest

CFG = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2)


def msg_of(kind: str, **fields) -> dict:
    return protocol.parse(wire.encode(protocol.message(kind, **fields)))


def refused(parser, msg: dict) -> str:
    """The code `parser.from_msg` raises for `msg` (the test fails if it accepts it)."""
    with pytest.raises(ProtocolError) as e:
        parser.from_msg(msg)
    return e.value.code


# ---- every valid message: parsed back to itself, and the bytes both sides have always sent ----------------
HELLO = protocol.Hello("box-1", 4, "i" * 32, 3, pid=4242)
WELCOME = protocol.Welcome("0123456789ab", 7, 5, 2, 10, 1.0, CFG, 16, "sync")
TRAJ = protocol.Traj(7, 3, ["anything: not checked until validate"])
ACK = protocol.Ack(3, 2, False, 11)
PARAM_REQ = protocol.ParamReq(7, -1)
ACTOR_BEAT = protocol.ActorHeartbeat(7)
BEAT = protocol.Heartbeat("0123456789ab", 5, 11)
ERROR = protocol.Error("bad_array", "episode 0 reward ünïcode", seq=3)
MESSAGES = [HELLO, WELCOME, TRAJ, ACK, PARAM_REQ, ACTOR_BEAT, BEAT, ERROR]


@pytest.mark.parametrize("message", MESSAGES, ids=[type(m).__name__ for m in MESSAGES])
def test_every_message_survives_the_wire(message):
    parsed = protocol.parse(wire.encode(message.to_msg()))
    assert type(message).from_msg(parsed) == message


def test_to_msg_sends_the_same_bytes_as_before():
    """The field order of each map is what the learner and the reference actor sent before the dataclasses
    (msgpack keeps it), so the bytes on the wire did not change."""
    m = protocol.message
    old = [
        (HELLO, m("HELLO", actor="box-1", num_envs=4, pid=4242, instance="i" * 32, first_unacked=3)),
        (protocol.Hello("a1", 16, "i1", 1), m("HELLO", actor="a1", num_envs=16, instance="i1", first_unacked=1)),
        (
            WELCOME,
            m("WELCOME", run_id="0123456789ab", actor_id=7, policy_version=5, acked_upto=2, grant=10,
              heartbeat_every=1.0, model=CFG.to_dict(), max_steps=16, mode="sync"),
        ),
        (
            protocol.Welcome("r", 1, 0, 0, 8, 1.0, CFG, 16),  # no mode: the field is left out (async)
            m("WELCOME", run_id="r", actor_id=1, policy_version=0, acked_upto=0, grant=8, heartbeat_every=1.0,
              model=CFG.to_dict(), max_steps=16),
        ),
        (TRAJ, m("TRAJ", actor_id=7, seq=3, episodes=TRAJ.episodes)),
        (ACK, m("ACK", seq=3, accepted=2, duplicate=False, grant=11)),
        (PARAM_REQ, m("PARAM_REQ", actor_id=7, have_version=-1)),
        (ACTOR_BEAT, m("HEARTBEAT", actor_id=7)),
        (BEAT, m("HEARTBEAT", run_id="0123456789ab", policy_version=5, grant=11)),
        (ERROR, m("ERROR", code="bad_array", reason="episode 0 reward ünïcode", seq=3)),
        (protocol.Error("invalid", "x"), m("ERROR", code="invalid", reason="x")),
    ]  # fmt: skip
    for message, before in old:
        assert wire.encode(message.to_msg()) == wire.encode(before), message
    assert protocol.error("bad_array", "x", seq=3) == wire.encode(
        m("ERROR", code="bad_array", reason="x", seq=3)
    )


# ---- each parser refuses each bad field: missing, wrongly typed, bool for an int, out of range -----------
def bad_variants(good: dict, field: str, wrong: list) -> list[dict]:
    missing = {k: v for k, v in good.items() if k != field}
    return [missing, *({**good, field: w} for w in wrong)]


INT = ["3", 3.0, True, None, [3]]
STR = [3, b"bytes", True, None, ["x"]]
CASES = [
    (protocol.Hello, HELLO, "actor", STR),
    (protocol.Hello, HELLO, "num_envs", [*INT, 0, -1]),
    (protocol.Hello, HELLO, "instance", [*STR, "", "i" * (protocol.MAX_INSTANCE + 1)]),
    (protocol.Hello, HELLO, "first_unacked", [*INT, 0]),
    (protocol.Welcome, WELCOME, "run_id", STR),
    (protocol.Welcome, WELCOME, "actor_id", [*INT, 0]),
    (protocol.Welcome, WELCOME, "policy_version", INT),
    (protocol.Welcome, WELCOME, "acked_upto", [*INT, -1]),
    (protocol.Welcome, WELCOME, "grant", [*INT, -1]),
    (protocol.Welcome, WELCOME, "heartbeat_every", ["1", True, None]),
    (
        protocol.Welcome,
        WELCOME,
        "model",
        [None, "x", [1], {**CFG.to_dict(), "d_model": True}, {**CFG.to_dict(), "d_model": 0}, {"wings": 2}],
    ),
    (protocol.Welcome, WELCOME, "max_steps", [*INT, 0]),
    (protocol.Traj, TRAJ, "actor_id", INT),
    (protocol.Traj, TRAJ, "seq", [*INT, 0, -5]),
    (protocol.Ack, ACK, "seq", INT),
    (protocol.Ack, ACK, "grant", INT),
    (protocol.ParamReq, PARAM_REQ, "actor_id", INT),
    (protocol.ActorHeartbeat, ACTOR_BEAT, "actor_id", INT),
    (protocol.Heartbeat, BEAT, "run_id", STR),
    (protocol.Heartbeat, BEAT, "policy_version", INT),
    (protocol.Heartbeat, BEAT, "grant", INT),
    (protocol.Error, ERROR, "code", STR),
    (protocol.Error, ERROR, "reason", STR),
]


@pytest.mark.parametrize(
    ("parser", "good", "field", "wrong"), CASES, ids=[f"{c[0].__name__}.{c[2]}" for c in CASES]
)
def test_a_bad_required_field_is_bad_field(parser, good, field, wrong):
    msg = protocol.parse(wire.encode(good.to_msg()))
    for bad in bad_variants(msg, field, wrong):
        assert refused(parser, bad) == "bad_field", bad


@pytest.mark.parametrize(
    ("parser", "good", "field", "wrong"),
    [
        (protocol.Welcome, WELCOME, "mode", [3, True, None, "", "turbo"]),
        (protocol.Ack, ACK, "accepted", INT),
        (protocol.Ack, ACK, "duplicate", [0, 1, "yes", None]),
        (protocol.Error, ERROR, "seq", INT),
    ],
    ids=["Welcome.mode", "Ack.accepted", "Ack.duplicate", "Error.seq"],
)
def test_an_optional_field_may_be_absent_but_not_wrong(parser, good, field, wrong):
    msg = protocol.parse(wire.encode(good.to_msg()))
    for bad in bad_variants(msg, field, wrong)[1:]:
        assert refused(parser, bad) == "bad_field", bad
    absent = parser.from_msg({k: v for k, v in msg.items() if k != field})
    assert getattr(absent, field) == {"mode": None, "accepted": 0, "duplicate": False, "seq": None}[field]


def test_informational_fields_are_never_refused():
    """HELLO `pid` and PARAM_REQ `have_version` are informational (docs/PROTOCOL.md §4): the learner
    never refused a message over them, and still does not."""
    hello = HELLO.to_msg()
    for pid in ("x", True, None, 1.5):
        assert protocol.Hello.from_msg({**hello, "pid": pid}).pid is None
    for have in ("x", True, None, 1.5):
        assert protocol.ParamReq.from_msg({**PARAM_REQ.to_msg(), "have_version": have}).have_version == -1
    assert protocol.ParamReq.from_msg(msg_of("PARAM_REQ", actor_id=2)) == protocol.ParamReq(2, -1)


def test_hello_keeps_the_first_characters_of_a_long_name():
    msg = {**HELLO.to_msg(), "actor": "n" * 1000}
    assert protocol.Hello.from_msg(msg).actor == "n" * protocol.MAX_TEXT


def test_the_reasons_name_the_message_and_the_field():
    msg = HELLO.to_msg()
    with pytest.raises(ProtocolError, match="HELLO needs field 'num_envs' of type int"):
        protocol.Hello.from_msg({**msg, "num_envs": True})
    with pytest.raises(ProtocolError, match="HELLO num_envs must be at least 1, got 0"):
        protocol.Hello.from_msg({**msg, "num_envs": 0})
    with pytest.raises(ProtocolError, match="TRAJ seq must be at least 1, got 0"):
        protocol.Traj.from_msg({**TRAJ.to_msg(), "seq": 0})
    with pytest.raises(ProtocolError, match="WELCOME model: model config field d_model"):
        protocol.Welcome.from_msg({**WELCOME.to_msg(), "model": {**CFG.to_dict(), "d_model": -1}})


def test_actor_id_of_takes_only_an_int():
    assert protocol.actor_id_of({"kind": "TRAJ", "actor_id": 4}) == 4
    for bad in ({"kind": "TRAJ"}, {"kind": "TRAJ", "actor_id": True}, {"kind": "TRAJ", "actor_id": "4"}):
        with pytest.raises(ProtocolError) as e:
            protocol.actor_id_of(bad)
        assert e.value.code == "bad_field"


def test_require_refuses_bool_for_any_number_type():
    msg = {"kind": "WELCOME", "x": True, "y": 2.5, "z": False}
    with pytest.raises(ProtocolError):
        protocol.require(msg, "x", (int, float))
    assert protocol.require(msg, "y", (int, float)) == 2.5
    assert protocol.require(msg, "z", bool) is False


def test_traj_checks_its_episodes_only_when_asked():
    """A duplicate batch is acknowledged without looking at its episodes, so parsing a TRAJ checks only
    `actor_id` and `seq`; `validate` then checks the episodes exactly as `validate_episodes` does."""
    spec = featurize.episode_spec(MODEL, text_vocab_size=0)
    for junk in (None, "x", [], [1]):
        traj = protocol.Traj.from_msg(msg_of("TRAJ", actor_id=1, seq=2, episodes=junk))
        assert (traj.actor_id, traj.seq, traj.episodes) == (1, 2, junk)
        with pytest.raises(ProtocolError) as e:
            traj.validate(spec, 4, 0)
        assert e.value.code == "bad_field"
    episodes = [make_episode(MODEL.to_dict(), 3, np.random.default_rng(2))]
    traj = protocol.Traj.from_msg(protocol.parse(wire.encode(protocol.Traj(1, 2, episodes).to_msg())))
    (ep,) = traj.validate(spec, 4, 0)
    assert ep.length == 3


def test_traj_packs_episode_lists_and_keeps_a_packed_map_as_it_came():
    """A sender's list of episode maps is packed by `to_msg` (PROTOCOL.md 6); a parsed TRAJ keeps its packed
    map untouched until `validate`, which never packs: a list on the wire is a version 2 sender's."""
    spec, rng = featurize.episode_spec(MODEL, text_vocab_size=0), np.random.default_rng(4)
    episodes = [make_episode(MODEL.to_dict(), n, rng) for n in (1, 3)]
    msg = protocol.Traj(1, 2, episodes).to_msg()
    assert set(msg["episodes"]) == {"task", "arrays", "data"} and msg["episodes"]["task"] == ["fake_task"] * 2
    parsed = protocol.Traj.from_msg(protocol.parse(wire.encode(msg)))
    assert parsed.episodes["arrays"] == msg["episodes"]["arrays"]
    assert bytes(parsed.episodes["data"]) == bytes(msg["episodes"]["data"])
    assert protocol.Traj(1, 2, parsed.episodes).to_msg()["episodes"] is parsed.episodes  # not packed again
    assert [ep.length for ep in parsed.validate(spec, 4, 0)] == [1, 3]
    with pytest.raises(ProtocolError) as e:
        protocol.Traj(1, 2, episodes).validate(spec, 4, 0)
    assert e.value.code == "bad_field"


# ---- the learner: same checks in the same order, so the same `rejected` codes --------------------------
def ask(peer: Peer, msg: dict) -> dict:
    """Send one message; the first reply that is not a HEARTBEAT (the learner beats every second)."""
    peer.sock.send(wire.encode(msg))
    while True:
        assert peer.sock.poll(5000), "the learner did not answer"
        reply = protocol.parse(peer.sock.recv())
        if reply["kind"] != protocol.HEARTBEAT:
            return reply


@pytest.fixture
def ingest():
    running = RunningIngest()
    yield running
    running.close()


def test_the_learner_checks_the_actor_before_the_fields_of_its_message(ingest):
    peer = Peer(ingest, "order")
    try:
        stranger = peer.actor_id + 100
        sent = [
            (protocol.message("TRAJ", actor_id=stranger, seq="x"), "not_welcomed"),  # not bad_field
            (protocol.message("TRAJ", actor_id=True, seq=1), "bad_field"),
            (protocol.message("TRAJ", actor_id=peer.actor_id, seq=0), "bad_field"),
            (protocol.message("TRAJ", actor_id=peer.actor_id, seq=True), "bad_field"),
            (protocol.message("HELLO", actor="a", num_envs=True, instance="i", first_unacked=1), "bad_field"),
            (protocol.message("HEARTBEAT"), "bad_field"),
            (protocol.message("WELCOME", actor_id=peer.actor_id), "unexpected_kind"),
            (protocol.message("ACK", actor_id=stranger, seq=1, grant=1), "not_welcomed"),
        ]
        for msg, code in sent:
            reply = ask(peer, msg)
            assert (reply["kind"], reply.get("code")) == ("ERROR", code), (msg, reply)
        assert (
            peer.request([wire.encode(protocol.ActorHeartbeat(peer.actor_id).to_msg())])["kind"]
            == "HEARTBEAT"
        )
        assert ingest.server.rejected == {"not_welcomed": 2, "bad_field": 5, "unexpected_kind": 1}
    finally:
        peer.close()


def test_a_duplicate_is_acknowledged_without_checking_its_episodes_again(ingest):
    peer = Peer(ingest, "dup")
    try:
        episodes = [make_episode(MODEL.to_dict(), 2, np.random.default_rng(3))]
        first = protocol.Ack.from_msg(ask(peer, protocol.Traj(peer.actor_id, 1, episodes).to_msg()))
        assert (first.seq, first.accepted, first.duplicate) == (1, 1, False)
        again = ask(peer, protocol.Traj(peer.actor_id, 1, "not episodes").to_msg())
        assert protocol.Ack.from_msg(again) == protocol.Ack(1, 0, True, again["grant"])
        refusal = protocol.Error.from_msg(ask(peer, protocol.Traj(peer.actor_id, 2, "not episodes").to_msg()))
        assert (refusal.code, refusal.seq) == ("bad_field", 2)
        assert len(ingest.stored) == 1 and ingest.server.duplicates == 1
        assert ingest.server.rejected == {"bad_field": 1}
    finally:
        peer.close()


def test_the_learner_refuses_older_peers_and_broken_packing(ingest):
    """A version 2 (or 5) HELLO or TRAJ gets `bad_version` (version 3 packed the episodes). Version 3 peers,
    served or refused by the run's family: tests/test_protocol_v3_peer.py."""
    peer = Peer(ingest, "packing")
    try:
        rng = np.random.default_rng(5)
        episodes = [make_episode(MODEL.to_dict(), n, rng) for n in (2, 1)]
        old_hellos = [
            {"v": v, "kind": "HELLO", "actor": "old", "num_envs": 1, "instance": "old", "first_unacked": 1}
            for v in (2,)
        ]
        old_traj = {"v": 2, "kind": "TRAJ", "actor_id": peer.actor_id, "seq": 1, "episodes": episodes}
        # each refused v4 batch has a seq of its own: a batch refused for good settles its seq
        v2_list = protocol.message("TRAJ", actor_id=peer.actor_id, seq=1, episodes=episodes)  # old episodes
        broken = protocol.Traj(peer.actor_id, 2, episodes).to_msg()
        broken["episodes"]["arrays"][1][3] += 8  # the second array out of place
        short = protocol.Traj(peer.actor_id, 3, episodes).to_msg()
        short["episodes"]["data"] = bytes(short["episodes"]["data"])[:-1]
        five = {**old_hellos[0], "v": 5}  # a newer peer
        for msg, code in [
            (five, "bad_version"),
            *((hello, "bad_version") for hello in old_hellos),
            (old_traj, "bad_version"),
            (v2_list, "bad_field"),
            (broken, "bad_encoding"),
            (short, "bad_encoding"),
        ]:
            reply = ask(peer, msg)
            assert (reply["kind"], reply.get("code")) == ("ERROR", code), (msg.get("v"), reply)
            assert reply.get("seq") == (
                msg["seq"] if msg["v"] == protocol.PROTOCOL_VERSION else None
            )  # a refused v4 TRAJ names its batch
        ack = protocol.Ack.from_msg(ask(peer, protocol.Traj(peer.actor_id, 4, episodes).to_msg()))
        assert (ack.seq, ack.accepted, ack.duplicate) == (4, 2, False)
        assert ingest.server.rejected == {"bad_version": 3, "bad_field": 1, "bad_encoding": 2}
        for ep, want in zip(ingest.stored, episodes, strict=True):
            assert ep.length == len(want["reward"]) and ep.task == want["task"]
            for name in protocol.STEP_ARRAYS:
                np.testing.assert_array_equal(ep.steps[name], want[name])
            for key, arr in want["obs"].items():
                np.testing.assert_array_equal(ep.obs[key], arr)
    finally:
        peer.close()


def test_the_learner_refuses_welcome_fields_it_cannot_send():
    from learner.ingest.server import RunWelcome

    with pytest.raises(TypeError):  # when the ingest is built (learner/setup/ingest.py), before any HELLO
        RunWelcome("run", 1.0, {"model": MODEL, "max_steps": 4, "colour": "red"})


# ---- the actor's connection: typed replies, malformed ones counted, one heartbeat cadence ---------------
class Router:
    """A bare ROUTER standing in for the learner, to send the actor's connection whatever we like."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.params_port = self.pub.bind_to_random_port("tcp://127.0.0.1")

    def recv(self) -> tuple[bytes, dict]:
        assert self.sock.poll(10_000), "the connection sent nothing"
        identity, data = self.sock.recv_multipart()
        return identity, protocol.parse(data)

    def send(self, identity: bytes, msg: dict) -> None:
        self.sock.send_multipart([identity, wire.encode(msg)])

    def close(self) -> None:
        self.sock.close(0)
        self.pub.close(0)
        self.ctx.term()


@pytest.fixture
def router_and_conn():
    router = Router()
    logs: list[str] = []
    conn = LearnerConnection("127.0.0.1", router.port, router.params_port, log=logs.append)
    conn.logs = logs
    yield router, conn
    conn.close()
    router.close()


def test_the_handshake_waits_past_a_malformed_welcome(router_and_conn):
    router, conn = router_and_conn

    def learner():
        identity, hello = router.recv()
        assert protocol.Hello.from_msg(hello).instance == "inst"
        router.send(identity, {**WELCOME.to_msg(), "grant": True})  # malformed: ignored, counted
        router.send(identity, WELCOME.to_msg())

    thread = threading.Thread(target=learner)
    thread.start()
    welcome = conn.handshake("t", 2, "inst", lambda: 1, timeout=5, max_backoff=5, should_stop=lambda: False)
    thread.join()
    assert welcome == WELCOME and conn.welcome == WELCOME and conn.actor_id == WELCOME.actor_id
    assert conn.stats["bad_replies"] == 1
    assert any("malformed WELCOME" in line for line in conn.logs)


def test_receive_returns_typed_replies_and_counts_malformed_ones(router_and_conn):
    router, conn = router_and_conn
    conn._new_dealer()
    conn.actor_id = 7
    assert conn.heartbeat_if_due(60.0)
    identity, beat = router.recv()
    assert protocol.ActorHeartbeat.from_msg(beat) == protocol.ActorHeartbeat(7)
    sent = [
        ACK.to_msg(),
        {**ACK.to_msg(), "grant": True},  # bool for an int
        {k: v for k, v in BEAT.to_msg().items() if k != "run_id"},  # missing
        BEAT.to_msg(),
        {**ERROR.to_msg(), "seq": "3"},  # mistyped
        ERROR.to_msg(),
        WELCOME.to_msg(),  # a late WELCOME (an abandoned HELLO's): not a reply, dropped
        protocol.message("HELLO"),  # not something a learner sends: dropped
    ]
    for msg in sent:
        router.send(identity, msg)
    replies: list = []
    deadline = time.monotonic() + 10
    while len(replies) < 3 and time.monotonic() < deadline:
        conn.wait(100)
        replies += conn.receive()[0]
    assert replies == [ACK, BEAT, ERROR]
    assert conn.stats["bad_replies"] == 3


def test_heartbeat_if_due_keeps_one_cadence(router_and_conn):
    router, conn = router_and_conn
    conn._new_dealer()
    conn.actor_id = 5
    assert conn.heartbeat_if_due(0.3)  # never sent: due at once
    assert not conn.heartbeat_if_due(0.3)
    time.sleep(0.35)
    assert conn.heartbeat_if_due(0.3)
    assert not conn.heartbeat_if_due(0.3)
    for _ in range(2):
        assert router.recv()[1] == protocol.message("HEARTBEAT", actor_id=5)
    assert not router.sock.poll(200)
