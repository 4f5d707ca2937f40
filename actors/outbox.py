"""Finished episodes on their way to the learner: kept until acknowledged, re-sent when in doubt.

Episodes wait in `pending` until the learner's grant lets a parcel go (credit-based flow control:
docs/PROTOCOL.md §2); a sent parcel stays in `unacked` under its `seq` until the learner's ACK, and is
sent again, same `seq`, after a reconnect or when its ACK is overdue. The learner stores a `seq` once,
so a re-send is never counted twice. `pending` is bounded: when the learner is behind and it fills,
the actor either waits (stops stepping its environments) or discards the oldest pending episodes,
counted (`--when-blocked`).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Parcel:
    """A batch of finished episodes on its way to the learner: one TRAJ's worth under its seq (what
    docs/PROTOCOL.md calls a batch; the counters keep that word, batches_*), kept until the learner
    acknowledges that seq. Not learner/batch.py:Batch, the learner's training batch."""

    seq: int
    episodes: list[dict[str, Any]]
    """Wire fields of each episode (protocol.episode_fields, built by common/episode.py)."""
    sent_at: float
    """time.monotonic() of its last sending (an ACK overdue from then breaks the session)."""


class Outbox:
    """The actor's side of acknowledged delivery: every finished episode from the moment it is recorded
    until the learner has stored it.

    It holds the `pending` episodes (bounded by `max_pending`, waiting for credit), the sent parcels in
    `unacked` by seq, the next seq and the learner's `grant`. It numbers parcels and decides what may go
    (`take_parcels`), what to send again after a reconnect (`to_resend`), when an ACK is `overdue`, and,
    when the learner lags, whether the actor waits (`blocked`) or discards its oldest pending episodes
    (`--when-blocked`). It never touches a socket: the actor sends what it hands out and feeds back the
    WELCOME, ACK and grants it receives; its counts go into the actor's `stats`."""

    def __init__(self, max_pending: int, max_parcel: int, when_blocked: str, stats: Counter):
        if when_blocked not in ("wait", "discard"):
            raise ValueError(f'when_blocked must be "wait" or "discard", got {when_blocked!r}')
        self.max_pending = max_pending
        self.max_parcel = max_parcel
        self.when_blocked = when_blocked
        self.stats = stats
        self.pending: deque[dict[str, Any]] = deque()
        self.unacked: OrderedDict[int, Parcel] = OrderedDict()
        self.next_seq = 1
        self.grant = 0
        """The highest seq the learner lets this actor send."""
        self.unavailable: set[int] = set()
        """Sent parcels the learner refused `unavailable` (it could not store them then): sent again at the
        learner's next HEARTBEAT (every second, and at once when its storage works again)."""
        self.storage_down = False
        """The learner refused a parcel `unavailable` and has acknowledged none since."""
        self.on_settled: Callable[[int, int, str], None] | None = None
        """Called with (seq, episodes, "ack" | "duplicate" | "welcome") for each parcel the learner has
        (actors/ack_log.py)."""

    # ---- state -------------------------------------------------------------------------------------
    @property
    def first_unacked(self) -> int:
        """The lowest seq still held (or the next one): sent in HELLO."""
        return next(iter(self.unacked), self.next_seq)

    def blocked(self) -> bool:
        """True when the actor should stop stepping its environments until the learner catches up."""
        return self.when_blocked == "wait" and len(self.pending) >= self.max_pending

    def held(self) -> int:
        """Episodes not yet acknowledged (pending and unacknowledged)."""
        return len(self.pending) + sum(len(b.episodes) for b in self.unacked.values())

    # ---- events ------------------------------------------------------------------------------------
    def add(self, episodes: list[dict[str, Any]]) -> None:
        self.pending.extend(episodes)
        while self.when_blocked == "discard" and len(self.pending) > self.max_pending:
            self.pending.popleft()
            self.stats["episodes_discarded_backlog"] += 1

    def take_parcels(self) -> list[Parcel]:
        """New parcels the grant allows, moved to `unacked`; the caller sends them."""
        out = []
        while self.pending and self.next_seq <= self.grant:
            n = min(self.max_parcel, len(self.pending))
            parcel = Parcel(self.next_seq, [self.pending.popleft() for _ in range(n)], time.monotonic())
            self.unacked[parcel.seq] = parcel
            self.next_seq += 1
            out.append(parcel)
        return out

    def on_grant(self, grant: int, authoritative: bool = False) -> None:
        """A grant from ACK or HEARTBEAT only ever raises it; WELCOME's replaces it (a new learner)."""
        self.grant = grant if authoritative else max(self.grant, grant)

    def on_ack(self, seq: int, accepted: int, duplicate: bool) -> None:
        self.unavailable.discard(seq)
        self.storage_down = False
        parcel = self.unacked.pop(seq, None)
        if parcel is None:
            self.stats["acks_unexpected"] += 1  # an ACK for a parcel already settled (a re-send's twin)
            return
        self.stats["episodes_acked"] += len(parcel.episodes)
        if self.on_settled is not None:
            self.on_settled(seq, len(parcel.episodes), "duplicate" if duplicate else "ack")
        if duplicate:
            self.stats["batches_acked_as_duplicate"] += 1
        elif accepted != len(parcel.episodes):
            self.stats["acks_count_mismatch"] += 1

    def on_welcome(self, acked_upto: int, grant: int) -> None:
        """The learner stores everything up to `acked_upto`: forget those parcels."""
        for seq in [s for s in self.unacked if s <= acked_upto]:
            episodes = len(self.unacked.pop(seq).episodes)
            self.stats["episodes_acked"] += episodes
            if self.on_settled is not None:
                self.on_settled(seq, episodes, "welcome")
        self.on_grant(grant, authoritative=True)

    def overdue(self, ack_timeout: float) -> bool:
        """True when the oldest unacknowledged parcel has waited longer than ack_timeout for its ACK."""
        oldest = next(iter(self.unacked.values()), None)
        return oldest is not None and time.monotonic() - oldest.sent_at > ack_timeout

    def on_unavailable(self, seq: int) -> None:
        """The learner could not store parcel `seq` now: keep it for `to_retry`."""
        self.storage_down = True
        if seq in self.unacked:
            self.unavailable.add(seq)
            self.stats["batches_refused_unavailable"] += 1

    def to_retry(self) -> list[Parcel]:
        """The parcels refused `unavailable`, oldest first, to send again now (on the learner's HEARTBEAT:
        its storage may work again), each once until it is refused again."""
        parcels = [self.unacked[s] for s in sorted(self.unavailable) if s in self.unacked]
        self.unavailable.clear()
        now = time.monotonic()
        for parcel in parcels:
            parcel.sent_at = now
        self.stats["batches_retried"] += len(parcels)
        return parcels

    def to_resend(self) -> list[Parcel]:
        """Every unacknowledged parcel, oldest first, to send again (after a new handshake)."""
        self.unavailable.clear()
        now = time.monotonic()
        for parcel in self.unacked.values():
            parcel.sent_at = now
        self.stats["batches_resent"] += len(self.unacked)
        return list(self.unacked.values())

    def relabel_versions(self, newest: int) -> int:
        """Cap the policy versions of held episodes at `newest` (a restarted learner numbers again from its
        checkpoint's version, and refuses versions it has not published); returns the steps changed."""
        changed = 0
        for ep in [*self.pending, *(e for b in self.unacked.values() for e in b.episodes)]:
            versions = ep["policy_version"]
            over = versions > newest
            if over.any():
                changed += int(over.sum())
                ep["policy_version"] = versions.clip(max=newest)
        return changed
