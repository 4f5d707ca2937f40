"""A learner that cannot write its run directory while it starts: one line and a documented exit status
instead of a traceback.

Once running, the learner rides out a full disk (the write-ahead log refuses batches until it can write,
metrics lines are dropped and counted, a checkpoint that fails is retried at the next interval). While it
starts there is nothing to ride out for: it has acknowledged nothing yet, so it stops, says which file it
could not write, and exits with a status a supervisor can act on: try again later (the disk may clear) or
not (the directory is read-only or not ours). Whatever it had bound is closed by `open_session`."""

from __future__ import annotations

import errno
from pathlib import Path

DISK_FULL_STATUS = 75
"""Exit status when the disk, the quota or the file size limit is full (ENOSPC, EDQUOT, EFBIG):
EX_TEMPFAIL of sysexits.h, "try again later". A restarted learner resumes from its newest checkpoint and
its write-ahead log, so retrying loses nothing."""
UNWRITABLE_STATUS = 73
"""Exit status when the run directory cannot be written at all (EROFS, EACCES, EPERM): EX_CANTCREAT of
sysexits.h; retrying will not help until someone changes the directory."""

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def startup_failure(e: OSError, run_dir: Path) -> tuple[int, str] | None:
    """(exit status, the one line to print) for a write error that stops a learner's start-up in
    `run_dir`; None for any other OSError (a bug or a bad file, which keeps its traceback). A failed
    write(2) names no file, so the line names the run directory then."""
    reason = f"{e.filename}: " if e.filename else f"writing in {run_dir}: "
    reason += f"{e.strerror or e} [Errno {e.errno}]"
    if e.errno in _FULL:
        return DISK_FULL_STATUS, (
            f"learner: cannot start: {reason}; the disk is full. Nothing was acknowledged by this "
            f"start; exit status {DISK_FULL_STATUS} (a restart once there is space resumes the run)"
        )
    if e.errno in _UNWRITABLE:
        return UNWRITABLE_STATUS, (
            f"learner: cannot start: {reason}; the run directory cannot be written (pick another "
            f"with --run-dir); exit status {UNWRITABLE_STATUS}"
        )
    return None
