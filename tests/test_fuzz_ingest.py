"""Property-based fuzzing of the learner's ingest over real sockets: thousands of malformed and mutated
messages, each answered, none crashing or stalling it, none changing what it already stored."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as npst

from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from learner.ingest.registry import ActorRegistry
from learner.ingest.transport import Transport
from learner.setup.ingest import ingest_server
from tests.test_fake_actor import make_episode

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]

MODEL = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2,
                    d_model=8, num_heads=2, num_layers=1, mlp_dim=8)  # fmt: skip
MAX_STEPS = 4
REPLY_MS = 5000


class RunningIngest:
    """The learner's IngestServer on loopback, polled on its own thread as the learner loop polls it."""

    def __init__(self):
        self.stored: list[protocol.Episode] = []
        self.server = ingest_server(
            Transport("127.0.0.1", 0, 0), ActorRegistry(actor_timeout=3600),
            welcome_fields={"model": MODEL.to_dict(), "max_steps": MAX_STEPS},
            episode_spec=featurize.episode_spec(MODEL, 0), max_steps=MAX_STEPS,
            on_episodes=lambda eps, _record: self.stored.extend(eps), credit=1_000_000,
        )  # fmt: skip
        self.server.publish(0, {"w": np.zeros(3, np.float32)})
        self.crashed: BaseException | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                self.server.poll(20)
        except BaseException as e:  # the test fails on this: the learner must never raise
            self.crashed = e

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.server.close()


class Peer:
    def __init__(self, ingest: RunningIngest, instance: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{ingest.server.ingest_port}")
        hello = protocol.message(
            protocol.HELLO, actor=instance, num_envs=1, instance=instance, first_unacked=1
        )
        welcome = self.request([wire.encode(hello)])
        assert welcome["kind"] == protocol.WELCOME, welcome
        self.actor_id = welcome["actor_id"]
        self.seq = 0

    def request(self, frames: list[bytes]) -> dict:
        """Send frames; the one reply (PARAMS: its header). An unsolicited HEARTBEAT is skipped unless
        what was sent decodes as a HEARTBEAT, whose reply is one."""
        try:
            beat = len(frames) == 1 and wire.decode(frames[0]).get("kind") == protocol.HEARTBEAT
        except Exception:
            beat = False
        self.sock.send_multipart(frames)
        while True:
            assert self.sock.poll(REPLY_MS), "the learner did not answer (crashed or stalled)"
            reply = self.sock.recv_multipart()
            msg = protocol.parse(reply[0])
            if beat or msg["kind"] != protocol.HEARTBEAT:
                return msg

    def traj(self, episodes: list[dict]) -> dict:
        self.seq += 1
        return self.request([wire.encode(protocol.Traj(self.actor_id, self.seq, episodes).to_msg())])

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture(scope="module")
def world():
    ingest = RunningIngest()
    good, fuzzer = Peer(ingest, "good"), Peer(ingest, "fuzzer")
    rng = np.random.default_rng(0)
    before = [make_episode(MODEL.to_dict(), int(rng.integers(1, MAX_STEPS + 1)), rng) for _ in range(6)]
    assert good.traj(before)["accepted"] == 6
    snapshot = [(ep.task, {k: v.copy() for k, v in {**ep.obs, **ep.steps}.items()}) for ep in ingest.stored]
    template = protocol.Traj(fuzzer.actor_id, 1, before[:2]).to_msg()
    yield {"ingest": ingest, "good": good, "fuzzer": fuzzer, "snapshot": snapshot, "template": template,
           "replies": Counter()}  # fmt: skip
    good.close()
    fuzzer.close()
    ingest.close()


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
ARRAY_FIELDS = (
    sorted(protocol.EPISODE_ARRAYS) + sorted(protocol.STEP_ARRAYS) + sorted(protocol.ESTIMATE_ARRAYS)
    + [protocol.OBS_PREFIX + key for key in sorted(featurize.feature_spec(MODEL))]
)  # fmt: skip
FIELDS = ["v", "kind", "actor_id", "seq", "episodes", "task", "arrays", "data", "success", "truncated",
          "length", "reward", "obs/instr_tokens", "instance", "first_unacked", "num_envs", "actor"]  # fmt: skip


@st.composite
def hostile_frames(draw) -> list[bytes]:
    """One hostile multipart message: random bytes, a mutated valid TRAJ (its bytes, one of its packed
    arrays, or an entry of its array table), or a valid envelope whose fields are replaced by arbitrary
    values (structure that decodes but lies)."""
    kinds = ["bytes", "flip", "cut", "fields", "episode", "frames", "array", "array", "table", "table"]
    kind = draw(st.sampled_from(kinds))
    if kind == "bytes":
        return [draw(st.binary(max_size=256))]
    if kind == "frames":
        return [draw(st.binary(max_size=16)) for _ in range(draw(st.integers(0, 4)))] or [b""]
    if kind == "array":  # one packed array of a valid batch replaced: wrong dtype, shape, range or NaN
        dtype = draw(st.sampled_from(["<i4", "<f4", "|b1", "<i8", "<f8", "<u1"]))
        arr = draw(npst.arrays(dtype, npst.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))
        return [("array", draw(st.sampled_from(ARRAY_FIELDS)), arr)]
    if kind == "table":  # one value of one entry of the array table (name, dtype, shape, offset) replaced
        return [("table", draw(st.integers(0, 63)), draw(st.integers(0, 3)), draw(msgpack_values))]
    if kind in ("flip", "cut"):
        return [("flip" if kind == "flip" else "cut", draw(st.integers(0, 10**6)), draw(st.integers(1, 255)))]
    base = protocol.message(draw(st.sampled_from(sorted(protocol.KINDS))), actor_id=0, seq=0)
    for _ in range(draw(st.integers(1, 4))):
        base[draw(st.sampled_from(FIELDS))] = draw(msgpack_values)
    if kind == "episode":
        base["kind"] = protocol.TRAJ
        episodes = {draw(st.sampled_from(FIELDS)): draw(msgpack_values) for _ in range(3)}
        base["episodes"] = draw(st.sampled_from([episodes, [episodes]]))  # packed, or a version 2 list
    return [("fields", base)]


def _realize(frames, world) -> list[bytes]:
    """Fill in the mutations that need the live template (its actor id and bytes)."""
    if not frames or not isinstance(frames[0], tuple):
        return frames
    op = frames[0]
    if op[0] == "fields":
        msg = dict(op[1])
        if msg.get("actor_id") == 0:
            msg["actor_id"] = world["fuzzer"].actor_id  # get past the handshake check, into validation
        try:
            return [wire.encode(msg)]
        except (TypeError, ValueError, OverflowError, wire.WireError):
            return [b"\x00"]
    fuzzer = world["fuzzer"]
    fuzzer.seq += 1  # a fresh seq, or the ledger would answer a duplicate before validating anything
    msg = {**world["template"], "seq": fuzzer.seq}
    if op[0] == "array":
        _, name, arr = op
        arrays = {**protocol.unpack_episodes(msg["episodes"]).arrays, name: arr}
        table, data = wire.pack_arrays(arrays)
        return [wire.encode({**msg, "episodes": {**msg["episodes"], "arrays": table, "data": data}})]
    if op[0] == "table":
        _, entry, field, value = op
        table = [list(e) for e in msg["episodes"]["arrays"]]
        table[entry % len(table)][field] = value
        return [wire.encode({**msg, "episodes": {**msg["episodes"], "arrays": table}})]
    data = bytearray(wire.encode(msg))
    pos = op[1] % len(data)
    if op[0] == "flip":
        data[pos] ^= op[2]
        return [bytes(data)]
    return [bytes(data[:pos])]


@settings(max_examples=2500, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(frames=hostile_frames())
def test_hostile_messages_are_answered_and_change_nothing_stored(world, frames):
    fuzzer = world["fuzzer"]
    reply = fuzzer.request(_realize(frames, world))
    world["replies"][(reply["kind"], reply.get("code"))] += 1
    assert reply["kind"] in (
        protocol.ERROR,
        protocol.ACK,
        protocol.WELCOME,
        protocol.PARAMS,
        protocol.HEARTBEAT,
    )
    if reply["kind"] == protocol.ERROR:
        assert isinstance(reply["code"], str) and isinstance(reply["reason"], str)
    assert world["ingest"].crashed is None


def test_after_the_fuzz_a_good_actor_is_served_and_stored_data_is_intact(world):
    ingest, good = world["ingest"], world["good"]
    assert sum(world["replies"].values()) >= 2500, "the fuzz test did not run first"
    codes = {code for (kind, code), n in world["replies"].items() if kind == protocol.ERROR}
    assert {"bad_encoding", "bad_version", "bad_envelope", "bad_field", "bad_array"} <= codes  # reached deep
    refused = sum(n for (kind, _), n in world["replies"].items() if kind == protocol.ERROR)
    assert refused >= 2000 and sum(ingest.server.rejected.values()) >= refused
    rng = np.random.default_rng(1)
    stored_before = len(ingest.stored)
    assert good.traj([make_episode(MODEL.to_dict(), 2, rng)])["accepted"] == 1
    assert len(ingest.stored) == stored_before + 1
    for (task, arrays), ep in zip(world["snapshot"], ingest.stored, strict=False):
        assert ep.task == task
        for name, want in arrays.items():
            np.testing.assert_array_equal({**ep.obs, **ep.steps}[name], want, err_msg=name)
    assert ingest.crashed is None and ingest.thread.is_alive()
