"""Acknowledged delivery on the learner's side: which TRAJ batches are settled, and how far each actor may send.

Each actor process picks a random `instance` string at start and numbers its TRAJ batches 1, 2, 3, ...
for its whole life, across reconnects. The ledger remembers, per instance, every settled `seq`: stored,
or refused for good (its episodes failed validation; the actor drops it). It keeps a watermark, the
highest seq at and below which every seq is settled, plus the few settled above it, so a batch re-sent
after a lost ACK, a reconnect or a learner restart is acknowledged again but stored once, and a refused
one never holds the watermark back. It is saved with each checkpoint next to the replay, so the two
always agree.

Flow control is credit-based (ZeroMQ guide, "Credit-Based Flow Control"): the learner grants each
instance an absolute `grant`, the highest `seq` it may send. Grants only grow, so they survive
reordering and repetition; while the learner is behind it stops raising them, and the actor's
unacknowledged window, hence the learner's ingest queue, stays bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from common.protocol import ProtocolError


@dataclass
class _Stream:
    watermark: int = 0
    """Every seq <= watermark is settled (stored, or refused for good)."""
    above: set[int] = field(default_factory=set)
    """Settled seqs above the watermark (batches that overtook a missing one)."""
    granted: int = 0
    """The highest seq this instance may send."""
    joined: bool = False
    """The instance said HELLO to this process (not saved: a restored stream starts False)."""


class DeliveryLedger:
    """Per actor `instance`: which TRAJ seqs are settled (a watermark plus the few settled above it) and
    the grant handed out, least recently used first and bounded by `max_instances`.

    The IngestServer asks it whether a batch is a duplicate (acknowledge again, store nothing) or
    beyond the grant (`no_credit`), records a batch once it is in the replay or refused for good, and
    asks for the grant
    each ACK, WELCOME and HEARTBEAT carries. `state`/`load_state` save it with each checkpoint next to
    the replay, so after a restart the two agree on what is stored; `join` reconciles an instance that
    holds batches the restored ledger never saw."""

    def __init__(self, credit: int, max_instances: int = 100_000):
        if credit < 1:
            raise ValueError(f"credit must be at least 1, got {credit}")
        self.credit = credit
        self.max_instances = max_instances
        self._streams: OrderedDict[str, _Stream] = OrderedDict()  # least recently used first
        self.forgotten = 0
        """Instances dropped to keep the ledger bounded (long-silent actors)."""
        self.lost_in_restart = 0
        """Batches acknowledged by an earlier learner process after its last checkpoint (see `join`)."""

    def _stream(self, instance: str) -> _Stream:
        stream = self._streams.get(instance)
        if stream is None:
            stream = self._streams[instance] = _Stream()
            while len(self._streams) > self.max_instances:
                self._streams.popitem(last=False)
                self.forgotten += 1
        self._streams.move_to_end(instance)
        return stream

    def join(self, instance: str, first_unacked: int) -> int:
        """An instance (re)joins holding batches from `first_unacked` on; returns its watermark for WELCOME.

        The actor no longer holds the batches below `first_unacked`: they are skipped over. On its first
        HELLO to this process, those this ledger never settled were acknowledged by an earlier learner
        process and lost with it (it died after its last checkpoint, `--durability none`): their number
        is added to `lost_in_restart`. On a later HELLO a gap cannot be such a batch (every batch this
        process acknowledged or refused is settled here), so nothing is counted."""
        stream = self._stream(instance)
        first_join, stream.joined = not stream.joined, True
        if first_unacked - 1 > stream.watermark:
            gap = range(stream.watermark + 1, first_unacked)
            if first_join:
                self.lost_in_restart += sum(seq not in stream.above for seq in gap)
            stream.above = {seq for seq in stream.above if seq >= first_unacked}
            stream.watermark = first_unacked - 1
            self.record(instance, stream.watermark)  # pull up any stored batches right above it
        return stream.watermark

    def grant(self, instance: str, open_: bool = True) -> int:
        """The instance's grant, raised to watermark + credit when the learner accepts more data."""
        stream = self._stream(instance)
        if open_:
            stream.granted = max(stream.granted, stream.watermark + self.credit)
        return stream.granted

    def is_duplicate(self, instance: str, seq: int) -> bool:
        """True for a batch already settled (stored, or refused for good); refuses a seq that was never
        granted (`no_credit`)."""
        stream = self._stream(instance)
        if seq < 1:
            raise ProtocolError("bad_field", f"TRAJ seq must be at least 1, got {seq}")
        if seq <= stream.watermark or seq in stream.above:
            return True
        if seq > stream.granted:
            raise ProtocolError(
                "no_credit", f"TRAJ seq {seq} is beyond the grant {stream.granted}: wait for credit"
            )
        return False

    def stored(self, instance: str, seq: int) -> bool:
        """Whether the batch is settled (no grant check, no new instance: for replaying the log)."""
        stream = self._streams.get(instance)
        return stream is not None and (seq <= stream.watermark or seq in stream.above)

    def record(self, instance: str, seq: int) -> None:
        """Mark a batch settled: after it is in the replay, before its ACK goes out; or refused for good,
        before its ERROR goes out (so the watermark, hence the grant, keeps rising past it)."""
        stream = self._stream(instance)
        if seq > stream.watermark:
            stream.above.add(seq)
        while stream.watermark + 1 in stream.above:
            stream.watermark += 1
            stream.above.remove(stream.watermark)

    def state(self) -> dict[str, Any]:
        """A JSON-able copy, for the checkpoint."""
        return {
            "credit": self.credit,
            "streams": {k: [s.watermark, sorted(s.above), s.granted] for k, s in self._streams.items()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Replace the contents with a saved state; raises ValueError on a malformed one."""
        try:
            streams = OrderedDict(
                (str(k), _Stream(int(w), {int(x) for x in above}, int(g)))
                for k, (w, above, g) in state["streams"].items()
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed delivery state: {e!r}") from e
        self._streams = streams

    def __len__(self) -> int:
        return len(self._streams)
