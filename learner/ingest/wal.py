"""The learner's write-ahead log: every accepted TRAJ batch is appended here before it is acknowledged.

An ACK then means "on disk" (`--durability os`: handed to the operating system, which survives a
`kill -9` of the learner; `fsync`: flushed to the device, which also survives a power cut), not "in
memory". After a crash, the learner restores its newest checkpoint and replays the records after the
checkpoint's log position (learner/ingest/server.py `IngestServer.recover`), so the replay and the delivery
ledger are what they were at the crash.

Layout: a directory of segments named by the number (LSN) of their first record, `<lsn:020d>.wal`,
each a sequence of records:

    header (24 bytes, little-endian): magic b"DWAL" | u32 payload length | u64 LSN | u32 CRC-32 of the
        payload | u32 CRC-32 of the 20 header bytes before it
    payload: u8 length of the actor's instance, the instance (ASCII), u64 batch seq, the TRAJ message
        exactly as it arrived

LSNs increase by one per record across segments. A segment grows to `segment_bytes`, then the next one
starts. The header's own CRC makes its length trustworthy, so a record whose payload is damaged is
skipped by its length; a damaged header is skipped by scanning for the next valid one. Damage that
nothing valid follows in the newest segment is a torn tail (the learner died mid-write): it is cut
off. Every skipped record and cut byte is counted (`stats`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MAGIC = b"DWAL"
HEADER = struct.Struct("<4sIQII")
"""magic, payload length, LSN, payload CRC-32, header CRC-32 (of the 20 bytes before it)."""
_CRC_SPAN = HEADER.size - 4
SEGMENT_BYTES = 64 * 1024 * 1024
"""A segment is closed and the next one started once it holds this many bytes."""
MAX_RECORD_BYTES = 128 * 1024 * 1024
"""Longest payload accepted when reading (a TRAJ message is at most 64 MiB, plus the small prefix)."""
_SUFFIX = ".wal"

Durability = Literal["os", "fsync"]


class WalError(OSError):
    """The log cannot be written (disk full, I/O error): nothing may be acknowledged until it can."""


@dataclass(frozen=True)
class Record:
    lsn: int
    payload: bytes


def pack_batch(instance: str, seq: int, raw: bytes | memoryview) -> list[bytes | memoryview]:
    """A TRAJ batch's payload as buffers for `WriteAheadLog.append` (the message itself is not copied)."""
    name = instance.encode("ascii")
    return [struct.pack(f"<B{len(name)}sQ", len(name), name, seq), raw]


def unpack_batch(payload: bytes) -> tuple[str, int, memoryview]:
    """(instance, seq, TRAJ message) of a record written by `pack_batch`; ValueError if malformed."""
    try:
        n = payload[0]
        instance = payload[1 : 1 + n].decode("ascii")
        (seq,) = struct.unpack_from("<Q", payload, 1 + n)
    except (IndexError, UnicodeDecodeError, struct.error) as e:
        raise ValueError(f"malformed batch record: {e}") from e
    return instance, seq, memoryview(payload)[9 + n :]


def _header(payload_len: int, lsn: int, payload_crc: int) -> bytes:
    head = struct.pack("<4sIQI", MAGIC, payload_len, lsn, payload_crc)
    return head + struct.pack("<I", zlib.crc32(head))


def _valid_header(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """(length, lsn, payload crc) of a header at `pos` whose own CRC holds, else None."""
    if len(data) - pos < HEADER.size or data[pos : pos + 4] != MAGIC:
        return None
    _magic, length, lsn, pcrc, hcrc = HEADER.unpack_from(data, pos)
    if zlib.crc32(data[pos : pos + _CRC_SPAN]) != hcrc or length > MAX_RECORD_BYTES:
        return None
    return length, lsn, pcrc


def _next_header(data: bytes, start: int) -> int | None:
    """The offset of the next valid header at or after `start`, or None."""
    pos = data.find(MAGIC, start)
    while pos != -1:
        if _valid_header(data, pos) is not None:
            return pos
        pos = data.find(MAGIC, pos + 1)
    return None


def scan_segment(data: bytes, stats: Counter) -> tuple[list[Record], int]:
    """The intact records of one segment's bytes, and the offset where its intact part ends (a torn
    tail starts there). A damaged record followed by a valid one is skipped and counted in
    `stats["corrupt_records"]`; damage at the end is left to the caller (torn tail or corruption)."""
    records: list[Record] = []
    pos, last_lsn = 0, -1
    while pos < len(data):
        header = _valid_header(data, pos)
        if header is not None:
            length, lsn, pcrc = header
            end = pos + HEADER.size + length
            payload = data[pos + HEADER.size : end]
            if end <= len(data) and zlib.crc32(payload) == pcrc and lsn > last_lsn:
                records.append(Record(lsn, payload))
                last_lsn, pos = lsn, end
                continue
        nxt = _next_header(data, pos + 1)  # a damaged record: skip to the next valid header, if any
        if nxt is None:
            return records, pos
        stats["corrupt_records"] += 1
        pos = nxt
    return records, pos


class WriteAheadLog:
    """One learner process's log directory: `recover` reads it back (cutting a torn tail) and opens it for
    appending; `append` writes one record (`os`: a write(2) to the operating system), `sync` flushes
    what was appended since the last sync to the device (`fsync` mode; one fdatasync covers a whole
    group of records), `prune` deletes segments a committed checkpoint no longer needs, `read` gives
    chosen records back (a checkpoint's replay refers to the episodes the log holds).

    A failed write or sync raises WalError; the caller stops acknowledging until a later write works."""

    def __init__(self, directory: Path, durability: Durability, segment_bytes: int = SEGMENT_BYTES):
        if durability not in ("os", "fsync"):
            raise ValueError(f"durability must be 'os' or 'fsync', got {durability!r}")
        self.directory = Path(directory)
        self.durability = durability
        self.segment_bytes = segment_bytes
        self.next_lsn = 0
        """The LSN the next appended record gets: every record below it is in the log."""
        self.stats: Counter[str] = Counter()
        """records, bytes, syncs, write_errors, recovered, corrupt_records, torn_tail_bytes, pruned_segments,
        retracted."""
        self._fd: int | None = None
        self._size = 0
        """Bytes of the open segment that hold whole records."""
        self._dirty = False
        self._recovered = False
        self._last: tuple[int, int] | None = None
        """(LSN, the open segment's size before it) of the newest record, while it can still be retracted."""

    # ---- start-up ----------------------------------------------------------------------------------
    def segments(self) -> list[tuple[int, Path]]:
        """(first LSN, path) of every segment, oldest first."""
        out = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            stem = path.name[: -len(_SUFFIX)]
            if stem.isdigit():
                out.append((int(stem), path))
        return sorted(out)

    def recover(self, start_lsn: int = 0) -> Iterator[Record]:
        """The intact records with LSN >= `start_lsn`, oldest first; then the log is open for appending
        after the newest one. Reading the whole iterator is what opens the log."""
        self.directory.mkdir(parents=True, exist_ok=True)
        segments = self.segments()
        last_lsn = start_lsn - 1
        for i, (_first, path) in enumerate(segments):
            data = path.read_bytes()
            records, intact = scan_segment(data, self.stats)
            if intact < len(data):
                if i == len(segments) - 1:  # the learner died mid-write: cut the partial record off
                    self.stats["torn_tail_bytes"] += len(data) - intact
                    with open(path, "r+b") as f:
                        f.truncate(intact)
                        os.fsync(f.fileno())
                else:
                    self.stats["corrupt_records"] += 1
            for record in records:
                if record.lsn > last_lsn:
                    last_lsn = record.lsn
                if record.lsn >= start_lsn:
                    self.stats["recovered"] += 1
                    yield record
        self.next_lsn = last_lsn + 1
        self._recovered = True
        if segments:
            _first, path = segments[-1]
            self._open(path)
        else:
            self._start_segment()

    def read(self, lsns: set[int]) -> dict[int, bytes]:
        """The payloads of the intact records with these LSNs, by LSN (absent: not in the log). Read-only:
        the log is neither opened nor repaired, so a checkpoint's replay can be read back before
        `recover`. Only segments whose LSN range holds a wanted record are read."""
        segments = self.segments()
        out: dict[int, bytes] = {}
        wanted = sorted(lsns)
        for i, (first, path) in enumerate(segments):
            end = segments[i + 1][0] if i + 1 < len(segments) else None
            if not any(first <= lsn and (end is None or lsn < end) for lsn in wanted):
                continue
            records, _intact = scan_segment(path.read_bytes(), Counter())
            out.update((r.lsn, r.payload) for r in records if r.lsn in lsns)
        return out

    # ---- writing -----------------------------------------------------------------------------------
    def append(self, buffers: list[bytes | memoryview]) -> int:
        """Write one record made of `buffers` (concatenated); returns its LSN. WalError if it cannot be
        written, with the segment cut back to its last whole record."""
        if not self._recovered:
            raise WalError("the write-ahead log is not open: read recover() first")
        length = sum(len(b) for b in buffers)
        crc = 0
        for b in buffers:
            crc = zlib.crc32(b, crc)
        lsn = self.next_lsn
        parts = [_header(length, lsn, crc), *buffers]
        try:
            if self._fd is None:  # closed after a failed write or sync: start afresh
                self._start_segment()
            elif self._size >= self.segment_bytes:
                self._roll()
            before = self._size
            self._write_all(parts, HEADER.size + length)
        except OSError as e:
            self.stats["write_errors"] += 1
            self._cut_back()
            raise WalError(e.errno, f"cannot write the log {self.directory}: {e.strerror or e}") from e
        self._size += HEADER.size + length
        self._last = (lsn, before)
        self._dirty = True
        self.next_lsn = lsn + 1
        self.stats["records"] += 1
        self.stats["bytes"] += HEADER.size + length
        return lsn

    def retract(self, lsn: int) -> None:
        """Take the newest record (`lsn`, appended and not yet answered) back out of the log: the caller
        could not record it where it must also be (the audit log, learner/ingest/audit.py). WalError if
        it is not the newest record of the open segment, or cannot be cut off (the segment is then closed
        and recovery will find the record)."""
        if self._last is None or self._last[0] != lsn or self._fd is None or lsn != self.next_lsn - 1:
            raise WalError(f"record {lsn} is not the newest of the open segment: it cannot be retracted")
        before = self._last[1]
        try:
            os.ftruncate(self._fd, before)
            os.lseek(self._fd, before, os.SEEK_SET)
        except OSError as e:
            self._close()
            raise WalError(e.errno, f"cannot retract record {lsn} of the log {self.directory}: {e}") from e
        self.stats["records"] -= 1
        self.stats["bytes"] -= self._size - before
        self.stats["retracted"] += 1
        self._size, self.next_lsn, self._last = before, lsn, None

    def sync(self) -> None:
        """In `fsync` mode, flush every record appended since the last sync to the device (one
        fdatasync for the whole group); a no-op in `os` mode or when nothing was appended."""
        if self.durability != "fsync" or not self._dirty or self._fd is None:
            return
        try:
            os.fdatasync(self._fd)
        except OSError as e:
            self.stats["write_errors"] += 1
            # After a failed fsync the kernel may have dropped the dirty pages: never trust this segment's
            # tail again; the next append starts a fresh segment.
            self._close()
            raise WalError(e.errno, f"cannot sync the log {self.directory}: {e.strerror or e}") from e
        self._dirty = False
        self.stats["syncs"] += 1

    def prune(self, below_lsn: int) -> int:
        """Delete the segments whose records all have LSN < `below_lsn` (a committed checkpoint holds them);
        the open segment is kept. Returns how many were deleted."""
        segments = self.segments()
        deleted = 0
        for (_first, path), (next_first, _) in itertools.pairwise(segments):
            if next_first <= below_lsn:
                path.unlink(missing_ok=True)
                deleted += 1
        self.stats["pruned_segments"] += deleted
        return deleted

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(WalError):
                self.sync()
            self._close()

    # ---- internals ---------------------------------------------------------------------------------
    def _write_all(self, parts: list, total: int) -> None:
        written = os.writev(self._fd, parts)
        if written < total:  # a short write (rare: signals, a nearly full disk): finish it piece by piece
            data = b"".join(bytes(p) for p in parts)[written:]
            while data:
                n = os.write(self._fd, data)
                if n == 0:
                    raise OSError(28, "no space left on device")
                data = data[n:]

    def _cut_back(self) -> None:
        """After a failed append: drop its partial bytes, so the segment ends with a whole record."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._size)
            os.lseek(self._fd, self._size, os.SEEK_SET)
        except OSError:
            self._close()  # the next append starts a fresh segment; recovery skips the damage

    def _open(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def _start_segment(self) -> None:
        path = self.directory / f"{self.next_lsn:020d}{_SUFFIX}"
        self._open(path)
        if self.durability == "fsync":  # the new file's directory entry must survive a power cut too
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _roll(self) -> None:
        """Close the full segment (synced in `fsync` mode) and start the next one."""
        if self._fd is not None:
            self.sync()
            self._close()
        self._start_segment()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        self._dirty, self._last = False, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
