"""The learner's two sockets: the ingest ROUTER (handshakes, trajectories, acks, parameter requests,
heartbeats both ways) and the params PUB (versioned snapshots). All socket work happens on the caller's
thread (`poll`, `publish`, `heartbeat`). Messages are parsed into common/protocol.py's dataclasses.
Delivery is acknowledged and deduplicated, and flow is credit-based (learner/delivery.py). With a
write-ahead log (learner/wal.py, `--durability os|fsync`) a batch is on disk before it is stored and
acknowledged, and `recover` puts the log's batches back after a crash.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from common import protocol, wire
from common.config import ModelConfig
from common.curve import CurveServer
from common.protocol import Episode, ProtocolError
from common.sockets import bind_tcp
from learner.delivery import DeliveryLedger
from learner.wal import WalError, WriteAheadLog, pack_batch, unpack_batch

INGEST_QUEUE_MESSAGES = 32
"""ROUTER receive high-water mark, per actor connection (whole messages): at most this many messages of
one actor wait unread, so the learner holds at most connections x 32 x the message size limit."""
REPLY_QUEUE_MESSAGES = 64
"""ROUTER send high-water mark, per actor connection (whole messages)."""

BIND_HINT = (
    "Is another learner running? Pick other ports with --ingest-port/--params-port (0 picks a free one)."
)
"""The end of the error for a port already in use."""
STORAGE_RETRY_S = 1.0
"""After a failed log write, TRAJ batches are refused (`unavailable`) this long before writing is tried again."""


@dataclass
class ActorInfo:
    """What the learner knows of one welcomed actor connection, from its HELLO to its expiry.

    Held in `IngestServer.actors` under the `actor_id` its WELCOME gave it; every later message must
    carry that id and come from the same ROUTER `identity` (a WELCOME is bound to its connection).
    `last_seen` drives the expiry after `actor_timeout`; `instance` keys its batches in the delivery
    ledger; `num_envs` sizes a sync round (`connected_envs`)."""

    actor_id: int
    identity: bytes
    """The ROUTER routing id of the DEALER that sent HELLO: replies go there."""
    name: str
    """Display name from HELLO (cut to protocol.MAX_TEXT characters)."""
    instance: str
    """The actor process's random id: its TRAJ seqs are numbered per instance, across reconnects."""
    num_envs: int
    last_seen: float
    """time.monotonic() of its last message."""
    episodes: int = 0
    """Episodes stored from this connection."""
    active: bool = False
    """Sent something after WELCOME; an abandoned handshake (the actor retried on a new socket) never is."""


@dataclass
class _Pending:
    """A batch appended to the log and waiting for the group's fsync before it is stored and acknowledged."""

    actor: ActorInfo
    seq: int
    episodes: list[Episode]
    identities: list[bytes] = field(default_factory=list)
    """Connections to acknowledge it on: the sender, and any that sent it again before the sync."""


class IngestServer:
    """The learner's end of the protocol (docs/PROTOCOL.md): the ingest ROUTER and the params PUB.

    It binds both sockets in the constructor and does all socket work in `poll`, `publish` and
    `heartbeat`, on the caller's thread (ZeroMQ sockets are not thread-safe). Each message is parsed into
    its `common.protocol` dataclass and answered: HELLO registers an `ActorInfo` and gets a WELCOME,
    TRAJ episodes are validated and handed to `on_episodes` (the replay) before their ACK, PARAM_REQ
    gets the newest snapshot, HEARTBEAT gets one back. A refused message gets an ERROR and is counted in
    `rejected` by code, so a malformed message costs that message, never the learner. Which batches are
    stored and how far each actor may send lives in `ledger` (learner/delivery.py); `gate` is the
    learner's rate limit on the grants it hands out."""

    def __init__(
        self,
        bind: str,
        ingest_port: int,
        params_port: int,
        welcome_fields: dict,
        feature_spec: dict,
        vocab_size: int,
        max_steps: int,
        on_episodes: Callable[[list[Episode]], None],
        actor_timeout: float = 15.0,
        credit: int = 8,
        heartbeat_every: float = 1.0,
        curve: CurveServer | None = None,
        text_vocab_size: int = 0,
        wal: WriteAheadLog | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.ctx = zmq.Context()
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
        # A reply that cannot be queued raises instead of vanishing, so every drop is counted (_send_frames).
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 2)  # slow subscribers skip to the newest snapshot
        self._auth_events = None
        if curve is not None:
            curve.apply(self.router)
            curve.apply(self.pub)
            self._auth_events = self.router.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            )
        self.ingest_port = bind_tcp(self.router, bind, ingest_port, BIND_HINT)
        self.params_port = bind_tcp(self.pub, bind, params_port, BIND_HINT)
        self.run_id = uuid.uuid4().hex[:12]
        self._run_fields = {**welcome_fields, "model": ModelConfig.from_dict(welcome_fields["model"])}
        """The run-wide WELCOME fields (`welcome_fields`: `model` as a dict, `max_steps`, optionally `mode`)."""
        protocol.Welcome("", 1, 0, 0, 0, heartbeat_every, **self._run_fields)  # a wrong key fails here, once
        self.feature_spec = feature_spec
        self.vocab_size = vocab_size
        self.text_vocab_size = text_vocab_size
        """The text encoder's WordPiece vocabulary (0 without one): TRAJ's WordPiece ids are checked against it."""
        self.max_steps = max_steps
        self.on_episodes = on_episodes
        self.actor_timeout = actor_timeout
        self.heartbeat_every = heartbeat_every
        self.ledger = DeliveryLedger(credit)
        self.gate: Callable[[], bool] = lambda: True
        """The learner's rate limit, asked at every grant: False while it is behind, so grants stop growing
        and actors wait. Asked per grant (not per poll), so a poll that takes in many batches cannot
        hand out credit past the limit."""
        self.accepting = True
        """The gate's answer at the end of the last poll (for the metrics)."""
        self._last_beat = time.monotonic()
        self.actors: dict[int, ActorInfo] = {}
        self.rejected: Counter[str] = Counter()
        """Refused messages by reason."""
        self.drops: Counter[str] = Counter()
        """Replies that could not be sent, by reason."""
        self.duplicates = 0
        """TRAJ batches received again after they were stored (acknowledged again, stored once)."""
        self.policy_version = -1
        self._params_frames: list = []
        self._next_actor_id = 1
        self.wal = wal
        """The write-ahead log every new batch is appended to before it is stored (None: `--durability none`)."""
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.storage_error = ""
        """Why the log cannot be written now ("" while it can): TRAJ batches are refused `unavailable`."""
        self._retry_at = 0.0
        self._pending: dict[tuple[str, int], _Pending] = {}
        """Batches of this loop turn waiting for the group's fsync, by (instance, seq)."""

    # ---- parameters --------------------------------------------------------------------------------
    def publish(self, version: int, flat: dict[str, np.ndarray]) -> None:
        """Publish a snapshot to all subscribers and keep it to answer PARAM_REQ."""
        self.policy_version = version
        self._params_frames = protocol.params_frames(version, flat)
        self.pub.send_multipart(self._params_frames, copy=False)

    # ---- ingest ------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int, max_messages: int = 1000) -> int:
        """Handle waiting messages; block up to timeout_ms for the first. Returns how many were handled."""
        handled = 0
        while handled < max_messages and self.router.poll(timeout_ms if handled == 0 else 0):
            frames = self.router.recv_multipart(copy=False)
            handled += 1
            identity = frames[0].bytes
            if len(frames) != 2:
                self._refuse(identity, "bad_envelope", f"expected one message frame, got {len(frames) - 1}")
                continue
            msg = None
            try:
                msg = protocol.parse(frames[1].buffer)
                self._handle(identity, msg, frames[1].buffer)
            except ProtocolError as e:
                self._refuse(identity, e.code, e.reason, _seq_of(msg))
            except Exception as e:  # a validator gap must cost one message, never the learner
                self._refuse(identity, "invalid", f"{type(e).__name__}: {e}", _seq_of(msg))
        self._commit()  # group commit: one fsync for every batch of this turn, then their ACKs
        while self._auth_events is not None and self._auth_events.poll(0):
            self._auth_events.recv_multipart()  # a client without an authorized key (or not speaking CURVE)
            self.rejected["auth_failed"] += 1
        if handled < max_messages:  # everything that arrived is read: silence now is the actor's own
            self._forget_silent()
        self._check_gate()
        if time.monotonic() - self._last_beat >= self.heartbeat_every:
            self.heartbeat()
        return handled

    def _open(self) -> bool:
        """Whether grants may grow: the rate limit allows it and the log can be written."""
        return not self.storage_error and self.gate()

    def _check_gate(self) -> None:
        """When the gate has opened again, tell every actor its new grant at once, not at the next beat."""
        was, self.accepting = self.accepting, self._open()
        if self.accepting and not was:
            self.heartbeat()

    def heartbeat(self) -> None:
        """HEARTBEAT to every live actor: they learn the learner is alive, its newest version, their grant."""
        self._last_beat = time.monotonic()
        for actor in self.actors.values():
            if actor.active:  # an abandoned handshake's socket is gone: nothing to tell it
                self._send(actor.identity, self._beat(actor))

    def _beat(self, actor: ActorInfo) -> dict:
        grant = self.ledger.grant(actor.instance, self._open())
        return protocol.Heartbeat(self.run_id, self.policy_version, grant).to_msg()

    def connected_envs(self) -> int:
        """Environments of the actors connected now (from their HELLO): a sync round waits for this many."""
        return sum(a.num_envs for a in self.actors.values() if a.active)

    def connected_actors(self) -> int:
        """Actors not forgotten: heard from within actor_timeout as of the last poll that read every
        waiting message."""
        return sum(a.active for a in self.actors.values())

    def _forget_silent(self) -> None:
        """Forget the actors silent for actor_timeout (they must HELLO again). Only called by a poll that
        has read every waiting message: while the learner is busy (compiling, a long step) an actor's
        heartbeats wait in the socket, and that wait must not count as the actor's silence."""
        now = time.monotonic()
        for actor_id in [i for i, a in self.actors.items() if now - a.last_seen >= self.actor_timeout]:
            del self.actors[actor_id]

    def _handle(self, identity: bytes, msg: dict, raw: memoryview) -> None:
        """One parsed message, checked in the order of docs/PROTOCOL.md §7: HELLO on its own; for every
        other kind the `actor_id` and its connection first, then the message's own fields."""
        kind = msg["kind"]
        if kind == protocol.HELLO:
            self._hello(identity, protocol.Hello.from_msg(msg))
            return
        actor = self._known_actor(identity, protocol.actor_id_of(msg))
        actor.last_seen = time.monotonic()
        actor.active = True
        if kind == protocol.TRAJ:
            self._traj(identity, actor, protocol.Traj.from_msg(msg), raw)
        elif kind == protocol.PARAM_REQ:
            protocol.ParamReq.from_msg(msg)  # checked; the answer is the newest snapshot whatever it holds
            self._send_frames([identity, *self._params_frames])
        elif kind == protocol.HEARTBEAT:
            protocol.ActorHeartbeat.from_msg(msg)
            self._send(identity, self._beat(actor))
        else:
            raise ProtocolError("unexpected_kind", f"{kind} is not something an actor sends")

    def _traj(self, identity: bytes, actor: ActorInfo, traj: protocol.Traj, raw: memoryview) -> None:
        """A new batch: validated, appended to the log (if any), then stored and acknowledged (after the
        group's fsync in `fsync` mode). A batch stored before is acknowledged again, its episodes unchecked."""
        key = (actor.instance, traj.seq)
        if key in self._pending:  # sent again (on a new connection) before its group was synced
            self._pending[key].identities.append(identity)
            return
        if self.ledger.is_duplicate(actor.instance, traj.seq):
            self.duplicates += 1
            grant = self.ledger.grant(actor.instance, self._open())
            self._send(identity, protocol.Ack(traj.seq, 0, True, grant).to_msg())
            return
        episodes = traj.validate(
            self.feature_spec, self.max_steps, self.policy_version, self.vocab_size, self.text_vocab_size
        )
        if self.wal is not None:
            self._append(actor.instance, traj.seq, raw)
            if self.wal.durability == "fsync":
                self._pending[key] = _Pending(actor, traj.seq, episodes, [identity])
                return
        self._store(actor, traj.seq, episodes, [identity])

    def _append(self, instance: str, seq: int, raw: memoryview) -> None:
        """The batch into the log; ProtocolError `unavailable` (the actor keeps it and sends it again
        later) while the log cannot be written."""
        if self.storage_error and time.monotonic() < self._retry_at:
            raise ProtocolError("unavailable", f"the learner cannot store batches now: {self.storage_error}")
        try:
            self.wal.append(pack_batch(instance, seq, raw))
        except WalError as e:
            self._storage_failed(e)
            raise ProtocolError("unavailable", f"the learner cannot store batches now: {e}") from e
        self._storage_works()

    def _commit(self) -> None:
        """`fsync` mode: one sync for the batches appended this turn, then each is stored and acknowledged;
        if the sync fails none is, and each sender is told `unavailable` (it keeps the batch)."""
        if not self._pending:
            return
        pending, self._pending = list(self._pending.values()), {}
        try:
            self.wal.sync()
        except WalError as e:
            self._storage_failed(e)
            for p in pending:
                for identity in p.identities:
                    self._refuse(identity, "unavailable", f"the learner cannot store batches now: {e}", p.seq)
            return
        self._storage_works()
        for p in pending:
            self._store(p.actor, p.seq, p.episodes, p.identities)

    def _store(self, actor: ActorInfo, seq: int, episodes: list[Episode], identities: list[bytes]) -> None:
        """Into the replay and the ledger, then the ACK (the first connection's counts the episodes)."""
        self.on_episodes(episodes)
        self.ledger.record(actor.instance, seq)
        actor.episodes += len(episodes)
        grant = self.ledger.grant(actor.instance, self._open())
        for i, identity in enumerate(identities):
            accepted, duplicate = (len(episodes), False) if i == 0 else (0, True)
            self._send(identity, protocol.Ack(seq, accepted, duplicate, grant).to_msg())

    def _storage_failed(self, error: WalError) -> None:
        if not self.storage_error:
            self.log(
                f"learner: cannot write the log ({error}); not acknowledging trajectories until it works again "
                "(actors keep them and send them again; nothing is lost)"
            )
        self.storage_error = str(error)
        self._retry_at = time.monotonic() + STORAGE_RETRY_S

    def _storage_works(self) -> None:
        if self.storage_error:
            self.storage_error = ""
            self.log("learner: the log can be written again; acknowledging trajectories")
            self.heartbeat()  # grants grow again: tell the actors now

    def recover(self, start_lsn: int, newest_version: int) -> Counter:
        """After a restart: open the log and store its batches from `start_lsn` on (the log position the
        restored checkpoint saved), skipping those the restored ledger holds. Their steps' policy versions
        are capped at `newest_version`, as an actor caps what it re-sends to a restarted learner
        (docs/PROTOCOL.md §2.7). Returns counts: batches, episodes, skipped (stored before), unreadable."""
        counts: Counter[str] = Counter()
        never_refused = 2**31 - 1  # every logged batch passed the version check when it arrived
        for record in self.wal.recover(start_lsn):
            try:
                instance, seq, raw = unpack_batch(record.payload)
                traj = protocol.Traj.from_msg(protocol.parse(raw))
                if self.ledger.stored(instance, seq):
                    counts["skipped"] += 1
                    continue
                episodes = traj.validate(
                    self.feature_spec, self.max_steps, never_refused, self.vocab_size, self.text_vocab_size
                )
            except (ValueError, ProtocolError) as e:
                counts["unreadable"] += 1
                self.log(f"learner: log record {record.lsn} cannot be read back ({e}); skipped")
                continue
            self.on_episodes([_capped(ep, newest_version) for ep in episodes])
            self.ledger.record(instance, seq)
            counts["batches"] += 1
            counts["episodes"] += len(episodes)
        return counts

    def _hello(self, identity: bytes, hello: protocol.Hello) -> None:
        for old_id in [i for i, a in self.actors.items() if a.instance == hello.instance]:
            del self.actors[old_id]  # the same process on a new connection: its old id is void
        acked_upto = self.ledger.join(hello.instance, hello.first_unacked)
        actor_id = self._next_actor_id
        self._next_actor_id += 1
        self.actors[actor_id] = ActorInfo(
            actor_id, identity, hello.actor, hello.instance, hello.num_envs, time.monotonic()
        )
        welcome = protocol.Welcome(
            run_id=self.run_id,
            actor_id=actor_id,
            policy_version=self.policy_version,
            acked_upto=acked_upto,
            grant=self.ledger.grant(hello.instance, self._open()),
            heartbeat_every=self.heartbeat_every,
            **self._run_fields,
        )
        self._send(identity, welcome.to_msg())

    def _known_actor(self, identity: bytes, actor_id: int) -> ActorInfo:
        actor = self.actors.get(actor_id)
        if actor is None or actor.identity != identity:
            raise ProtocolError(
                "not_welcomed", f"actor_id {actor_id} has not completed the handshake on this socket"
            )
        return actor

    def _refuse(self, identity: bytes, code: str, reason: str, seq: int | None = None) -> None:
        self.rejected[code] += 1
        self._send_raw(identity, protocol.error(code, reason, seq))

    def _send(self, identity: bytes, msg: dict) -> None:
        self._send_raw(identity, wire.encode(msg))

    def _send_raw(self, identity: bytes, data: bytes) -> None:
        self._send_frames([identity, data])

    def _send_frames(self, frames: list) -> None:
        """Never blocks: a reply to an actor that does not read (its queue is full) or that is gone is
        dropped and counted by reason (the actor re-sends what stays unacknowledged)."""
        try:
            self.router.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.drops["queue_full"] += 1
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self.drops["actor_gone"] += 1

    def close(self) -> None:
        self._commit()
        if self.wal is not None:
            self.wal.close()
        if self._auth_events is not None:
            self.router.disable_monitor()
            self._auth_events.close(0)
        self.router.close(0)
        self.pub.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def _capped(ep: Episode, newest_version: int) -> Episode:
    versions = ep.steps["policy_version"]
    if versions.max(initial=0) <= newest_version:
        return ep
    return dataclasses.replace(ep, steps={**ep.steps, "policy_version": versions.clip(max=newest_version)})


def _seq_of(msg: dict | None) -> int | None:
    """A refused TRAJ's seq, echoed in the ERROR so the actor knows which batch to give up on."""
    seq = msg.get("seq") if isinstance(msg, dict) and msg.get("kind") == protocol.TRAJ else None
    return seq if type(seq) is int else None
