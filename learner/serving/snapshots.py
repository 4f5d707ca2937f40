"""The run folder's parameter snapshots: the decoder snapshot (`DECODER_SNAPSHOT`) and --snapshot-every's.

--snapshot-every: the parameters at fixed wall times, for benchmarks that evaluate policies greedily at
equal times across runs (a run's last checkpoint compares runs only at their end).

RUN_DIR/snapshots/tNNNNN.safetensors (common/params_file.py, what `python -m actors eval --params` reads)
holds the parameters as they were when the run's wall clock (seconds since the learner started, the
"wall" of metrics.jsonl) first passed the multiple NNNNN of the period; RUN_DIR/snapshots/index.jsonl gets
one line per file once it is complete: {"t", "wall", "update", "version", "episodes", "env_steps",
"phase"}, "wall" the exact seconds, the rest as in metrics.jsonl. The learner looks between updates, so a
file is at most one update late; a multiple passed entirely within one update (or the compile) gets no
file of its own, and the file after it is named by the latest multiple passed. A resumed run's clock
starts at 0 again: its files replace the earlier ones of the same name, and index.jsonl goes on. A run
stopped by its --time-limit writes its last parameters under the limit's multiple (if that one has no file
yet), though it stops up to one update before it: {"final": true} in that line (WallSnapshots.write).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common import params_file
from common.config import ModelConfig

DECODER_SNAPSHOT = "decoder.safetensors"
"""RUN_DIR/decoder.safetensors: a pretrained decoder (the lm family) as trained, written at every checkpoint
(Session.save, Trainer.write_decoder) and served from by `python -m learner export RUN_DIR OUT`."""
INDEX = "index.jsonl"
WARMUP_END = "warmup-end.safetensors"
"""RUN_DIR/snapshots/warmup-end.safetensors: the parameters the imitation warm-up ended with, written once
as reinforcement learning starts (Session.start_rl), with {"update", "version", "max_steps"} in its
metadata: the supervised policy of the same run, which `python -m learner eval --params` compares with
the run's last checkpoint (checkpoints keep only the newest few)."""


def write_file(
    path: Path, flat: dict[str, np.ndarray], model_cfg: ModelConfig, fields: dict[str, Any]
) -> None:
    """A parameters file (common/params_file.py, `fields` in its metadata), written to a temporary name
    first so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    params_file.write(tmp, flat, model_cfg, fields)
    tmp.replace(path)


@dataclass
class WallSnapshots:
    """When the next snapshot is due and how one is written (only process 0 writes)."""

    directory: Path
    """RUN_DIR/snapshots."""
    every: int
    """--snapshot-every: the period in seconds (0: off)."""
    writes: bool
    """This process writes the files (process 0 of a multi-host run; the others take part in the
    parameters' host copy, a collective, and count along)."""
    next_multiple: int = 1
    """The next multiple of `every` without a file: the names only ever increase."""

    def due(self, wall: float) -> bool:
        """Whether `wall` seconds since the start have passed the next multiple of the period."""
        return self.every > 0 and wall >= self.next_multiple * self.every

    def write(
        self,
        wall: float,
        flat: dict[str, np.ndarray],
        model_cfg: ModelConfig,
        fields: dict[str, Any],
        stands_for: float | None = None,
    ) -> Path:
        """The parameters `flat` under the latest multiple passed (at least the next one: in a multi-host
        run another process's clock may have said so first), then their index line (`fields`: update,
        version, episodes, env_steps, phase). Written to a temporary name first, so a reader never sees
        half a file. Returns the file's path (not written unless `writes`).

        `stands_for`: the run's final parameters at its time limit (Session.snapshot_if_due): the learner
        stops when the next update would pass the limit, so it stops a little before it (or, after a
        start-up or an update longer than the limit left, after it), and the parameters it stops with
        are its parameters at the limit. The file is named by the limit's multiple (Session asks `due` of
        the limit first, so none is written where that multiple already has one); the index keeps the
        exact `wall` and says "final": true."""
        named = wall if stands_for is None else stands_for
        multiple = max(int(named // self.every), self.next_multiple)
        self.next_multiple = multiple + 1
        t = multiple * self.every
        path = self.directory / f"t{t:05d}.safetensors"
        if not self.writes:
            return path
        write_file(path, flat, model_cfg, fields)
        line = {"t": t, "wall": round(wall, 3), **fields} | ({} if stands_for is None else {"final": True})
        with (self.directory / INDEX).open("a") as index:
            index.write(json.dumps(line) + "\n")
        return path


def read_index(directory: Path) -> list[dict[str, Any]]:
    """The index lines of RUN_DIR/snapshots, in the order written."""
    lines = (directory / INDEX).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]
