"""A checkpoint's own files, written on a helper thread so the learner keeps answering actors and training:
the replay file, then the delivery ledger (a ledger always describes a replay file on disk, which the
resume relies on), then the write-ahead log's segments the previous checkpoint no longer needs are deleted
(not this one's: orbax may still be finishing its part of it). One save's files at a time: the next save
waits for the previous one's (usually long done).

A failed write (a full disk) is logged and counted, and the checkpoint stays incomplete (no ledger), so a
restart resumes from the previous one; training goes on, and the log keeps every record that previous
checkpoint needs (`log_needed_from` only moves once a save's files are all on disk).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CheckpointFiles:
    """Runs each save's file writing (`start`) on its own thread; `wait` blocks until it is done."""

    def __init__(
        self, log_needed_from: int, prune: Callable[[int], object] | None, log: Callable[[str], None]
    ):
        self.prune = prune
        """Deletes the write-ahead log's segments below a record (None without a log)."""
        self.log_needed_from = log_needed_from
        """The oldest write-ahead log record the newest complete checkpoint needs (its log position, or an
        older record its replay references): the log is pruned below it, never further."""
        self.log = log
        self.stats = {"replay_bytes": 0, "write_s": 0.0, "errors": 0, "saves": 0}
        """The newest replay file's bytes, seconds spent writing in all, failed saves, completed saves."""
        self._thread: threading.Thread | None = None

    def start(self, update: int, write: Callable[[], int], needed_from: int) -> None:
        """Write checkpoint `update`'s files (`write`: the replay file and ledger, returns the replay's
        bytes); on success the log may be pruned below `needed_from` from the next save on."""
        self.wait()
        prune_below = self.log_needed_from  # the previous complete checkpoint's, read after its files
        self._thread = threading.Thread(
            target=self._run, args=(update, write, needed_from, prune_below), name=f"checkpoint-{update}",
            daemon=True,
        )  # fmt: skip
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

    def _run(self, update: int, write: Callable[[], int], needed_from: int, prune_below: int) -> None:
        t0 = time.monotonic()
        try:
            self.stats["replay_bytes"] = write()
            if self.prune is not None:
                self.prune(prune_below)
        except (OSError, ValueError) as e:
            self.failed(update, e)
            return
        finally:
            self.stats["write_s"] += time.monotonic() - t0
        self.stats["saves"] += 1
        self.log_needed_from = needed_from
