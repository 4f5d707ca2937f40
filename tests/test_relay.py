"""The per-host relay forwards snapshots whole, byte for byte and in order, to every local subscriber,
stops cleanly, and its CLI and benchmark run. Real sockets on 127.0.0.1; the relay runs in a thread
(or, for the CLI, a subprocess) and everything started is stopped at teardown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from actors.tools.relay import Relay, RelayConfig
from common import protocol
from tests.conftest import ROOT

WAIT_MS = 30_000
"""How long to wait for a message that should come: milliseconds normally, seconds on a busy machine."""


def _snapshot(version: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "dense/kernel": rng.standard_normal((64, 48)).astype(np.float32),
        "dense/bias": rng.standard_normal(48).astype(np.float32),
        "embed": rng.integers(-(2**31), 2**31 - 1, (100, 16), dtype=np.int32),
        "scalar": np.asarray(float(version), np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }


class _Harness:
    """A stand-in learner (an XPUB, so it can see the relay subscribe), the relay in a thread, and SUBs
    configured as actors configure theirs."""

    def __init__(self, status_every: float = 10.0):
        self.ctx = zmq.Context()
        self.learner = self.ctx.socket(zmq.XPUB)
        self.learner.setsockopt(zmq.LINGER, 0)
        self.learner_port = self.learner.bind_to_random_port("tcp://127.0.0.1")
        self.lines: list[str] = []
        cfg = RelayConfig(params_port=self.learner_port, port=0, status_every=status_every)
        self.relay = Relay(cfg, log=self.lines.append)
        self.thread = threading.Thread(target=self.relay.run, daemon=True)
        self.thread.start()
        assert self.learner.poll(WAIT_MS), "the relay never subscribed upstream"
        assert self.learner.recv() == b"\x01"
        self.subs: list[zmq.Socket] = []

    def subscribe(self, count: int = 1) -> list[zmq.Socket]:
        new = []
        for _ in range(count):
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 2)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(self.relay.endpoint)
            new.append(sub)
        self.subs += new
        # The relay counts each subscription when it reads it, i.e. once it will deliver to that SUB.
        _wait_for(lambda: self.relay.stats.subscribers == len(self.subs), "subscribers at the relay")
        return new

    def stop(self) -> None:
        self.relay.request_stop("test over")
        self.thread.join(WAIT_MS / 1000)
        for sub in self.subs:
            sub.close(0)
        self.learner.close(0)
        self.ctx.term()


@pytest.fixture
def harness():
    started: list[_Harness] = []

    def start(**kwargs) -> _Harness:
        started.append(_Harness(**kwargs))
        return started[-1]

    yield start
    for h in started:
        h.stop()
        assert not h.thread.is_alive()


def _wait_for(cond, what: str, timeout: float = WAIT_MS / 1000) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _try_bind(sock: zmq.Socket, port: int) -> bool:
    """close() is asynchronous: the old socket's I/O thread may still hold the port for a moment."""
    try:
        sock.bind(f"tcp://127.0.0.1:{port}")
    except zmq.ZMQError:
        return False
    return True


def _recv(sub: zmq.Socket) -> list[bytes]:
    assert sub.poll(WAIT_MS), f"no message within {WAIT_MS / 1000:.0f} s"
    return sub.recv_multipart()


def test_snapshots_reach_every_subscriber_byte_identical(harness):
    h = harness()
    subs = h.subscribe(3)
    for version in (1, 2, 7):
        flat = _snapshot(version, seed=version)
        frames = protocol.params_frames(version, flat)
        h.learner.send_multipart(frames)
        sent = [bytes(f) for f in frames]
        for sub in subs:
            got = _recv(sub)
            assert got == sent
            got_version, got_flat = protocol.parse_params(got)
            assert got_version == version
            assert set(got_flat) == set(flat)
            for name, arr in flat.items():
                assert got_flat[name].dtype == arr.dtype and got_flat[name].shape == arr.shape
                np.testing.assert_array_equal(got_flat[name], arr)
    # The relay counts a message after forwarding its last frame: a subscriber can be faster than that.
    _wait_for(lambda: h.relay.stats.newest_version == 7, "the relay to count the third snapshot")
    assert h.relay.stats.snapshots == 3
    assert h.relay.stats.bad_snapshots == 0


def test_multipart_frames_and_messages_keep_their_order(harness):
    h = harness()
    (sub,) = h.subscribe(1)
    # 40 arrays of different lengths: frame i must carry array i, and message 1 must come before 2.
    first = {f"a{i:02d}": np.full(i + 1, i, np.int32) for i in range(40)}
    second = {f"b{i:02d}": np.full(40 - i, 100 + i, np.int32) for i in range(40)}
    sent = [protocol.params_frames(1, first), protocol.params_frames(2, second)]
    for frames in sent:  # back to back: two messages stay within every high-water mark of 2
        h.learner.send_multipart(frames)
    for frames in sent:
        assert _recv(sub) == [bytes(f) for f in frames]
    for name, arr in protocol.parse_params([bytes(f) for f in sent[1]])[1].items():
        np.testing.assert_array_equal(arr, second[name])


def test_late_subscriber_gets_the_next_snapshot(harness):
    h = harness()
    (early,) = h.subscribe(1)
    h.learner.send_multipart(protocol.params_frames(1, _snapshot(1, 1)))
    assert protocol.parse_params(_recv(early))[0] == 1
    (late,) = h.subscribe(1)
    frames = protocol.params_frames(2, _snapshot(2, 2))
    h.learner.send_multipart(frames)
    for sub in (early, late):
        assert _recv(sub) == [bytes(f) for f in frames]
    assert not late.poll(100), "a late subscriber gets no replay of older snapshots"


def test_relay_subscribes_again_after_a_learner_restart(harness):
    h = harness()
    (sub,) = h.subscribe(1)
    h.learner.close(0)
    h.learner = h.ctx.socket(zmq.XPUB)  # the restarted learner, on the same port
    h.learner.setsockopt(zmq.LINGER, 0)
    _wait_for(lambda: _try_bind(h.learner, h.learner_port), "the old learner's port to be released")
    assert h.learner.poll(WAIT_MS), "the relay did not subscribe to the restarted learner"
    assert h.learner.recv() == b"\x01"
    frames = protocol.params_frames(1, _snapshot(1, 1))
    h.learner.send_multipart(frames)
    assert _recv(sub) == [bytes(f) for f in frames]


def test_bad_header_is_counted_forwarded_and_survived(harness):
    h = harness(status_every=0.05)
    (sub,) = h.subscribe(1)
    h.learner.send_multipart([b"\xc1 not msgpack", b"payload"])
    assert _recv(sub) == [b"\xc1 not msgpack", b"payload"]
    good = protocol.params_frames(5, _snapshot(5, 5))
    h.learner.send_multipart(good)
    assert _recv(sub) == [bytes(f) for f in good]
    _wait_for(lambda: h.relay.stats.newest_version == 5, "the relay to count the second snapshot")
    assert (h.relay.stats.snapshots, h.relay.stats.bad_snapshots) == (2, 1)
    _wait_for(lambda: any("2 snapshots forwarded" in line for line in h.lines), "a status line")
    status = next(line for line in h.lines if "2 snapshots forwarded" in line)
    assert "newest version 5" in status and "1 bad" in status and "1 subscribers" in status


def test_relay_stops_cleanly_and_frees_its_port(harness):
    h = harness()
    h.subscribe(2)
    port = h.relay.port
    h.relay.request_stop("test")
    h.thread.join(WAIT_MS / 1000)
    assert not h.thread.is_alive()
    assert h.relay.xpub.closed and h.relay.xsub.closed
    assert "stopped (test)" in h.lines[-1]
    probe = h.ctx.socket(zmq.PUB)
    probe.bind(f"tcp://127.0.0.1:{port}")  # raises if the relay still held the port
    probe.close(0)


def test_port_in_use_is_a_clear_error():
    ctx = zmq.Context()
    taken = ctx.socket(zmq.PUB)
    taken.setsockopt(zmq.LINGER, 0)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(SystemExit) as e:
            Relay(RelayConfig(params_port=1, port=port))
        assert f"cannot bind tcp://127.0.0.1:{port}" in str(e.value) and "--port" in str(e.value)
    finally:
        taken.close(0)
        ctx.term()


def test_cli_help():
    cmd = [sys.executable, "-m", "actors", "relay", "--help"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--host", "--params-port", "--port", "--endpoint-file", "--status-every"):
        assert flag in result.stdout
    assert "one network copy" in result.stdout


def test_cli_forwards_and_exits_on_sigterm(tmp_path):
    ctx = zmq.Context()
    learner = ctx.socket(zmq.XPUB)
    learner.setsockopt(zmq.LINGER, 0)
    learner_port = learner.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    endpoint_file = tmp_path / "relay.json"
    cmd = [sys.executable, "-m", "actors", "relay", "--params-port", str(learner_port)]
    cmd += ["--port", "0", "--endpoint-file", str(endpoint_file)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: endpoint_file.exists() or proc.poll() is not None, "the endpoint file", 60)
        endpoint = json.loads(endpoint_file.read_text())
        sub.connect(endpoint["endpoint"])
        assert learner.poll(WAIT_MS) and learner.recv() == b"\x01"
        # The SUB's subscription reaches the relay asynchronously: publish until one arrives.
        frames = protocol.params_frames(3, _snapshot(3, 3))
        deadline = time.monotonic() + WAIT_MS / 1000
        while not sub.poll(50):
            assert time.monotonic() < deadline, "nothing came through the relay"
            learner.send_multipart(frames)
        assert sub.recv_multipart() == [bytes(f) for f in frames]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=WAIT_MS / 1000)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        sub.close(0)
        learner.close(0)
        ctx.term()
    assert proc.returncode == 0, out
    assert f"port {endpoint['port']}" in out
    assert "newest version 3" in out and "stopped (SIGTERM)" in out
    assert "Traceback" not in out


def test_broadcast_benchmark_smoke():
    from benchmarks import broadcast
    from benchmarks.__main__ import BENCHMARKS

    assert BENCHMARKS["broadcast"] == "benchmarks.broadcast"
    rows = broadcast.run(True, size=1 << 20, fanouts=(3,), repeats=1)
    assert [(r["path"], r["subscribers"], r["learner_copies"]) for r in rows] == [
        ("loopback PUSH/PULL (reference)", 1, 1),
        ("direct PUB", 3, 3),
        ("through relay", 3, 1),
    ]
    for row in rows:
        assert row["bytes"] == 1 << 20
        for key in ("seconds", "gbps", "vs_loopback"):
            assert row[key] > 0, (key, row)
        assert row["gbps"] == pytest.approx(row["subscribers"] * row["bytes"] / row["seconds"] / 1e9)
    assert rows[2]["seconds_vs_direct"] > 0
