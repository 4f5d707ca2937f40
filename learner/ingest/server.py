"""The learner's end of the protocol (docs/PROTOCOL.md): it dispatches each message to the parts it is
handed, built by learner/setup/ingest.py.

The parts: learner/ingest/transport.py (the ROUTER and PUB sockets, replies, drops),
learner/ingest/registry.py (who is welcomed and alive), learner/ingest/settler.py (each TRAJ batch
settled: write-ahead log, group commit, the replay and the ledger, recovery), learner/ingest/publisher.py
(snapshots) and learner/ingest/delivery.py (which batches are settled, and the grants). All socket work
happens on the caller's thread (`poll`, `publish`, `heartbeat`). Messages are parsed into the dataclasses
of the common/protocol/ package (messages.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from common import protocol
from common.protocol import Episode, ProtocolError
from learner.ingest.delivery import DeliveryLedger
from learner.ingest.publisher import ParamPublisher
from learner.ingest.registry import ActorInfo, ActorRegistry
from learner.ingest.settler import BatchSettler
from learner.ingest.transport import Transport
from learner.ingest.wal import WriteAheadLog

__all__ = ["ActorInfo", "EpisodeCheck", "IngestServer", "RunWelcome"]


@dataclass(frozen=True)
class EpisodeCheck:
    """What a TRAJ's episodes must satisfy (docs/PROTOCOL.md §6-7): the one place they are validated."""

    spec: protocol.EpisodeSpec
    """What the policy family's episodes carry (observations, choices and their bounds, id ranges)."""
    max_steps: int
    """Longest episode accepted."""

    def episodes(self, traj: protocol.Traj, newest_version: int) -> list[Episode]:
        """The batch's episodes, or ProtocolError at the first fault (a step newer than `newest_version`
        is `future_version`)."""
        return traj.validate(self.spec, self.max_steps, newest_version)


@dataclass(frozen=True)
class RunWelcome:
    """What every actor's WELCOME carries alike: the run's id, the heartbeat cadence and the run-wide
    fields. Checked once when built (a key WELCOME does not have is a TypeError here, not at the first
    HELLO)."""

    run_id: str
    """New for every learner process: a different one tells an actor the learner restarted."""
    heartbeat_every: float
    """Seconds between the learner's unsolicited HEARTBEATs."""
    fields: dict[str, Any]
    """`model` (a ModelConfig), `max_steps`, and optionally `mode`, `text_vocab_size` (the text encoder's
    WordPiece vocabulary) and `inference_port` (the inference service's port, 0 without one)."""

    def __post_init__(self) -> None:
        self.welcome(1, 0, 0, 0)

    def welcome(self, actor_id: int, policy_version: int, acked_upto: int, grant: int) -> protocol.Welcome:
        return protocol.Welcome(
            self.run_id, actor_id, policy_version, acked_upto, grant, self.heartbeat_every, **self.fields
        )


class IngestServer:
    """The ingest ROUTER and params PUB (`transport`, bound before it is handed in), and how each message
    is answered: HELLO registers the actor and gets a WELCOME; TRAJ is checked (`check`) and settled by
    the settler (stored then ACK, or refused for good then ERROR); PARAM_REQ gets the newest
    snapshot; HEARTBEAT gets one back. A refused message gets an ERROR and is counted in `rejected` by
    code, so a malformed message costs that message, never the learner. Which batches are settled and how
    far each actor may send lives in `ledger` (learner/ingest/delivery.py); the settler hands out the
    grants, asking the learner's rate limit. Every part comes built (learner/setup/ingest.py composes
    them)."""

    def __init__(
        self,
        transport: Transport,
        registry: ActorRegistry,
        ledger: DeliveryLedger,
        settler: BatchSettler,
        params: ParamPublisher,
        check: EpisodeCheck,
        welcome: RunWelcome,
    ):
        self.transport, self.registry, self.ledger, self.settler = transport, registry, ledger, settler
        self.params, self.check, self.welcome = params, check, welcome
        self.ingest_port, self.params_port = transport.ingest_port, transport.params_port
        self.rejected: Counter[str] = transport.rejected
        """Refused messages by reason."""
        self.drops: Counter[str] = transport.drops
        """Replies that could not be sent, by reason."""
        self.actors: dict[int, ActorInfo] = registry.actors
        self.run_id = welcome.run_id
        self.wal: WriteAheadLog | None = settler.wal
        """The write-ahead log every new batch is appended to before it is stored (None: `--durability none`)."""
        self.accepting = True
        """Whether grants could grow at the end of the last poll (for the metrics)."""
        self.duplicates = 0
        """TRAJ batches received again after they were settled (acknowledged again, stored once)."""
        self._last_beat = time.monotonic()

    @property
    def storage_error(self) -> str:
        """Why the log cannot be written now ("" while it can): TRAJ batches are refused `unavailable`."""
        return self.settler.storage_error

    def publish(self, version: int, flat: dict[str, np.ndarray]) -> None:
        """Publish a snapshot to all subscribers and keep it to answer PARAM_REQ."""
        self.params.publish(version, flat)
        for identity in self.transport.peers.older(actor.identity for actor in self.registry.live()):
            self.params.answer(identity)  # a version 3 actor refuses the PUB's version 4 PARAMS

    def poll(self, timeout_ms: int, max_messages: int = 1000) -> int:
        """Handle waiting messages; block up to timeout_ms for the first. Returns how many were handled."""
        handled = 0
        while handled < max_messages:
            got = self.transport.receive(timeout_ms if handled == 0 else 0)
            if got is None:
                break
            handled += 1
            if got[1] is not None:
                self._handle(*got)
        self.settler.commit()  # group commit: one fsync for every batch of this turn, then their answers
        self.transport.count_auth_failures()
        if handled < max_messages:  # everything that arrived is read: silence now is the actor's own
            self.registry.forget_silent()
        self._check_gate()
        if time.monotonic() - self._last_beat >= self.welcome.heartbeat_every:
            self.heartbeat()
        return handled

    def _handle(self, identity: bytes, raw: memoryview) -> None:
        """One message, checked in the order of docs/PROTOCOL.md §7: HELLO on its own; for every other
        kind the `actor_id` and its connection first, then the message's own fields."""
        msg = None
        try:
            msg = protocol.parse(raw, protocol.PEER_VERSIONS)
            self.transport.peers.heard(identity, msg["v"])  # (a version this run cannot serve: bad_version)
            kind = msg["kind"]
            if kind == protocol.HELLO:
                self._hello(identity, protocol.Hello.from_msg(msg))
                return
            actor = self.registry.known(identity, protocol.actor_id_of(msg))
            if kind == protocol.TRAJ:
                self._traj(identity, actor, protocol.Traj.from_msg(msg), raw)
            elif kind == protocol.PARAM_REQ:
                protocol.ParamReq.from_msg(
                    msg
                )  # checked; the answer is the newest snapshot whatever it holds
                self.params.answer(identity)
            elif kind == protocol.HEARTBEAT:
                protocol.ActorHeartbeat.from_msg(msg)
                self.transport.send(identity, self._beat(actor))
            else:
                raise ProtocolError("unexpected_kind", f"{kind} is not something an actor sends")
        except ProtocolError as e:
            self.transport.refuse(identity, e.code, e.reason, _seq_of(msg))
        except Exception as e:  # a validator gap must cost one message, never the learner
            self.transport.refuse(identity, "invalid", f"{type(e).__name__}: {e}", _seq_of(msg))

    def _traj(self, identity: bytes, actor: ActorInfo, traj: protocol.Traj, raw: memoryview) -> None:
        """A batch settled before is acknowledged again, its episodes unchecked; a new one is validated,
        then stored and acknowledged, or, if its episodes fail, settled as refused for good (so the grant
        keeps rising past it) and answered with the ERROR."""
        if self.settler.resent_while_pending(actor.instance, traj.seq, identity):
            return
        if self.ledger.is_duplicate(actor.instance, traj.seq):
            self.duplicates += 1
            self.transport.send(
                identity, protocol.Ack(traj.seq, 0, True, self.settler.grant(actor.instance)).to_msg()
            )
            return
        try:
            episodes = self.check.episodes(traj, self.params.version)
        except Exception as e:  # the same episodes fail the same way whenever they come: refused for good
            code, reason = (
                (e.code, e.reason)
                if isinstance(e, ProtocolError)
                else ("invalid", f"{type(e).__name__}: {e}")
            )
            self.settler.settle_refused(actor, traj.seq, identity, code, reason)
            return
        self.settler.take(actor, traj.seq, raw, episodes, identity)

    def _hello(self, identity: bytes, hello: protocol.Hello) -> None:
        acked_upto = self.ledger.join(hello.instance, hello.first_unacked)
        actor = self.registry.register(identity, hello)
        grant = self.settler.grant(hello.instance)
        welcome = self.welcome.welcome(actor.actor_id, self.params.version, acked_upto, grant)
        self.transport.send(identity, welcome.to_msg())

    def _check_gate(self) -> None:
        """When grants may grow again (the rate limit allows it and the log can be written), tell every
        actor its new grant at once, not at the next beat."""
        was, self.accepting = self.accepting, self.settler.open()
        if self.accepting and not was:
            self.heartbeat()

    def heartbeat(self) -> None:
        """HEARTBEAT to every live actor: they learn the learner is alive, its newest version, their grant."""
        self._last_beat = time.monotonic()
        for actor in self.registry.live():  # an abandoned handshake's socket is gone: nothing to tell it
            self.transport.send(actor.identity, self._beat(actor))

    def _beat(self, actor: ActorInfo) -> dict:
        return protocol.Heartbeat(
            self.run_id, self.params.version, self.settler.grant(actor.instance)
        ).to_msg()

    def connected_envs(self) -> int:
        """Environments of the actors connected now (from their HELLO): a sync round waits for this many."""
        return self.registry.connected_envs()

    def connected_actors(self) -> int:
        """Actors not forgotten: heard from within actor_timeout as of the last poll that read every
        waiting message."""
        return self.registry.connected_actors()

    def recover(self, start_lsn: int, newest_version: int) -> Counter:
        """After a restart: settle the log's batches from `start_lsn` on (learner/ingest/settler.py
        `BatchSettler.recover`). Returns counts: batches, episodes, refused, skipped, unreadable."""
        return self.settler.recover(start_lsn, newest_version, self.check.episodes)

    def close(self) -> None:
        self.settler.commit()
        if self.wal is not None:
            self.wal.close()
        if self.settler.audit is not None:
            self.settler.audit.close()
        self.transport.close()


def _seq_of(msg: dict | None) -> int | None:
    """A refused TRAJ's seq, echoed in the ERROR so the actor knows which batch to give up on."""
    seq = msg.get("seq") if isinstance(msg, dict) and msg.get("kind") == protocol.TRAJ else None
    return seq if type(seq) is int else None
