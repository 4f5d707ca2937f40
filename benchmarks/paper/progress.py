"""How long `python -m benchmarks paper` will take: the estimate printed before the first run, and the
time left printed after each, so an experiment of hours says early whether it fits the time the machine
has, and a resumed one counts only the runs it still has to do.

Before any run the estimate is the recipe's arithmetic with the assumed costs (Costs); once runs finish,
the time left is their measured mean duration (training and evaluation, `duration_s` in each result.json,
earlier sittings' included) times the runs left, plus the end's share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.paper.plan import Recipe

SPLITS_EVALUATED = 2
"""general/train and general/test (benchmarks/paper/eval.py SPLITS)."""


@dataclass(frozen=True)
class Costs:
    """What a run costs beyond its `seconds` on this 2-core machine, before any run says otherwise."""

    run_fixed_s: float = 25.0
    """Per run: the learner's start before its clock and its stop, the evaluator's start-up (JAX, the text
    encoder, the compile)."""
    eval_episode_s: float = 0.025
    """Per greedy evaluation episode (about 10 steps of one batched policy call over 16 environments)."""
    end_s: float = 60.0
    """Once at the end: `python -m learner report` per N, the figures, the summary."""


ASSUMED = Costs()
"""From the quick run: 8 runs of 100 s with 400 evaluation episodes each took about 18 minutes, 135 s a
run, 35 s over its length = 25 s + 400 x 0.025 s (the split between fixed and per episode assumed)."""


def run_estimate_s(recipe: Recipe, costs: Costs = ASSUMED) -> float:
    """One run: its length, the fixed overhead, and its evaluation (every grid snapshot, both splits)."""
    episodes = recipe.snapshots * SPLITS_EVALUATED * recipe.eval_episodes
    return recipe.seconds + costs.run_fixed_s + episodes * costs.eval_episode_s


def estimate_s(recipe: Recipe, done: int = 0, costs: Costs = ASSUMED) -> float:
    """The whole experiment from now, `done` runs already kept: the runs left, then the end."""
    return (recipe.runs - done) * run_estimate_s(recipe, costs) + costs.end_s


def estimate_words(recipe: Recipe, done: int = 0, costs: Costs = ASSUMED) -> str:
    """The estimate with its arithmetic, the line printed before the first run."""
    left = recipe.runs - done
    episodes = recipe.snapshots * SPLITS_EVALUATED * recipe.eval_episodes
    minutes = estimate_s(recipe, done, costs) / 60
    return (
        f"{recipe.runs} runs, {done} kept from earlier sittings; estimate {minutes:.1f} "
        f"min = {left} x ({recipe.seconds} s + {costs.run_fixed_s:g} s + {episodes} evaluation episodes x "
        f"{costs.eval_episode_s:g} s) + {costs.end_s:g} s at the end"
    )


def remaining_s(durations: list[float], left: int, recipe: Recipe, costs: Costs = ASSUMED) -> float:
    """Time left: the runs left at the measured mean run (the assumed one before any), then the end."""
    per_run = sum(durations) / len(durations) if durations else run_estimate_s(recipe, costs)
    return left * per_run + costs.end_s


@dataclass
class Progress:
    """The experiment's clock: which runs are done, how long the measured ones took, and the line to print
    after each."""

    recipe: Recipe
    done: int = 0
    """Runs finished, kept ones included."""
    durations: list[float] = field(default_factory=list)
    """Measured durations of finished runs (this sitting's, and kept ones that recorded theirs)."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for the elapsed time (replaced in tests)."""
    started: float = 0.0
    """The clock when this sitting began."""

    @classmethod
    def begin(cls, recipe: Recipe, out: Path, clock: Callable[[], float] = time.monotonic) -> Progress:
        """Count the runs an earlier sitting kept (their result.json under `out`) and print the estimate."""
        kept = kept_results(out)
        print(f"paper: {recipe.name}: {estimate_words(recipe, len(kept))}", flush=True)
        return cls(recipe, clock=clock, started=clock())

    def finished(self, row: dict) -> str:
        """Count one run (kept or new) and print done/total, elapsed and the time left."""
        self.done += 1
        if row.get("duration_s") is not None:
            self.durations.append(row["duration_s"])
        left = max(self.recipe.runs - self.done, 0)
        line = (
            f"paper: {self.done}/{self.recipe.runs} runs done, {(self.clock() - self.started) / 60:.1f} min "
            f"elapsed, about {remaining_s(self.durations, left, self.recipe) / 60:.1f} min left"
            f" ({len(self.durations)} runs measured)"
        )
        print(line, flush=True)
        return line


def kept_results(out: Path) -> list[Path]:
    """The result.json files earlier sittings left under `out` (one per finished run)."""
    return sorted(out.glob("N*/*/s*/result.json")) if out.exists() else []
