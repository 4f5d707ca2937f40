"""What a learner run has seen and spent, for metrics.jsonl, the dashboards and --stop-at-success."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from common.protocol import Episode
from learner.replay.instruction_critic import InstructionCritic

SUCCESS_WINDOW = 100
"""Episodes in the training success rate (success_rate in metrics, and --stop-at-success)."""
LAG_CAP = 1024
"""Policy lags are counted exactly up to this many versions; larger ones are counted as this."""


class LagHistogram:
    """How many steps had each policy lag (in versions), over the whole run: the lag's distribution as
    percentiles, which a mean and a max of the last batch cannot show (issue 33: actor-side against
    remote inference)."""

    def __init__(self):
        self.counts = np.zeros(LAG_CAP + 1, np.int64)

    def add(self, lags: np.ndarray) -> None:
        self.counts += np.bincount(np.clip(lags, 0, LAG_CAP).astype(np.int64), minlength=LAG_CAP + 1)

    def summary(self) -> dict[str, int]:
        """steps counted, p50 / p90 / p99 (the smallest lag with at least that share of steps at or below
        it) and max; {} before the first step."""
        total = int(self.counts.sum())
        if not total:
            return {}
        cumulative = np.cumsum(self.counts)
        quantile = {f"p{q}": int(np.searchsorted(cumulative, total * q / 100)) for q in (50, 90, 99)}
        return {"steps": total, **quantile, "max": int(np.flatnonzero(self.counts)[-1])}


class RunStats:
    """Counters of episodes and steps, recent success (overall and per task), the last batch's policy
    lag and the run's lag distributions, the last update's loss metrics, and seconds spent per stage (compile, ingest, train, publish,
    checkpoint; cleanba-style, so every record says where the time went)."""

    def __init__(self):
        self.totals: Counter[str] = Counter()
        """episodes, env_steps, behavior_version_max, imitation_updates, skipped_nonfinite,
        instruction_filtered, episodes_at_rl_start (set once reinforcement learning starts)."""
        self.recent_success: deque[bool] = deque(maxlen=SUCCESS_WINDOW)
        self.recent_tasks: deque[str] = deque(maxlen=SUCCESS_WINDOW)
        """The tasks of the same last SUCCESS_WINDOW episodes, in step with `recent_success`: what the
        console's per-family columns are computed over, so they and the headline share one window."""
        self.tasks = InstructionCritic(window=SUCCESS_WINDOW, counts=self.totals)
        """Recent success per task, for the success_by_task metric. It is also the instruction-level
        critic the session asks for the filter (--instruction-filter): the decision is the critic's, and it
        counts what it drops in `totals` (instruction_filtered)."""
        self.lag_mean = 0.0
        self.lag_max = 0
        self.trained_lag = LagHistogram()
        """The lag of every step trained on (newest version at the update minus the one that acted)."""
        self.arrival_lag = LagHistogram()
        """The lag of every step stored, when it arrived (newest version then minus the one that acted):
        how stale acting is; about 0 with remote inference, the snapshot's age with actor-side."""
        self.train_metrics: dict[str, float] = {}
        self.validation: dict[str, float] = {}
        """The newest validation on held-back demonstrations (`validation/nll`, `/rho`, `/value_gap`,
        `/update`, `/epoch`, `/best`; learner/warmup.py), in every record after it."""
        self.timing: Counter[str] = Counter()
        """Seconds per stage: compile_s, ingest_s, train_s, publish_s, checkpoint_s."""

    def on_episodes(self, episodes: list[Episode], newest_version: int) -> None:
        for ep in episodes:
            self.arrival_lag.add(newest_version - ep.steps["policy_version"])
            self.recent_success.append(ep.success)
            self.recent_tasks.append(ep.task)
            self.tasks.observe(ep.task, ep.success)
            self.totals["episodes"] += 1
            self.totals["env_steps"] += ep.length
            self.totals["behavior_version_max"] = max(
                self.totals["behavior_version_max"], int(ep.steps["policy_version"].max())
            )

    def mark_rl_start(self) -> None:
        """Reinforcement learning starts now (after any warm-up): later success counts for the target."""
        if "episodes_at_rl_start" not in self.totals:
            self.totals["episodes_at_rl_start"] = self.totals["episodes"]

    def success_rate(self) -> float:
        return float(np.mean(self.recent_success)) if self.recent_success else 0.0

    def recent_by_task(self) -> dict[str, dict[str, int]]:
        """The success_rate window split by task, as two record fields: how many of the last SUCCESS_WINDOW
        episodes each task had (recent_episodes_by_task) and how many of those succeeded
        (recent_successes_by_task). Counts rather than rates, so any grouping of tasks (the console's
        families) gets the exact success of its episodes in that window."""
        episodes: Counter[str] = Counter(self.recent_tasks)
        successes: Counter[str] = Counter(
            t for t, ok in zip(self.recent_tasks, self.recent_success, strict=True) if ok
        )
        return {
            "recent_episodes_by_task": dict(sorted(episodes.items())),
            "recent_successes_by_task": {t: successes[t] for t in sorted(episodes)},
        }

    def success_reached(self, target: float) -> bool:
        """The last SUCCESS_WINDOW episodes all came after the warm-up and succeeded at least `target`."""
        if "episodes_at_rl_start" not in self.totals:  # still warming up
            return False
        recent = self.totals["episodes"] - self.totals["episodes_at_rl_start"]
        return recent >= SUCCESS_WINDOW and self.success_rate() >= target

    def observe_lag(self, version: int, policy_versions: np.ndarray, mask: np.ndarray) -> None:
        """The policy lag (newest version minus the one that acted) of a batch's real steps."""
        lags = (version - policy_versions)[mask]
        self.lag_mean, self.lag_max = float(np.mean(lags)), int(np.max(lags))
        self.trained_lag.add(lags)
