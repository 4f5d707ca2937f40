"""The instruction-level critic: how likely each task is to succeed now, from the episodes that arrive.

DigiRL (Bai et al. 2024) trains a value function of the instruction alone and uses it to
skip tasks that carry little policy-gradient signal: ones the policy already always solves, and ones it
never does. With task templates, the success rate of a template's recent episodes is that value function
in its tabular form: unbiased, cheap, and exact enough once a template has a few dozen episodes. The
learner also reads it for the per-task success it logs.

`keep` gives the filter for a batch: a trajectory trains the actor only if its task's recent success
rate lies in [low, high] (learner.losses.aride.instruction_keep), or its task has too few episodes to judge.
`filter` is that decision as the session asks it for each replay batch (--instruction-filter): the
critic both decides and counts the trajectories it drops, so the run's statistics only report the count.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import numpy as np

from learner.losses.aride import instruction_keep


class InstructionCritic:
    """Recent success rate per task (the last `window` episodes of each)."""

    def __init__(self, window: int = 100, min_episodes: int = 10, counts: Counter[str] | None = None):
        if window < 1 or not 1 <= min_episodes <= window:
            raise ValueError(
                f"need window >= 1 and 1 <= min_episodes <= window, got {window}, {min_episodes}"
            )
        self.window = window
        self.min_episodes = min_episodes
        self._recent: dict[str, deque[bool]] = {}
        self.counts: Counter[str] = Counter() if counts is None else counts
        """Where `filter` counts the trajectories it drops, as instruction_filtered (the run's totals in
        learner/observe/run_stats.py, which report it in metrics.jsonl)."""

    def observe(self, task: str, success: bool) -> None:
        self._recent.setdefault(task, deque(maxlen=self.window)).append(bool(success))

    def value(self, task: str) -> float | None:
        """The task's recent success rate, or None while it has fewer than min_episodes episodes."""
        recent = self._recent.get(task)
        if recent is None or len(recent) < self.min_episodes:
            return None
        return sum(recent) / len(recent)

    def values(self) -> dict[str, float]:
        """Recent success rate of every task seen (however few its episodes), sorted by name."""
        return {task: float(np.mean(recent)) for task, recent in sorted(self._recent.items())}

    def keep(self, tasks: Sequence[str], low: float, high: float) -> np.ndarray:
        """[len(tasks)] bool: the task's value is in [low, high], or it cannot be judged yet."""
        values = np.array([np.nan if (v := self.value(t)) is None else v for t in tasks], np.float32)
        return np.asarray(instruction_keep(values, low, high)) | np.isnan(values)

    def filter(self, tasks: Sequence[str], low: float, high: float) -> np.ndarray:
        """The instruction-level filter on a replay batch: `keep`, with the dropped trajectories counted."""
        keep = self.keep(tasks, low, high)
        self.counts["instruction_filtered"] += int((~keep).sum())
        return keep
