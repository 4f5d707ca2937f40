"""What `python -m benchmarks paper` runs: the recipe (how long, how many seeds, how slow the devices),
the cells (what each run changes against plain async or sync), and one run's learner command.

Every run is the real learner with its local actors on SimPhone `general`/train behind the emulator
latency model of benchmarks/collection.py, the same loss, replay, warm-up and demonstrations in every
cell (the demonstrations prefill the replay without buying updates: the rate limit counts actor
inserts only). The only differences between cells are the ones named in CELLS.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.collection import emulator_flags

CELLS: dict[str, str] = {
    "sync": "DigiRL's loop: every environment runs one episode per round on one policy version; the "
    "learner trains on the round (as far as the rate limit allows) and publishes the next version",
    "async": "DistRL's loop: actors collect without waiting, the learner trains as data arrives and "
    "publishes every --publish-every updates",
    "async_throttled": "async with each actor's episode rate capped at sync's measured rate (same seed, "
    "same N): freshness and pipelining without the extra data",
    "sync_matched": "sync with more environments, enough to match async's measured episode rate: what "
    "sync loses to stragglers alone",
    "async_uniform": "async with uniform replay sampling instead of prioritized (--replay uniform)",
    "async_no_correction": "async with every importance ratio set to 1 (--no-off-policy-correction)",
}
"""Each cell and what it isolates. sync and async first: the two controls are sized from them."""

EVAL_SEED = 1234
"""Seed of the greedy evaluation episodes: every snapshot of every run meets the same episodes."""


@dataclass(frozen=True)
class Recipe:
    """One size of the experiment (STANDARD's docstring below: how a size is fitted to the time the machine
    has, with the arithmetic of its estimate)."""

    name: str
    """"full", "standard" or "quick"."""
    envs: tuple[int, ...]
    """Environments per run (N); each N is its own set of cells."""
    seeds: tuple[int, ...]
    """Seeds per cell (learner --seed: demonstrations, tasks and initial parameters per seed)."""
    seconds: int
    """Wall time of each run, learner start to stop (start-up, demonstrations and warm-up included)."""
    snapshot_every: int
    """Seconds between the parameter snapshots that are evaluated greedily (a divisor of `seconds`)."""
    eval_episodes: int
    """Greedy episodes per snapshot and split."""
    time_scale: float
    """Emulator latency scale: 1.0 is a mean step of about 1 s, like a device."""
    warmup_updates: int
    """Behaviour-cloning updates on the demonstrations before reinforcement learning (same in every cell)."""
    warmup_demos: int
    """Oracle demonstrations written at start (same in every cell for a seed)."""
    target: float
    """Greedy success on general/train whose first crossing is "time to target"; fixed before measuring."""
    cells: tuple[str, ...]
    """The cells this recipe runs (keys of CELLS)."""

    def actors(self, envs: int) -> int:
        """Local actor processes for N environments: 8 to 16 environments each."""
        return max(2, math.ceil(envs / 16))

    @property
    def snapshots(self) -> int:
        """Grid times per run (every, 2 every, ..., seconds): at most this many snapshots to evaluate."""
        return self.seconds // self.snapshot_every

    @property
    def runs(self) -> int:
        """Learner runs in the whole experiment: every cell for every seed and N."""
        return len(self.envs) * len(self.seeds) * len(self.cells)

    def out_dir(self, extra: tuple[str, ...] = ()) -> Path:
        """Where the runs and results live (kept between sittings: the benchmark resumes from it); extra
        learner flags get a folder of their own, so results of different flags never mix."""
        slug = re.sub(r"[^A-Za-z0-9.]+", "_", " ".join(extra)).strip("_")
        root = Path(__file__).resolve().parents[1] / "runs"
        return root / (f"paper-{self.name}" + (f"-{slug}" if slug else ""))


FULL = Recipe(
    name="full", envs=(16, 64), seeds=(0, 1, 2, 3, 4), seconds=900, snapshot_every=90,
    eval_episodes=200, time_scale=1.0, warmup_updates=150, warmup_demos=400, target=0.5,
    cells=tuple(CELLS),
)  # fmt: skip
STANDARD = Recipe(
    name="standard", envs=(16,), seeds=(0, 1, 2), seconds=360, snapshot_every=40,
    eval_episodes=100, time_scale=0.25, warmup_updates=30, warmup_demos=400, target=0.5,
    cells=tuple(CELLS),
)  # fmt: skip
"""The size that settles the claims on this 2-core machine within 150 minutes (issue 48), fixed before
its run: N = 16, seeds 0-2, all six cells (18 runs), 360 s runs at time scale 0.25, snapshots every 40 s
(9 per run, the crossing of the target placed to 40 s), 100 greedy episodes per snapshot and split
(binomial standard error at most 0.05), the greedy target 0.5 on general/train (the full size's), and
the warm-up of `actor_loss`'s runs (400 demonstrations, 30 imitation updates).

Why 360 s is long enough for async to pass 0.5 in every seed: `actor_loss`'s async runs (this N, time
scale, warm-up and default actor weighting) reached final greedy train success 0.75-0.84 at 240 s in all
three seeds with a train AUC of 0.595-0.645 over the grid 60, 120, 180, 240 s, so each reached 0.5 by
180 s at the latest (with the 60, 120 and 180 s points all below 0.5 the AUC would be under
(3 x 0.5 + 0.84) / 4 = 0.585); 360 s is twice that. Sync (20 updates in the quick run's 100 s against async's 47-50, greedy train
0.10-0.14 at the end) may not reach it: its time is then censored at 360 s and the ratio is a lower bound
(benchmarks/paper/verdict.py says how that counts).

The estimate (benchmarks/paper/progress.py, printed before the first run, with the costs measured as
the runs finish): a run costs its 360 s, plus 25 s of fixed overhead (the learner's start before its
clock and its stop, the evaluator's start-up: JAX, the text encoder, the compile), plus its evaluation,
9 snapshots x 2 splits x 100 episodes x 0.025 s = 45 s: 430 s. 18 runs x 430 s = 7,740 s, plus 60 s
at the end (`learner report`, figures, summary) = 7,800 s = 130 minutes, 20 minutes under the limit.
The costs come from the quick run (8 runs of 100 s with 400 evaluation episodes each in about 18
minutes: 135 s a run, 35 s over its length = 25 s + 400 x 0.025 s; the split between the two is
assumed). If the evaluation were twice as slow (0.05 s an episode), 18 x 475 s + 60 s = 143.5 minutes,
still within the limit; whatever the split, with f of the quick run's 35 s fixed and the rest per episode,
the total is 18 x (517.5 - 3.5 f) + 60 s, within 150 minutes for any f of 6 s or more (the learner's and
the evaluator's process start-ups alone take more)."""
QUICK = Recipe(
    name="quick", envs=(16,), seeds=(0, 1), seconds=100, snapshot_every=25,
    eval_episodes=50, time_scale=0.25, warmup_updates=10, warmup_demos=200, target=0.3,
    cells=("sync", "async", "async_throttled", "sync_matched"),
)  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One learner run of the experiment."""

    cell: str
    base_envs: int
    """The N of the cell set this run belongs to."""
    envs: int
    """Environments it runs (more than base_envs for sync_matched)."""
    seed: int
    actors: int
    envs_per_actor: int
    episode_rate_per_actor: float = 0.0
    """async_throttled: each actor's cap (episodes/s); 0 elsewhere."""

    @property
    def key(self) -> str:
        return f"N{self.base_envs}/{self.cell}/s{self.seed}"


def plain_run(recipe: Recipe, cell: str, envs: int, seed: int) -> Run:
    actors = recipe.actors(envs)
    return Run(cell, envs, envs, seed, actors, math.ceil(envs / actors))


def throttled_run(recipe: Recipe, envs: int, seed: int, sync_episodes_per_s: float) -> Run:
    """async capped at sync's episode rate, split evenly over the actors."""
    run = plain_run(recipe, "async_throttled", envs, seed)
    return Run(**{**run.__dict__, "episode_rate_per_actor": sync_episodes_per_s / run.actors})


def matched_run(recipe: Recipe, envs: int, seed: int, async_rate: float, sync_rate: float) -> Run:
    """sync with N * async_rate / sync_rate environments (at least N, at most 4N), same actor count."""
    actors = recipe.actors(envs)
    wanted = min(4 * envs, max(envs, round(envs * async_rate / max(sync_rate, 1e-9))))
    per_actor = math.ceil(wanted / actors)
    return Run("sync_matched", envs, per_actor * actors, seed, actors, per_actor)


def learner_command(recipe: Recipe, run: Run, run_dir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """`python -m learner ...` for one run, `extra` flags last; the time limit leaves a margin so the last
    snapshot is written."""
    mode = "sync" if run.cell.startswith("sync") else "async"
    cmd = [
        sys.executable, "-m", "learner", "--mode", mode, "--run-dir", str(run_dir),
        "--ingest-port", "0", "--params-port", "0", "--seed", str(run.seed),
        "--local-actors", str(run.actors), "--envs-per-actor", str(run.envs_per_actor),
        "--env", "simphone", "--tasks", "general", "--split", "train",
        "--warmup-demos", str(recipe.warmup_demos), "--warmup-updates", str(recipe.warmup_updates),
        "--time-limit", str(recipe.seconds + 3), "--snapshot-every", str(recipe.snapshot_every),
        "--log-every", "2", "--console", "lines",
        *emulator_flags(recipe.time_scale),
    ]  # fmt: skip
    if run.cell == "async_uniform":
        cmd += ["--replay", "uniform"]
    if run.cell == "async_no_correction":
        cmd += ["--no-off-policy-correction"]
    if run.episode_rate_per_actor:
        cmd += [f"--local-actor-args=--max-episode-rate {run.episode_rate_per_actor:.4f}"]
    return cmd + list(extra)
