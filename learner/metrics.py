"""RUN_DIR/metrics.jsonl: one JSON object per line, appended and flushed as it is written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends one JSON object per line to RUN_DIR/metrics.jsonl, flushed at once (a crash loses no line)."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


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
        out[f"time/{phase}_interval_s"] = spent
        out[f"time/{phase}_share"] = spent / dt
    return out
