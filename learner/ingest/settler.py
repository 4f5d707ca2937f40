"""Settling TRAJ batches durably (the ingest's step between a validated batch and its answer; the replay
inserter, learner/inserter.py, is where the settled episodes go): a new batch is appended to the write-ahead log (learner/ingest/wal.py), then
stored (the replay via `on_episodes`, then the delivery ledger), then acknowledged; in `fsync` mode one
flush per poll turn covers the turn's batches (group commit). A batch refused for good (its episodes fail
validation) is settled the same way with a tombstone record (the batch's record with an empty message),
so the ledger's watermark, hence the actor's grant, keeps rising past it, in this process and after a
restart, and the batch is never stored if it comes again. `recover` replays the log after a crash.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from common import protocol
from common.protocol import Episode, ProtocolError
from common.trajectory_file import parse_record
from learner.ingest.audit import AuditLog
from learner.ingest.delivery import DeliveryLedger
from learner.ingest.registry import ActorInfo
from learner.ingest.transport import Transport
from learner.ingest.wal import WalError, WriteAheadLog, pack_batch, unpack_batch

STORAGE_RETRY_S = 1.0
"""After a failed log write, TRAJ batches are refused (`unavailable`) this long before writing is tried again."""
NEVER_REFUSED = 2**31 - 1
"""The newest version a logged batch is checked against when read back: it passed the check on arrival."""
TOMBSTONE = b""
"""The message a log record holds for a batch refused for good (empty: no TRAJ is): recovery settles its
seq and stores nothing."""

Validate = Callable[[protocol.Traj, int], list[Episode]]
"""A TRAJ's episodes, checked against the newest published version (learner/ingest/server.py `EpisodeCheck`)."""
Store = Callable[[list[Episode], int], None]
"""Where settled episodes go (learner/inserter.py), with the log record they are in (-1: no log)."""


@dataclass
class _Pending:
    """A batch appended to the log and waiting for the group's fsync before it is settled and answered."""

    actor: ActorInfo
    seq: int
    episodes: list[Episode]
    identities: list[bytes] = field(default_factory=list)
    """Connections to answer: the sender, and any that sent it again before the sync."""
    refusal: tuple[str, str] | None = None
    """(code, reason) of a batch refused for good: settled without storing anything, answered by ERROR."""
    record: int = -1
    """Its write-ahead log record (-1 without the log)."""


class BatchSettler:
    """Appends, group-commits, stores and answers TRAJ batches, and refuses them all (`unavailable`, the
    actor keeps them) while the log cannot be written. `wal` None (`--durability none`): stored at once.

    It also says how far each actor may send (`grant`): grants grow only while the log can be written and
    `gate`, the learner's rate limit, allows it. The gate is asked per grant (not per poll), so a poll that
    takes in many batches cannot hand out credit past the limit."""

    def __init__(
        self,
        ledger: DeliveryLedger,
        wal: WriteAheadLog | None,
        on_episodes: Store,
        transport: Transport,
        gate: Callable[[], bool],
        log: Callable[[str], None],
        audit: AuditLog | None = None,
    ):
        """`audit`: --audit-log, a line per logged batch (learner/ingest/audit.py); needs `wal`."""
        self.ledger, self.wal, self.on_episodes, self.audit = ledger, wal, on_episodes, audit
        self.transport, self.gate, self.log = transport, gate, log
        self.storage_error = ""
        """Why the log cannot be written now ("" while it can): TRAJ batches are refused `unavailable`."""
        self._retry_at = 0.0
        self._pending: dict[tuple[str, int], _Pending] = {}
        """Batches of this loop turn waiting for the group's fsync, by (instance, seq)."""

    def open(self) -> bool:
        """Whether grants may grow: the rate limit allows it and the log can be written."""
        return not self.storage_error and self.gate()

    def grant(self, instance: str) -> int:
        """The highest seq `instance` may send now (what ACK, WELCOME and HEARTBEAT carry)."""
        return self.ledger.grant(instance, self.open())

    def resent_while_pending(self, instance: str, seq: int, identity: bytes) -> bool:
        """A batch sent again (on a new connection) before its group was synced: answer it with the group."""
        pending = self._pending.get((instance, seq))
        if pending is not None:
            pending.identities.append(identity)
        return pending is not None

    def take(
        self, actor: ActorInfo, seq: int, raw: memoryview, episodes: list[Episode], identity: bytes
    ) -> None:
        """A new, validated batch: logged, then stored and acknowledged (after the group's fsync in `fsync`
        mode). ProtocolError `unavailable` while the log cannot be written."""
        self._log(raw, _Pending(actor, seq, episodes, [identity]))

    def settle_refused(self, actor: ActorInfo, seq: int, identity: bytes, code: str, reason: str) -> None:
        """A batch refused for good: its tombstone logged, its seq settled in the ledger (stored nothing),
        then the ERROR. ProtocolError `unavailable` while the log cannot be written (the actor keeps the
        batch and is refused again when it sends it again)."""
        self._log(TOMBSTONE, _Pending(actor, seq, [], [identity], (code, reason)))

    def _log(self, raw: bytes | memoryview, pending: _Pending) -> None:
        if self.wal is not None:
            pending.record = self._append(raw, pending)
            if self.wal.durability == "fsync":
                self._pending[(pending.actor.instance, pending.seq)] = pending
                return
        self._settle(pending)

    def _append(self, raw: bytes | memoryview, p: _Pending) -> int:
        """The record's LSN (and its audit line, or neither)."""
        if self.storage_error and time.monotonic() < self._retry_at:
            raise ProtocolError("unavailable", f"the learner cannot store batches now: {self.storage_error}")
        try:
            lsn = self.wal.append(pack_batch(p.actor.instance, p.seq, raw))
            self._audit(p.actor.instance, p.seq, p.episodes, p.refusal is not None, lsn)
        except WalError as e:
            self._storage_failed(e)
            raise ProtocolError("unavailable", f"the learner cannot store batches now: {e}") from e
        self._storage_works()
        return lsn

    def commit(self) -> None:
        """`fsync` mode: one sync for the batches appended this turn, then each is settled and answered;
        if the sync fails none is, and each sender is told `unavailable` (it keeps the batch)."""
        if not self._pending:
            return
        pending, self._pending = list(self._pending.values()), {}
        try:
            self.wal.sync()
            if self.audit is not None:
                self._audit_io(self.audit.sync)
        except WalError as e:
            self._storage_failed(e)
            for p in pending:
                for identity in p.identities:
                    self.transport.refuse(
                        identity, "unavailable", f"the learner cannot store batches now: {e}", p.seq
                    )
            return
        self._storage_works()
        for p in pending:
            self._settle(p)

    def _audit(self, instance: str, seq: int, episodes: list, refused: bool, lsn: int) -> None:
        """The record's audit line (--audit-log); WalError when it cannot be written, after taking the
        record back out of the log: a record never lacks its line."""
        if self.audit is None:
            return
        outcome = "refused" if refused else "stored"
        try:
            self._audit_io(lambda: self.audit.write(instance, seq, len(episodes), outcome, lsn))
        except WalError:
            self.wal.retract(lsn)  # WalError too if it cannot: recovery then writes the line
            raise

    def _audit_io(self, io: Callable[[], None]) -> None:
        """An audit file operation, its OSError as the WalError that refuses batches (`unavailable`)."""
        try:
            io()
        except OSError as e:
            raise WalError(e.errno, f"cannot write the audit log {self.audit.path}: {e.strerror or e}") from e

    def _settle(self, p: _Pending) -> None:
        """Into the replay (unless refused) and the ledger, then the answer: the ACK (the first connection's
        counts the episodes) or the refusal's ERROR."""
        if p.refusal is None:
            self.on_episodes(p.episodes, p.record)
        self.ledger.record(p.actor.instance, p.seq)
        if p.refusal is not None:
            for identity in p.identities:
                self.transport.refuse(identity, *p.refusal, p.seq)
            return
        p.actor.episodes += len(p.episodes)
        grant = self.grant(p.actor.instance)
        for i, identity in enumerate(p.identities):
            accepted, duplicate = (len(p.episodes), False) if i == 0 else (0, True)
            self.transport.send(identity, protocol.Ack(p.seq, accepted, duplicate, grant).to_msg())

    def _storage_failed(self, error: WalError) -> None:
        if not self.storage_error:
            self.log(
                f"learner: cannot write the log ({error}); not acknowledging trajectories until it works again "
                "(actors keep them and send them again; nothing is lost)"
            )
        self.storage_error = str(error)
        self._retry_at = time.monotonic() + STORAGE_RETRY_S

    def _storage_works(self) -> None:
        """The log works again: grants may grow, and the IngestServer tells every actor its grant at the
        end of this poll (`IngestServer._check_gate`)."""
        if self.storage_error:
            self.storage_error = ""
            self.log("learner: the log can be written again; acknowledging trajectories")

    def recover(self, start_lsn: int, newest_version: int, validate: Validate) -> Counter:
        """After a restart: open the log and settle its batches from `start_lsn` on (the log position the
        restored checkpoint saved), skipping those the restored ledger holds: a batch is stored, a
        tombstone only settles its seq. Steps' policy versions are capped at `newest_version`, as an
        actor caps what it re-sends to a restarted learner (docs/PROTOCOL.md §2.7). Returns counts:
        batches, episodes, refused (tombstones), skipped (settled before), unreadable."""
        counts: Counter[str] = Counter()
        for record in self.wal.recover(start_lsn):
            try:
                instance, seq, raw = unpack_batch(record.payload)
                if self.ledger.stored(instance, seq):
                    counts["skipped"] += 1
                    continue
                episodes = None if len(raw) == 0 else validate(_parsed(raw), NEVER_REFUSED)
            except (ValueError, ProtocolError) as e:
                counts["unreadable"] += 1
                self.log(f"learner: log record {record.lsn} cannot be read back ({e}); skipped")
                continue
            if self.audit is not None and record.lsn > self.audit.newest_lsn:  # killed before its line
                outcome, n = ("refused", 0) if episodes is None else ("stored", len(episodes))
                line = functools.partial(
                    self.audit.write, instance, seq, n, outcome, record.lsn, recovered=True
                )
                self._audit_io(line)
            if episodes is None:
                counts["refused"] += 1
            else:
                self.on_episodes([_capped(ep, newest_version) for ep in episodes], record.lsn)
                counts["batches"] += 1
                counts["episodes"] += len(episodes)
            self.ledger.record(instance, seq)
        return counts


class LoggedEpisodes:
    """Episodes read back from the log by (record, index): the items a checkpoint's replay references
    (learner/replay/file.py). Each record is validated as on arrival (`validate`) and each episode capped
    at the newest version it was stored with. Read-only: usable before the log is recovered."""

    def __init__(self, wal: WriteAheadLog, validate: Validate):
        self.wal, self.validate = wal, validate
        self.read_back = 0
        """Episodes read back so far (a restore reports it)."""

    def __call__(self, origins: np.ndarray, caps: np.ndarray) -> list[Episode]:
        payloads = self.wal.read(set(origins[:, 0].tolist()))
        batches: dict[int, list[Episode]] = {}
        out = []
        for (lsn, index), cap in zip(origins.tolist(), caps.tolist(), strict=True):
            if lsn not in batches:
                batches[lsn] = self._batch(lsn, payloads.get(lsn))
            if not 0 <= index < len(batches[lsn]):
                raise ValueError(f"{self.wal.directory}: record {lsn} has no episode {index}")
            out.append(_capped(batches[lsn][index], cap))
        self.read_back += len(out)
        return out

    def _batch(self, lsn: int, payload: bytes | None) -> list[Episode]:
        where = f"{self.wal.directory}: record {lsn}"
        if payload is None:
            raise ValueError(f"{where} is not in the log (deleted or damaged); the checkpoint needs it")
        try:
            _instance, _seq, raw = unpack_batch(payload)
            if len(raw) == 0:
                raise ValueError("it is a tombstone, it holds no episodes")
            return self.validate(_parsed(raw), NEVER_REFUSED)
        except (ValueError, ProtocolError) as e:
            raise ValueError(f"{where} cannot be read back: {e}") from e


def _parsed(raw: memoryview) -> protocol.Traj:
    """A logged TRAJ; one an older learner logged (protocol version 3 or 2) is read as a trajectory file's
    record is, so an upgrade loses no acknowledged batch."""
    return protocol.Traj.from_msg(parse_record(raw))


def _capped(ep: Episode, newest_version: int) -> Episode:
    versions = ep.steps["policy_version"]
    if versions.max(initial=0) <= newest_version:
        return ep
    return dataclasses.replace(ep, steps={**ep.steps, "policy_version": versions.clip(max=newest_version)})
