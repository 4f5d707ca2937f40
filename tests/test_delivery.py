"""The two halves of acknowledged delivery, without sockets: the learner's ledger and the actor's outbox."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from actors.outbox import Outbox
from common.protocol import ProtocolError
from learner.ingest.delivery import DeliveryLedger


def test_ledger_stores_each_seq_once_in_any_order():
    ledger = DeliveryLedger(credit=4)
    ledger.grant("a")
    stored = []
    for seq in [1, 3, 1, 2, 3, 4, 4, 2]:
        if not ledger.is_duplicate("a", seq):
            ledger.record("a", seq)
            stored.append(seq)
    assert stored == [1, 3, 2, 4]
    assert ledger.join("a", first_unacked=5) == 4
    # Instances are independent.
    ledger.grant("b")
    assert not ledger.is_duplicate("b", 1)


def test_ledger_grants_credit_past_the_watermark_and_refuses_beyond_it():
    ledger = DeliveryLedger(credit=2)
    assert ledger.grant("a") == 2
    with pytest.raises(ProtocolError) as e:
        ledger.is_duplicate("a", 3)
    assert e.value.code == "no_credit"
    with pytest.raises(ProtocolError) as e:
        ledger.is_duplicate("a", 0)
    assert e.value.code == "bad_field"
    ledger.record("a", 1)
    assert ledger.grant("a", open_=False) == 2  # behind: the grant holds still
    assert ledger.grant("a") == 3  # caught up: credit 2 past the watermark 1
    ledger.record("a", 2)
    ledger.record("a", 3)
    assert ledger.grant("a", open_=False) == 3  # grants never shrink, even when closed
    assert ledger.grant("a") == 5


def test_ledger_skips_batches_a_dead_learner_acknowledged_and_counts_them():
    ledger = DeliveryLedger(credit=8)
    ledger.grant("a")
    for seq in (1, 2, 5):
        ledger.record("a", seq)
    # The actor rejoins holding batches from 7 on: 3, 4 and 6 were acknowledged by a learner process
    # that died before its checkpoint, so they are gone; 5 is here.
    assert ledger.join("a", first_unacked=7) == 6
    assert ledger.lost_in_restart == 3
    assert ledger.is_duplicate("a", 6) and not ledger.is_duplicate("a", 7)
    # A rejoin that holds everything from the watermark on changes nothing.
    assert ledger.join("a", first_unacked=7) == 6 and ledger.lost_in_restart == 3


def test_ledger_state_round_trips_through_json_and_refuses_garbage():
    ledger = DeliveryLedger(credit=3)
    ledger.grant("a")
    for seq in (1, 3):
        ledger.record("a", seq)
    copy = DeliveryLedger(credit=3)
    copy.load_state(json.loads(json.dumps(ledger.state())))
    assert copy.is_duplicate("a", 1) and copy.is_duplicate("a", 3) and not copy.is_duplicate("a", 2)
    assert copy.grant("a", open_=False) == ledger.grant("a", open_=False)
    with pytest.raises(ValueError, match="malformed"):
        copy.load_state({"streams": {"a": [1]}})
    assert copy.is_duplicate("a", 3)  # a refused state leaves the ledger as it was


def test_ledger_is_bounded_and_counts_what_it_forgets():
    ledger = DeliveryLedger(credit=1, max_instances=3)
    for name in "abcd":
        ledger.grant(name)
    assert len(ledger) == 3 and ledger.forgotten == 1
    assert ledger.grant("a", open_=False) == 0  # "a" was the least recently used: it starts over


def _episodes(n: int, version: int = 5) -> list[dict]:
    return [{"policy_version": np.full(3, version, np.int32), "i": i} for i in range(n)]


def test_outbox_sends_only_what_the_grant_allows_and_keeps_it_until_acked():
    stats = Counter()
    box = Outbox(max_pending=100, max_parcel=2, when_blocked="wait", stats=stats)
    box.add(_episodes(5))
    assert box.take_parcels() == []  # no grant yet
    box.on_grant(2)
    parcels = box.take_parcels()
    assert [(b.seq, len(b.episodes)) for b in parcels] == [(1, 2), (2, 2)]
    assert len(box.pending) == 1 and box.held() == 5 and box.first_unacked == 1
    box.on_ack(1, accepted=2, duplicate=False)
    box.on_grant(1)  # a stale, lower grant never lowers it
    assert box.grant == 2 and box.first_unacked == 2
    box.on_ack(2, accepted=0, duplicate=True)
    box.on_ack(2, accepted=0, duplicate=True)  # the twin of a re-send
    assert stats["episodes_acked"] == 4 and stats["batches_acked_as_duplicate"] == 1
    assert stats["acks_unexpected"] == 1
    box.on_grant(5)
    assert [b.seq for b in box.take_parcels()] == [3] and box.held() == 1


def test_outbox_resends_everything_unacked_in_order_and_forgets_what_the_learner_holds():
    stats = Counter()
    box = Outbox(max_pending=100, max_parcel=1, when_blocked="wait", stats=stats)
    box.on_grant(10)
    box.add(_episodes(4))
    box.take_parcels()
    assert not box.overdue(ack_timeout=60)
    assert box.overdue(ack_timeout=-1)
    box.on_welcome(acked_upto=2, grant=4)  # a new learner: its grant replaces ours, even when lower
    assert box.grant == 4 and stats["episodes_acked"] == 2
    assert [b.seq for b in box.to_resend()] == [3, 4] and stats["batches_resent"] == 2
    assert box.first_unacked == 3


def test_outbox_when_blocked_waits_or_discards_the_oldest():
    stats = Counter()
    wait = Outbox(max_pending=3, max_parcel=8, when_blocked="wait", stats=stats)
    wait.add(_episodes(2))
    assert not wait.blocked()
    wait.add(_episodes(2))
    assert wait.blocked() and len(wait.pending) == 4  # nothing dropped: the actor stops stepping
    drop = Outbox(max_pending=3, max_parcel=8, when_blocked="discard", stats=stats)
    drop.add(_episodes(5))
    assert not drop.blocked() and [e["i"] for e in drop.pending] == [2, 3, 4]
    assert stats["episodes_discarded_backlog"] == 2
    with pytest.raises(ValueError):
        Outbox(max_pending=3, max_parcel=8, when_blocked="never", stats=stats)


def test_outbox_relabels_versions_a_restarted_learner_has_not_published():
    box = Outbox(max_pending=10, max_parcel=1, when_blocked="wait", stats=Counter())
    box.add([{"policy_version": np.array([3, 7, 9], np.int32)}, {"policy_version": np.array([1], np.int32)}])
    box.on_grant(1)
    box.take_parcels()
    assert box.relabel_versions(5) == 2
    held = [*box.pending, *box.unacked[1].episodes]
    assert [e["policy_version"].tolist() for e in held] == [[1], [3, 5, 5]]


def test_only_an_instances_first_join_to_this_process_counts_batches_lost_in_a_restart():
    ledger = DeliveryLedger(credit=4)
    ledger.load_state({"credit": 4, "streams": {"a": [1, [], 5]}})  # restored: seq 1 stored
    assert ledger.join("a", 4) == 3  # seqs 2-3 were acknowledged by the dead process: lost
    assert ledger.lost_in_restart == 2
    ledger.record("a", 5)  # seq 4 never settled here (say its refusal was not logged), 5 stored
    assert ledger.join("a", 7) == 6  # the same process: the actor dropped 4 after this process's ERROR
    assert ledger.lost_in_restart == 2
    assert ledger.join("b", 3) == 2 and ledger.lost_in_restart == 4  # a new instance, first seen holding 3
