"""Parameter broadcast: one snapshot to N subscribers, direct from the learner's PUB and through the relay.

Each path is timed from the publisher's send until every subscriber holds the whole snapshot, and
stated against a plain PUSH -> PULL transfer of the same frames to one receiver over tcp://127.0.0.1
measured in the same run. Subscribers are threads with their own zmq context each (their own I/O
thread, as separate actor processes would have): zmq receives in those C threads without the GIL, so
threads measure the transport, while 32 Python processes on 2 cores would mostly measure start-up and
scheduling. The relay runs as its own process (`python -m actors relay`), as it would in production.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from common import protocol

ROOT = Path(__file__).resolve().parents[1]
NUM_ARRAYS = 16
WAIT_S = 120.0

NOTE = (
    "broadcast: every transfer here is loopback, so 'vs_loopback' is the aggregate rate to all subscribers "
    "over one TCP stream's rate on this machine (the CPUs copying bytes are the limit). Through the relay "
    "the learner sends 1 copy per host instead of one per subscriber ('learner_copies'); the fan-out is "
    "local. On one machine both hops are loopback, so the relay's extra hop shows as 'seconds_vs_direct' "
    "> 1; across a network the relay saves (N - 1) copies on the learner's link per host."
)


def snapshot_arrays(size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """About `size` bytes of float32 in NUM_ARRAYS equal layers, the shape of a flat parameter dict."""
    rows = max(1, size // (NUM_ARRAYS * 1024 * 4))
    rng = np.random.default_rng(seed)
    return {f"layer_{i:02d}/w": rng.standard_normal((rows, 1024), np.float32) for i in range(NUM_ARRAYS)}


class _Subscriber(threading.Thread):
    """An actor's SUB (RCVHWM 2, everything subscribed); records when each whole snapshot arrived."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 2)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.ready = threading.Event()
        self.done = threading.Event()
        self.arrived = 0.0
        self.nbytes = 0
        self.version = -1
        self._stopping = False

    def run(self) -> None:
        try:
            while not self._stopping:
                if not self.sock.poll(50):
                    continue
                frames = self.sock.recv_multipart(copy=False)
                if len(frames) == 1:  # a ping: an empty PARAMS
                    self.ready.set()
                    continue
                arrived = time.perf_counter()
                self.version = protocol.parse(frames[0].buffer)["version"]
                self.nbytes = sum(len(f) for f in frames[1:])
                del frames  # free the snapshot before the next one
                self.arrived = arrived
                self.done.set()
        finally:
            self.sock.close(0)

    def stop(self) -> None:
        self._stopping = True
        self.join(5)
        self.ctx.term()


class _Relay:
    """`python -m actors relay` on a free port, upstream the given params port; stopped with SIGTERM."""

    def __init__(self, params_port: int):
        self.dir = tempfile.TemporaryDirectory()
        endpoint_file = Path(self.dir.name) / "relay.json"
        self.log = open(Path(self.dir.name) / "relay.log", "wb")  # noqa: SIM115 (closed in stop)
        cmd = [sys.executable, "-m", "actors", "relay", "--host", "127.0.0.1"]
        cmd += ["--params-port", str(params_port), "--port", "0", "--status-every", "0"]
        cmd += ["--endpoint-file", str(endpoint_file)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not endpoint_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the relay did not start: {self.output()}")
            time.sleep(0.05)
        self.endpoint = json.loads(endpoint_file.read_text())["endpoint"]

    def output(self) -> str:
        self.log.flush()
        return (Path(self.dir.name) / "relay.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()


def _fanout_seconds(
    flat: dict[str, np.ndarray], subscribers: int, via_relay: bool, repeats: int
) -> list[float]:
    """Seconds from send until the last of `subscribers` holds the whole snapshot, once per repeat."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 2)  # as the learner's
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    relay = _Relay(port) if via_relay else None
    subs: list[_Subscriber] = []
    try:
        endpoint = relay.endpoint if relay else f"tcp://127.0.0.1:{port}"
        subs = [_Subscriber(endpoint) for _ in range(subscribers)]
        for s in subs:
            s.start()
        _ping_until_ready(pub, subs, relay)
        size = sum(a.nbytes for a in flat.values())
        times = []
        for version in range(1, repeats + 1):
            for s in subs:
                s.done.clear()
            frames = protocol.params_frames(version, flat)
            t0 = time.perf_counter()
            pub.send_multipart(frames, copy=False)
            for s in subs:
                if not s.done.wait(WAIT_S):
                    got = sum(x.done.is_set() for x in subs)
                    raise RuntimeError(f"only {got} of {subscribers} subscribers got the snapshot")
            for s in subs:
                if s.version != version or s.nbytes != size:
                    raise RuntimeError(f"a subscriber got version {s.version} with {s.nbytes} bytes")
            times.append(max(s.arrived for s in subs) - t0)
        return times
    finally:
        for s in subs:
            s.stop()
        if relay:
            relay.stop()
        pub.close(0)
        ctx.term()


def _ping_until_ready(pub: zmq.Socket, subs: list[_Subscriber], relay: _Relay | None) -> None:
    """Subscriptions propagate asynchronously (and through the relay's upstream connection): publish
    empty snapshots until every subscriber has seen one, so no timed snapshot goes to a slow joiner."""
    ping = protocol.params_frames(0, {})
    deadline = time.monotonic() + 60
    while not all(s.ready.is_set() for s in subs):
        if time.monotonic() > deadline:
            output = relay.output() if relay else ""
            raise RuntimeError(f"subscribers did not connect. {output}")
        pub.send_multipart(ping)
        time.sleep(0.02)
    time.sleep(0.1)  # the last pings drain before the timed snapshot


def _loopback_seconds(flat: dict[str, np.ndarray], repeats: int) -> list[float]:
    """The same frames PUSH -> PULL to one receiver, each end with its own context (two I/O threads)."""
    send_ctx, recv_ctx = zmq.Context(), zmq.Context()
    push = send_ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    pull = recv_ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.connect(f"tcp://127.0.0.1:{port}")
    size = sum(a.nbytes for a in flat.values())
    arrived: list[tuple[float, int]] = []
    got = threading.Semaphore(0)

    def receive() -> None:
        for _ in range(repeats + 1):  # a warm-up message first: the connection exists before any timing
            frames = pull.recv_multipart(copy=False)
            arrived.append((time.perf_counter(), sum(len(f) for f in frames[1:])))
            del frames
            got.release()

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    try:
        push.send(b"warm-up")
        if not got.acquire(timeout=WAIT_S):
            raise RuntimeError("the loopback receiver did not connect")
        times = []
        for version in range(1, repeats + 1):
            t0 = time.perf_counter()
            push.send_multipart(protocol.params_frames(version, flat), copy=False)
            if not got.acquire(timeout=WAIT_S):
                raise RuntimeError("the loopback receiver got nothing")
            done, nbytes = arrived[-1]
            if nbytes != size:
                raise RuntimeError(f"loopback transfer delivered {nbytes} of {size} bytes")
            times.append(done - t0)
        receiver.join(5)
        return times
    finally:
        push.close(0)
        send_ctx.term()
        if not receiver.is_alive():  # else it is still blocked in recv (an error above): leave it be
            pull.close(0)
            recv_ctx.term()


def run(
    quick: bool, size: int | None = None, fanouts: tuple[int, ...] | None = None, repeats: int | None = None
) -> list[dict]:
    """Rows: the loopback reference, then direct and relay for each subscriber count (median seconds)."""
    size = size or (10_000_000 if quick else 100_000_000)
    fanouts = fanouts or ((8,) if quick else (8, 32))
    repeats = repeats or (3 if quick else 7)
    flat = snapshot_arrays(size)
    nbytes = sum(a.nbytes for a in flat.values())
    loop = _loopback_seconds(flat, repeats)
    loop_gbps = nbytes / statistics.median(loop) / 1e9
    rows = [_row("loopback PUSH/PULL (reference)", 1, nbytes, 1, loop, loop_gbps)]
    for n in fanouts:
        direct = _fanout_seconds(flat, n, via_relay=False, repeats=repeats)
        rows.append(_row("direct PUB", n, nbytes, n, direct, loop_gbps))
        relayed = _fanout_seconds(flat, n, via_relay=True, repeats=repeats)
        row = _row("through relay", n, nbytes, 1, relayed, loop_gbps)
        row["seconds_vs_direct"] = row["seconds"] / rows[-1]["seconds"]
        rows.append(row)
    print(NOTE, flush=True)
    return rows


def _row(path: str, n: int, nbytes: int, learner_copies: int, times: list[float], loop_gbps: float) -> dict:
    median = statistics.median(times)
    gbps = n * nbytes / median / 1e9
    return {
        "path": path,
        "subscribers": n,
        "bytes": nbytes,
        "learner_copies": learner_copies,
        "repeats": len(times),
        "seconds": median,
        "seconds_min": min(times),
        "seconds_max": max(times),
        "gbps": gbps,
        "vs_loopback": gbps / loop_gbps,
        "load_1m": os.getloadavg()[0],  # other work on the machine when this row finished
    }
