"""The instruction-level critic (a per-task recent success rate) and its filter on the actor loss."""

from __future__ import annotations

import numpy as np
import pytest

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
