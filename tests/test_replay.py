"""learner.replay.prioritized: the sum tree against brute-force prefix sums, sampling frequencies against p^alpha,
importance weights against the formula, and the buffer's bookkeeping (FIFO, staleness, generations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.protocol import Episode
from learner.replay.prioritized import PrioritizedReplay, SumTree, oldest_version, trajectory_priority

PROPS = settings(derandomize=True, max_examples=60, deadline=None)


def reference_find(priorities: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The leaf i with prefix(i) <= v < prefix(i + 1), by brute force; values past the end go to the last
    positive leaf, negative ones count as 0."""
    cum = np.cumsum(priorities)
    idx = np.searchsorted(cum, np.maximum(values, 0.0), side="right")
    last_positive = np.flatnonzero(priorities > 0)[-1]
    return np.minimum(idx, last_positive)


def exact_buffer(priorities, alpha=1.0, **kw) -> PrioritizedReplay[int]:
    """A buffer holding items 0..K-1 at exactly the given priorities (eps 0, priority = the delta term)."""
    buf = PrioritizedReplay[int](len(priorities), alpha=alpha, priority_weights=(1, 0, 0), eps=0.0, **kw)
    slots = [buf.add(i, 0) for i in range(len(priorities))]
    set_priorities(buf, slots, priorities)
    return buf


def set_priorities(buf, slots, priorities) -> int:
    slots = np.asarray(slots)
    return buf.update_priorities(slots, buf.generations[slots], priorities, 0.0, 0.0)


def draw_counts(buf, draws: int, batch: int = 1000) -> tuple[np.ndarray, list]:
    counts = np.zeros(buf.capacity, np.int64)
    samples = []
    for _ in range(draws // batch):
        s = buf.sample(batch)
        counts += np.bincount(s.indices, minlength=buf.capacity)
        samples.append(s)
    return counts, samples


def assert_frequencies(counts: np.ndarray, probs: np.ndarray) -> None:
    """Per-index 5-sigma binomial bound on each count. Stratified draws have at most the binomial variance
    (the marginal of every draw is P(i), the segments only remove variance), so the bound is conservative;
    a false alarm for one index has probability < 6e-7."""
    n = counts.sum()
    expected = n * probs
    bound = 5 * np.sqrt(n * probs * (1 - probs)) + 1e-9
    bad = np.flatnonzero(np.abs(counts - expected) > bound)
    assert bad.size == 0, f"indices {bad}: counts {counts[bad]}, expected {expected[bad]} +- {bound[bad]}"


# ---- SumTree ---------------------------------------------------------------------------------------------
def test_sumtree_exact_on_dyadic_priorities_through_many_updates():
    """Small integer priorities (zeros included) make every sum exact, so total and find() must match the
    cumulative-sum reference exactly, boundaries included (a value equal to a prefix sum opens the next leaf)."""
    rng = np.random.default_rng(0)
    cap = 37  # not a power of two: padded leaves must never be found
    tree, ref = SumTree(cap), np.zeros(cap)
    for round_ in range(300):
        k = rng.integers(1, 8)
        idx = rng.integers(cap, size=k)  # repeats allowed: the last value wins
        p = rng.integers(0, 5, size=k).astype(float)
        tree.set(idx, p)
        for i, v in zip(idx, p, strict=True):
            ref[i] = v
        assert tree.total == ref.sum()
        np.testing.assert_array_equal(tree.leaves, ref)
        if ref.sum() == 0:
            continue
        cum = np.cumsum(ref)
        values = np.concatenate([[0.0], cum[:-1], cum - 0.5, rng.uniform(0, ref.sum(), 20)])
        values = values[values < ref.sum()]
        np.testing.assert_array_equal(tree.find_batch(values), reference_find(ref, values))
        assert tree.find(values[round_ % len(values)]) == reference_find(ref, values[round_ % len(values)])


def test_sumtree_random_floats_match_bruteforce():
    rng = np.random.default_rng(1)
    cap = 1000
    tree, ref = SumTree(cap), np.zeros(cap)
    for _ in range(50):
        idx = rng.choice(cap, size=100, replace=False)
        ref[idx] = rng.exponential(size=100)
        tree.set(idx, ref[idx])
    assert tree.total == pytest.approx(math.fsum(ref), rel=1e-13)
    values = rng.uniform(0, tree.total, 20_000)
    np.testing.assert_array_equal(tree.find_batch(values), reference_find(ref, values))


def test_sumtree_edges():
    p = np.array([0.0, 0.0, 3.0, 0.0, 0.25, 2.0, 0.0, 0.0, 0.0])
    tree = SumTree(len(p))
    tree.set(np.arange(len(p)), p)
    total = tree.total
    assert total == 5.25
    assert tree.find(0.0) == 2  # leading zero leaves are skipped
    assert tree.find(-1.0) == 2
    assert tree.find(3.0) == 4 and tree.find(np.nextafter(3.0, 0)) == 2
    assert tree.find(np.nextafter(total, 0)) == 5  # total - epsilon: the last positive leaf
    assert tree.find(total) == 5 and tree.find(10 * total) == 5  # at or past the end: clamped
    found = tree.find_batch(np.random.default_rng(2).uniform(0, total, 10_000))
    assert set(found.tolist()) == {2, 4, 5}
    one = SumTree(1)
    one.set(0, 0.5)
    assert one.total == 0.5 and one.find(0.49) == 0 and one.find(7.0) == 0
    with pytest.raises(IndexError):
        tree.set(len(p), 1.0)
    with pytest.raises(ValueError):
        tree.set(0, -1.0)
    with pytest.raises(ValueError):
        tree.set(0, math.nan)
    with pytest.raises(ValueError):
        tree.find(math.nan)


# ---- sampling distribution and weights ---------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_sampled_frequencies_follow_p_alpha(alpha):
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 3.0, size=25)
    buf = exact_buffer(p, alpha=alpha, seed=4)
    counts, _ = draw_counts(buf, 200_000)
    assert_frequencies(counts, p**alpha / np.sum(p**alpha))


def test_importance_weights_match_formula():
    p = np.array([1.0, 2.0, 3.0, 4.0])
    buf = exact_buffer(p, alpha=0.5, beta_start=0.5, beta_end=1.0, beta_steps=4, seed=5)
    for call in range(6):
        s = buf.sample(3)
        beta = 0.5 + 0.5 * min(call, 4) / 4
        probs = np.sqrt(p) / np.sqrt(p).sum()
        raw = (4 * probs[s.indices]) ** -beta
        assert s.beta == beta
        np.testing.assert_allclose(s.probs, probs[s.indices], rtol=1e-14)
        np.testing.assert_allclose(s.weights, raw / raw.max(), rtol=1e-12)
        assert s.weights.max() == 1.0 and s.items == s.indices.tolist()
    # hand value: item 0 against item 3 at beta 1 is (P(3) / P(0)) = sqrt(4) / sqrt(1)
    w = (4 * probs[[0, 3]]) ** -1.0
    assert w[1] / w[0] == pytest.approx(0.5)


def test_beta_anneals_linearly_and_stops():
    buf = exact_buffer([1.0, 1.0], beta_start=0.4, beta_end=1.0, beta_steps=10)
    betas = [buf.sample(2).beta for _ in range(15)]
    np.testing.assert_allclose(betas, [0.4 + 0.06 * min(t, 10) for t in range(15)], rtol=1e-12)
    assert betas[-1] == 1.0 and buf.stats()["beta"] == 1.0
    assert exact_buffer([1.0], beta_start=0.4, beta_steps=0).sample(1).beta == 1.0


def test_beta_follows_the_learners_update_count():
    """The learner passes its update count (imitation updates included): beta is on that clock, not on the
    number of batches this buffer happened to hand out, and a restored buffer continues from it."""
    buf = exact_buffer([1.0, 1.0], beta_start=0.4, beta_end=1.0, beta_steps=10)
    assert buf.sample(2, progress=5).beta == pytest.approx(0.7)
    assert buf.sample(2, progress=8).beta == pytest.approx(0.88)  # updates 6, 7 were imitation
    assert buf.sample(2, progress=40).beta == 1.0
    other = exact_buffer([1.0, 1.0], beta_start=0.4, beta_end=1.0, beta_steps=10)
    other.load_state_dict(*buf.state_dict())
    assert other.sample(2, progress=9).beta == pytest.approx(0.94)


# ---- priorities ------------------------------------------------------------------------------------------
def test_new_items_enter_at_running_max():
    buf = PrioritizedReplay[str](8, alpha=0.5, priority_weights=(1, 0, 0), eps=0.0)
    a = buf.add("a", 0)
    assert buf.priorities[a] == 1.0 and buf.tree.leaves[a] == 1.0
    set_priorities(buf, [a], [9.0])
    b = buf.add("b", 0)
    assert buf.priorities[b] == 9.0 and buf.tree.leaves[b] == 3.0  # 9^0.5
    set_priorities(buf, [a, b], [0.25, 0.25])  # the running max never decreases
    assert buf.add("c", 0) is not None and buf.priorities.max() == 9.0 and buf.max_priority == 9.0
    s = buf.stats()
    assert (s["priority_min"], s["priority_max"], s["priority_mean"]) == (0.25, 9.0, (0.25 + 0.25 + 9) / 3)


def test_priority_formula_and_update_changes_sampling():
    np.testing.assert_allclose(
        trajectory_priority([0.5, 2.0], [1.0, 0.0], [3.0, 1.0], (2.0, 0.5, 0.1), eps=0.01),
        [2 * 0.5 + 0.5 * 1 + 0.1 * 3 + 0.01, 2 * 2 + 0 + 0.1 * 1 + 0.01],
    )
    with pytest.raises(ValueError):
        trajectory_priority([-1.0], [1.0], [1.0])
    with pytest.raises(ValueError):
        trajectory_priority([math.nan], [1.0], [1.0])
    buf = PrioritizedReplay[int](2, alpha=1.0, priority_weights=(2.0, 0.5, 0.1), eps=0.01, seed=6)
    slots = [buf.add(i, 0) for i in range(2)]
    counts, _ = draw_counts(buf, 20_000)
    assert_frequencies(counts, np.array([0.5, 0.5]))
    s = buf.sample(2)
    assert buf.update_priorities(s.indices, s.generations, [4.0, 0.0], [0.0, 0.0], [0.0, 0.0]) == 2
    p = {int(i): v for i, v in zip(s.indices, [8.01, 0.01], strict=True)}  # 2*4 + eps, eps
    assert buf.priorities[slots].tolist() == [p[0], p[1]]
    counts, _ = draw_counts(buf, 20_000)
    assert_frequencies(counts, np.array([p[0], p[1]]) / (p[0] + p[1]))


def test_updates_for_reused_slots_are_ignored():
    buf = PrioritizedReplay[str](2, alpha=1.0, priority_weights=(1, 0, 0), eps=0.0, seed=7)
    buf.add("a", 0)
    buf.add("b", 0)
    s = buf.sample(2)
    assert sorted(s.items) == ["a", "b"]
    buf.add("c", 0)  # evicts "a": its slot now holds "c" at the running max (1.0)
    slot_a = s.indices[s.items.index("a")]
    slot_b = s.indices[s.items.index("b")]
    assert buf.update_priorities(s.indices, s.generations, [5.0, 5.0], 0.0, 0.0) == 1
    assert buf.priorities[slot_a] == 1.0 and buf.priorities[slot_b] == 5.0
    assert buf.stats()["stale_updates"] == 1
    assert buf.max_priority == 5.0


# ---- eviction and staleness -----------------------------------------------------------------------------
def test_fifo_eviction_order_and_counts():
    buf = PrioritizedReplay[int](3)
    for i in range(8):
        buf.add(i, 0)
        assert buf.items() == list(range(max(0, i - 2), i + 1))
    s = buf.stats()
    assert len(buf) == 3 and (s["added"], s["evicted_fifo"], s["size"]) == (8, 5, 3)


def make_episode(versions) -> Episode:
    n = len(versions)
    steps = {"policy_version": np.asarray(versions, np.int32), "reward": np.zeros(n, np.float32)}
    return Episode("task", False, False, {}, steps)


def test_max_policy_lag_drops_exactly_the_stale():
    buf = PrioritizedReplay[Episode](16, max_policy_lag=3, seed=8)
    episodes = [make_episode([v, v + 1]) for v in range(10)] + [make_episode([5, 7])]
    for ep in episodes:
        buf.add(ep, oldest_version(ep))
    s = buf.sample(64, policy_version=9)  # cutoff 6: oldest versions 0..5 (and [5, 7]) are stale
    assert len(buf) == 4 and buf.stats()["dropped_stale"] == 7
    assert {oldest_version(ep) for ep in s.items} == {6, 7, 8, 9}
    assert buf.add(make_episode([5, 9]), 5) is None  # already stale on arrival: dropped, not stored
    assert buf.add(make_episode([6]), 6) is not None
    assert buf.stats()["dropped_stale"] == 8 and len(buf) == 5
    assert buf.drop_stale(9) == 0  # nothing new is stale at the same version
    # freed slots are refilled before anything is evicted; then the oldest live item goes first
    for _ in range(11):
        buf.add(make_episode([9]), 9)
    assert buf.stats()["evicted_fifo"] == 0 and len(buf) == 16
    buf.add(make_episode([9]), 9)
    assert buf.stats()["evicted_fifo"] == 1 and oldest_version(buf.items()[0]) == 7

    off = PrioritizedReplay[Episode](4, max_policy_lag=0)
    off.add(make_episode([0]), 0)
    off.sample(1, policy_version=1000)
    assert len(off) == 1 and off.stats()["dropped_stale"] == 0


def test_insertion_order_stays_bounded_with_drops_behind_a_live_item():
    buf = PrioritizedReplay[int](4, max_policy_lag=1)
    buf.add(-1, 1000)  # stays live and oldest: dead entries pile up behind it
    for v in range(100):
        buf.add(v, v)
        assert buf.drop_stale(v + 2) == 1
        assert len(buf._order) <= 2 * buf.capacity + 1
    assert buf.items() == [-1] and buf.stats()["dropped_stale"] == 100


def test_uniform_switch_samples_uniformly_with_unit_weights():
    p = np.random.default_rng(9).uniform(0.01, 10.0, size=20)
    buf = exact_buffer(p, alpha=1.0, uniform=True, seed=10)
    counts, samples = draw_counts(buf, 200_000)
    assert_frequencies(counts, np.full(20, 1 / 20))
    assert all(np.all(s.weights == 1.0) for s in samples)
    assert buf.priorities.tolist() == p.tolist()  # priorities are still kept


def test_sample_rejects_empty_and_update_rejects_bad_terms():
    buf = PrioritizedReplay[int](4, max_policy_lag=1)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    buf.add(0, 0)
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities([0], buf.generations[[0]], [math.inf], [0.0], [0.0])
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1, policy_version=5)


# ---- property: the tree mirrors the stored priorities --------------------------------------------------------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 6)),
        st.tuples(st.just("update"), st.integers(0, 7), st.floats(0.0, 100.0)),
        st.tuples(st.just("sample"), st.integers(0, 8)),
    ),
    max_size=60,
)


@PROPS
@given(ops=OPS, alpha=st.sampled_from([0.0, 0.6, 1.0]), lag=st.sampled_from([0, 2]))
def test_tree_total_is_sum_of_priorities_alpha(ops, alpha, lag):
    buf = PrioritizedReplay[int](5, alpha=alpha, max_policy_lag=lag, priority_weights=(1, 0, 0), eps=1e-3)
    for step, op in enumerate(ops):
        if op[0] == "add":
            buf.add(step, op[1])
        elif op[0] == "update" and buf.live[op[1] % 5]:
            set_priorities(buf, [op[1] % 5], [op[2]])
        elif op[0] == "sample" and len(buf):
            try:
                buf.sample(4, policy_version=op[1])
            except ValueError:  # everything was stale
                assert len(buf) == 0
        live = buf.live
        expected = np.where(live, buf.priorities, 0.0) ** alpha * live
        np.testing.assert_array_equal(buf.tree.leaves, expected)
        assert buf.tree.total == pytest.approx(math.fsum(expected), rel=1e-12, abs=0)
        assert len(buf) == int(live.sum()) == len(buf.items())
        assert buf.max_priority >= max(buf.priorities.max(), 1.0)
