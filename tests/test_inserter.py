"""The replay-insert path on its own: episodes in -> the replay holds them at the actor's own priority
terms (the running max without them), the stale ones dropped, and the schedule and statistics counted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.protocol import Episode
from learner.config import LearnerConfig
from learner.inserter import ReplayInserter
from learner.observe.run_stats import LAG_CAP, LagHistogram, RunStats
from learner.replay.prioritized import PrioritizedReplay, trajectory_priority
from learner.schedule import Schedule

GAMMA = 0.5
NEWEST = 6
"""The learner's policy version while the episodes arrive."""
WEIGHTS = (1.0, 0.5, 0.25)


def episode(versions, rewards, values=None, success=False, task="t") -> Episode:
    steps = {"policy_version": np.asarray(versions, np.int32), "reward": np.asarray(rewards, np.float32)}
    estimates = {}
    if values is not None:
        estimates = {
            "value": np.asarray(values, np.float32),
            "entropy": np.full(len(values), 0.4, np.float32),
        }
    return Episode(task, success, False, {}, steps, estimates)


def inserter(mode: str = "sync", max_policy_lag: int = 0, **buffer) -> ReplayInserter:
    cfg = LearnerConfig(mode=mode)
    cfg = dataclasses.replace(
        cfg, buffer=dataclasses.replace(cfg.buffer, max_policy_lag=max_policy_lag, **buffer)
    )
    replay = PrioritizedReplay[Episode](8, priority_weights=WEIGHTS, max_policy_lag=max_policy_lag)
    return ReplayInserter(
        replay, Schedule(cfg, local_batch=2, has_demos=False), RunStats(), GAMMA, lambda: NEWEST
    )


def test_episodes_enter_at_the_actors_priority_and_are_counted():
    insert = inserter()
    with_estimates = episode([3, 4], [0.0, 1.0], values=[1.0, 2.0], success=True)
    without = episode([5], [0.0])
    insert([with_estimates, without])

    replay = insert.replay
    assert replay.items() == [with_estimates, without]
    # |0 + 0.5 * 2 - 1| = 0 and |1 - 2| = 1 (terminal): mean |delta| 0.5, ratio 1, entropy 0.4
    want = float(trajectory_priority(0.5, 1.0, 0.4, WEIGHTS, replay.eps))
    slots = {id(item): slot for slot, item in enumerate(replay._items) if item is not None}
    assert replay.priorities[slots[id(with_estimates)]] == pytest.approx(want)
    assert replay.priorities[slots[id(without)]] == replay.max_priority  # no estimates: the running max
    assert replay.counts["added_at_max"] == 1
    assert replay._version[slots[id(with_estimates)]] == 3  # judged stale by its oldest step

    stats = insert.stats
    assert (stats.totals["episodes"], stats.totals["env_steps"], stats.totals["behavior_version_max"]) == (
        2,
        3,
        5,
    )
    assert list(stats.recent_success) == [True, False]
    # how old each step's policy was when it arrived: 6 - [3, 4, 5]
    assert stats.arrival_lag.summary() == {"steps": 3, "p50": 2, "p90": 3, "p99": 3, "max": 3}
    assert insert.schedule.round_complete(connected_envs=2)  # the sync round saw both episodes


def test_stale_episodes_are_counted_but_not_stored():
    insert = inserter(max_policy_lag=1)
    insert.replay.drop_stale(10)  # the learner has seen version 10: oldest version 9 is the cutoff
    insert([episode([8, 9], [0.0, 0.0]), episode([9], [1.0], success=True)])
    assert len(insert.replay) == 1 and insert.replay.counts["dropped_stale_at_add"] == 1
    assert insert.stats.totals["episodes"] == 2  # received, whether stored or not


def test_the_gate_closes_once_inserts_run_past_the_slack_and_training_could_go_on():
    insert = inserter(mode="async", insert_slack=3, samples_per_insert=1.0)
    insert([episode([0], [0.0]) for _ in range(3)])
    assert insert.accepts()  # 3 received, none used: within the slack
    insert([episode([0], [0.0])])
    assert not insert.accepts()  # 4 past the slack of 3, and a batch of 2 could train now
    insert.schedule.count_update(imitation=False)
    insert.schedule.count_update(imitation=False)
    assert insert.accepts()  # 2 updates of 2 used all 4


def test_imitation_updates_pace_the_insert_side_during_the_warmup():
    """Actors keep collecting at the pace of training while the learner imitates demonstrations (the
    user watches the warmed-up policy's success), instead of stopping at the slack."""
    insert = inserter(mode="async", insert_slack=3, samples_per_insert=1.0)
    insert([episode([0], [0.0]) for _ in range(5)])
    assert not insert.accepts()  # 5 received, nothing used: past the slack of 3
    insert.schedule.count_update(imitation=True)  # as Session.draw_demos does
    assert insert.accepts()  # one update's batch of 2 counts as used: 5 - 2 <= 3


def test_the_warmups_pace_ends_when_reinforcement_learning_starts():
    """A warm-up of 50 imitation updates with no actors (--actors-after-warmup) gives them no credit
    afterwards: once reinforcement learning starts only its updates use episodes (the later imitation
    updates draw none), so the gate closes at the slack as in a run without a warm-up."""
    insert = inserter(mode="async", insert_slack=3, samples_per_insert=1.0)
    schedule = insert.schedule
    for _ in range(50):
        schedule.count_update(imitation=True)
    schedule.start_rl(insert.stats.totals["episodes"])  # nothing came in during the warm-up
    insert([episode([0], [0.0]) for _ in range(4)])
    assert not insert.accepts()  # 4 past the slack of 3 (counted for ever, 100 were paced)
    schedule.count_update(imitation=True)  # an imitation update after the warm-up uses no actor episode
    assert not insert.accepts()
    schedule.count_update(imitation=False)
    assert insert.accepts()


def test_episodes_the_warmup_paced_count_as_used_when_reinforcement_learning_starts():
    insert = inserter(mode="async", insert_slack=3, samples_per_insert=1.0)
    schedule = insert.schedule
    for _ in range(3):
        schedule.count_update(imitation=True)  # pace 6 episodes
    insert([episode([0], [0.0]) for _ in range(8)])
    assert insert.accepts()  # 8 - 6 <= 3
    schedule.start_rl(8)
    schedule.start_rl(20)  # called every turn after the warm-up: the first call counts
    assert schedule.used == 6  # at most what the warm-up paced
    insert([episode([0], [0.0]) for _ in range(2)])
    assert not insert.accepts()  # 10 received, 6 used: past the slack
    schedule.count_update(imitation=False)
    assert insert.accepts()  # 10 - 8 <= 3


def test_demonstrations_in_the_replay_give_no_update_budget():
    insert = inserter(mode="async", samples_per_insert=4.0)
    for _ in range(8):  # as Session.start_rl prefills them: straight into the replay, not through actors
        insert.replay.add(episode([0], [1.0], success=True), 0)
    schedule = insert.schedule
    assert len(insert.replay) == 8 and not schedule.can_train(len(insert.replay))
    assert insert.accepts()  # nothing came from actors: the insert side stays open
    insert([episode([0], [0.0])])  # one actor episode: 4 samples, two updates of 2
    assert schedule.inserted == 1 and schedule.can_train(len(insert.replay))
    schedule.count_update(imitation=False)
    schedule.count_update(imitation=False)
    assert not schedule.can_train(len(insert.replay))


def test_stale_episodes_are_no_inserts_of_the_rate_limit():
    insert = inserter(max_policy_lag=1)
    insert.replay.drop_stale(10)
    insert([episode([8], [0.0]), episode([9], [1.0])])
    assert insert.schedule.inserted == 1


def test_lag_percentiles_match_numpys_inverted_cdf():
    rng = np.random.default_rng(0)
    lags = np.concatenate([rng.geometric(0.3, 5000) - 1, [3000]])  # one lag past the cap
    hist = LagHistogram()
    for part in np.array_split(lags, 7):
        hist.add(part)
    clipped = np.minimum(lags, LAG_CAP)
    want = {f"p{q}": int(np.percentile(clipped, q, method="inverted_cdf")) for q in (50, 90, 99)}
    assert hist.summary() == {"steps": lags.size, **want, "max": LAG_CAP}
    assert LagHistogram().summary() == {}
