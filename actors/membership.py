"""The actor's place in a learner's run: joining it (HELLO -> WELCOME), taking in its replies, noticing when
the session broke (a silent learner, an overdue ACK, a learner that forgot us or restarted) and sending
the outbox's parcels. The actor then joins again on a fresh socket and re-sends what is unacknowledged."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from actors.config import ActorConfig
from actors.connection import LearnerConnection, Snapshot
from actors.outbox import Outbox, Parcel
from common import protocol

KEEP_ON_ERROR = frozenset({"no_credit", "not_welcomed", "unavailable"})
"""ERROR codes after which a refused parcel is kept and sent again (after a new grant or handshake)."""


class Membership:
    """The session state an actor keeps with one learner over its sockets (a LearnerConnection, passed to
    each call): the `run_id` it joined, and `rejoin`, why the session ended ("" while it holds). Replies
    settle the `outbox`; counts go into the actor's `stats`."""

    def __init__(self, cfg: ActorConfig, outbox: Outbox, stats: Counter, log, instance: str):
        self.cfg, self.outbox, self.stats, self.log, self.instance = cfg, outbox, stats, log, instance
        self.run_id = ""
        """The run of the last WELCOME (a HEARTBEAT of another run means the learner restarted)."""
        self.rejoin = ""
        """Why the session ended (not_welcomed, a silent learner, an overdue ACK): handshake again."""
        self.welcomed = False

    def handshake(self, conn: LearnerConnection, give_up: Callable[[], bool]) -> protocol.Welcome | None:
        cfg = self.cfg
        return conn.handshake(
            cfg.name, planned_envs(cfg), self.instance, lambda: self.outbox.first_unacked,
            cfg.handshake_timeout, cfg.max_backoff, give_up,
        )  # fmt: skip

    def join(self, conn: LearnerConnection, welcome: protocol.Welcome) -> None:
        """Start a session: settle what the learner already stores, count and log the join."""
        self.outbox.on_welcome(welcome.acked_upto, welcome.grant)
        if self.welcomed:  # every WELCOME after the first, including one that came before any parameters
            self.stats["rejoins"] += 1
        self.welcomed = True
        self.log(
            f"actor {conn.actor_id}: joined run {welcome.run_id} at {conn.ingest_addr}"
            + (f" ({self.rejoin}; {self.outbox.held()} episodes held)" if self.rejoin else "")
        )
        self.rejoin = ""

    def end(self, reason: str) -> None:
        """The session is over (`reason`): the actor joins again."""
        self.rejoin = reason

    def check(self, conn: LearnerConnection) -> None:
        """Mark the session broken when the learner has gone silent or an ACK is overdue: the caller then
        joins again on a fresh socket (Lazy Pirate) and re-sends what is unacknowledged."""
        silent = time.monotonic() - conn.last_heard
        if not self.rejoin and silent > self.cfg.learner_timeout:
            self.rejoin = f"the learner was silent for {silent:.0f}s"
        if not self.rejoin and self.outbox.overdue(self.cfg.ack_timeout):
            self.rejoin = f"no ACK for {self.cfg.ack_timeout:.0f}s"

    def send(self, conn: LearnerConnection, parcels: list[Parcel]) -> None:
        for parcel in parcels:
            if conn.send(protocol.Traj(conn.actor_id, parcel.seq, parcel.episodes).to_msg()):
                self.stats["batches_sent"] += 1
            else:  # kept in the outbox: sent again when its ACK is overdue
                self.stats["send_queue_full"] += 1

    def take_in(self, conn: LearnerConnection) -> Snapshot | None:
        """Settle the replies that came (ACKs, HEARTBEATs, ERRORs); the newest parameter snapshot that
        came with them, (version, flat arrays), or None."""
        replies, newest = conn.receive()  # parsed: a malformed reply was counted in bad_replies there
        for reply in replies:
            if isinstance(reply, protocol.Ack):
                self.outbox.on_grant(reply.grant)
                self.outbox.on_ack(reply.seq, reply.accepted, reply.duplicate)
            elif isinstance(reply, protocol.Heartbeat):
                self.outbox.on_grant(reply.grant)
                if self.run_id and reply.run_id != self.run_id:
                    self.rejoin = "the learner restarted"
                else:  # its storage may work again: what it refused `unavailable` goes again now
                    self.send(conn, self.outbox.to_retry())
            elif isinstance(reply, protocol.Error):
                self._refused(reply)
        return newest

    def _refused(self, error: protocol.Error) -> None:
        code, seq = error.code, error.seq
        self.stats["errors"] += 1
        if code == "not_welcomed":
            self.rejoin = "the learner no longer knows this actor"
        again = code == "unavailable" and self.outbox.storage_down  # said once until an ACK comes
        if code == "unavailable" and seq is not None:
            self.outbox.on_unavailable(seq)
        if seq is not None and seq in self.outbox.unacked and code not in KEEP_ON_ERROR:
            # The learner will never take this parcel (malformed): drop it, counted, not re-sent forever.
            self.stats["episodes_refused"] += len(self.outbox.unacked.pop(seq).episodes)
        if not again:
            self.log(f"actor: learner refused a message: {code}: {error.reason}")


def planned_envs(cfg: ActorConfig) -> int:
    """How many environments this actor will run (announced in HELLO before they are built)."""
    if cfg.env == "adb":
        return len(cfg.adb.serials) or len(cfg.adb.avds) or 1
    return cfg.num_envs
