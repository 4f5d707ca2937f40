"""The learner's two sockets: the ingest ROUTER (one frame per message from each actor's DEALER, replies
back to its routing id) and the params PUB. All socket work happens on the caller's thread (ZeroMQ
sockets are not thread-safe). Replies never block: what cannot be queued is dropped and counted, and
every refused message is counted by its code, so the metrics account for every message either way.
"""

from __future__ import annotations

from collections import Counter

import zmq
from zmq.utils.monitor import parse_monitor_message

from common import protocol, wire
from common.net.curve import CurveServer
from common.net.sockets import bind_tcp
from learner.ingest.peer_versions import PeerVersions

INGEST_QUEUE_MESSAGES = 32
"""ROUTER receive high-water mark, per actor connection (whole messages): at most this many messages of
one actor wait unread, so the learner holds at most connections x 32 x the message size limit."""
REPLY_QUEUE_MESSAGES = 64
"""ROUTER send high-water mark, per actor connection (whole messages)."""

BIND_HINT = (
    "Is another learner running? Pick other ports with --ingest-port/--params-port (0 picks a free one)."
)
"""The end of the error for a port already in use."""
_AUTH_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


def send_or_count(router: zmq.Socket, frames: list, drops: Counter) -> None:
    """Send a reply on a ROUTER with ROUTER_MANDATORY without blocking; one that cannot be queued (the
    peer does not read) or whose peer is gone is dropped and counted in `drops` by reason."""
    try:
        router.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
    except zmq.Again:
        drops["queue_full"] += 1
    except zmq.ZMQError as e:
        if e.errno != zmq.EHOSTUNREACH:
            raise
        drops["actor_gone"] += 1


class Transport:
    """The bound ROUTER and PUB, with CURVE when `curve` is given (its failed handshakes are counted in
    `rejected["auth_failed"]` and, for connections that were no ZeroMQ peer, `["handshake_failed"]`: no
    reply can reach such a client)."""

    def __init__(
        self,
        bind: str,
        ingest_port: int,
        params_port: int,
        curve: CurveServer | None = None,
        peers: PeerVersions | None = None,
    ):
        self.ctx = zmq.Context()
        self.peers = peers if peers is not None else PeerVersions()
        """The connections that speak the previous protocol version: replies to them are in it. Built for
        the run (its episode spec and model say which older versions it can serve); without one, every
        older version is refused."""
        self.auth = curve.start(self.ctx) if curve is not None else None
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)  # refuse floods before buffering them
        # Per connection, at most this many messages wait unread; past it ZeroMQ stops reading that TCP
        # stream, so an actor that ignores its credit is slowed to the learner's pace (TCP back-pressure).
        self.router.setsockopt(zmq.RCVHWM, INGEST_QUEUE_MESSAGES)
        # Replies queued per actor: a well-behaved one has at most its credit's ACKs, a few heartbeats and a
        # snapshot waiting; one that stops reading gets the rest dropped (counted), not buffered.
        self.router.setsockopt(zmq.SNDHWM, REPLY_QUEUE_MESSAGES)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # an actor with a fixed routing id may reconnect
        # A reply that cannot be queued raises instead of vanishing, so every drop is counted (send_frames).
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 2)  # slow subscribers skip to the newest snapshot
        self._auth_events = None
        if curve is not None:
            curve.apply(self.router)
            curve.apply(self.pub)
            self._auth_events = self.router.get_monitor_socket(_AUTH_FAILURES)
        self.ingest_port = bind_tcp(self.router, bind, ingest_port, BIND_HINT)
        self.params_port = bind_tcp(self.pub, bind, params_port, BIND_HINT)
        self.rejected: Counter[str] = Counter()
        """Refused messages by reason (§7 code)."""
        self.drops: Counter[str] = Counter()
        """Replies that could not be sent, by reason."""

    def receive(self, timeout_ms: int) -> tuple[bytes, memoryview | None] | None:
        """The next message as (routing id, its one frame), waiting up to timeout_ms; None when none came.
        A message of another frame count is refused here (`bad_envelope`) and comes back as (id, None)."""
        if not self.router.poll(timeout_ms):
            return None
        frames = self.router.recv_multipart(copy=False)
        identity = frames[0].bytes
        if len(frames) != 2:
            self.refuse(identity, "bad_envelope", f"expected one message frame, got {len(frames) - 1}")
            return identity, None
        return identity, frames[1].buffer

    def count_auth_failures(self) -> None:
        """Count the failed handshakes since the last call: `auth_failed`, a ZeroMQ peer refused by CURVE
        (a key not authorized, or no CURVE at all); `handshake_failed`, anything else that connected and
        left without a handshake (port scanners, health probes that only open a TCP connection, and a
        peer without CURVE that saw the mechanism mismatch first and hung up before this side read it)."""
        while self._auth_events is not None and self._auth_events.poll(0):
            event = parse_monitor_message(self._auth_events.recv_multipart())
            refused = event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH or (
                event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                and event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            )
            self.rejected["auth_failed" if refused else "handshake_failed"] += 1

    def refuse(self, identity: bytes, code: str, reason: str, seq: int | None = None) -> None:
        """An ERROR with `code` (and the refused TRAJ's `seq`), counted in `rejected`."""
        self.rejected[code] += 1
        self.send(identity, protocol.Error(code, reason, seq).to_msg())

    def send(self, identity: bytes, msg: dict) -> None:
        """One reply, in the protocol version the peer speaks (`peers`)."""
        self.send_frames([identity, wire.encode(self.peers.reply(identity, msg))])

    def send_frames(self, frames: list) -> None:
        """Never blocks: a reply to an actor that does not read (its queue is full) or that is gone is
        dropped and counted by reason (the actor re-sends what stays unacknowledged)."""
        send_or_count(self.router, frames, self.drops)

    def close(self) -> None:
        if self._auth_events is not None:
            self.router.disable_monitor()
            self._auth_events.close(0)
        self.router.close(0)
        self.pub.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
