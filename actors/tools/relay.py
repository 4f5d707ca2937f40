"""`python -m actors relay --host LEARNER`: one copy of each parameter snapshot per host, fanned out locally.

Every actor subscribes to the learner's params PUB, so a host with 32 actors pulls each snapshot 32
times over the network. The relay subscribes once (XSUB connected to the learner) and republishes on a
local XPUB that the host's actors connect to instead. Frames are forwarded one by one, zero-copy and in
order, so a multipart snapshot leaves exactly as it arrived and the relay never needs to understand it;
it only peeks at frame 0 (the header) to count snapshots and report the newest version.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from common import protocol
from common.net.curve import CurveClient, CurveError, is_loopback
from common.net.ports import PARAMS_PORT, RELAY_PORT
from common.net.sockets import bind_tcp
from common.protocol import ProtocolError

HEADER_LIMIT = 1 << 20
"""Frame 0 larger than this is not decoded (counted as bad, still forwarded): a header is a few kB."""

BIND_HINT = "Is another relay running on this host? Pick another port with --port (0 picks a free one)."
"""The end of the error for a port already in use."""


@dataclass
class RelayConfig:
    """Forward the learner's parameter snapshots to the actors of this host over one network copy."""

    host: str = "127.0.0.1"
    """Address of the learner machine (as for `python -m actors --host`)."""
    params_port: int = PARAMS_PORT
    """The learner's parameter (PUB) port."""
    bind: str = "127.0.0.1"
    """Interface the relay listens on for local actors (127.0.0.1: this host only)."""
    port: int = RELAY_PORT
    """Port local actors subscribe to (0 picks a free one, printed and written to --endpoint-file)."""
    endpoint_file: str = ""
    """Write {"bind", "port", "endpoint"} as JSON here once bound (for scripts that use --port 0)."""
    status_every: float = 10.0
    """Seconds between status lines on the console (0: only at exit)."""
    curve_secret_key: str = ""
    """For a learner that uses CURVE: a key pair authorized by the learner (like an actor's). Needs
    --curve-server-key. The relay's local side stays plain, so it binds to loopback only."""
    curve_server_key: str = ""
    """The learner's public key (its learner.key file)."""
    insecure: bool = False
    """Allow --bind beyond loopback: anyone who reaches the relay's port could read the parameters."""

    def __post_init__(self) -> None:
        if not 1 <= self.params_port <= 65535:
            raise ValueError(f"--params-port must be in [1, 65535], got {self.params_port}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if not self.status_every >= 0:
            raise ValueError(f"--status-every must be >= 0, got {self.status_every}")


@dataclass
class RelayStats:
    snapshots: int = 0
    """Messages forwarded, whole (bad ones included: the actors validate and reject them)."""
    bad_snapshots: int = 0
    """Forwarded messages whose header was not a PARAMS header this side understands."""
    newest_version: int = -1
    subscribers: int = 0
    """Local subscriptions now held (XPUB_VERBOSER reports every subscribe and unsubscribe)."""
    bytes: int = 0


class Relay:
    """XSUB (to the learner) -> XPUB (to local actors); `run` forwards on the caller's thread until
    `request_stop`. Binds in the constructor, so a port already in use fails before anything runs.

    Memory stays bounded whatever the actors do: the XPUB's SNDHWM is 2 (as on the learner's PUB), so a
    slow actor has at most 2 snapshots queued and then skips to the newest, and queued frames are shared
    by reference among subscribers, not copied per actor. The XSUB's RCVHWM is 2 as well.
    """

    def __init__(self, cfg: RelayConfig, log: Callable[[str], None] = print):
        self.cfg = cfg
        self.log = log
        self.upstream = f"tcp://{cfg.host}:{cfg.params_port}"
        self.stats = RelayStats()
        self._stop_reason = ""
        if not is_loopback(cfg.bind) and not cfg.insecure:
            raise SystemExit(
                f"--bind {cfg.bind} would republish the learner's parameters beyond this machine without "
                "authentication; keep the relay on 127.0.0.1 (its actors are local) or pass --insecure"
            )
        if bool(cfg.curve_secret_key) != bool(cfg.curve_server_key):
            raise SystemExit("--curve-secret-key and --curve-server-key go together")
        try:
            keys = (
                CurveClient(Path(cfg.curve_secret_key), Path(cfg.curve_server_key))
                if cfg.curve_secret_key
                else None
            )
        except CurveError as e:
            raise SystemExit(f"CURVE: {e}") from e
        self.ctx = zmq.Context()
        self.xsub = self.ctx.socket(zmq.XSUB)
        self.xsub.setsockopt(zmq.LINGER, 0)
        self.xsub.setsockopt(zmq.RCVHWM, 2)
        if keys is not None:
            keys.apply(self.xsub)
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.LINGER, 0)
        self.xpub.setsockopt(zmq.SNDHWM, 2)  # slow actors skip to the newest snapshot (class docstring)
        self.xpub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscribe arrives: a subscriber count
        try:
            self.port = bind_tcp(self.xpub, cfg.bind, cfg.port, BIND_HINT)
            self.endpoint = f"tcp://{_connect_host(cfg.bind)}:{self.port}"
            # Subscribe upstream to everything, once, whoever listens locally: a snapshot then crosses the
            # network as soon as it is published, and an actor that joins later gets the next one at once.
            self.xsub.send(b"\x01")
            self.xsub.connect(self.upstream)
            if cfg.endpoint_file:
                info = {"bind": cfg.bind, "port": self.port, "endpoint": self.endpoint}
                _write_atomic(Path(cfg.endpoint_file), json.dumps(info))
        except BaseException:
            self._close_sockets()
            raise

    def request_stop(self, reason: str = "stop requested") -> None:
        self._stop_reason = reason

    def run(self) -> RelayStats:
        """Forward until asked to stop; closes the sockets on the way out and returns the final counts."""
        self.log(f"relay: {self.upstream} -> {self.endpoint} (port {self.port})")
        poller = zmq.Poller()
        poller.register(self.xsub, zmq.POLLIN)
        poller.register(self.xpub, zmq.POLLIN)
        next_status = time.monotonic() + self.cfg.status_every
        try:
            while not self._stop_reason:
                events = dict(poller.poll(100))
                if self.xsub in events:
                    self._forward_one()
                if self.xpub in events:
                    self._count_subscription()
                if self.cfg.status_every > 0 and time.monotonic() >= next_status:
                    self.log(self.status())
                    next_status = time.monotonic() + self.cfg.status_every
        finally:
            self._close_sockets()
        self.log(f"{self.status()}; stopped ({self._stop_reason})")
        return self.stats

    def status(self) -> str:
        s = self.stats
        return (
            f"relay: {s.snapshots} snapshots forwarded ({s.bytes / 1e6:.1f} MB, newest version "
            f"{s.newest_version}, {s.bad_snapshots} bad), {s.subscribers} subscribers"
        )

    def _forward_one(self) -> None:
        """One whole multipart message, frame by frame (as zmq.proxy does), then its header is read."""
        first = self.xsub.recv(copy=False)
        more = first.more
        self.xpub.send(first, copy=False, flags=zmq.SNDMORE if more else 0)
        size = len(first)
        while more:
            frame = self.xsub.recv(copy=False)
            more = frame.more
            self.xpub.send(frame, copy=False, flags=zmq.SNDMORE if more else 0)
            size += len(frame)
        self.stats.snapshots += 1
        self.stats.bytes += size
        version = _header_version(first.buffer)
        if version is None:
            self.stats.bad_snapshots += 1
        else:
            self.stats.newest_version = max(self.stats.newest_version, version)

    def _count_subscription(self) -> None:
        while self.xpub.poll(0):
            msg = self.xpub.recv()
            if msg[:1] == b"\x01":
                self.stats.subscribers += 1
            elif msg[:1] == b"\x00":
                self.stats.subscribers = max(0, self.stats.subscribers - 1)

    def _close_sockets(self) -> None:
        self.xsub.close(0)
        self.xpub.close(0)
        self.ctx.term()


def _header_version(buf: memoryview) -> int | None:
    if len(buf) > HEADER_LIMIT:
        return None
    try:
        head = protocol.parse(buf)
        if head["kind"] != protocol.PARAMS:
            return None
        return protocol.require(head, "version", int)
    except ProtocolError:
        return None


def _connect_host(bind: str) -> str:
    return "127.0.0.1" if bind in ("0.0.0.0", "*") else bind


def _write_atomic(path: Path, text: str) -> None:
    """Readers polling for the file never see it half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run_relay(cfg: RelayConfig) -> RelayStats:
    """The CLI entry: run until SIGINT or SIGTERM, then exit cleanly."""
    relay = Relay(cfg, log=functools.partial(print, flush=True))
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, _f: relay.request_stop(signal.Signals(signum).name))
    return relay.run()
