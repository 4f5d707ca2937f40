"""The instruction-level critic (a per-task recent success rate) and its filter on the actor loss."""

from __future__ import annotations

import numpy as np
import pytest

from common.protocol import Episode
from learner.observe.run_stats import RunStats
from learner.replay.instruction_critic import InstructionCritic


def test_value_is_the_success_rate_of_the_last_window_episodes():
    critic = InstructionCritic(window=10, min_episodes=4)
    for success in [True] * 3:
        critic.observe("a", success)
    assert critic.value("a") is None  # too few episodes to judge
    assert critic.values() == {"a": 1.0}  # but the metrics show it
    critic.observe("a", False)
    assert critic.value("a") == 0.75
    for _ in range(10):  # the window forgets the first four
        critic.observe("a", False)
    assert critic.value("a") == 0.0
    assert critic.value("never seen") is None


def test_keep_filters_solved_and_hopeless_tasks_and_keeps_unjudged_ones():
    critic = InstructionCritic(window=20, min_episodes=5)
    rates = {"solved": 1.0, "hopeless": 0.0, "learning": 0.4, "edge": 0.9}
    for task, rate in rates.items():
        n = 10
        for i in range(n):
            critic.observe(task, i < round(rate * n))
    critic.observe("new", True)
    keep = critic.keep(["solved", "hopeless", "learning", "edge", "new", "learning"], 0.1, 0.9)
    np.testing.assert_array_equal(keep, [False, False, True, True, True, True])
    assert keep.dtype == bool


@pytest.mark.parametrize(("window", "min_episodes"), [(0, 1), (5, 0), (5, 6)])
def test_bad_windows_are_refused(window, min_episodes):
    with pytest.raises(ValueError, match="window"):
        InstructionCritic(window, min_episodes)


def test_filter_is_keep_with_the_dropped_trajectories_counted():
    critic = InstructionCritic(window=10, min_episodes=2)
    for task, success in (
        [("solved", True)] * 3 + [("hopeless", False)] * 3 + [("learning", True), ("learning", False)]
    ):
        critic.observe(task, success)
    tasks = ["solved", "learning", "hopeless", "new", "solved"]
    keep = critic.filter(tasks, 0.1, 0.9)
    np.testing.assert_array_equal(keep, critic.keep(tasks, 0.1, 0.9))
    np.testing.assert_array_equal(keep, [False, True, False, True, False])
    assert critic.counts["instruction_filtered"] == 3
    critic.filter(["hopeless"], 0.1, 0.9)
    assert critic.counts["instruction_filtered"] == 4


def test_the_run_statistics_report_what_the_critic_filtered_without_deciding_it():
    """The session asks the critic the run's statistics hold (`RunStats.tasks`); its count lands in the
    run's totals, which metrics.jsonl reports as instruction_filtered."""
    stats = RunStats()
    episodes = [
        Episode(
            task,
            success,
            False,
            {},
            {"policy_version": np.zeros(2, np.int32), "reward": np.zeros(2, np.float32)},
        )
        for task, success in [("solved", True)] * 10 + [("learning", i % 2 == 0) for i in range(10)]
    ]
    stats.on_episodes(episodes, newest_version=0)
    assert not hasattr(stats, "instruction_keep")
    keep = stats.tasks.filter(["solved", "learning", "solved"], 0.1, 0.9)
    np.testing.assert_array_equal(keep, [False, True, False])
    assert stats.totals["instruction_filtered"] == 2
    assert stats.tasks.values() == {"learning": 0.5, "solved": 1.0}
