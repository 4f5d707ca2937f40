"""learner.losses.a2c (and the shared helpers) against slow loop references (and rlax where the definitions coincide)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.losses import LossParams as LossConfig
from learner.losses import a2c, shared
from tests.loss_batch import loss_batch

B, T = 6, 7
PROPS = settings(derandomize=True, max_examples=40, deadline=None)

_returns = jax.jit(shared.discounted_returns)
_loss = jax.jit(lambda *a: a2c.actor_critic_loss(*a)[:2])  # (loss, metrics)


# ---- references ---------------------------------------------------------------------------------------
def returns_ref(rewards, values, length, terminal, gamma):
    out = np.zeros((B, T))
    for b in range(B):
        n = int(length[b])
        g = 0.0 if terminal[b] else float(values[b, n])
        for t in reversed(range(n)):
            g = float(rewards[b, t]) + gamma * g
            out[b, t] = g
    return out


def loss_ref(logp, behavior_logp, entropy, values, rewards, length, terminal, cfg):
    """Everything the loss reports, plus the expected gradients, with one explicit loop over steps."""
    returns = returns_ref(rewards, values, length, terminal, cfg.gamma)
    count = max(sum(int(n) for n in length), 1)
    policy = value = ent = adv_sum = rho_sum = 0.0
    d_logp, d_entropy, d_values = np.zeros((B, T)), np.zeros((B, T)), np.zeros((B, T + 1))
    for b in range(B):
        for t in range(int(length[b])):
            adv = returns[b, t] - values[b, t]
            rho = min(cfg.rho_clip, math.exp(logp[b, t] - behavior_logp[b, t]))
            policy += -rho * adv * logp[b, t]
            value += 0.5 * adv**2
            ent += entropy[b, t]
            adv_sum += adv
            rho_sum += rho
            d_logp[b, t] = -rho * adv / count  # rho and the advantage are constants
            d_entropy[b, t] = -cfg.entropy_coef / count
            d_values[b, t] = -cfg.value_coef * adv / count  # the return target is a constant
    policy, value, ent = policy / count, value / count, ent / count
    metrics = {
        "loss": policy + cfg.value_coef * value - cfg.entropy_coef * ent,
        "policy_loss": policy,
        "value_loss": value,
        "entropy": ent,
        "advantage_mean": adv_sum / count,
        "rho_mean": rho_sum / count,
    }
    return metrics, {"logp": d_logp, "entropy": d_entropy, "values": d_values}


def random_batch(seed: int, length=None, terminal=None):
    rng = np.random.default_rng(seed)
    length = rng.integers(1, T + 1, B) if length is None else np.asarray(length)
    terminal = rng.random(B) < 0.5 if terminal is None else np.asarray(terminal)
    rewards = rng.standard_normal((B, T)).astype(np.float32)
    values = rng.standard_normal((B, T + 1)).astype(np.float32)
    # garbage after the episode ends must not matter (the bootstrap column values[b, length] excepted)
    for b in range(B):
        rewards[b, length[b] :] = 1e6
        values[b, length[b] + 1 :] = -1e6
    behavior = -rng.random((B, T)).astype(np.float32) * 3
    logp = (behavior + rng.uniform(-1.0, 1.0, (B, T))).astype(np.float32)  # ratios on both sides of 1
    logp = np.minimum(logp, 0.0).astype(np.float32)
    entropy = rng.random((B, T)).astype(np.float32) * 2
    return {
        "logp": logp,
        "behavior_logp": behavior,
        "entropy": entropy,
        "values": values,
        "rewards": rewards,
        "length": length.astype(np.int32),
        "terminal": terminal.astype(bool),
    }


def call_loss(batch, cfg):
    typed = loss_batch(batch["behavior_logp"], batch["rewards"], batch["length"], batch["terminal"])
    return _loss(batch["logp"], batch["entropy"], batch["values"], typed, cfg)


# ---- step_mask and discounted returns -----------------------------------------------------------------
def test_step_mask():
    length = np.array([0, 1, 3, T, 2, 5])
    got = np.asarray(shared.step_mask(jnp.asarray(length), T))
    assert got.dtype == bool and got.shape == (B, T)
    for b in range(B):
        for t in range(T):
            assert got[b, t] == (t < length[b])


@PROPS
@given(
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
    terminal=st.lists(st.booleans(), min_size=B, max_size=B),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]),
    seed=st.integers(0, 2**31),
)
def test_discounted_returns_match_loops(lengths, terminal, gamma, seed):
    batch = random_batch(seed, lengths, terminal)
    args = (batch["rewards"], batch["values"], batch["length"], batch["terminal"])
    got = np.asarray(_returns(*args, gamma))
    want = returns_ref(*args, gamma)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for b in range(B):
        assert (got[b, lengths[b] :] == 0).all()  # padded steps are exactly 0


def test_terminal_and_truncated_differ_only_by_the_bootstrap():
    batch = random_batch(3, [T] * B, [True] * B)
    r, v, n = batch["rewards"], batch["values"], batch["length"]
    term = np.asarray(_returns(r, v, n, np.ones(B, bool), 0.9))
    trunc = np.asarray(_returns(r, v, n, np.zeros(B, bool), 0.9))
    powers = 0.9 ** np.arange(T, 0, -1)  # gamma^(L - t)
    np.testing.assert_allclose(trunc - term, v[:, T : T + 1] * powers[None], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(term[:, T - 1], r[:, T - 1], rtol=1e-6)


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "truncated"])
def test_discounted_returns_match_rlax_on_full_episodes(terminal):
    """Full-length episodes: G = rlax returns with discount gamma, 0 at a terminal end, v_t = V(s_{t+1})."""
    gamma = 0.93
    batch = random_batch(4, [T] * B, [terminal] * B)
    r, v = batch["rewards"], batch["values"]
    discount = np.full((B, T), gamma, np.float32)
    if terminal:
        discount[:, -1] = 0.0
    ours = np.asarray(_returns(r, v, batch["length"], batch["terminal"], gamma))
    by_rlax = np.asarray(jax.vmap(rlax.discounted_returns)(r, discount, v[:, 1:]))
    by_lambda = np.asarray(jax.vmap(lambda a, d, w: rlax.lambda_returns(a, d, w, 1.0))(r, discount, v[:, 1:]))
    np.testing.assert_allclose(ours, by_rlax, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, by_lambda, rtol=1e-5, atol=1e-5)


# ---- the loss -----------------------------------------------------------------------------------------
CONFIGS = [
    LossConfig(),
    LossConfig(gamma=0.8, value_coef=0.7, entropy_coef=0.05, rho_clip=1.0),
    LossConfig(gamma=1.0, value_coef=1.3, entropy_coef=0.0, rho_clip=1.7),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "custom", "wide-clip"])
@pytest.mark.parametrize("seed", [0, 1])
def test_actor_critic_loss_matches_loops(cfg, seed):
    batch = random_batch(seed)
    total, metrics = call_loss(batch, cfg)
    want, _ = loss_ref(**batch, cfg=cfg)
    assert set(metrics) >= set(want)
    assert float(total) == pytest.approx(want["loss"], rel=1e-5, abs=1e-5)
    for name, value in want.items():
        assert float(metrics[name]) == pytest.approx(value, rel=1e-5, abs=1e-5), name
    ratio = np.exp(batch["logp"] - batch["behavior_logp"])
    valid = np.asarray(shared.step_mask(jnp.asarray(batch["length"]), T))
    assert (ratio[valid] > cfg.rho_clip).any() and (
        ratio[valid] < cfg.rho_clip
    ).any()  # clipping is exercised


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_gradients_flow_only_where_expected(seed):
    cfg = CONFIGS[1]
    batch = random_batch(seed)
    names = ("logp", "behavior_logp", "entropy", "values")

    def total(*xs, which="loss"):
        b = {**batch, **dict(zip(names, xs, strict=True))}
        return call_loss(b, cfg)[1][which]

    argnums = tuple(range(len(names)))
    xs = tuple(batch[k] for k in names)
    grads = dict(zip(names, jax.device_get(jax.grad(total, argnums)(*xs)), strict=True))
    _, want = loss_ref(**batch, cfg=cfg)
    np.testing.assert_allclose(grads["logp"], want["logp"], rtol=1e-4, atol=1e-6)  # 0 on padded steps
    np.testing.assert_allclose(grads["entropy"], want["entropy"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["values"], want["values"], rtol=1e-4, atol=1e-6)  # none into targets
    np.testing.assert_array_equal(grads["behavior_logp"], 0.0)  # truncated ratios are constants
    for b in range(B):
        n = batch["length"][b]
        assert (grads["logp"][b, n:] == 0).all() and (grads["entropy"][b, n:] == 0).all()
        assert (grads["values"][b, n:] == 0).all()  # the bootstrap value is a target, not a prediction
    # the advantage is a constant: the policy loss does not train the critic
    g_policy = jax.device_get(jax.grad(lambda *a: total(*a, which="policy_loss"), argnums)(*xs))
    np.testing.assert_array_equal(g_policy[3], 0.0)
    assert np.abs(g_policy[0]).sum() > 0


def test_loss_of_an_empty_batch_is_zero_not_nan():
    batch = random_batch(5, [0] * B, [True] * B)
    total, metrics = call_loss(batch, LossConfig())
    assert float(total) == 0.0
    assert all(np.isfinite(float(v)) and float(v) == 0.0 for v in metrics.values())


def test_imitation_loss_against_loops():
    """Behavior cloning (-mean log pi over real steps) plus the critic on discounted returns."""

    rng = np.random.default_rng(11)
    b, t, gamma = 5, 6, 0.9
    logp = -rng.random((b, t)).astype(np.float32)
    values = rng.standard_normal((b, t + 1)).astype(np.float32)
    rewards = rng.random((b, t)).astype(np.float32)
    length = rng.integers(1, t + 1, size=b).astype(np.int32)
    terminal = rng.random(b) < 0.5
    clean = loss_batch(np.zeros((b, t), np.float32), rewards, length, terminal)  # a noiseless demonstrator
    total, parts, _ = a2c.imitation_loss(
        jnp.asarray(logp), jnp.asarray(values), clean, LossConfig(gamma=gamma, value_coef=0.25)
    )
    bc_sum = value_sum = count = 0.0
    for i in range(b):
        g = 0.0 if terminal[i] else float(values[i, length[i]])
        for s in reversed(range(length[i])):
            g = float(rewards[i, s]) + gamma * g
            bc_sum -= float(logp[i, s])
            value_sum += 0.5 * (g - float(values[i, s])) ** 2
            count += 1
    np.testing.assert_allclose(float(parts["bc_loss"]), bc_sum / count, rtol=1e-5)
    np.testing.assert_allclose(float(parts["value_loss"]), value_sum / count, rtol=1e-5)
    np.testing.assert_allclose(float(total), bc_sum / count + 0.25 * value_sum / count, rtol=1e-5)


def test_imitation_is_weighted_by_the_demonstrator_probability():
    """With behavior log-probs, each step's -log pi counts in proportion to exp(behavior_logp) (loops)."""

    rng = np.random.default_rng(12)
    b, t = 4, 5
    logp = -rng.random((b, t)).astype(np.float32)
    values = rng.standard_normal((b, t + 1)).astype(np.float32)
    rewards = rng.random((b, t)).astype(np.float32)
    length = np.array([5, 3, 1, 0], np.int32)
    terminal = np.array([True, False, True, True])
    # Oracle steps (probability 0.7) and noise steps (0.3 / 50), as a noisy demonstrator records them.
    behavior_logp = np.where(rng.random((b, t)) < 0.7, np.log(0.7), np.log(0.3 / 50)).astype(np.float32)
    logp, values = jnp.asarray(logp), jnp.asarray(values)
    noisy = loss_batch(behavior_logp, rewards, length, terminal)
    _, weighted, _ = a2c.imitation_loss(logp, values, noisy, LossConfig())
    num = den = 0.0
    for i in range(b):
        for s in range(length[i]):
            w = float(np.exp(behavior_logp[i, s]))
            num -= w * float(logp[i, s])
            den += w
    np.testing.assert_allclose(float(weighted["bc_loss"]), num / den, rtol=1e-5)
    plain = -sum(float(logp[i, s]) for i in range(b) for s in range(length[i])) / sum(length)
    _, clean, _ = a2c.imitation_loss(
        logp, values, loss_batch(np.zeros((b, t), np.float32), rewards, length, terminal), LossConfig()
    )
    np.testing.assert_allclose(
        float(clean["bc_loss"]), plain, rtol=1e-5
    )  # a noiseless demonstrator: the plain mean
    assert abs(float(weighted["bc_loss"]) - plain) > 1e-3
