"""Scalar dashboards of a run: TensorBoard event files in RUN_DIR/tensorboard and, optionally, Weights & Biases.

Every metrics record becomes scalars at global step = its `update`: each numeric field (nested dicts such
as success_by_task flattened to `success_by_task/<name>`, booleans as 0/1, strings skipped), plus what
the interval since the previous record says (learner.observe.metrics.interval, as cleanba logs it): env steps/s,
updates/s, and the seconds and share of the interval spent waiting for / taking in data, in train steps,
publishing and checkpointing. metrics.jsonl stays the source of truth; these are for watching.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from learner.observe.metrics import interval


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The record's numeric values by tag; nested dicts joined with "/", booleans as 0/1, the rest skipped."""
    out: dict[str, float] = {}
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{tag}/"))
            continue
        if hasattr(value, "item"):  # numpy scalars
            value = value.item()
        if isinstance(value, bool | int | float):
            out[tag] = float(value)
    return out


def require_wandb(project: str) -> ModuleType | None:
    """The wandb module when --wandb-project is set (None otherwise: wandb is never imported then). A
    missing install stops the learner at start-up, before it trains for hours without its dashboard."""
    if not project:
        return None
    try:
        return importlib.import_module("wandb")
    except ImportError as e:
        raise SystemExit(
            f"--wandb-project {project} needs Weights & Biases, which is not installed ({e}): "
            "`pip install wandb` or `pip install -e '.[wandb]'`, or drop --wandb-project"
        ) from e


class Dashboards:
    """Writes each metrics record to TensorBoard (--tensorboard) and wandb (--wandb-project).

    Nothing is opened before the first record, so a start-up failure leaves no writer behind; `close`
    flushes and closes both (idempotent)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], tensorboard: bool, wandb_project: str):
        self.logdir = run_dir / "tensorboard"
        self.config = config
        self.tensorboard = tensorboard
        self.wandb_project = wandb_project
        self._wandb = require_wandb(wandb_project)
        self._tb = None
        self._wandb_run = None
        self._prev: dict[str, Any] | None = None
        self._closed = False

    def write(self, record: dict[str, Any]) -> None:
        if self._closed:
            return
        scalars = {**flatten(record), **interval(self._prev, record)}
        self._prev = record
        step = int(record["update"])
        if self.tensorboard:
            if self._tb is None:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(self.logdir), flush_secs=10)
            for tag, value in scalars.items():
                self._tb.add_scalar(tag, value, global_step=step)
            self._tb.flush()  # once per record (every few seconds): the dashboard stays current
        if self._wandb is not None:
            if self._wandb_run is None:
                self._wandb_run = self._wandb.init(
                    project=self.wandb_project, dir=str(self.logdir.parent), config=self.config
                )
            self._wandb_run.log(scalars, step=step)

    def close(self, last: dict[str, Any] | None = None) -> None:
        """Write the final record (if given), then close the writers."""
        try:
            if last is not None:
                self.write(last)
        finally:
            self._closed = True
            if self._tb is not None:
                self._tb.close()
                self._tb = None
            if self._wandb_run is not None:
                self._wandb_run.finish()
                self._wandb_run = None
