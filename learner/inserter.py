"""Where a settled TRAJ batch's episodes go: the ingest's batch settler calls a `ReplayInserter` with them
(its `on_episodes`), after the batch is durable and before it is acknowledged (learner/ingest/settler.py);
the write-ahead log's recovery calls it the same way."""

from __future__ import annotations

from collections.abc import Callable

from common.protocol import Episode
from learner.observe.run_stats import RunStats
from learner.replay.prioritized import PrioritizedReplay, initial_priority_terms, oldest_version
from learner.schedule import Schedule


class ReplayInserter:
    """Stores episodes in the replay at the priority of the actor's own TD errors and entropy (when it
    sent them), and counts them for the schedule (sync rounds, the rate limit) and the run statistics.
    `accepts` is the insert side of the rate limit, the ingest's gate (--insert-slack). `newest_version`
    gives the learner's current policy version (for the steps' lag on arrival)."""

    def __init__(
        self,
        replay: PrioritizedReplay[Episode],
        schedule: Schedule,
        stats: RunStats,
        gamma: float,
        newest_version: Callable[[], int],
    ):
        self.replay, self.schedule, self.stats, self.gamma = replay, schedule, stats, gamma
        self.newest_version = newest_version

    def __call__(self, episodes: list[Episode], record: int = -1) -> None:
        """`record`: the write-ahead log record the episodes were read from (-1: none), kept per item so a
        checkpoint can save them by reference."""
        self.schedule.on_episodes(len(episodes))
        slots = [
            self.replay.add(ep, oldest_version(ep), initial_priority_terms(ep, self.gamma), (record, i))
            for i, ep in enumerate(episodes)
        ]
        self.schedule.count_inserts(sum(slot is not None for slot in slots))  # the stale ones are not stored
        self.stats.on_episodes(episodes, self.newest_version())

    def accepts(self) -> bool:
        """Whether actors may get new credit now (Schedule.accepts_inserts on what came in and is stored)."""
        return self.schedule.accepts_inserts(self.stats.totals["episodes"], len(self.replay))
