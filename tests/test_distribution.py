"""common.policies.pointer.distribution against brute-force enumeration of every complete action.

A complete action is a type plus the one argument that type uses (tap -> element, type -> word,
swipe -> direction, the other four types -> nothing). With E elements and W words there are
E + W + 4 + 4 complete actions per observation; a slow reference enumerates all of them in Python.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.policies.pointer import distribution
from common.policies.pointer import network as model
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS, ActionType

B, E, W = 8, 5, 6
HEAD_SIZE = {"type": NUM_ACTION_TYPES, "element": E, "word": W, "direction": NUM_SWIPE_DIRECTIONS}
ARG = {int(ActionType.TAP): "element", int(ActionType.TYPE): "word", int(ActionType.SWIPE): "direction"}
N_DRAWS = 20_000
SIGMAS = 5.0


def make_logits(seed: int) -> dict[str, np.ndarray]:
    """Random logits [B, ...] with masked element/word slots as the model produces them.

    Row 1 has no valid element, row 2 no valid word (the model then keeps slot 0), row 3 is sharp.
    """
    rng = np.random.default_rng(seed)
    scale = rng.choice([0.5, 2.0, 5.0], size=(B, 1))
    scale[3] = 12.0
    raw = {k: rng.standard_normal((B, n)) * scale for k, n in HEAD_SIZE.items()}
    elem_mask = rng.random((B, E)) < 0.6
    word_mask = rng.random((B, W)) < 0.6
    elem_mask[0], word_mask[0] = True, True
    elem_mask[1], word_mask[2] = False, False
    return {
        "type": raw["type"].astype(np.float32),
        "direction": raw["direction"].astype(np.float32),
        "element": np.asarray(model._mask_logits(raw["element"].astype(np.float32), elem_mask)),
        "word": np.asarray(model._mask_logits(raw["word"].astype(np.float32), word_mask)),
    }


# ---- slow reference ---------------------------------------------------------------------------------
def softmax_ref(row) -> list[float]:
    row = [float(x) for x in row]
    m = max(row)
    ex = [math.exp(x - m) for x in row]
    z = sum(ex)
    return [e / z for e in ex]


def complete_actions_ref(logits: dict[str, np.ndarray], b: int) -> list[tuple[int, str | None, int, float]]:
    """Every complete action of row b as (type, argument head or None, argument index, probability)."""
    p = {k: softmax_ref(logits[k][b]) for k in HEAD_SIZE}
    out = []
    for t in range(NUM_ACTION_TYPES):
        head = ARG.get(t)
        if head is None:
            out.append((t, None, 0, p["type"][t]))
        else:
            for i in range(HEAD_SIZE[head]):
                out.append((t, head, i, p["type"][t] * p[head][i]))
    return out


N_ACTIONS = E + W + NUM_SWIPE_DIRECTIONS + (NUM_ACTION_TYPES - 3)


def enumerate_choices(logits, filler_seed: int):
    """Choice arrays [B, N_ACTIONS] for all complete actions; arguments a type ignores are random."""
    rng = np.random.default_rng(filler_seed)
    choice = {k: np.zeros((B, N_ACTIONS), np.int32) for k in distribution.CHOICE_KEYS}
    probs = np.zeros((B, N_ACTIONS))
    for b in range(B):
        actions = complete_actions_ref(logits, b)
        assert len(actions) == N_ACTIONS
        for n, (t, head, i, p) in enumerate(actions):
            choice["action_type"][b, n] = t
            for h in ("element", "word", "direction"):
                choice[h][b, n] = i if h == head else rng.integers(HEAD_SIZE[h])
            probs[b, n] = p
    return choice, probs


def entropy_ref(logits, b: int) -> float:
    return -sum(p * math.log(p) for *_, p in complete_actions_ref(logits, b) if p > 0)


# ---- the code under test, compiled once per shape -----------------------------------------------------
@jax.jit
def _log_prob_all(logits, choice):
    wide = {k: jnp.broadcast_to(v[:, None], (B, N_ACTIONS, v.shape[-1])) for k, v in logits.items()}
    return distribution.log_prob(wide, choice)


_entropy = jax.jit(distribution.entropy)


@jax.jit
def _sample_many(key, logits):
    wide = {k: jnp.broadcast_to(v, (N_DRAWS, *v.shape)) for k, v in logits.items()}
    choice, logp = distribution.sample(key, wide)
    return choice, logp, distribution.log_prob(wide, choice)


SEEDS = [0, 1, 2]


@pytest.mark.parametrize("seed", SEEDS)
def test_log_prob_matches_enumeration(seed):
    logits = make_logits(seed)
    choice, probs = enumerate_choices(logits, filler_seed=seed)
    logp = np.asarray(_log_prob_all(logits, choice))
    assert logp.shape == (B, N_ACTIONS)
    # exp(log_prob) over all complete actions is a distribution
    np.testing.assert_allclose(np.exp(logp.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)  # the reference itself
    live = probs > 0
    np.testing.assert_allclose(logp[live], np.log(probs[live]), rtol=1e-5, atol=2e-5)
    assert (logp[~live] < -1e8).all()  # masked slots: impossible actions
    assert (~live).any(), "the masks must make some actions impossible"
    # the argument a type does not use does not matter
    other, _ = enumerate_choices(logits, filler_seed=seed + 100)
    assert any((other[h] != choice[h]).any() for h in ("element", "word", "direction"))
    np.testing.assert_array_equal(np.asarray(_log_prob_all(logits, other)), logp)


@pytest.mark.parametrize("seed", SEEDS)
def test_entropy_matches_enumeration(seed):
    logits = make_logits(seed)
    got = np.asarray(_entropy(logits))
    assert got.shape == (B,)
    want = np.array([entropy_ref(logits, b) for b in range(B)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the joint is never less uncertain than its type marginal
    type_only = np.array([-sum(p * math.log(p) for p in softmax_ref(logits["type"][b])) for b in range(B)])
    assert (got >= type_only - 1e-6).all()


def test_entropy_of_uniform_heads():
    """All logits equal: H = log 7 + (1/7) (log E + log W + log 4)."""
    logits = {k: np.zeros((B, n), np.float32) for k, n in HEAD_SIZE.items()}
    want = math.log(7) + (math.log(E) + math.log(W) + math.log(4)) / 7
    np.testing.assert_allclose(np.asarray(_entropy(logits)), want, rtol=1e-6)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_sample_frequencies_match_enumeration(seed):
    logits = make_logits(seed)
    choice, logp, logp_again = jax.device_get(_sample_many(jax.random.key(seed), logits))
    assert choice["action_type"].shape == (N_DRAWS, B) and logp.shape == (N_DRAWS, B)
    assert all(v.dtype == np.int32 for v in choice.values())
    # the returned log-prob is log_prob of the returned choice
    np.testing.assert_allclose(logp, logp_again, rtol=1e-6, atol=1e-6)
    for b in range(B):
        a = choice["action_type"][:, b]
        seen = np.zeros(N_DRAWS, bool)
        for t, head, i, p in complete_actions_ref(logits, b):
            hit = a == t if head is None else (a == t) & (choice[head][:, b] == i)
            seen |= hit
            count = int(hit.sum())
            if p == 0.0:
                assert count == 0, (b, t, head, i)
                continue
            sigma = math.sqrt(p * (1 - p) / N_DRAWS)
            assert abs(count / N_DRAWS - p) <= SIGMAS * sigma + 1e-9, (b, t, head, i, count / N_DRAWS, p)
            # and its log-prob is the enumerated one
            if count:
                np.testing.assert_allclose(logp[hit, b], math.log(p), rtol=1e-5, atol=2e-5)
        assert seen.all()  # every draw is one of the enumerated complete actions
        # masked slots are never drawn, whatever the type
        for head in ("element", "word"):
            valid = logits[head][b] > -1e8
            assert valid[choice[head][:, b]].all()


def test_sampling_is_deterministic_per_key():
    logits = make_logits(0)
    c1, l1, _ = jax.device_get(_sample_many(jax.random.key(7), logits))
    c2, l2, _ = jax.device_get(_sample_many(jax.random.key(7), logits))
    c3, _, _ = jax.device_get(_sample_many(jax.random.key(8), logits))
    for k in distribution.CHOICE_KEYS:
        np.testing.assert_array_equal(c1[k], c2[k])
    np.testing.assert_array_equal(l1, l2)
    assert (c1["action_type"] != c3["action_type"]).any()


def test_gradients_are_finite_and_zero_on_masked_slots():
    logits = make_logits(1)
    choice, probs = enumerate_choices(logits, filler_seed=1)

    def total(lg):
        return jnp.sum(_entropy(lg)) + jnp.sum(_log_prob_all(lg, choice) * (probs > 0))

    grads = jax.device_get(jax.grad(total)(logits))
    for k, g in grads.items():
        assert np.isfinite(g).all(), k
    for head in ("element", "word"):
        masked = logits[head] < -1e8
        assert masked.any()
        np.testing.assert_array_equal(grads[head][masked], 0.0)


def test_log_prob_gradient_only_reaches_the_used_heads():
    """d log pi(tap e) / d word logits = 0 and likewise for the other heads."""
    logits = make_logits(2)
    one = {k: v[:1] for k, v in logits.items()}
    grad = jax.jit(jax.grad(lambda lg, c: distribution.log_prob(lg, c).sum()))
    for t, used in [(0, "element"), (1, "direction"), (2, "word"), (5, None)]:
        choice = {k: np.ones((1,), np.int32) for k in distribution.CHOICE_KEYS}
        choice["action_type"] = np.full((1,), t, np.int32)
        g = jax.device_get(grad(one, choice))
        assert np.abs(g["type"]).sum() > 0
        for head in ("element", "word", "direction"):
            if head == used:
                assert np.abs(g[head]).sum() > 0, (t, head)
            else:
                np.testing.assert_array_equal(g[head], 0.0)


def test_mode_is_the_most_likely_complete_action_of_its_type_then_argument():
    from common.policies.pointer import distribution as dist

    rng = np.random.default_rng(3)
    logits = {
        "type": jnp.asarray(rng.standard_normal((5, 7)), jnp.float32),
        "element": jnp.asarray(rng.standard_normal((5, 6)), jnp.float32),
        "word": jnp.asarray(rng.standard_normal((5, 4)), jnp.float32),
        "direction": jnp.asarray(rng.standard_normal((5, 4)), jnp.float32),
    }
    choice, logp = dist.mode(logits)
    for head, key in (
        ("type", "action_type"),
        ("element", "element"),
        ("word", "word"),
        ("direction", "direction"),
    ):
        np.testing.assert_array_equal(np.asarray(choice[key]), np.argmax(np.asarray(logits[head]), -1))
    np.testing.assert_allclose(np.asarray(logp), np.asarray(dist.log_prob(logits, choice)), rtol=1e-6)
