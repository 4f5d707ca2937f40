"""The actor's side of the sockets: a DEALER to the learner's ingest ROUTER and a SUB to its params PUB.

The handshake follows the ZeroMQ guide's "Lazy Pirate": send HELLO, wait, and on silence close the
socket, back off and try again, so stale requests never pile up inside a DEALER's queue. `last_heard`
tells the actor when the learner last said anything (it sends heartbeats), so a dead or restarted
learner is noticed and the actor joins again ("Paranoid Pirate"). Replies come back parsed into the
message dataclasses of common/protocol/messages.py; a malformed one is logged and counted (`bad_replies`),
never acted on.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import zmq

from common import protocol, wire
from common.net.curve import CurveClient
from common.protocol import ProtocolError

REPLIES = {protocol.ACK: protocol.Ack, protocol.HEARTBEAT: protocol.Heartbeat, protocol.ERROR: protocol.Error}
"""What the learner sends on the DEALER after WELCOME, besides PARAMS: each kind's parser."""
Reply = protocol.Ack | protocol.Heartbeat | protocol.Error
Snapshot = tuple[int, dict[str, np.ndarray]]
"""A parameter snapshot: its version and flat arrays (protocol.parse_params)."""


class LearnerConnection:
    """The actor's sockets to one learner: a DEALER (replaced on every handshake) and a SUB (kept).

    It holds the session's `actor_id` and `welcome`, when the learner was `last_heard` and when this side
    last sent a HEARTBEAT (`last_beat`). It owns the wire: messages go out as protocol dataclasses' maps,
    and what comes in is parsed (`receive`), so the actor deals only in typed replies and snapshots. The
    actor's main thread is its only user (ZeroMQ sockets are not thread-safe)."""

    def __init__(
        self,
        host: str,
        ingest_port: int,
        params_port: int,
        log: Callable[[str], None] = print,
        params_addr: str = "",
        curve: CurveClient | None = None,
        stats: Counter | None = None,
        subscribe: bool = True,
    ):
        self.ingest_addr = f"tcp://{host}:{ingest_port}"
        self.params_addr = params_addr or f"tcp://{host}:{params_port}"
        self.log = log
        self.stats = Counter() if stats is None else stats
        """Counts `bad_replies`: replies of a known kind with a missing or mistyped field (the actor's stats)."""
        self.ctx = zmq.Context()
        self.curve = curve
        self.dealer: zmq.Socket | None = None
        self.sub = self.ctx.socket(zmq.SUB)
        if curve is not None and not params_addr:  # a relay's local side is plain (actors/tools/relay.py)
            curve.apply(self.sub)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 2)
        if subscribe:  # --inference remote: no snapshots are needed, none are received
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            self.sub.connect(self.params_addr)
        self.actor_id = -1
        self.welcome: protocol.Welcome | None = None
        self.last_heard = time.monotonic()
        """When the learner last sent anything on the DEALER."""
        self.last_beat = 0.0
        """When this side last sent a HEARTBEAT (0: never, so the first `heartbeat_if_due` sends one)."""

    def _new_dealer(self) -> None:
        if self.dealer is not None:
            self.dealer.close(0)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            self.curve.apply(self.dealer)
        self.dealer.connect(self.ingest_addr)

    def handshake(
        self,
        name: str,
        num_envs: int,
        instance: str,
        first_unacked: Callable[[], int],
        timeout: float,
        max_backoff: float,
        should_stop: Callable[[], bool],
    ) -> protocol.Welcome | None:
        """HELLO on a fresh socket until a WELCOME arrives; returns it (None if asked to stop first). A
        malformed WELCOME is logged, counted as a bad reply and waited past, like silence."""
        name = name or f"{socket.gethostname()}-{os.getpid()}"
        wait = timeout
        while not should_stop():
            self._new_dealer()
            hello = protocol.Hello(name, num_envs, instance, first_unacked(), pid=os.getpid())
            self.send(hello.to_msg())
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not should_stop():
                if self.dealer.poll(100):
                    msg = self._recv_single()
                    if msg is not None and msg["kind"] == protocol.WELCOME:
                        welcome = self._parse_reply(protocol.Welcome, msg)
                        if welcome is None:
                            continue
                        self.actor_id = welcome.actor_id
                        self.welcome = welcome
                        self.last_heard = time.monotonic()
                        return welcome
            wait = min(wait * 2, max_backoff)  # the next attempt waits longer: that is the backoff
            self.log(
                f"actor: no answer from the learner at {self.ingest_addr}; retrying, waiting {wait:.0f}s"
                + (" (is this actor's key in the learner's --curve-authorized folder?)" if self.curve else "")
            )
        return None

    def send(self, msg: dict) -> bool:
        """Queue a message without blocking; False when the outgoing queue is full (learner gone or stalled)."""
        try:
            self.dealer.send(wire.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def request_params(self, have_version: int) -> None:
        self.send(protocol.ParamReq(self.actor_id, have_version).to_msg())

    def heartbeat_if_due(self, every: float) -> bool:
        """Send a HEARTBEAT when `every` seconds have passed since the last one (the learner forgets an
        actor it has not heard from for its --actor-timeout); True when one went out."""
        now = time.monotonic()
        if now - self.last_beat < every:
            return False
        self.last_beat = now
        self.send(protocol.ActorHeartbeat(self.actor_id).to_msg())
        return True

    def _recv_single(self) -> dict | None:
        frames = self.dealer.recv_multipart(copy=False)
        try:
            return protocol.parse(frames[0].buffer)
        except ProtocolError as e:
            self.log(f"actor: ignoring a bad message from the learner ({e})")
            return None

    def _parse_reply(self, parser, msg: dict):
        """`parser.from_msg(msg)`, or None for a malformed reply (logged and counted in `bad_replies`)."""
        try:
            return parser.from_msg(msg)
        except ProtocolError as e:
            self.stats["bad_replies"] += 1
            self.log(f"actor: ignoring a malformed {msg['kind']} from the learner ({e})")
            return None

    def receive(self) -> tuple[list[Reply], Snapshot | None]:
        """Everything waiting on both sockets: the replies (ACK, HEARTBEAT, ERROR, parsed; other kinds,
        such as a late WELCOME to an abandoned HELLO, are dropped) and the newest snapshot."""
        replies, newest = [], None
        while self.dealer.poll(0):
            frames = self.dealer.recv_multipart(copy=False)
            self.last_heard = time.monotonic()
            try:
                head = protocol.parse(frames[0].buffer)
                if head["kind"] == protocol.PARAMS:
                    newest = _newer(newest, protocol.parse_params([f.buffer for f in frames]))
                    continue
            except ProtocolError as e:
                self.log(f"actor: ignoring a bad message from the learner ({e})")
                continue
            parser = REPLIES.get(head["kind"])
            reply = self._parse_reply(parser, head) if parser is not None else None
            if reply is not None:
                replies.append(reply)
        while self.sub.poll(0):
            frames = self.sub.recv_multipart(copy=False)
            try:
                newest = _newer(newest, protocol.parse_params([f.buffer for f in frames]))
            except ProtocolError as e:
                self.log(f"actor: ignoring a bad snapshot ({e})")
        return replies, newest

    def wait(self, timeout_ms: int) -> None:
        """Block until something arrives on either socket, or the timeout."""
        poller = zmq.Poller()
        poller.register(self.dealer, zmq.POLLIN)
        poller.register(self.sub, zmq.POLLIN)
        poller.poll(timeout_ms)

    def close(self) -> None:
        if self.dealer is not None:
            self.dealer.close(0)
        self.sub.close(0)
        self.ctx.term()


def _newer(a, b):
    """The newer of two snapshots; at equal versions the later arrival wins (it may be a resend)."""
    if a is None or b[0] >= a[0]:
        return b
    return a
