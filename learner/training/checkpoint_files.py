"""A checkpoint's own files, written on a helper thread so the learner keeps answering actors and training:
the replay file, then the delivery ledger (a ledger always describes a replay file on disk, which the
resume relies on), then the write-ahead log's segments that no checkpoint a restart could resume from
still needs are deleted. One save's files at a time: the next save waits for the previous one's (usually
long done).

A failed write (a full disk) is logged and counted, and the checkpoint stays incomplete (no ledger), so a
restart resumes from an older one; training goes on, and the log keeps every record that older checkpoint
needs. The log is pruned below what the newest checkpoint *complete on every learner process* needs, and
never by the save in progress (orbax may still be finishing its part of it; the other processes may not
have written theirs): a process whose own files were written while another process's failed would
otherwise delete records the checkpoint every process falls back to references.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CheckpointFiles:
    """Runs each save's file writing (`start`) on its own thread; `wait` blocks until it is done."""

    def __init__(
        self,
        resumed: tuple[int, int],
        prune: Callable[[int], object] | None,
        complete: Callable[[int], bool],
        log: Callable[[str], None],
    ):
        """`resumed`: (the update the run resumed from, or its first; the oldest log record that
        checkpoint needs). `complete(update)`: whether that checkpoint's files are on disk on every
        learner process (learner/training/checkpoint.py `complete`)."""
        self.prune = prune
        """Deletes the write-ahead log's segments below a record (None without a log)."""
        self.complete = complete
        self.log = log
        self.stats = {"replay_bytes": 0, "write_s": 0.0, "errors": 0, "saves": 0}
        """The newest replay file's bytes, seconds spent writing in all, failed saves, completed saves."""
        self._needed = dict([resumed])
        """update -> the oldest log record its checkpoint needs (its log position, or an older record its
        replay references), for this process's checkpoints whose files were written; older entries are
        forgotten once a newer checkpoint is complete everywhere."""
        self._thread: threading.Thread | None = None

    @property
    def log_needed_from(self) -> int:
        """The oldest log record a restart may need now: what the newest checkpoint complete on every
        process needs (the oldest known when none is)."""
        needed = self._needed
        complete = [u for u in needed if self.complete(u)]
        return needed[max(complete)] if complete else min(needed.values())

    def start(self, update: int, write: Callable[[], int], needed_from: int) -> None:
        """Write checkpoint `update`'s files (`write`: the replay file and ledger, returns the replay's
        bytes); then prune the log below what the newest older checkpoint complete everywhere needs."""
        self.wait()
        self._thread = threading.Thread(
            target=self._run, args=(update, write, needed_from), name=f"checkpoint-{update}", daemon=True
        )
        self._thread.start()

    def failed(self, update: int, error: Exception) -> None:
        """Checkpoint `update` could not be written at all (orbax's part): counted, logged."""
        self.stats["errors"] += 1
        self.log(
            f"learner: the checkpoint at update {update} could not be saved ({error}); a restart resumes from "
            "an older one"
        )

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, update: int, write: Callable[[], int], needed_from: int) -> None:
        t0 = time.monotonic()
        try:
            self.stats["replay_bytes"] = write()
            below = self._prune_point(update)
            if self.prune is not None and below is not None:
                self.prune(below)
        except (OSError, ValueError) as e:
            self.failed(update, e)
            return
        finally:
            self.stats["write_s"] += time.monotonic() - t0
        self.stats["saves"] += 1
        self._needed[update] = needed_from

    def _prune_point(self, update: int) -> int | None:
        """What the newest checkpoint before `update` that is complete on every process needs (None: no
        such checkpoint, prune nothing); the entries older than it are forgotten."""
        for older in sorted((u for u in self._needed if u < update), reverse=True):
            if self.complete(older):
                self._needed = {u: n for u, n in self._needed.items() if u >= older}
                return self._needed[older]
        return None
