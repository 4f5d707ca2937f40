"""New trajectories enter the replay at a priority computed from the actor's own estimates, not at the
running maximum, and the replay reports whether its priorities steer sampling."""

from __future__ import annotations

import numpy as np
import pytest

from common import protocol
from common.protocol import Episode, ProtocolError
from learner.replay.prioritized import PrioritizedReplay, initial_priority_terms, trajectory_priority

GAMMA = 0.9


def _episode(rewards, values, entropies, truncated: bool) -> Episode:
    n = len(rewards)
    steps = {"policy_version": np.zeros(n, np.int32), "reward": np.asarray(rewards, np.float32)}
    estimates = {"value": np.asarray(values, np.float32), "entropy": np.asarray(entropies, np.float32)}
    return Episode("task", not truncated, truncated, {}, steps, estimates)


def _reference_terms(rewards, values, entropies, truncated):
    """Written out step by step: |r_t + gamma V(s_{t+1}) - V(s_t)|, V(terminal) = 0, no last step if truncated."""
    errors = []
    for t in range(len(rewards)):
        if t + 1 < len(rewards):
            errors.append(abs(rewards[t] + GAMMA * values[t + 1] - values[t]))
        elif not truncated:
            errors.append(abs(rewards[t] - values[t]))
    return (sum(errors) / len(errors) if errors else 0.0), 1.0, sum(entropies) / len(entropies)


@pytest.mark.parametrize("truncated", [False, True])
def test_initial_terms_match_a_step_by_step_reference(truncated):
    rng = np.random.default_rng(0)
    for n in (1, 2, 7):
        rewards, values = rng.normal(size=n).round(3), rng.normal(size=n).round(3)
        entropies = rng.uniform(0, 2, n).round(3)
        got = initial_priority_terms(_episode(rewards, values, entropies, truncated), GAMMA)
        want = _reference_terms(rewards, values, entropies, truncated)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_episode_without_estimates_has_no_initial_terms():
    ep = _episode([1.0], [0.5], [0.1], False)
    assert initial_priority_terms(Episode(ep.task, True, False, {}, ep.steps), GAMMA) is None


def test_new_items_enter_at_their_own_priority_not_the_max():
    weights = (1.0, 0.5, 0.1)
    buf = PrioritizedReplay[int](8, priority_weights=weights, eps=1e-6)
    first = buf.add(0, 0)
    buf.update_priorities([first], buf.generations[[first]], 5.0, 1.0, 1.0)  # the running max grows to 5.65
    slot = buf.add(1, 0, (0.2, 1.0, 0.8))
    assert buf.priorities[slot] == pytest.approx(float(trajectory_priority(0.2, 1.0, 0.8, weights, 1e-6)))
    assert buf.priorities[slot] < 0.2 * buf.max_priority
    plain = buf.add(2, 0)  # no estimates (a demonstration, an older actor): the running max, counted
    assert buf.priorities[plain] == buf.max_priority and buf.counts["added_at_max"] == 2


def test_resampled_share_counts_draws_of_items_drawn_before():
    buf = PrioritizedReplay[int](4, seed=0)
    for i in range(4):
        buf.add(i, 0, (1.0, 1.0, 1.0))  # equal priorities
    first = buf.sample(4)  # stratified over 4 equal items: each once, none drawn before
    assert sorted(first.indices.tolist()) == [0, 1, 2, 3]
    assert buf.stats()["resampled_share"] == 0.0
    buf.sample(4)
    assert buf.stats()["resampled_share"] == 0.5  # the last 8 draws: 4 new, then 4 seen before
    buf.add(4, 0, (1.0, 1.0, 1.0))  # evicts slot 0's item: the new item in slot 0 counts as never drawn
    assert buf.counts["draws_resampled"] == 4


def test_priority_delta_correlation_tells_informative_priorities_from_noise():
    rng = np.random.default_rng(1)

    def correlation(informative: bool) -> float:
        buf = PrioritizedReplay[int](64, priority_weights=(1.0, 0.0, 0.0), eps=0.0, seed=2)
        truth = rng.uniform(0.1, 2.0, 64)  # each item's true mean |delta|
        for i in range(64):
            buf.add(i, 0, (truth[i] if informative else rng.uniform(0.1, 2.0), 0.0, 0.0))
        s = buf.sample(64)  # one update's worth: each pair is (priority at insertion, the |delta| measured)
        measured = truth[s.indices] * rng.uniform(0.9, 1.1, 64)
        buf.update_priorities(s.indices, s.generations, measured, 0.0, 0.0)
        return buf.stats()["priority_delta_corr"]

    assert correlation(True) > 0.9
    assert abs(correlation(False)) < 0.4


def test_the_stale_drop_share_is_of_everything_received():
    buf = PrioritizedReplay[int](8, max_policy_lag=2)
    for v in range(4):
        buf.add(v, v)
    buf.drop_stale(5)  # cutoff 3: versions 0, 1, 2 are dropped from the buffer
    buf.add(9, 1)  # too old on arrival
    assert buf.stats()["stale_dropped_share"] == pytest.approx(4 / 5)


def test_an_older_replay_state_without_the_new_counts_still_loads():
    buf = PrioritizedReplay[int](4)
    buf.add(0, 0)
    items, state = buf.state_dict()
    state["counts"] = {k: v for k, v in state["counts"].items() if k in ("added", "evicted_fifo", "dropped_stale", "sampled", "stale_updates")}  # fmt: skip
    other = PrioritizedReplay[int](4)
    other.load_state_dict(items, state)
    assert other.counts["added"] == 1 and other.counts["added_at_max"] == 0


# ---- on the wire -------------------------------------------------------------------------------------
def _traj(**estimates) -> dict:
    from common.config import ModelConfig
    from common.policies.pointer import featurize
    from tests.test_fake_actor import make_episode

    cfg = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2)
    ep = make_episode(cfg.to_dict(), 3, np.random.default_rng(0))
    ep.update(estimates)
    return protocol.Traj(1, 1, [ep]).to_msg(), featurize.episode_spec(cfg, text_vocab_size=0), cfg


def _validate(**estimates):
    msg, spec, _ = _traj(**estimates)
    return protocol.validate_episodes(msg, spec, 8, 10)


def test_estimates_travel_checked():
    f32 = np.float32
    good = {"value": np.array([0.1, -0.2, 0.3], f32), "entropy": np.array([1.0, 0.5, 0.0], f32)}
    (ep,) = _validate(**good)
    assert set(ep.estimates) == {"value", "entropy"}
    np.testing.assert_array_equal(ep.estimates["value"], good["value"])
    assert _validate()[0].estimates == {}  # an older actor sends none
    bad = [
        ({"value": good["value"]}, "bad_field"),  # one without the other
        ({**good, "value": np.array([0.1, 0.2], f32)}, "bad_array"),  # wrong length
        ({**good, "value": np.array([0.1, np.nan, 0.3], f32)}, "non_finite"),
        ({**good, "entropy": np.array([1.0, -0.5, 0.0], f32)}, "bad_array"),
        ({**good, "value": good["value"].astype(np.float64)}, "bad_array"),  # wrong dtype
    ]
    for estimates, code in bad:
        with pytest.raises(ProtocolError) as e:
            _validate(**estimates)
        assert e.value.code == code, estimates


def test_each_terms_spread_is_its_weight_times_its_standard_deviation():
    weights = (1.0, 0.5, 0.1)
    buf = PrioritizedReplay[int](8, priority_weights=weights)
    slots = np.array([buf.add(i, 0) for i in range(4)])
    delta, rho, entropy = np.array([0.1, 0.3, 0.2, 0.6]), np.array([1.0, 0.8, 0.9, 1.0]), np.full(4, 2.0)
    buf.update_priorities(slots, buf.generations[slots], delta, rho, entropy)
    stats = buf.stats()
    assert stats["priority_spread_delta"] == pytest.approx(delta.std())
    assert stats["priority_spread_rho"] == pytest.approx(0.5 * rho.std())
    assert stats["priority_spread_entropy"] == 0.0  # a constant term does not steer sampling
