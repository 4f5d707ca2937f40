"""A fake learner (a ROUTER and a PUB owned by the test) drives the real `python -m actors` process."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from common import protocol, wire
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies.pointer import featurize
from common.policies.pointer import network as model
from tests.conftest import ACTOR_ENV, ROOT, START_S

TINY = ModelConfig(vocab_size=256, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)
MAX_STEPS = 5


class FakeLearner:
    def __init__(self, ingest_port: int | None = None):
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.pub = self.ctx.socket(zmq.PUB)
        for s in (self.router, self.pub):
            s.setsockopt(zmq.LINGER, 0)
        if ingest_port is None:
            self.ingest_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        else:
            self.router.bind(f"tcp://127.0.0.1:{ingest_port}")
            self.ingest_port = ingest_port
        self.params_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        _, self.params = model.create(TINY, 0)
        self.run_id, self.grant = "fake", 1000
        """What the last WELCOME said: heartbeat replies repeat it."""

    def recv(self, timeout: float = START_S) -> tuple[bytes, dict]:
        assert self.router.poll(int(timeout * 1000)), "the actor sent nothing"
        identity, data = self.router.recv_multipart()
        return identity, protocol.parse(data)

    def recv_kind(self, kind: str, timeout: float = START_S) -> tuple[bytes, dict]:
        """Next message of this kind, answering heartbeats as a learner does (an actor that hears nothing
        for --learner-timeout joins again, and its first compile alone can take that long on a busy
        machine). The default timeout covers an actor's start-up: its first TRAJ comes after it has
        built and compiled its policy."""
        deadline = time.monotonic() + timeout
        while True:
            identity, msg = self.recv(max(0.1, deadline - time.monotonic()))
            if msg["kind"] == kind:
                return identity, msg
            assert msg["kind"] == protocol.HEARTBEAT, f"unexpected {msg['kind']} while waiting for {kind}"
            # As the last WELCOME said (another run_id would tell the actor the learner restarted).
            self.reply(identity, protocol.HEARTBEAT, run_id=self.run_id, policy_version=0, grant=self.grant)

    def reply(self, identity: bytes, kind: str, **fields) -> None:
        self.router.send_multipart([identity, wire.encode(protocol.message(kind, **fields))])

    def welcome(self, identity: bytes, actor_id: int = 7, run_id: str = "fake", acked_upto: int = 0,
                grant: int = 1000, policy_version: int = 0, **extra) -> None:  # fmt: skip
        """A WELCOME (`extra`: more fields, e.g. mode="sync"); later heartbeat replies repeat its run_id."""
        self.run_id, self.grant = run_id, grant
        self.reply(
            identity, protocol.WELCOME, run_id=run_id, actor_id=actor_id, policy_version=policy_version,
            model=TINY.to_dict(), max_steps=MAX_STEPS, acked_upto=acked_upto, grant=grant,
            heartbeat_every=1.0, **extra,
        )  # fmt: skip

    def params_frames(self, version: int) -> list:
        return protocol.params_frames(version, params_to_flat(self.params))

    def close(self) -> None:
        self.router.close(0)
        self.pub.close(0)
        self.ctx.term()


def start_actor(ingest_port: int, params_port: int, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "actors", "--host", "127.0.0.1", "--ingest-port", str(ingest_port),
        "--params-port", str(params_port), "--num-envs", "3", "--seed", "5", "--heartbeat-every", "0.5", *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=ACTOR_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture
def fake_learner():
    learner = FakeLearner()
    yield learner
    learner.close()


@pytest.fixture
def actor_procs():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _read_until(proc: subprocess.Popen, text: str, timeout: float = START_S, times: int = 1) -> str:
    """The actor's output up to and including the `times`-th line that contains `text`."""
    out, deadline = "", time.monotonic() + timeout
    while out.count(text) < times:
        assert time.monotonic() < deadline and proc.poll() is None, f"never printed {text!r}:\n{out}"
        if select.select([proc.stdout], [], [], 0.5)[0]:  # raw reads: a buffered readline could hide lines
            out += os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
    return out


def _read_available(proc: subprocess.Popen) -> str:
    """What the actor has printed since the last read, without waiting for more."""
    out = ""
    while select.select([proc.stdout], [], [], 0)[0]:
        chunk = os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
        if not chunk:
            break
        out += chunk
    return out


def stop_and_read(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=START_S)  # a SIGTERM is handled once start-up (the compile) is done
    return proc.returncode, out.decode(errors="replace")


def test_actor_handshakes_requests_params_and_streams_valid_episodes(fake_learner, actor_procs):
    proc = start_actor(fake_learner.ingest_port, fake_learner.params_port)
    actor_procs.append(proc)
    identity, hello = fake_learner.recv_kind(protocol.HELLO)
    assert hello["num_envs"] == 3 and isinstance(hello["actor"], str)
    assert len(hello["instance"]) == 32 and hello["first_unacked"] == 1
    fake_learner.welcome(identity)

    # A late joiner asks for parameters at once instead of waiting for the next publish.
    _, req = fake_learner.recv_kind(protocol.PARAM_REQ)
    assert req["actor_id"] == 7 and req["have_version"] == -1
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(0)])

    spec = featurize.episode_spec(TINY, text_vocab_size=0)
    _, traj = fake_learner.recv_kind(protocol.TRAJ)
    episodes = protocol.validate_episodes(traj, spec, MAX_STEPS, newest_version=0)
    assert traj["actor_id"] == 7 and traj["seq"] == 1
    for ep in episodes:
        assert ep.length <= MAX_STEPS
        assert ep.truncated == (not ep.success and ep.length == MAX_STEPS)
        assert (ep.steps["policy_version"] == 0).all()
        assert np.all(ep.steps["behavior_logp"] <= 0)
        assert ep.steps["reward"].sum() == float(ep.success)
        # The actor's own V(s) and policy entropy, for the episode's priority at the learner.
        assert set(ep.estimates) == {"value", "entropy"} and np.all(ep.estimates["entropy"] > 0)
    fake_learner.reply(identity, protocol.ACK, seq=traj["seq"], accepted=len(episodes))

    # Publish a newer snapshot on the PUB: the actor swaps and later steps carry the new version.
    deadline = time.monotonic() + START_S
    seen_v3 = False
    while time.monotonic() < deadline and not seen_v3:
        fake_learner.pub.send_multipart(fake_learner.params_frames(3))
        _, traj = fake_learner.recv_kind(protocol.TRAJ)
        eps = protocol.validate_episodes(traj, spec, MAX_STEPS, newest_version=3)
        seen_v3 = any((ep.steps["policy_version"] == 3).any() for ep in eps)
    assert seen_v3, "the actor never acted with the published version 3"
    rc, out = stop_and_read(proc)
    assert rc == 0, out
    assert "stopped (SIGTERM)" in out


def test_actor_waits_for_a_learner_that_is_not_there_yet(actor_procs):
    import socket

    with socket.socket() as s:  # a free port nobody listens on yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start_actor(port, port + 1 if port < 65535 else port - 1, "--handshake-timeout", "0.5")
    actor_procs.append(proc)
    # Two handshakes without an answer (however long the actor takes to start), and it is still trying.
    seen = _read_until(proc, "no answer from the learner", times=2)
    assert proc.poll() is None, "the actor gave up instead of retrying"
    learner = FakeLearner(ingest_port=port)
    try:
        identity, _ = learner.recv_kind(protocol.HELLO, timeout=START_S)
        learner.welcome(identity, actor_id=1)
        while True:  # a retry's HELLO may cross our WELCOME (Lazy Pirate): welcome it too, as a learner does
            _, msg = learner.recv(timeout=START_S)
            if msg["kind"] == protocol.HELLO:
                learner.welcome(_, actor_id=msg["first_unacked"] + 1)
            elif msg["kind"] == protocol.PARAM_REQ:
                break
        assert msg["actor_id"] in (1, 2)
    finally:
        learner.close()
    rc, out = stop_and_read(proc)
    out = seen + out
    assert rc == 0, out
    assert "no answer from the learner" in out and "retrying" in out


def test_actor_survives_error_replies_and_bad_snapshots(fake_learner, actor_procs):
    proc = start_actor(fake_learner.ingest_port, fake_learner.params_port)
    actor_procs.append(proc)
    identity, _ = fake_learner.recv_kind(protocol.HELLO)
    fake_learner.welcome(identity)
    fake_learner.recv_kind(protocol.PARAM_REQ)
    # A snapshot of the wrong shape must be refused, and garbage ignored, before a good one arrives.
    bad = {k: np.zeros((1,), np.float32) for k in params_to_flat(fake_learner.params)}
    fake_learner.router.send_multipart([identity, *protocol.params_frames(0, bad)])
    fake_learner.router.send_multipart([identity, b"\xc1 not msgpack"])
    # Only once the actor has tried (and refused) the bad snapshot does the good one go out: sent together,
    # the actor would take just the newest of them.
    seen = _read_until(proc, "does not fit the model", timeout=START_S)
    assert proc.poll() is None
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(0)])
    _, traj = fake_learner.recv_kind(protocol.TRAJ)
    fake_learner.reply(identity, protocol.ACK, seq=traj["seq"], accepted=1, duplicate=False, grant=True)
    fake_learner.reply(identity, protocol.ERROR, code="bad_array", reason="test", seq=traj["seq"])
    seen += _read_until(proc, "learner refused a message: bad_array", timeout=60)  # however loaded the box
    sent_error = time.monotonic()
    while True:  # keep streaming well after the ERROR reached the actor
        _, traj2 = fake_learner.recv_kind(protocol.TRAJ)
        if time.monotonic() - sent_error > 1.5:
            break
    assert traj2["seq"] > traj["seq"], "the actor stopped streaming after an ERROR"
    rc, out = stop_and_read(proc)
    out = seen + out
    assert rc == 0, out
    assert "does not fit the model" in out and "bad_snapshots" in out
    assert "learner refused a message: bad_array" in out
    # The ACK with a bool grant was malformed: ignored (its batch was refused after all), counted, logged.
    assert "'bad_replies': 1" in out and "ignoring a malformed ACK" in out, out
    refused = int(re.search(r"'episodes_refused': (\d+)", out)[1])
    assert refused == len(traj["episodes"]["task"]), (
        out
    )  # the refused batch is given up, counted, not re-sent


def test_actor_joins_again_when_the_learner_forgets_it(fake_learner, actor_procs):
    proc = start_actor(fake_learner.ingest_port, fake_learner.params_port)
    actor_procs.append(proc)
    identity, _ = fake_learner.recv_kind(protocol.HELLO)
    fake_learner.welcome(identity, actor_id=7)
    fake_learner.recv_kind(protocol.PARAM_REQ)
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(4)])
    _, traj = fake_learner.recv_kind(protocol.TRAJ)
    assert traj["actor_id"] == 7
    # As after a learner restart: the actor id is unknown now. The actor must HELLO again.
    fake_learner.reply(identity, protocol.ERROR, code="not_welcomed", reason="unknown actor")
    deadline = time.monotonic() + START_S
    while True:
        identity, msg = fake_learner.recv(max(0.1, deadline - time.monotonic()))
        if msg["kind"] == protocol.HELLO:
            break
    assert msg["first_unacked"] == traj["seq"] == 1  # the unacknowledged batch is still held
    # A restarted learner (new run_id) that resumed at version 0: the held batch is sent again, same seq,
    # with its versions capped at 0 (the new learner refuses versions it has not published).
    fake_learner.welcome(identity, actor_id=8, run_id="restarted")
    _, req = fake_learner.recv_kind(protocol.PARAM_REQ)
    assert req["actor_id"] == 8
    _, resent = fake_learner.recv_kind(protocol.TRAJ)
    assert resent["actor_id"] == 8 and resent["seq"] == 1
    assert len(resent["episodes"]["task"]) == len(traj["episodes"]["task"])
    spec = featurize.episode_spec(TINY, text_vocab_size=0)
    eps = protocol.validate_episodes(resent, spec, MAX_STEPS, 0)
    assert all((ep.steps["policy_version"] == 0).all() for ep in eps), "old-run versions leaked"
    fake_learner.reply(identity, protocol.ACK, seq=1, accepted=len(eps), duplicate=False, grant=1000)
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(0)])
    _, traj = fake_learner.recv_kind(protocol.TRAJ)
    assert traj["actor_id"] == 8 and traj["seq"] >= 2
    eps = protocol.validate_episodes(traj, spec, MAX_STEPS, 0)
    assert all((ep.steps["policy_version"] == 0).all() for ep in eps), "old-run versions leaked"
    rc, out = stop_and_read(proc)
    assert rc == 0, out
    assert "joining again" in out and "'rejoins': 1" in out and "'steps_relabelled'" in out


def test_actor_streams_simphone_episodes(fake_learner, actor_procs):
    proc = start_actor(
        fake_learner.ingest_port, fake_learner.params_port, "--env", "simphone", "--tasks", "webshop"
    )
    actor_procs.append(proc)
    identity, _ = fake_learner.recv_kind(protocol.HELLO)
    fake_learner.welcome(identity)
    fake_learner.recv_kind(protocol.PARAM_REQ)
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(0)])
    _, traj = fake_learner.recv_kind(protocol.TRAJ)
    eps = protocol.validate_episodes(traj, featurize.episode_spec(TINY, text_vocab_size=0), MAX_STEPS, 0)
    assert all(ep.task.startswith("shop.") for ep in eps)
    # A SimPhone screen has real content: elements beyond the status bar and instruction words.
    assert all(ep.obs["elem_mask"][0].sum() >= 4 and ep.obs["instr_mask"][0].sum() >= 3 for ep in eps)
    rc, out = stop_and_read(proc)
    assert rc == 0, out


def test_actor_survives_emulator_faults(fake_learner, actor_procs):
    faults = ("--emulator.enabled", "--emulator.time-scale", "0.0005", "--emulator.crash-prob", "0.05",
              "--emulator.hang-prob", "0.05", "--emulator.disconnect-prob", "0.05")  # fmt: skip
    proc = start_actor(fake_learner.ingest_port, fake_learner.params_port, "--env", "simphone", *faults)
    actor_procs.append(proc)
    identity, _ = fake_learner.recv_kind(protocol.HELLO)
    fake_learner.welcome(identity)
    fake_learner.recv_kind(protocol.PARAM_REQ)
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(0)])
    spec = featurize.episode_spec(TINY, text_vocab_size=0)
    truncated_early = 0
    deadline = time.monotonic() + START_S
    while truncated_early < 3 and time.monotonic() < deadline:
        _, traj = fake_learner.recv_kind(protocol.TRAJ)
        for ep in protocol.validate_episodes(traj, spec, MAX_STEPS, 0):
            truncated_early += (
                ep.truncated and ep.length < MAX_STEPS
            )  # only a device fault cuts an episode short
    assert truncated_early >= 3, "no fault-interrupted episode arrived"
    rc, out = stop_and_read(proc)
    assert rc == 0, out
    counted = sum(int(n) for n in re.findall(r"'device_(?:crash|hang|disconnect)': (\d+)", out))
    assert counted >= 3, out  # every fault is counted by kind


def test_a_batch_refused_unavailable_goes_again_at_the_next_heartbeat(fake_learner, actor_procs):
    """The learner's storage is down (`unavailable`): the actor keeps the batch and sends it again, same
    seq, when the learner's next HEARTBEAT says it may try (no new handshake, no waiting for its ACK to be
    overdue: --ack-timeout is an hour here, so only the retry can bring it)."""
    proc = start_actor(fake_learner.ingest_port, fake_learner.params_port, "--ack-timeout", "3600")
    actor_procs.append(proc)
    identity, _ = fake_learner.recv_kind(protocol.HELLO)
    fake_learner.welcome(identity, grant=1)  # one batch may go, so any later TRAJ is that one again
    fake_learner.recv_kind(protocol.PARAM_REQ)
    fake_learner.router.send_multipart([identity, *fake_learner.params_frames(0)])
    _, traj = fake_learner.recv_kind(protocol.TRAJ)
    for _ in range(2):  # refused twice: kept both times
        fake_learner.reply(identity, protocol.ERROR, code="unavailable", reason="disk full", seq=traj["seq"])
        fake_learner.reply(identity, protocol.HEARTBEAT, run_id="fake", policy_version=0, grant=1)
        _, again = fake_learner.recv_kind(protocol.TRAJ)  # a HELLO here would fail: not a heartbeat
        assert again["seq"] == traj["seq"] == 1 and again["episodes"] == traj["episodes"]
    fake_learner.reply(identity, protocol.ACK, seq=1, accepted=len(traj["episodes"]["task"]), duplicate=False,
                       grant=1000)  # fmt: skip
    _, traj2 = fake_learner.recv_kind(protocol.TRAJ)
    assert traj2["seq"] == 2
    rc, out = stop_and_read(proc)
    assert rc == 0, out
    assert "'batches_refused_unavailable': 2" in out and "'batches_retried': 2" in out, out
    assert out.count("learner refused a message: unavailable") == 1  # said once, not at every retry
    assert "'rejoins'" not in out
