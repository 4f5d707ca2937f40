"""The write-ahead log (learner/ingest/wal.py) against the failures it exists for: torn tails, damaged records,
full disks, segment rolling and pruning. Every check reads the log back from real files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from learner.ingest.wal import HEADER, WalError, WriteAheadLog, pack_batch, unpack_batch


def _payloads(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(rng.integers(0, 300))) for _ in range(n)]


def _write(directory: Path, payloads: list[bytes], durability: str = "os", **kw) -> WriteAheadLog:
    wal = WriteAheadLog(directory, durability, **kw)
    assert list(wal.recover()) == []
    for p in payloads:
        wal.append([p])
    wal.sync()
    return wal


def _read(directory: Path, start: int = 0) -> tuple[list[tuple[int, bytes]], WriteAheadLog]:
    wal = WriteAheadLog(directory, "os")
    records = [(r.lsn, r.payload) for r in wal.recover(start)]
    return records, wal


def test_records_come_back_in_order_and_numbering_continues(tmp_path):
    payloads = _payloads(20)
    _write(tmp_path, payloads).close()
    records, wal = _read(tmp_path)
    assert records == list(enumerate(payloads))
    assert wal.append([b"next", b"-one"]) == 20  # buffers are concatenated into one record
    wal.close()
    records, _ = _read(tmp_path, start=18)
    assert records == [(18, payloads[18]), (19, payloads[19]), (20, b"next-one")]


def test_batch_payload_round_trip():
    raw = bytes(range(256)) * 3
    payload = b"".join(bytes(b) for b in pack_batch("actor-7f3a", 123456789, memoryview(raw)))
    instance, seq, message = unpack_batch(payload)
    assert (instance, seq, bytes(message)) == ("actor-7f3a", 123456789, raw)
    with pytest.raises(ValueError, match="malformed"):
        unpack_batch(payload[:5])


def test_a_log_cut_at_every_byte_of_its_last_record_recovers_the_records_before_it(tmp_path):
    payloads = [*_payloads(6, seed=1), b"the last record's payload"]
    _write(tmp_path / "src", payloads).close()
    (segment,) = (tmp_path / "src").glob("*.wal")
    data = segment.read_bytes()
    last_start = len(data) - HEADER.size - len(payloads[-1])
    for cut in range(last_start, len(data)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / segment.name).write_bytes(data[:cut])
        records, wal = _read(d)
        assert records == list(enumerate(payloads[:-1])), cut
        assert wal.stats["torn_tail_bytes"] == cut - last_start
        assert wal.stats["corrupt_records"] == 0
        assert (d / segment.name).stat().st_size == last_start  # the partial record is cut off
        assert wal.append([b"after"]) == len(payloads) - 1  # and the log goes on where it was whole
        wal.close()
        assert _read(d)[0][-1] == (len(payloads) - 1, b"after")


@pytest.mark.parametrize("where", ["payload", "header", "length"])
def test_a_damaged_record_in_the_middle_is_skipped_and_counted(tmp_path, where):
    payloads = _payloads(9, seed=2)
    payloads[4] = b"x" * 50
    _write(tmp_path, payloads).close()
    (segment,) = tmp_path.glob("*.wal")
    data = bytearray(segment.read_bytes())
    start = sum(HEADER.size + len(p) for p in payloads[:4])
    offset = {"payload": HEADER.size + 10, "header": 10, "length": 4}[where]  # the length field itself too
    data[start + offset] ^= 0xFF
    segment.write_bytes(bytes(data))
    records, wal = _read(tmp_path)
    assert records == [(i, p) for i, p in enumerate(payloads) if i != 4]
    assert wal.stats["corrupt_records"] == 1
    assert wal.stats["torn_tail_bytes"] == 0
    assert segment.stat().st_size == len(data)  # damage in the middle is never cut away


def test_segments_roll_and_prune_keeps_what_a_checkpoint_needs(tmp_path):
    payloads = [bytes([i]) * 100 for i in range(30)]
    wal = _write(tmp_path, payloads, segment_bytes=500)
    firsts = [first for first, _ in wal.segments()]
    assert len(firsts) > 3 and firsts[0] == 0
    assert wal.prune(below_lsn=firsts[2]) == 2  # the first two segments hold only records below it
    assert wal.prune(below_lsn=10**9) == len(firsts) - 3  # the open segment always stays
    wal.close()
    records, _ = _read(tmp_path, start=firsts[2])
    assert records[0][0] == firsts[-1]  # what is left starts at the newest segment
    assert [p for _, p in records] == payloads[firsts[-1] :]


def test_fsync_mode_syncs_once_per_group(tmp_path):
    wal = WriteAheadLog(tmp_path, "fsync")
    list(wal.recover())
    for group in range(3):
        for i in range(5):
            wal.append([f"{group}-{i}".encode()])
        wal.sync()
    wal.sync()  # nothing new: no sync
    assert wal.stats["syncs"] == 3 and wal.stats["records"] == 15
    wal.close()
    assert len(_read(tmp_path)[0]) == 15


def test_a_failed_write_leaves_whole_records_and_writing_resumes(tmp_path, file_size_limit):
    wal = _write(tmp_path, [b"a" * 100, b"b" * 100])
    size = sum(p.stat().st_size for _, p in wal.segments())
    file_size_limit(size + 60)  # the next record (124 bytes) does not fit
    with pytest.raises(WalError) as failed:
        wal.append([b"c" * 100])
    assert failed.value.errno is not None
    assert wal.stats["write_errors"] == 1
    assert sum(p.stat().st_size for _, p in wal.segments()) == size  # the partial record was cut off
    file_size_limit(None)
    assert wal.append([b"d" * 100]) == 2  # the failed record never got its number
    wal.close()
    records, reread = _read(tmp_path)
    assert records == [(0, b"a" * 100), (1, b"b" * 100), (2, b"d" * 100)]
    assert reread.stats["corrupt_records"] == 0 == reread.stats["torn_tail_bytes"]


def test_damage_at_the_end_of_an_older_segment_is_corruption_not_a_tail(tmp_path):
    payloads = [bytes([i]) * 100 for i in range(12)]
    wal = _write(tmp_path, payloads, segment_bytes=400)
    wal.close()
    (_first, path), *_ = wal.segments()
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the first segment lost its last record's end
    records, reread = _read(tmp_path)
    lost = len(data) // (HEADER.size + 100) - 1
    assert [lsn for lsn, _ in records] == [i for i in range(12) if i != lost]
    assert reread.stats["corrupt_records"] == 1 and reread.stats["torn_tail_bytes"] == 0
    assert Counter(p for _, p in records)[payloads[lost]] == 0
