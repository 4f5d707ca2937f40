"""The imitation warm-up in epochs, measured on held-back demonstrations (issue 47).

Imitation updates drew demonstrations with replacement, and nothing said when the warm-up had learned what
it could: the lm recipe's 10 updates were a tenth of an epoch, and its loss was still the uniform guess.
Here the training demonstrations are drawn in epochs (`EpochDraws`: each once per epoch, in a seeded
order), the last --validation-demos of them are held back (demonstrations of the
same training templates, never drawn for an update), and before the warm-up and after each of its epochs
their imitation loss is measured (`Validation`: nats per action, the mean over steps of -log pi(a_demo | s)); with
--warmup-patience the warm-up ends once that loss has not reached a new low for that many epochs, and
reinforcement learning starts. The end is written to RUN_DIR/warmup.json, so a resumed run does not warm
up again (`ended_at`); a run resumed within its warm-up draws on from where its updates were, and counts
its patience from its own first epoch. With --warmup-share the warm-up also ends once that share of
--time-limit has passed (`end_if_late`), recorded the same way.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console

from learner.training import multihost
from learner.training.trainer import run_while_serving

if TYPE_CHECKING:
    from common.protocol import Episode
    from learner.observe.run_stats import RunStats
    from learner.schedule import Schedule
    from learner.training.trainer import Trainer

WARMUP_FILE = "warmup.json"
"""In the run directory: where the warm-up ended early and its validation losses, for a resume."""


@dataclass
class EpochDraws:
    """Indices into `count` training demonstrations, drawn in epochs: every index once per epoch, epoch e
    in the order of a permutation seeded by (`seed`, e). Stateless but for the position, so a resumed run
    that starts at the position its updates reached draws what an uninterrupted one would."""

    count: int
    seed: list[int]
    """The run's seed and this process's index: each process draws its own order."""
    drawn: int = 0
    """The position: indices drawn so far (by this run and the runs it resumes)."""
    _epoch: int = -1
    _order: np.ndarray | None = None

    @property
    def epochs(self) -> int:
        """Epochs completed so far."""
        return self.drawn // self.count

    def take(self, k: int) -> list[int]:
        """The next `k` indices (a batch may span two epochs)."""
        out = []
        for position in range(self.drawn, self.drawn + k):
            epoch = position // self.count
            if epoch != self._epoch:
                self._epoch, self._order = (
                    epoch,
                    np.random.default_rng([*self.seed, epoch]).permutation(self.count),
                )
            out.append(int(self._order[position % self.count]))
        self.drawn += k
        return out


@dataclass
class Validation:
    """The held-back demonstrations' loss before the warm-up and after each of its epochs, and whether it
    stopped improving."""

    patience: int
    """End the warm-up after this many epochs in a row without a new lowest loss (0: never early)."""
    losses: list[float] = field(default_factory=list)
    """Nats per action before the first epoch (a fresh run) and after each, in order."""

    @property
    def best(self) -> float:
        return min(self.losses, default=math.inf)

    def record(self, loss: float) -> bool:
        """Adds one epoch's loss; True when the warm-up should end (patience epochs since the lowest)."""
        self.losses.append(loss)
        since_best = len(self.losses) - 1 - int(np.argmin(self.losses))
        return self.patience > 0 and since_best >= self.patience


@dataclass
class Warmup:
    """One learner process's demonstration draws in epochs and the held-back demonstrations' validation:
    what the Session draws imitation batches from and the loop asks to validate."""

    trainer: Trainer
    schedule: Schedule
    stats: RunStats
    console: Console
    run_dir: Path
    """Where RUN_DIR/warmup.json goes (process 0 writes it)."""
    rank: int
    seed: int
    count: int
    """Training demonstrations (the Session's `demos`)."""
    held_back: list[Episode] = field(default_factory=list)
    """The demonstrations held back (--validation-demos): never imitated nor prefilled."""
    validation: Validation | None = None
    """Their loss before the warm-up and after each of its epochs; None without held-back ones."""
    _draws: EpochDraws | None = None
    _validated: int = -1
    """The warm-up epoch validated last."""
    _validated_update: int = 0
    """The update validated last (the reinforcement-learning phase's interval counts from it)."""

    def picks(self) -> list[int]:
        """An imitation batch's indices into the training demonstrations, in epochs, from the position the
        updates so far reached (a resumed run goes on where the run it resumes was)."""
        if self._draws is None:
            done = sum(self.schedule.imitates(u) for u in range(self.trainer.update))
            self._draws = EpochDraws(
                self.count, [self.seed, self.rank], drawn=done * self.trainer.local_batch
            )
            self._validated = max(self._validated, self._draws.epochs)
        return self._draws.take(self.trainer.local_batch)

    def end_if_late(self) -> None:
        """--warmup-share with --time-limit: end the warm-up at this update once that share of the run's
        time has passed (recorded like an early end, so a resume does not warm up again)."""
        share, limit = self.schedule.cfg.imitation.warmup_share, self.schedule.cfg.time_limit
        update = self.trainer.update
        if not (share and limit and self.schedule.in_warmup(update)):
            return
        _, late = multihost.agree(True, time.monotonic() - self.schedule.start >= share * limit)
        if not late:  # every learner process ends it at the same update: the first that is late decides
            return
        self.schedule.warmup_end = update
        if self.rank == 0:
            write_end(self.run_dir, update, self.validation.losses if self.validation else [])
        self.console.print(
            f"learner: the warm-up ends at update {update}: {share:.0%} of the {limit:.0f} s time limit has "
            "passed (--warmup-share); reinforcement learning starts"
        )

    def validate_if_due(self, serve: Callable[[], None], abandon: Callable[[], bool]) -> None:
        """The held-back demonstrations' fit (`Trainer.demo_fit`) when due (`_due`), on a helper thread
        while `serve` answers actors (forward only: a stop may abandon it, the parameters stay whole).
        Recorded (`validation/*` in metrics.jsonl, a console line); in the warm-up, with
        --warmup-patience, it ends the warm-up once the loss stopped reaching new lows."""
        due = self._due()
        if due is None:
            return
        phase, epoch = due
        update = self.trainer.update
        self._validated, self._validated_update = epoch, update
        fit = run_while_serving(lambda: self.trainer.demo_fit(self.held_back), serve, "validation", abandon)
        ends = phase == "warmup" and self.validation.record(fit.nll) and update < self.schedule.warmup_updates
        best = self.validation.best
        self.stats.validation = {
            "validation/nll": fit.nll,
            "validation/rho": fit.rho,
            "validation/value_gap": fit.value_gap,
            "validation/update": update,
            "validation/epoch": epoch,
            "validation/best": best,
        }
        where = f"warm-up epoch {epoch}" if phase == "warmup" else "reinforcement learning"
        if phase == "warmup" and update == self.schedule.warmup_updates and self._draws is not None:
            where = f"the warm-up's end ({self._draws.drawn / self.count:.2f} epochs)"  # within an epoch
        self.console.print(
            f"learner: {where} (update {update}): validation loss {fit.nll:.3f} nats per action (lowest "
            f"{best:.3f} in the warm-up), rho on demonstration steps {fit.rho:.3f}, value gap {fit.value_gap:.3f}"
        )
        if ends:
            self.schedule.warmup_end = update
            if self.rank == 0:
                write_end(self.run_dir, update, self.validation.losses)
            self.console.print(
                f"learner: the warm-up ends at update {update}: the validation loss has not reached a new low "
                f"for {self.validation.patience} epoch(s); reinforcement learning starts"
            )

    def _due(self) -> tuple[str, int] | None:
        """("warmup", epoch) before the warm-up's first update, after each update that completed an epoch
        of it and after its last; ("rl", epoch) after the warm-up, once as many updates as an epoch has
        were made since the last validation (imitation's and reinforcement learning's alike: rho and the
        value gap across RL); None when not due or without held-back demonstrations."""
        if self.validation is None:
            return None
        epoch = 0 if self._draws is None else self._draws.epochs
        update = self.trainer.update
        end = self.schedule.warmup_updates
        if update <= end and self.schedule.has_demos:
            last = update == end and update != self._validated_update  # the supervised policy's fit
            return ("warmup", epoch) if epoch != self._validated or last else None
        every = max(1, -(-self.count // self.trainer.local_batch))
        return ("rl", epoch) if update - self._validated_update >= every else None


def split_validation(demos: list, n: int) -> tuple[list, list]:
    """(training demonstrations, the last `n` held back); SystemExit when fewer than one would be left
    to train on."""
    if n <= 0:
        return demos, []
    if n >= len(demos):
        raise SystemExit(
            f"--validation-demos {n} leaves nothing to imitate: there are {len(demos)} demonstrations"
        )
    return demos[:-n], demos[-n:]


def ended_at(run_dir: Path) -> int | None:
    """The update a previous run of this directory ended its warm-up early at, or None."""
    path = run_dir / WARMUP_FILE
    if not path.exists():
        return None
    try:
        return int(json.loads(path.read_text())["ended_at"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"cannot read {path}: {e}") from e


def write_end(run_dir: Path, update: int, losses: list[float]) -> None:
    """Records that the warm-up ended at `update` (written whole, then renamed into place)."""
    path = run_dir / WARMUP_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ended_at": update, "validation_losses": losses}))
    tmp.replace(path)
