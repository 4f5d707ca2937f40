"""A fake actor, written from docs/PROTOCOL.md alone, drives the real learner over real ZeroMQ sockets.

Nothing here imports `actors`, `common` or `learner`: the few pieces of the wire format the fake actor
needs (msgpack maps, packed episodes, the array ext type, PARAMS frames) are implemented below with
msgpack, numpy and zmq, exactly as an actor in another language would have to. If the learner drifts from the document,
these tests fail.
"""

from __future__ import annotations

import math
import struct
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tests.conftest import read_jsonl

pytestmark = pytest.mark.timeout(600)

# ---- the wire format, from docs/PROTOCOL.md ------------------------------------------------------------
PROTOCOL_VERSION = 4
ARRAY_EXT_CODE = 1
PACK_ALIGN = 8  # §3.5: each packed array starts at the next multiple of 8 bytes
NUM_ACTION_TYPES = 7  # TAP SWIPE TYPE PRESS_BACK PRESS_HOME PRESS_ENTER STATUS_COMPLETE
NUM_SWIPE_DIRECTIONS = 4  # UP DOWN LEFT RIGHT
NUM_ELEMENT_FEATURES = 10
NUM_INSTRUCTION_FEATURES = 3
STEP_DTYPES = {
    "action_type": "<i4",
    "element": "<i4",
    "word": "<i4",
    "direction": "<i4",
    "behavior_logp": "<f4",
    "reward": "<f4",
    "policy_version": "<i4",
}
MODEL_FIELDS = {
    "vocab_size",
    "max_instruction_tokens",
    "max_elements",
    "max_element_tokens",
    "d_model",
    "num_heads",
    "num_layers",
    "mlp_dim",
    "max_instruction_pieces",
    "max_element_pieces",
}
TEXT_ENCODER_FIELDS = {
    "text_encoder": str,
    "text_encoder_weights": str,
    "text_encoder_sha256": str,
    "text_dim": int,
    "train_text_encoder": bool,
}
LM_FIELDS = {
    "backbone": str,
    "lora_rank": int,
    "lora_layers": int,
    "lm_prompt_tokens": int,
    "lm_action_tokens": int,
    "lm_history": int,
    "lm_max_text_chars": int,
    "lm_temperature": float,
    "lm_constrained": bool,
}
"""The `lm` family's fields (common/config.py), sent whatever the family."""
POINTER_OPTION_FIELDS = {"history": int, "span_words": int, "raw_instruction": bool}
"""The pointer family's generalization options (docs/PROTOCOL.md §4)."""
CONTRACT_FIELDS = {
    "wall": (int, float),
    "update": int,
    "env_steps": int,
    "episodes": int,
    "success_rate": (int, float),
    "policy_version": int,
    "policy_lag_mean": (int, float),
    "actors": int,
    "replay_size": int,
    "rejected": int,
}

REPLY_TIMEOUT = 300.0
"""Seconds to wait for a reply or a snapshot. Generous: the first snapshot after version 0 waits for the
train step's compile (seconds on an idle CPU, a minute or more on a busy one), and a passing test never
waits this long."""


def pack_array(array: np.ndarray) -> msgpack.ExtType:
    """Ext 1: u8 len(dtype), dtype ASCII, u8 ndim, ndim x u64 LE dims, raw C-order little-endian bytes."""
    array = np.ascontiguousarray(array)
    dtype = array.dtype.str
    head = struct.pack("<B", len(dtype)) + dtype.encode("ascii")
    head += struct.pack(f"<B{array.ndim}Q", array.ndim, *array.shape)
    return msgpack.ExtType(ARRAY_EXT_CODE, head + array.tobytes())


def _unpack_array(code: int, data: bytes) -> Any:
    assert code == ARRAY_EXT_CODE, f"unexpected ext code {code}"
    n = data[0]
    dtype = np.dtype(data[1 : 1 + n].decode("ascii"))
    ndim = data[1 + n]
    shape = struct.unpack_from(f"<{ndim}Q", data, 2 + n)
    return np.frombuffer(data, dtype, offset=2 + n + 8 * ndim).reshape(shape)


def encode(msg: Any) -> bytes:
    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return pack_array(obj)
        raise TypeError(type(obj).__name__)

    return msgpack.packb(msg, default=default, use_bin_type=True)


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, ext_hook=_unpack_array)


def message(kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "kind": kind, **fields}


def pack_arrays(arrays: dict[str, np.ndarray]) -> tuple[list[list], bytes]:
    """§3.5: the array table ([name, dtype, shape, offset] each) and the bin: every array's C-order
    little-endian bytes, in table order, each after zero bytes up to the next multiple of 8."""
    table, data = [], bytearray()
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        data += bytes(-len(data) % PACK_ALIGN)
        table.append([name, array.dtype.str, list(array.shape), len(data)])
        data += array.tobytes()
    return table, bytes(data)


def pack_episodes(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """§6: TRAJ `episodes` as a map of the task names, the array table and its bin. The arrays: the
    per-episode `success`, `truncated`, `length` [n], then each per-step array and each `obs/<key>` array
    of all the episodes concatenated along their first axis, episode 0's rows first. (A key whose value
    is None is left out, so that tests can send a batch without it.)"""
    arrays = {
        "success": np.array([ep["success"] for ep in episodes]),
        "truncated": np.array([ep["truncated"] for ep in episodes]),
        "length": np.array([len(ep["reward"]) for ep in episodes], "<i4"),
    }
    for name in [*STEP_DTYPES, "value", "entropy"]:
        if all(ep.get(name) is not None for ep in episodes):
            arrays[name] = np.concatenate([ep[name] for ep in episodes])
    for key in episodes[0]["obs"]:
        if all(ep["obs"].get(key) is not None for ep in episodes):
            arrays[f"obs/{key}"] = np.concatenate([ep["obs"][key] for ep in episodes])
    table, data = pack_arrays(arrays)
    return {"task": [ep["task"] for ep in episodes], "arrays": table, "data": data}


def traj_message(actor_id: int, seq: int, episodes: list[dict[str, Any]]) -> dict[str, Any]:
    return message("TRAJ", actor_id=actor_id, seq=seq, episodes=pack_episodes(episodes))


def parse_params(frames: list[bytes]) -> tuple[int, dict[str, np.ndarray]]:
    """PARAMS: a msgpack header frame, then one raw frame per array in the order of header["names"]."""
    head = decode(frames[0])
    assert head["v"] == PROTOCOL_VERSION and head["kind"] == "PARAMS", head
    names, dtypes, shapes = head["names"], head["dtypes"], head["shapes"]
    assert len(names) == len(dtypes) == len(shapes) == len(frames) - 1
    assert names == sorted(names)
    crc = 0
    for buf in frames[1:]:
        crc = zlib.crc32(buf, crc)
    assert crc == head["crc32"], "the snapshot fails its checksum"
    arrays = {}
    for name, dtype, shape, buf in zip(names, dtypes, shapes, frames[1:], strict=True):
        dt = np.dtype(dtype)
        assert dt.byteorder != ">", dtype
        assert len(buf) == math.prod(shape) * dt.itemsize, (name, dtype, shape, len(buf))
        arrays[name] = np.frombuffer(buf, dt).reshape(shape)
    return head["version"], arrays


# ---- episodes shaped by the model config in WELCOME ------------------------------------------------------
def make_episode(
    model: dict[str, int], length: int, rng: np.random.Generator, *, success: bool = False, version: int = 0
) -> dict[str, Any]:
    """A random but valid episode of `length` steps: observations have length + 1 rows."""
    li, e, le = model["max_instruction_tokens"], model["max_elements"], model["max_element_tokens"]
    vocab, rows = model["vocab_size"], length + 1
    instr_mask = np.arange(li)[None, :] < rng.integers(1, li + 1, size=(rows, 1))
    elem_mask = np.arange(e)[None, :] < rng.integers(1, e + 1, size=(rows, 1))
    words_per_elem = rng.integers(1, le + 1, size=(rows, e, 1))
    elem_words = (np.arange(le)[None, None, :] < words_per_elem) & elem_mask[..., None]
    obs = {
        "instr_tokens": np.where(instr_mask, rng.integers(1, vocab, size=(rows, li)), 0).astype("<i4"),
        "instr_mask": instr_mask,
        "instr_feats": (rng.random((rows, li, NUM_INSTRUCTION_FEATURES)) < 0.5).astype("<f4"),
        "elem_tokens": np.where(elem_words, rng.integers(1, vocab, size=(rows, e, le)), 0).astype("<i4"),
        "elem_mask": elem_mask,
        "elem_feats": (rng.random((rows, e, NUM_ELEMENT_FEATURES)) * elem_mask[..., None]).astype("<f4"),
    }
    steps = {
        "action_type": rng.integers(0, NUM_ACTION_TYPES, size=length),
        "element": rng.integers(0, e, size=length),
        "word": rng.integers(0, li, size=length),
        "direction": rng.integers(0, NUM_SWIPE_DIRECTIONS, size=length),
        "behavior_logp": -rng.exponential(2.0, size=length),
        "reward": np.arange(length) == length - 1 if success else np.zeros(length),
        "policy_version": np.full(length, version),
    }
    return {
        "task": "fake_task",
        "success": success,
        "truncated": not success,
        "obs": obs,
        **{name: np.asarray(steps[name]).astype(dtype) for name, dtype in STEP_DTYPES.items()},
    }


# ---- the fake actor --------------------------------------------------------------------------------------
class FakeActor:
    """A DEALER to the learner's ingest ROUTER and a SUB (subscribed to everything) to its params PUB."""

    def __init__(self, learner, name: str = "fake"):
        self.learner = learner
        self.name = name
        self.ctx = zmq.Context()
        self.dealer: zmq.Socket | None = None
        self.connect()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(learner.params)
        self.welcome: dict[str, Any] = {}
        self.actor_id = -1
        self.seq = 0
        self.instance = f"{name}-{id(self):x}"

    def connect(self, routing_id: bytes | None = None) -> None:
        """(Re)open the DEALER: a new connection, which needs a new HELLO unless its routing id is fixed."""
        if self.dealer is not None:
            self.dealer.close(0)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        if routing_id is not None:
            self.dealer.setsockopt(zmq.ROUTING_ID, routing_id)
        self.dealer.connect(self.learner.ingest)

    @property
    def model(self) -> dict[str, int]:
        return self.welcome["model"]

    def send(self, msg: dict[str, Any]) -> None:
        self.dealer.send(encode(msg))

    def recv_frames(self, timeout: float = REPLY_TIMEOUT) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while not self.dealer.poll(100):
            _check_alive(self.learner, f"{self.name} waiting for a reply")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name}: no reply within {timeout}s\n{self.learner.log()[-3000:]}")
        return self.dealer.recv_multipart()

    def recv(self, timeout: float = REPLY_TIMEOUT, skip_beats: bool = True) -> dict[str, Any]:
        """The next message; the learner's unsolicited HEARTBEATs (one a second) are skipped unless asked."""
        while True:
            frames = self.recv_frames(timeout)
            assert len(frames) == 1, f"expected a single-frame reply, got {len(frames)} frames"
            msg = decode(frames[0])
            assert isinstance(msg, dict) and msg.get("v") == PROTOCOL_VERSION, msg
            if not (skip_beats and msg["kind"] == "HEARTBEAT"):
                return msg

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["kind"] == "HEARTBEAT":  # older unsolicited beats would pass for the reply: drop them first
            while self.dealer.poll(0):
                self.dealer.recv_multipart()
        self.send(msg)
        return self.recv(skip_beats=msg["kind"] != "HEARTBEAT")

    def hello(self, first_unacked: int = 1) -> dict[str, Any]:
        hello = message("HELLO", actor=self.name, num_envs=4, pid=12345, instance=self.instance,
                        first_unacked=first_unacked)  # fmt: skip
        reply = self.request(hello)
        assert reply["kind"] == "WELCOME", reply
        self.welcome, self.actor_id = reply, reply["actor_id"]
        return reply

    def episodes(self, n: int, rng: np.random.Generator, **kw: Any) -> list[dict[str, Any]]:
        max_steps = self.welcome["max_steps"]
        return [make_episode(self.model, int(rng.integers(1, max_steps + 1)), rng, **kw) for _ in range(n)]

    def traj(self, episodes: list[dict[str, Any]], actor_id: int | None = None) -> tuple[int, dict[str, Any]]:
        """Send one TRAJ and return (seq, reply)."""
        self.seq += 1
        aid = self.actor_id if actor_id is None else actor_id
        return self.seq, self.request(traj_message(aid, self.seq, episodes))

    def params_reply(self, have_version: int = -1) -> tuple[int, dict[str, np.ndarray]]:
        self.send(message("PARAM_REQ", actor_id=self.actor_id, have_version=have_version))
        while True:
            frames = self.recv_frames()
            if len(frames) > 1 or decode(frames[0]).get("kind") != "HEARTBEAT":
                return parse_params(frames)

    def next_snapshot(self, newer_than: int, timeout: float = REPLY_TIMEOUT) -> tuple[int, dict]:
        """The first snapshot on the SUB whose version is above `newer_than`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sub.poll(100):
                version, arrays = parse_params(self.sub.recv_multipart())
                if version > newer_than:
                    return version, arrays
            _check_alive(self.learner, "a snapshot")
        pytest.fail(f"no snapshot newer than v{newer_than} on the SUB within {timeout}s")

    def close(self) -> None:
        self.dealer.close(0)
        self.sub.close(0)
        self.ctx.term()


@pytest.fixture
def fake_actor():
    """Factory: FakeActor(learner, name); every actor made is closed at teardown."""
    made: list[FakeActor] = []

    def make(learner, name: str = "fake") -> FakeActor:
        actor = FakeActor(learner, name)
        made.append(actor)
        return actor

    yield make
    for actor in made:
        actor.close()


def assert_stored(ack: dict[str, Any], seq: int, accepted: int, context: str = "") -> None:
    """The reply to a fresh TRAJ: an ACK of its seq with every episode stored (the grant may be any)."""
    want = {"v": PROTOCOL_VERSION, "kind": "ACK", "seq": seq, "accepted": accepted, "duplicate": False}
    assert ack == {**want, "grant": ack.get("grant")} and isinstance(ack["grant"], int), f"{context}: {ack}"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Complete lines of RUN_DIR/metrics.jsonl (a line still being written is skipped)."""
    return read_jsonl(run_dir / "metrics.jsonl")


def wait_for_metrics(learner, predicate, timeout: float = REPLY_TIMEOUT, what: str = "") -> dict[str, Any]:
    """The newest metrics line satisfying `predicate`, polling until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        lines = read_metrics(learner.run_dir)
        if lines and predicate(lines[-1]):
            return lines[-1]
        _check_alive(learner, what)
        if time.monotonic() > deadline:
            last = lines[-1] if lines else None
            pytest.fail(
                f"no metrics line with {what} within {timeout}s; last: {last}\n{learner.log()[-3000:]}"
            )
        time.sleep(0.1)


def _check_alive(learner, waiting_for: str) -> None:
    if learner.proc.poll() is not None:
        pytest.fail(
            f"learner exited ({learner.proc.returncode}) during {waiting_for}:\n{learner.log()[-3000:]}"
        )


# ---- tests -----------------------------------------------------------------------------------------------
def test_handshake_welcome_carries_run_and_model_and_is_bound_to_the_connection(learner_process, fake_actor):
    learner = learner_process("--max-steps", "5", "--model.max-elements", "7", "--model.vocab-size", "321")
    a, b = fake_actor(learner, "a"), fake_actor(learner, "b")

    welcome = a.hello()
    assert welcome["v"] == PROTOCOL_VERSION and welcome["kind"] == "WELCOME"
    assert isinstance(welcome["actor_id"], int) and welcome["actor_id"] >= 1
    assert isinstance(welcome["run_id"], str) and welcome["run_id"]
    assert welcome["max_steps"] == 5
    assert welcome["policy_version"] == 0  # version 0 is published before any actor is served
    model = welcome["model"]
    assert set(model) == MODEL_FIELDS | set(TEXT_ENCODER_FIELDS) | set(LM_FIELDS) | set(
        POINTER_OPTION_FIELDS
    ) | {"kind"}
    assert model["kind"] == "pointer"  # the policy family the episodes are featurized for
    assert model["max_elements"] == 7 and model["vocab_size"] == 321
    assert model["max_instruction_tokens"] == 16 and model["max_element_tokens"] == 6
    assert all(isinstance(model[k], int) and model[k] > 0 for k in MODEL_FIELDS)
    assert all(isinstance(model[k], t) for k, t in TEXT_ENCODER_FIELDS.items())
    assert all(isinstance(model[k], t) for k, t in LM_FIELDS.items())
    assert all(type(model[k]) is t for k, t in POINTER_OPTION_FIELDS.items())
    assert (model["text_encoder"], model["text_dim"], model["text_encoder_sha256"]) == ("none", 0, "")

    other = b.hello()
    assert other["run_id"] == welcome["run_id"]
    assert other["actor_id"] != welcome["actor_id"]

    beat = a.request(message("HEARTBEAT", actor_id=a.actor_id))
    assert beat["kind"] == "HEARTBEAT" and beat["policy_version"] == 0

    # The episode shapes follow the WELCOME config: a 5-step episode with 7 elements is accepted.
    seq, ack = a.traj([make_episode(model, 5, np.random.default_rng(0))])
    assert_stored(ack, seq, 1)

    # The WELCOME is bound to the connection. This was a test of its own, with a learner of its own (a
    # start-up and a compile to wait for at the end); the model flags above change nothing of it.
    c = fake_actor(learner, "c")
    c.hello()
    # A new DEALER without a routing id of its own is a new connection: the old actor_id is refused.
    c.connect()
    reply = c.request(message("HEARTBEAT", actor_id=c.actor_id))
    assert (reply["kind"], reply["code"]) == ("ERROR", "not_welcomed"), reply
    assert c.hello()["kind"] == "WELCOME"  # HELLO again on the new connection
    assert c.request(message("HEARTBEAT", actor_id=c.actor_id))["kind"] == "HEARTBEAT"

    # With a fixed routing id the registration survives a reconnect (ROUTER_HANDOVER).
    d = fake_actor(learner, "d")
    d.connect(routing_id=b"fake-actor-d")
    d.hello()
    d.connect(routing_id=b"fake-actor-d")
    reply = d.request(message("HEARTBEAT", actor_id=d.actor_id))
    assert reply["kind"] == "HEARTBEAT", reply


# The fake actor says nothing while it waits for training (no heartbeats of its own): tests that wait for
# the first updates, and then speak under the same actor id, keep it known with a long --actor-timeout.
# (The compile alone takes longer than the default 15 s on a busy machine.)
QUIET_ACTOR = ("--actor-timeout", "600")


@pytest.mark.long
def test_param_req_reply_and_published_snapshots(learner_process, fake_actor):
    learner = learner_process("--batch-size", "2", "--publish-every", "1", "--log-every", "0.5", *QUIET_ACTOR)
    actor = fake_actor(learner)
    welcome = actor.hello()

    # A late joiner asks at once instead of waiting for the next publish.
    version, v0 = actor.params_reply(have_version=-1)
    assert version == welcome["policy_version"] == 0
    assert v0 and all(a.dtype == np.dtype("<f4") and a.size > 0 for a in v0.values())
    model = actor.model
    assert any(a.shape == (model["vocab_size"], model["d_model"]) for a in v0.values())  # the embedding

    rng = np.random.default_rng(1)
    for _ in range(2):  # two batches of two -> two updates -> versions 1 and 2 published
        _, ack = actor.traj(actor.episodes(2, rng))
        assert ack["kind"] == "ACK" and ack["accepted"] == 2
    v1, p1 = actor.next_snapshot(newer_than=0)
    v2, p2 = actor.next_snapshot(newer_than=v1)
    assert v1 >= 1 and v2 > v1
    assert set(p1) == set(p2) == set(v0)
    assert all(p1[k].shape == v0[k].shape and p1[k].dtype == v0[k].dtype for k in v0)
    assert any(not np.array_equal(p1[k], v0[k]) for k in v0), "training did not change the parameters"

    # PARAM_REQ now answers with the newest snapshot, identical to the one published.
    version, newest = actor.params_reply(have_version=v2)
    assert version == v2
    assert all(np.array_equal(newest[k], p2[k]) for k in p2)
    assert actor.request(message("HEARTBEAT", actor_id=actor.actor_id))["policy_version"] == v2


def test_traj_is_acked_and_trained_on(learner_process, fake_actor):
    learner = learner_process("--batch-size", "4", "--publish-every", "1", "--log-every", "0.5", *QUIET_ACTOR)
    actor = fake_actor(learner)
    actor.hello()
    rng = np.random.default_rng(2)
    sent = [*actor.episodes(3, rng, success=True), *actor.episodes(5, rng)]

    _, ack = actor.traj(sent[:3])
    assert ack == {
        "v": PROTOCOL_VERSION,
        "kind": "ACK",
        "seq": 1,
        "accepted": 3,
        "duplicate": False,
        "grant": 9,
    }
    _, ack = actor.traj(sent[3:])  # each stored batch raises the grant (credit 8 past the watermark)
    assert ack == {
        "v": PROTOCOL_VERSION,
        "kind": "ACK",
        "seq": 2,
        "accepted": 5,
        "duplicate": False,
        "grant": 10,
    }

    line = wait_for_metrics(learner, lambda m: m["update"] >= 2, what="update >= 2")
    assert (
        line["update"] == 2
    )  # 8 episodes, batches of 4, at most one sample per insert (--samples-per-insert 1)
    assert line["episodes"] == 8
    assert line["env_steps"] == sum(len(ep["reward"]) for ep in sent)
    assert line["success_rate"] == pytest.approx(3 / 8)
    assert line["replay_size"] == 8  # episodes stay in the replay after they are sampled
    assert line["rejected"] == 0
    assert line["policy_version"] == 2  # published after every update
    assert line["policy_lag_mean"] == pytest.approx(1.0)  # batch 2 was collected by v0, trained at v1
    assert math.isfinite(line["train/loss"])
    version, _ = actor.next_snapshot(newer_than=0)
    assert version >= 1
    # A heartbeat reports the newest version and counts the actor as connected again.
    beat = actor.request(message("HEARTBEAT", actor_id=actor.actor_id))
    assert beat == {
        "v": PROTOCOL_VERSION,
        "kind": "HEARTBEAT",
        "policy_version": 2,
        "run_id": actor.welcome["run_id"],
        "grant": 10,
    }
    wait_for_metrics(learner, lambda m: m["wall"] > line["wall"] and m["actors"] >= 1, what="actors >= 1")


# ---- bad input: (name, expected ERROR code, frames the welcomed `bad` actor sends) ----------------------
def _bad_traj(actor_id_offset: int = 0, length: int = 3, obs: dict | None = None, **change: Any):
    """A builder of a TRAJ whose one episode is valid except for `change` (values or functions of the
    valid array) and `obs` (the same, for observation arrays)."""

    def build(bad: FakeActor, rng: np.random.Generator) -> list[bytes]:
        ep = make_episode(bad.model, length, rng)
        for container, changes in ((ep, change), (ep["obs"], obs or {})):
            for key, value in changes.items():
                container[key] = value(container[key]) if callable(value) else value
        seq = _next_seq(bad) if not actor_id_offset else 1  # (refused before its seq is looked at)
        return [encode(traj_message(bad.actor_id + actor_id_offset, seq, [ep]))]

    return build


def _bad_packing(edit):
    """A builder of a TRAJ of two valid episodes whose packed `episodes` map `edit` then changes."""

    def build(bad: FakeActor, rng: np.random.Generator) -> list[bytes]:
        msg = traj_message(
            bad.actor_id, _next_seq(bad), [make_episode(bad.model, 3, rng), make_episode(bad.model, 2, rng)]
        )
        edit(msg["episodes"])
        return [encode(msg)]

    return build


def _move_second_array(packed: dict[str, Any]) -> None:
    packed["arrays"][1][3] += PACK_ALIGN  # a gap before it (and it would run past the end)


def _frames(msg: Any, copies: int = 1):
    return lambda bad, rng: [encode(msg)] * copies


def _with_nan(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[0] = np.nan
    return a


def _too_long(bad: FakeActor, rng: np.random.Generator) -> list[bytes]:
    ep = make_episode(bad.model, bad.welcome["max_steps"] + 1, rng)
    return [encode(traj_message(bad.actor_id, _next_seq(bad), [ep]))]


def _with_actor_id(kind: str, **fields: Any):
    return lambda bad, rng: [encode(message(kind, actor_id=bad.actor_id, **fields))]


def _token_beyond_vocab(bad: FakeActor, rng: np.random.Generator) -> list[bytes]:
    ep = make_episode(bad.model, 2, rng)
    ep["obs"]["instr_tokens"][:, 0] = bad.model["vocab_size"]
    return [encode(traj_message(bad.actor_id, _next_seq(bad), [ep]))]


def _next_seq(bad: FakeActor) -> int:
    """A new seq for a batch whose episodes are refused: the learner settles a seq refused for good (the
    actor drops that batch), so each refused batch needs its own, as each stored one does."""
    bad.seq += 1
    return bad.seq


BAD_CASES = [
    ("undecodable bytes", "bad_encoding", lambda bad, rng: [b"\xc1\x00garbage"]),
    ("truncated msgpack", "bad_encoding", lambda bad, rng: [encode(message("HEARTBEAT", actor_id=1))[:-2]]),
    ("unknown ext code", "bad_encoding", _frames({"v": 1, "kind": msgpack.ExtType(7, b"")})),
    ("packed array of a disallowed dtype", "bad_encoding", _bad_traj(reward=lambda r: r.astype("<c8"))),
    ("packed array out of place", "bad_encoding", _bad_packing(_move_second_array)),
    ("packed data a byte short", "bad_encoding", _bad_packing(lambda p: p.update(data=p["data"][:-1]))),
    ("packed data a byte long", "bad_encoding", _bad_packing(lambda p: p.update(data=p["data"] + b"\0"))),
    ("array table not an array", "bad_field", _bad_packing(lambda p: p.update(arrays={}))),
    ("non-map message", "bad_envelope", _frames([1, "HELLO"])),
    ("multi-frame message", "bad_envelope", _frames(message("HEARTBEAT", actor_id=1), copies=2)),
    (
        "wrong protocol version",
        "bad_version",
        _frames({"v": 1, "kind": "HELLO", "actor": "x", "num_envs": 1}),
    ),
    ("missing protocol version", "bad_version", _frames({"kind": "HELLO", "actor": "x", "num_envs": 1})),
    (
        "a version 2 actor's HELLO",
        "bad_version",
        _frames({"v": 2, "kind": "HELLO", "actor": "x", "num_envs": 1, "instance": "i", "first_unacked": 1}),
    ),
    (  # (a version 3 pointer actor is served: tests/test_protocol_v3_peer.py)
        "a version 5 actor's HELLO",
        "bad_version",
        _frames({"v": 5, "kind": "HELLO", "actor": "x", "num_envs": 1, "instance": "i", "first_unacked": 1}),
    ),
    (
        "protocol version true",
        "bad_version",
        _frames({"v": True, "kind": "HELLO", "actor": "x", "num_envs": 1}),
    ),
    ("HELLO with zero environments", "bad_field", _frames(message("HELLO", actor="x", num_envs=0))),
    ("unknown kind", "unknown_kind", _with_actor_id("GOODBYE")),
    # A regression (it once crashed the learner): a kind that cannot be a dict key. It had a test of its
    # own, with a learner of its own; here the learner's answers after it show that it kept serving.
    ("unhashable kind", "unknown_kind", _frames({"v": PROTOCOL_VERSION, "kind": ["HELLO"]})),
    ("learner-only kind from an actor", "unexpected_kind", _with_actor_id("ACK", seq=1)),
    ("HELLO without num_envs", "bad_field", _frames(message("HELLO", actor="x"))),
    (
        "HELLO without instance",
        "bad_field",
        _frames(message("HELLO", actor="x", num_envs=1, first_unacked=1)),
    ),
    (
        "HELLO with a 65-character instance",
        "bad_field",
        _frames(message("HELLO", actor="x", num_envs=1, instance="i" * 65, first_unacked=1)),
    ),
    (
        "HELLO with first_unacked 0",
        "bad_field",
        _frames(message("HELLO", actor="x", num_envs=1, instance="i", first_unacked=0)),
    ),
    ("TRAJ with seq 0", "bad_field", _with_actor_id("TRAJ", seq=0, episodes=[])),
    ("TRAJ beyond the grant", "no_credit", _with_actor_id("TRAJ", seq=10_000, episodes=[])),
    ("TRAJ without actor_id", "bad_field", _frames(message("TRAJ", seq=1, episodes=[]))),
    ("TRAJ without seq", "bad_field", _with_actor_id("TRAJ", episodes=[])),
    (
        "TRAJ with no episodes",
        "bad_field",
        lambda bad, rng: [encode(message("TRAJ", actor_id=bad.actor_id, seq=_next_seq(bad), episodes=[]))],
    ),
    (
        "TRAJ with version 2 episodes (a list of maps)",
        "bad_field",
        lambda bad, rng: [
            encode(
                message(
                    "TRAJ",
                    actor_id=bad.actor_id,
                    seq=_next_seq(bad),
                    episodes=[make_episode(bad.model, 2, rng)],
                )
            )
        ],
    ),
    ("TRAJ with no task names", "bad_field", _bad_packing(lambda p: p.update(task=[]))),
    ("TRAJ with a wrong actor_id", "not_welcomed", _bad_traj(actor_id_offset=1000)),
    ("task name not a str", "bad_field", _bad_traj(task=5)),
    ("success as an integer", "bad_array", _bad_traj(success=1)),  # a `success` array of dtype <i8
    ("per-step array missing", "bad_field", _bad_traj(direction=None)),
    ("obs value that is not an array", "bad_field", _bad_traj(obs={"elem_feats": None})),
    ("array of the wrong dtype", "bad_array", _bad_traj(reward=lambda r: r.astype("<f8"))),
    ("obs array of the wrong dtype", "bad_array", _bad_traj(obs={"instr_mask": lambda m: m.astype("|u1")})),
    ("step array of the wrong shape", "bad_array", _bad_traj(word=lambda w: w[:-1])),
    ("obs with T rows instead of T + 1", "bad_array", _bad_traj(obs={"elem_feats": lambda f: f[:-1]})),
    ("action type out of range", "bad_array", _bad_traj(action_type=lambda a: a + NUM_ACTION_TYPES)),
    ("positive behavior_logp", "bad_array", _bad_traj(behavior_logp=lambda p: p * 0 + 0.5)),
    ("negative token id", "bad_array", _bad_traj(obs={"instr_tokens": lambda t: t * 0 - 1})),
    # A regression (it once poisoned the parameters), with a learner of its own before: id == vocab_size.
    ("token id beyond the vocabulary", "bad_array", _token_beyond_vocab),
    ("NaN in reward", "non_finite", _bad_traj(reward=_with_nan)),
    ("infinity in an obs feature", "non_finite", _bad_traj(obs={"elem_feats": lambda f: f + np.inf})),
    ("policy_version from the future", "future_version", _bad_traj(policy_version=lambda v: v + 10**6)),
    ("negative policy_version", "bad_array", _bad_traj(policy_version=lambda v: v - 1)),
    ("too many steps (> max_steps)", "bad_array", _too_long),
]


def test_bad_input_is_refused_and_the_learner_keeps_serving(learner_process, fake_actor):
    learner = learner_process("--batch-size", "4", "--publish-every", "1", "--log-every", "0.5")
    good, bad = fake_actor(learner, "good"), fake_actor(learner, "bad")
    good.hello()
    bad.hello()
    rng = np.random.default_rng(3)

    # Before any HELLO on its socket, even a real actor_id is refused.
    stranger = fake_actor(learner, "stranger")
    stranger.dealer.send(encode(message("TRAJ", actor_id=good.actor_id, seq=1, episodes=[])))
    refused = Counter(["not_welcomed"])
    reply = stranger.recv()
    assert (reply["kind"], reply["code"]) == ("ERROR", "not_welcomed"), reply
    assert isinstance(reply["reason"], str) and reply["reason"]

    good_episodes = 0
    for name, code, build in BAD_CASES:
        # Its grant, as HEARTBEATs tell it: each refusal for good settled a seq, so the grant kept rising.
        assert bad.request(message("HEARTBEAT", actor_id=bad.actor_id))["kind"] == "HEARTBEAT"
        bad.dealer.send_multipart(build(bad, rng))
        reply = bad.recv()
        assert reply["kind"] == "ERROR", f"{name}: expected ERROR {code}, got {reply}"
        assert reply["code"] == code, f"{name}: expected {code}, got {reply}"
        assert isinstance(reply["reason"], str) and reply["reason"], name
        refused[code] += 1
        # The learner still serves a well-behaved actor after every refusal.
        seq, ack = good.traj(good.episodes(1, rng))
        assert_stored(ack, seq, 1, f"after {name}")
        good_episodes += 1

    # ... and the misbehaving actor itself, once it sends something valid.
    seq, ack = bad.traj(bad.episodes(2, rng))
    assert ack["kind"] == "ACK" and ack["seq"] == seq and ack["accepted"] == 2
    assert seq > bad.welcome["grant"]  # past its first grant: every batch refused for good settled its seq
    good_episodes += 2

    total = sum(refused.values())
    line = wait_for_metrics(
        learner,
        lambda m: m["rejected"] >= total and m["episodes"] >= good_episodes,
        what=f"rejected >= {total}",
    )
    assert line["rejected"] == total
    assert line["rejected_by_reason"] == dict(refused)
    assert line["episodes"] == good_episodes
    wait_for_metrics(learner, lambda m: m["update"] >= good_episodes // 4, what="training after bad input")


def test_metrics_lines_hold_the_contract_fields_and_an_actor_that_never_reads_costs_only_its_replies(
    learner_process, fake_actor
):
    """The metrics contract, on a learner that also served an actor that never reads (below): that was a
    test with a learner of its own, and one learner saves a start-up and a stop. Its actors come after
    the check that one actor counts as one, and every line the learner wrote is checked at the end."""
    learner = learner_process("--log-every", "0.2")
    actor = fake_actor(learner)
    actor.hello()
    # A handshake alone does not count as connected (an abandoned handshake would be a phantom);
    # the first message after WELCOME does.
    assert actor.request(message("HEARTBEAT", actor_id=actor.actor_id))["kind"] == "HEARTBEAT"
    line = wait_for_metrics(learner, lambda m: m["actors"] >= 1, what="actors >= 1")
    assert line["actors"] == 1
    wait_for_metrics(learner, lambda m: m["wall"] > line["wall"], what="a second line")
    an_actor_that_never_reads_costs_only_its_own_replies(learner, fake_actor)
    assert learner.stop() == 0
    lines = read_metrics(learner.run_dir)
    assert len(lines) >= 3
    for m in lines:
        for key, typ in CONTRACT_FIELDS.items():
            assert key in m, f"metrics line lacks {key}: {m}"
            assert isinstance(m[key], typ) and not isinstance(m[key], bool), (key, m[key])
    walls = [m["wall"] for m in lines]
    assert walls == sorted(walls)
    assert lines[-1]["stopped"] == "SIGTERM"  # one last line at exit


@pytest.mark.long
def test_batches_are_stored_once_across_resends_reconnects_and_a_learner_restart(learner_process, fake_actor):
    learner = learner_process("--batch-size", "2", "--log-every", "0.2")
    a = fake_actor(learner, "a")
    a.hello()
    rng = np.random.default_rng(5)

    def send(seq: int, episodes: list) -> dict[str, Any]:
        return a.request(traj_message(a.actor_id, seq, episodes))

    batch = {seq: a.episodes(2, rng) for seq in (1, 2, 3, 4)}
    assert send(1, batch[1])["accepted"] == 2
    again = send(1, batch[1])  # its ACK was lost, say: acknowledged again, stored once
    assert (again["kind"], again["accepted"], again["duplicate"]) == ("ACK", 0, True)
    assert send(3, batch[3])["accepted"] == 2  # overtakes seq 2
    # A new connection of the same actor process: the learner says what it already holds.
    a.connect()
    assert a.hello(first_unacked=2)["acked_upto"] == 1
    assert send(2, batch[2])["accepted"] == 2
    assert send(3, batch[3])["duplicate"] is True
    line = wait_for_metrics(learner, lambda m: m["update"] >= 1 and m["duplicates"] == 2, what="2 duplicates")
    assert line["episodes"] == 6 and line["rejected"] == 0
    assert learner.stop() == 0  # checkpoints at exit, with the ledger

    restarted = learner_process("--batch-size", "2", "--log-every", "0.2", run_dir=learner.run_dir)
    b = fake_actor(restarted, "a")
    b.instance = a.instance  # the same actor process, reconnecting to the restarted learner
    a = b
    welcome = a.hello(first_unacked=3)
    assert welcome["acked_upto"] == 3 and welcome["run_id"] != line["run_id"]
    assert send(3, batch[3])["duplicate"] is True  # stored before the restart: still known
    assert send(4, batch[4])["accepted"] == 2
    line = wait_for_metrics(restarted, lambda m: m["duplicates"] == 1 and m["episodes"] == 2, what="resumed")
    assert line["batches_lost_in_restart"] == 0


def an_actor_that_never_reads_costs_only_its_own_replies(learner, fake_actor) -> None:
    """(Run by the metrics contract test, on its learner, which has stored no episode before.)"""
    slow, good = fake_actor(learner, "slow"), fake_actor(learner, "good")
    slow.dealer.close(0)
    slow.dealer = slow.ctx.socket(zmq.DEALER)
    slow.dealer.setsockopt(zmq.LINGER, 0)
    slow.dealer.setsockopt(zmq.RCVHWM, 1)  # it buffers (almost) nothing on its side either
    slow.dealer.connect(learner.ingest)
    slow.hello()
    good.hello()
    # The slow actor asks for the ~1.3 MB snapshot 300 times and reads nothing: its TCP buffers and the
    # learner's queue for it fill up, and the learner drops (and counts) the replies that do not fit
    # instead of blocking.
    for _ in range(300):
        slow.send(message("PARAM_REQ", actor_id=slow.actor_id))
    rng = np.random.default_rng(4)
    for seq in range(1, 4):
        reply = good.request(traj_message(good.actor_id, seq, good.episodes(1, rng)))
        assert (reply["kind"], reply["accepted"]) == ("ACK", 1), reply
    line = wait_for_metrics(
        learner, lambda m: m["dropped_replies"].get("queue_full", 0) > 0 and m["episodes"] == 3, what="drops"
    )
    assert line["dropped_replies"]["queue_full"] < 300  # those that fit were queued, not dropped
