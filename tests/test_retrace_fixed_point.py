"""The A-RIDE critic estimates V of the learner's policy pi from data of another policy mu.

A tiny MDP where everything is known: a chain of states, `left` / `right` actions, terminal ends with
random rewards at both sides, random step rewards, and a step limit that truncates episodes (which then
bootstrap from V(s_L)). Episodes are drawn from mu; a tabular critic is fitted by iterating
V(s) <- mean of the Retrace targets at its visits (learner/losses/aride.py:retrace_targets, the function the
loss regresses V onto). Its fixed point must be V^pi, solved exactly from the Bellman equations, whatever
lambda; the targets without correction (rho = c = 1) must land on V^mu instead, which shows the test
can tell the two apart. The same holds for the warm-up's critic on demonstrations
(learner/losses/aride.py:imitation_loss): its value gradient regresses V onto these targets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.batch import Batch
from learner.losses import LOSSES, LossParams
from learner.losses.aride import imitation_loss, retrace_targets

N, T, GAMMA = 5, 6, 0.9
EPISODES = 4000
TOLERANCE = 0.03
"""Max |V - V^pi| over states. Observed with 4,000 episodes, MDP seeds 0-4, lambda 1 and 0.5: 0.002-0.019
(the sampling error of the data), while |V^pi - V^mu| is 0.06-0.7."""


def _mdp(seed: int):
    rng = np.random.default_rng(seed)
    pi_right = rng.uniform(0.2, 0.8, N)
    return {
        "pi_right": pi_right,
        "mu_right": np.clip(1.0 - pi_right + rng.uniform(-0.1, 0.1, N), 0.2, 0.8),  # mu leans the other way
        "step_reward": rng.uniform(-0.2, 0.2, (N, 2)),  # r(s, a) for a move inside the chain
        "end_reward": rng.uniform(-1.0, 1.0, 2),  # falling off the left end, the right end
    }


def _exact_values(mdp: dict, right: np.ndarray) -> np.ndarray:
    """V = r + gamma P V on the transient states (the ends are terminal: 0 after them)."""
    p_matrix, r = np.zeros((N, N)), np.zeros(N)
    for s in range(N):
        for a, prob in ((0, 1.0 - right[s]), (1, right[s])):
            nxt = s - 1 if a == 0 else s + 1
            if 0 <= nxt < N:
                r[s] += prob * mdp["step_reward"][s, a]
                p_matrix[s, nxt] += prob
            else:
                r[s] += prob * mdp["end_reward"][a]
    return np.linalg.solve(np.eye(N) - GAMMA * p_matrix, r)


def _episodes(mdp: dict, seed: int):
    """EPISODES episodes of mu from uniform start states: states [B, T + 1], rho [B, T], rewards, lengths."""
    rng = np.random.default_rng(seed)
    states = np.zeros((EPISODES, T + 1), np.int32)
    rho = np.zeros((EPISODES, T), np.float32)
    rewards = np.zeros((EPISODES, T), np.float32)
    length, terminal = np.zeros(EPISODES, np.int32), np.zeros(EPISODES, bool)
    for b in range(EPISODES):
        s = int(rng.integers(N))
        states[b, 0] = s
        for t in range(T):
            a = int(rng.random() < mdp["mu_right"][s])
            pi_a = mdp["pi_right"][s] if a else 1.0 - mdp["pi_right"][s]
            mu_a = mdp["mu_right"][s] if a else 1.0 - mdp["mu_right"][s]
            rho[b, t] = pi_a / mu_a
            nxt = s - 1 if a == 0 else s + 1
            length[b] = t + 1
            if not 0 <= nxt < N:
                rewards[b, t], terminal[b] = mdp["end_reward"][a], True
                break
            rewards[b, t] = mdp["step_reward"][s, a]
            s = nxt
            states[b, t + 1] = s
    return states, rho, rewards, length, terminal


def _fitted_critic(data, lambda_: float, rho_clip: float, c_clip: float, iterations: int = 80):
    states, rho, rewards, length, terminal = data
    real = np.arange(T)[None, :] < length[:, None]
    visits = np.stack([(states[:, :T] == s) & real for s in range(N)])  # [N, B, T]
    targets_of = jax.jit(
        lambda v: retrace_targets(
            jnp.asarray(rho), v[states], rewards, length, terminal, GAMMA, lambda_, rho_clip, c_clip
        )[0]
    )
    v = jnp.zeros(N)
    for _ in range(iterations):
        targets = np.asarray(targets_of(v))
        v = jnp.asarray([targets[visits[s]].mean() for s in range(N)])
    return np.asarray(v)


@pytest.mark.parametrize("seed", [0, 2])  # MDPs where V^pi and V^mu differ by more than 0.2
@pytest.mark.parametrize("lambda_", [1.0, 0.5])
def test_the_retrace_critic_converges_to_v_pi(seed, lambda_):
    mdp = _mdp(seed)
    data = _episodes(mdp, seed + 100)
    assert data[4].any() and not data[4].all(), "both terminal and truncated episodes"
    v_pi, v_mu = _exact_values(mdp, mdp["pi_right"]), _exact_values(mdp, mdp["mu_right"])
    assert np.abs(v_pi - v_mu).max() > 5 * TOLERANCE, "pi and mu must be told apart"
    # Retrace: rho_bar unclipped (rho_clip large), traces cut at c = lambda * min(1, rho).
    v = _fitted_critic(data, lambda_, rho_clip=1e9, c_clip=1.0)
    assert np.abs(v - v_pi).max() < TOLERANCE, (v, v_pi)
    # Without the correction the same fit estimates the behaviour policy's values.
    uncorrected = _fitted_critic((data[0], np.ones_like(data[1]), *data[2:]), lambda_, 1e9, 1e9)
    assert np.abs(uncorrected - v_mu).max() < TOLERANCE
    assert np.abs(uncorrected - v_pi).max() > 3 * TOLERANCE


def test_the_imitation_critic_regresses_onto_the_retrace_targets_for_pi():
    """A-RIDE's imitation_loss value gradient is value_coef * (V - v^Retrace) / count on real steps, with the
    ratios pi / mu of the demonstrations: a demonstrator's Monte-Carlo returns would give another one."""
    mdp = _mdp(3)
    _states, rho, rewards, length, terminal = (x[:64] for x in _episodes(mdp, 7))
    rng = np.random.default_rng(0)
    behavior_logp = np.log(rng.uniform(0.3, 0.9, (64, T))).astype(np.float32)
    logp = (behavior_logp + np.log(np.where(rho > 0, rho, 1.0))).astype(np.float32)  # so that pi / mu = rho
    values = rng.normal(size=(64, T + 1)).astype(np.float32)
    zeros = np.zeros((64, T), np.int32)
    batch = Batch(
        obs={}, choice={}, behavior_logp=behavior_logp,
        reward=rewards, policy_version=zeros, length=length, terminal=terminal,
        weights=np.ones(64, np.float32), keep=np.ones(64, bool),
    )  # fmt: skip
    cfg = LossParams(gamma=GAMMA, lambda_=1.0, rho_clip=1.0, c_clip=1.0, value_coef=0.5)
    grad = jax.grad(lambda v: imitation_loss(jnp.asarray(logp), v, batch, cfg).loss)(jnp.asarray(values))
    targets, _ = retrace_targets(jnp.asarray(rho), values, rewards, length, terminal, GAMMA, 1.0, 1.0, 1.0)
    real = np.arange(T)[None, :] < length[:, None]
    expected = np.where(real, cfg.value_coef * (values[:, :T] - np.asarray(targets)) / real.sum(), 0.0)
    np.testing.assert_allclose(np.asarray(grad)[:, :T], expected, atol=1e-6)
    assert np.all(np.asarray(grad)[:, T] == 0.0)
    mc_targets, _ = retrace_targets(
        jnp.ones_like(rho), values, rewards, length, terminal, GAMMA, 1.0, 1e9, 1e9
    )
    assert np.abs(np.asarray(mc_targets) - np.asarray(targets))[real].max() > 0.1


@pytest.mark.long
def test_the_learners_imitation_update_uses_that_critic():
    """The jitted imitation step of an A-RIDE learner is A-RIDE's imitation_loss (its ratios are
    reported), not the plain actor-critic's imitation loss on Monte-Carlo returns.

    Which loss the step computes, and so which metrics it returns, is fixed when the step is traced:
    jax.eval_shape traces the very step make_train_step jits and gives its metrics' keys without the
    compile (two compiles cost this test 30 s of the suite). Both imitation steps are compiled and run
    elsewhere: A-RIDE's by the learner's warm-up in tests/test_end_to_end.py's SimPhone run, the actor-
    critic's in tests/test_text_encoder_finetune.py's test_the_step_trains_the_encoder_at_its_own_rate."""
    from common.policies import PointerPolicy
    from learner.training.train_step import make_optimizer, make_train_step
    from tests.mesh_check import TINY, random_batch

    policy = PointerPolicy(TINY)
    graphdef, params = policy.create(0)
    optimizer = make_optimizer(1e-3, 1.0)
    batch = random_batch(TINY, 0)
    for name, has_ratios in (("aride", True), ("a2c", False)):
        step = make_train_step(graphdef, optimizer, LOSSES[name].imitation, LossParams(), policy.evaluate)
        metrics = jax.eval_shape(step, params, optimizer.init(params), batch)[2]
        assert ("rho_mean" in metrics) == has_ratios and "bc_loss" in metrics
