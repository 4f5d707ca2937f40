"""--ack-log: the actor's own record of what the learner acknowledged, one JSON line per batch, flushed at
once (a killed actor's file ends at its last acknowledged batch). Audits such as `python -m benchmarks
chaos` check it against the learner's write-ahead log: every batch an actor saw acknowledged must be
stored there exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path


class AckLog:
    def __init__(self, path: Path, instance: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.instance = instance
        self._file = path.open("a", encoding="utf-8")

    def write(self, seq: int, episodes: int, how: str) -> None:
        """`how`: "ack" (stored now), "duplicate" (stored before: a re-send's ACK) or "welcome" (covered
        by a WELCOME's acked_upto); `time`: when it came (Unix seconds)."""
        line = {"instance": self.instance, "seq": seq, "episodes": episodes, "how": how, "time": time.time()}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
