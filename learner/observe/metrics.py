"""RUN_DIR/metrics.jsonl: one JSON object per line, appended and flushed as it is written."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends one JSON object per line to RUN_DIR/metrics.jsonl, each line one write(2) to the operating
    system (a crash loses no line). A line the disk refuses (full, a file size limit) is cut back off,
    dropped and counted in `dropped`, with one warning: training goes on, readers never see half a line,
    and the next record carries every running total again."""

    def __init__(self, run_dir: Path, warn: Callable[[str], None] = print):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.dropped = 0
        self._warn = warn

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        data = (json.dumps(clean, sort_keys=True) + "\n").encode()
        size = os.fstat(self._fd).st_size
        try:
            if os.write(self._fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)  # no half line for readers
            self.dropped += 1
            if self.dropped == 1:
                self._warn(
                    f"learner: cannot write {self.path} ({e}); metrics lines are dropped until it works"
                )

    def close(self) -> None:
        os.close(self._fd)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


TIMED_PHASES = ("ingest", "train", "publish", "checkpoint")
"""The loop's `time/<phase>_s` counters: waiting for and taking in data, train steps, publishing, saving."""
ROUNDING_S = 0.002
"""Records round the wall and each phase's total to the millisecond apart, so an interval spent wholly in
one phase (the records written during a long update) can show up to 2 ms more of it than of wall: a share
a hair above 1 that is rounding, not time counted twice (which still shows as more)."""


def interval(prev: dict[str, Any] | None, cur: dict[str, Any]) -> dict[str, float]:
    """What happened between two consecutive metrics records, as cleanba logs it: environment steps/s,
    updates/s, and per timed phase the seconds it took in the interval and its share of the interval.
    Records hold running totals, so rates need the previous record; empty for the first record or a
    zero-length interval."""
    if prev is None:
        return {}
    dt = cur["wall"] - prev["wall"]
    if dt <= 0:
        return {}
    out = {
        "rate/env_steps_per_s": (cur["env_steps"] - prev["env_steps"]) / dt,
        "rate/updates_per_s": (cur["update"] - prev["update"]) / dt,
    }
    for phase in TIMED_PHASES:
        spent = cur.get(f"time/{phase}_s", 0.0) - prev.get(f"time/{phase}_s", 0.0)
        if dt < spent <= dt + ROUNDING_S:
            spent = dt
        out[f"time/{phase}_interval_s"] = spent
        out[f"time/{phase}_share"] = spent / dt
    return out
