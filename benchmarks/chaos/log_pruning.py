"""Whether a soak's write-ahead log ended pruned as production needs it, judged after the stop from the
files on disk alone (nothing is changing then, so nothing races).

The learner prunes its log at every save, one save late: below the oldest record the newest *older*
checkpoint complete on every process needs (its log position, or an older record its replay references;
learner/training/checkpoint_files.py). So after the stop's final checkpoint F, with P the complete
checkpoint before it, each process's log must
- hold every record F needs (`short`: segments missing below F's need would fail a restore; must be 0);
- hold no segment whose records are all older than what P needs (`excess_segments`: a prune that stalled
  after a failed save or a restart keeps them; must be 0). Such a segment is what makes a log grow with
  the run's length; the segments at or above P's need are bounded by the replay and two save intervals.

The log's size over the run is reported beside it (benchmarks/chaos/audit.py `log_size`) but not judged
by ratio: a 64 MB segment is the unit of pruning, and faults that keep a learner from completing a save
legitimately keep the log (five restarts in a row from the same checkpoint held 184 MB in one soak).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common import wire
from common.trajectory_file import read_records


def complete_updates(checkpoints: Path, processes: int) -> list[int]:
    """The checkpoints complete on every process, oldest first: orbax's step folder committed and every
    process's delivery ledger (the last file a save writes) on disk."""
    steps = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and p.is_dir()]
    ledgers = checkpoints / "replay"
    return sorted(
        u
        for u in steps
        if all((ledgers / f"{u}.p{rank}.delivery.json").is_file() for rank in range(processes))
    )


def needed_from(checkpoints: Path, update: int, rank: int) -> tuple[int, int]:
    """(the oldest log record process `rank` needs to restore checkpoint `update`, its log position): the
    position, or the oldest record its replay file references if older (the file's last record, the
    replay state, holds each item's origin)."""
    ledger = json.loads((checkpoints / "replay" / f"{update}.p{rank}.delivery.json").read_text())
    position = int(ledger["wal_next_lsn"])
    *_, last = read_records(checkpoints / "replay" / f"{update}.p{rank}.replay")
    origins = np.asarray(wire.decode(last).get("origins", np.zeros((0, 2))), np.int64).reshape(-1, 2)
    referenced = origins[origins[:, 0] >= 0, 0]
    return (min(position, int(referenced.min())) if referenced.size else position), position


def segment_starts(wal: Path) -> list[int]:
    """The first log record of each segment on disk, oldest first (segments are named by it)."""
    return sorted(int(p.stem) for p in wal.glob("*.wal"))


def judge(checkpoints: Path, wal_dirs: list[Path]) -> dict:
    """Per process: segments kept that no restore can need (`excess_segments`) and whether the final
    checkpoint's records are all there (`short`); with fewer than two complete checkpoints there is
    nothing a prune was due to remove (`judged`: False)."""
    done = complete_updates(checkpoints, len(wal_dirs)) if checkpoints.is_dir() else []
    if len(done) < 2:
        return {"judged": False, "complete_checkpoints": done, "excess_segments": 0, "short": 0}
    final, previous = done[-1], done[-2]
    excess = short = 0
    for rank, wal in enumerate(wal_dirs):
        starts = segment_starts(wal)
        prunable, _ = needed_from(checkpoints, previous, rank)
        excess += sum(1 for nxt in starts[1:] if nxt <= prunable)  # all of the segment before it is older
        need, position = needed_from(checkpoints, final, rank)
        short += int(need < position and (not starts or starts[0] > need))  # a record it needs is gone
    return {"judged": True, "final": final, "previous": previous, "excess_segments": excess, "short": short}
