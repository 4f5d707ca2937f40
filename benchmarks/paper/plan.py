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
    """One size of the experiment."""

    name: str
    """"full" or "quick"."""
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
