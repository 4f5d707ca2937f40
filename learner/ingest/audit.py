"""RUN_DIR/audit.jsonl (--audit-log): one JSON line per batch the write-ahead log takes, small enough to
keep for a whole run while the log itself is pruned at every checkpoint.

Each line: `instance`, `seq`, `episodes`, `outcome` ("stored": the record's episodes go into the replay,
now or when a restart recovers the record; "refused": a tombstone, the batch was refused for good) and
`lsn`, the record's position in the log. A line is written right after its record is appended and
before anything is answered, and synced with the log's group commit (`fsync` durability), so an
acknowledged batch always has its line; a line that cannot be written takes its record back out of the
log (the batch is refused `unavailable` and sent again), so a record never lacks its line either. A kill
between the two leaves a record without a line: a restart's recovery writes it (`recovered`: true).

An audit (benchmarks/chaos/audit.py) reads it instead of the whole log: every acknowledged batch has a
line, no batch has lines with two different positions (logged twice), and the episodes stored match.
Appended across restarts; a torn last line (killed mid-write) is cut off at start-up."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

FILE_NAME = "audit.jsonl"


class AuditLog:
    """Appends the lines, one write(2) each; `newest_lsn` is the last line's position at start-up."""

    def __init__(self, path: Path, fsync: bool):
        self.path, self.fsync = path, fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._dirty = False
        self.newest_lsn = self._cut_torn_tail()
        """The position of the newest record with a line (-1: none): a recovered record past it has none."""

    def write(self, instance: str, seq: int, episodes: int, outcome: str, lsn: int, **extra) -> None:
        """One line; OSError if it cannot be written whole (what was written of it is cut back off)."""
        line = {"instance": instance, "seq": seq, "episodes": episodes, "outcome": outcome, "lsn": lsn}
        data = (json.dumps({**line, **extra}, sort_keys=True) + "\n").encode()
        size = os.fstat(self._fd).st_size
        try:
            if os.write(self._fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write", str(self.path))
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            raise
        self._dirty = True
        self.newest_lsn = max(self.newest_lsn, lsn)

    def sync(self) -> None:
        """With `fsync` durability: flush the lines written since the last sync (with the log's commit)."""
        if self.fsync and self._dirty:
            os.fdatasync(self._fd)
            self._dirty = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sync()
        os.close(self._fd)

    def _cut_torn_tail(self) -> int:
        """Cut a last line without its newline off; the newest position in the file (-1: empty)."""
        size = os.fstat(self._fd).st_size
        if not size:
            return -1
        tail = os.pread(self._fd, min(size, 64 * 1024), max(0, size - 64 * 1024))
        end = tail.rfind(b"\n") + 1
        keep = size - len(tail) + end
        if keep < size:
            os.ftruncate(self._fd, keep)
        lines = tail[:end].splitlines()
        return int(json.loads(lines[-1])["lsn"]) if lines else -1


def read(path: Path) -> list[dict]:
    """Every line of an audit file (a torn last line skipped)."""
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out
