"""--audit-log (learner/ingest/audit.py): a line per batch the write-ahead log takes, written before the
batch is answered, so an audit can check every acknowledged batch without a log that is never pruned.
Under the real ingest of tests/test_wal_ingest.py: across a crash, with a kill between a record and its
line, and with a line the disk refuses (a real write error: the process's file size limit)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from benchmarks.ingest import random_episode
from common import protocol, wire
from learner.ingest import audit, settler
from learner.ingest.audit import AuditLog
from learner.ingest.wal import pack_batch
from tests.test_wal_ingest import MAX_STEPS, MODEL, world  # noqa: F401 (the fixture)


def _lines(tmp_path) -> list[dict]:
    return audit.read(tmp_path / "audit.jsonl")


@pytest.mark.parametrize("durability", ["os", "fsync"])
def test_every_acknowledged_batch_has_one_line_across_a_crash(world, tmp_path, durability):  # noqa: F811
    first = world.learner(durability, audit=True)
    actor = world.actor(first)
    acked = {}
    for i in range(4):
        reply = actor.send(episodes=1 + i % 2)
        acked[actor.seq] = reply["accepted"]
    saved = first.checkpoint()
    for i in range(3):
        reply = actor.send(episodes=2 + i % 2)
        acked[actor.seq] = reply["accepted"]
    # Killed right after appending an 8th batch to the log, before its line was written:
    traj = protocol.Traj(actor.actor_id, 8, [random_episode(np.random.default_rng(5), MODEL, MAX_STEPS)])
    unlined = first.server.wal.append(pack_batch("inst-a", 8, wire.encode(traj.to_msg())))
    if durability == "fsync":
        first.server.wal.sync()
    lines = _lines(tmp_path)
    assert [(x["seq"], x["episodes"], x["outcome"], x["lsn"]) for x in lines] == [
        (seq, n, "stored", seq - 1) for seq, n in acked.items()
    ]
    second = world.learner(durability, *saved, audit=True)  # no close: the first one died
    assert second.recovered["batches"] == 4
    lines = _lines(tmp_path)
    assert len(lines) == 8 and lines[-1] == {
        "instance": "inst-a", "seq": 8, "episodes": 1, "outcome": "stored", "lsn": unlined, "recovered": True
    }  # fmt: skip
    third = world.learner(durability, *saved, audit=True)  # the same recovery again writes nothing new
    assert third.recovered["batches"] == 4 and len(_lines(tmp_path)) == 8


def test_a_line_the_disk_refuses_takes_its_record_back_out_of_the_log(
    world,  # noqa: F811 (the fixture imported above)
    tmp_path,
    file_size_limit,
    monkeypatch,
):
    monkeypatch.setattr(settler, "STORAGE_RETRY_S", 0.2)
    learner = world.learner("os", audit=True)
    wal = learner.server.wal
    wal.segment_bytes = 1  # a segment per record: the audit file soon outgrows any one segment
    actor = world.actor(learner)
    audit_file = tmp_path / "audit.jsonl"
    assert actor.send(episodes=1)["kind"] == protocol.ACK
    while audit_file.stat().st_size < 2 * max(p.stat().st_size for _, p in wal.segments()):
        assert actor.send(episodes=1)["kind"] == protocol.ACK
    before_lsn, before_lines, stored = wal.next_lsn, audit_file.read_bytes(), len(learner.replay)
    file_size_limit(audit_file.stat().st_size + 10)  # the next record fits in its segment, its line does not
    refused = actor.send(episodes=1)
    assert refused["kind"] == protocol.ERROR and refused["code"] == "unavailable"
    assert wal.stats["retracted"] == 1 and wal.next_lsn == before_lsn, (learner.logged, dict(wal.stats))
    assert wal.segments()[-1][1].stat().st_size == 0  # the record was cut back off
    assert audit_file.read_bytes() == before_lines and len(learner.replay) == stored
    assert any("cannot write the audit log" in line for line in learner.logged)
    file_size_limit(None)
    time.sleep(0.25)
    ack = actor.resend()
    assert ack["kind"] == protocol.ACK and not ack["duplicate"]
    lines = _lines(tmp_path)
    assert lines[-1]["seq"] == actor.seq and lines[-1]["lsn"] == before_lsn
    restarted = world.learner("os", audit=True)  # from the log alone: every batch once, no line added
    assert restarted.recovered["batches"] == len(lines) == len({x["lsn"] for x in _lines(tmp_path)})


def test_a_torn_last_line_is_cut_off_and_the_newest_position_read(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, fsync=True)
    assert log.newest_lsn == -1
    log.write("a", 1, 2, "stored", 0)
    log.write("a", 2, 0, "refused", 1)
    log.sync()
    log.close()
    with path.open("ab") as f:
        f.write(b'{"instance": "a", "seq": 3, "epis')  # killed mid-write
    again = AuditLog(path, fsync=False)
    assert again.newest_lsn == 1
    again.write("a", 3, 1, "stored", 2)
    again.close()
    assert [(x["seq"], x["outcome"], x["lsn"]) for x in audit.read(path)] == [
        (1, "stored", 0), (2, "refused", 1), (3, "stored", 2)
    ]  # fmt: skip
