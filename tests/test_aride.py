"""learner.aride against slow loop references, Monte-Carlo returns and rlax's V-trace."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.losses import LossParams, aride
from learner.losses.shared import discounted_returns
from tests.loss_batch import loss_batch

B, T = 6, 7
PROPS = settings(derandomize=True, max_examples=40, deadline=None)
GARBAGE = {"big": 1e6, "nan": np.nan}


@jax.jit
def _traces(logp, behavior_logp, values, rewards, length, terminal, gamma, lam, rho_clip, c_clip, pg_clip):
    """Ratios, targets, deltas and advantages, with every hyper-parameter traced (one compilation)."""
    rho = aride.importance_ratios(logp, behavior_logp, length)
    targets, delta = aride.retrace_targets(
        rho, values, rewards, length, terminal, gamma, lam, rho_clip, c_clip
    )
    adv = aride.pg_advantages(rho, targets, values, rewards, length, terminal, gamma, pg_clip)
    return rho, targets, delta, adv


_loss = jax.jit(aride.aride_loss)  # the params are a pytree: their numbers are traced


def flat(out):
    """A LossOutput as (loss, metrics with the priority terms named priority_<term>), as the references."""
    metrics = dict(out.metrics)
    metrics.update({f"priority_{k}": v for k, v in out.priority_terms._asdict().items()})
    return out.loss, metrics


GRAD_ARGS = ("logp", "behavior_logp", "entropy", "values")
BATCH_ARGS = (*GRAD_ARGS, "rewards", "length", "terminal")


@jax.jit
def _grads(logp, behavior_logp, entropy, values, rewards, length, terminal, cfg, weights, keep):
    """d metric / d (logp, behavior_logp, entropy, values) for the total, actor and critic losses."""

    def metric(logp, behavior_logp, entropy, values, which):
        batch = loss_batch(behavior_logp, rewards, length, terminal, weights, keep)
        return aride.aride_loss(logp, entropy, values, batch, cfg).metrics[which]

    xs = (logp, behavior_logp, entropy, values)
    argnums = tuple(range(len(xs)))
    return {
        w: jax.grad(partial(metric, which=w), argnums)(*xs) for w in ("loss", "policy_loss", "value_loss")
    }


# ---- data and references ------------------------------------------------------------------------------
def random_batch(seed: int, length=None, terminal=None, garbage: str = "big", spread: float = 1.5):
    """A padded batch whose storage past each end (and V(s_L) of terminal episodes) is garbage."""
    rng = np.random.default_rng(seed)
    length = rng.integers(1, T + 1, B) if length is None else np.asarray(length)
    terminal = rng.random(B) < 0.5 if terminal is None else np.asarray(terminal)
    rewards = rng.standard_normal((B, T)).astype(np.float32)
    values = rng.standard_normal((B, T + 1)).astype(np.float32)
    behavior = (-rng.random((B, T)) * 3).astype(np.float32)
    logp = np.minimum(behavior + rng.uniform(-spread, spread, (B, T)), 0.0).astype(np.float32)
    entropy = (rng.random((B, T)) * 2).astype(np.float32)
    g = GARBAGE[garbage]
    for b in range(B):
        n = int(length[b])
        for x in (rewards, behavior, logp, entropy):
            x[b, n:] = g
        values[b, n + (0 if terminal[b] else 1) :] = -g if garbage == "big" else g
    return {
        "logp": logp,
        "behavior_logp": behavior,
        "entropy": entropy,
        "values": values,
        "rewards": rewards,
        "length": length.astype(np.int32),
        "terminal": terminal.astype(bool),
    }


def traces_ref(logp, behavior_logp, values, rewards, length, terminal, gamma, lam, rho_clip, c_clip, pg_clip):
    """rho, Retrace targets, deltas and pg advantages with explicit Python loops over steps."""
    rho, v, delta, adv = (np.zeros((B, T)) for _ in range(4))
    for b in range(B):
        n = int(length[b])
        next_target = 0.0 if terminal[b] else float(values[b, n])  # v_L = V(s_L)
        for t in reversed(range(n)):
            r = math.exp(float(logp[b, t]) - float(behavior_logp[b, t]))
            done = bool(terminal[b]) and t == n - 1
            disc = 0.0 if done else gamma
            v_next = 0.0 if done else float(values[b, t + 1])  # never read V(s_L) of a terminal episode
            v_now = float(values[b, t])
            rho[b, t] = r
            delta[b, t] = min(rho_clip, r) * (float(rewards[b, t]) + disc * v_next - v_now)
            v[b, t] = v_now + delta[b, t] + disc * lam * min(c_clip, r) * (next_target - v_next)
            adv[b, t] = min(pg_clip, r) * (float(rewards[b, t]) + disc * next_target - v_now)
            next_target = v[b, t]
    return rho, v, delta, adv


def loss_ref(batch, cfg: LossParams, weights=None, keep=None):
    """Every metric, priority and expected gradient of aride_loss, with explicit loops."""
    w = np.ones(B) if weights is None else np.asarray(weights, float)
    kept = np.ones(B, bool) if keep is None else np.asarray(keep, bool)
    length, logp, entropy, values = batch["length"], batch["logp"], batch["entropy"], batch["values"]
    rho, v, delta, adv = traces_ref(
        logp,
        batch["behavior_logp"],
        values,
        batch["rewards"],
        length,
        batch["terminal"],
        cfg.gamma,
        cfg.lambda_,
        cfg.rho_clip,
        cfg.c_clip,
        cfg.pg_rho_clip,
    )
    count = max(int(sum(length)), 1)
    policy = value = ent = adv_sum = target_sum = rho_sum = clipped = trained = kl = 0.0
    grads = {"logp": np.zeros((B, T)), "entropy": np.zeros((B, T)), "values": np.zeros((B, T + 1))}
    prio = {k: np.zeros(B) for k in ("priority_delta", "priority_rho_clipped", "priority_entropy")}
    coefs = []
    for b in range(B):
        n = int(length[b])
        for t in range(n):
            a = adv[b, t]
            trains = kept[b] and (cfg.advantage_threshold is None or a > cfg.advantage_threshold)
            used = (1.0 if a > 0 else 0.0) if cfg.binarize_advantage else a
            if cfg.binarize_advantage and cfg.actor_weighting == "binary_ratio":
                used *= min(cfg.pg_rho_clip, rho[b, t])
            coef = w[b] * used if trains else 0.0
            coefs.append(coef)
            policy -= coef * logp[b, t]
            value += 0.5 * w[b] * (v[b, t] - values[b, t]) ** 2
            ent += entropy[b, t]
            adv_sum += a
            target_sum += v[b, t]
            rho_sum += rho[b, t]
            clipped += rho[b, t] > cfg.rho_clip
            trained += trains
            log_r = float(logp[b, t]) - float(batch["behavior_logp"][b, t])
            kl += math.exp(log_r) - 1.0 - log_r
            grads["logp"][b, t] = -coef / count
            grads["entropy"][b, t] = -cfg.entropy_coef / count
            grads["values"][b, t] = cfg.value_coef * w[b] * (values[b, t] - v[b, t]) / count
            prio["priority_delta"][b] += abs(delta[b, t]) / n
            prio["priority_rho_clipped"][b] += min(cfg.rho_clip, rho[b, t]) / n
            prio["priority_entropy"][b] += entropy[b, t] / n
    policy, value, ent = policy / count, value / count, ent / count
    metrics = {
        "loss": policy - cfg.entropy_coef * ent + cfg.value_coef * value,
        "policy_loss": policy,
        "value_loss": value,
        "entropy": ent,
        "advantage_mean": adv_sum / count,
        "target_mean": target_sum / count,
        "rho_mean": rho_sum / count,
        "rho_clipped_fraction": clipped / count,
        "actor_step_fraction": trained / count,
        "behavior_kl": kl / count,
        "kl_penalty": 0.0,
        "actor_weight_sum": sum(coefs) / count,
        "actor_ess": ess_fraction(coefs, count),
    }
    return metrics, prio, grads, adv


def ess_fraction(coefs, count):
    """Kish's effective sample size of the actor's per-step weights, as a share of the real steps."""
    squares = sum(c * c for c in coefs)
    return sum(abs(c) for c in coefs) ** 2 / squares / count if squares > 0 else 0.0


def call_loss(batch, cfg, weights=None, keep=None):
    typed = loss_batch(
        batch["behavior_logp"], batch["rewards"], batch["length"], batch["terminal"], weights, keep
    )
    return flat(_loss(batch["logp"], batch["entropy"], batch["values"], typed, cfg))


def loss_grads(batch, cfg, which="loss", weights=None, keep=None):
    """d metrics[which] / d (logp, behavior_logp, entropy, values), as a dict of numpy arrays."""
    weights = np.ones(B, np.float32) if weights is None else weights
    keep = np.ones(B, bool) if keep is None else keep
    out = jax.device_get(_grads(*(batch[k] for k in BATCH_ARGS), cfg, weights, keep)[which])
    return dict(zip(GRAD_ARGS, out, strict=True))


def real(length):
    return np.arange(T)[None, :] < np.asarray(length)[:, None]


# ---- ratios, targets, deltas, advantages ----------------------------------------------------------------
def test_importance_ratios_are_exact_on_real_steps_and_zero_on_padding():
    batch = random_batch(0)
    got = np.asarray(aride.importance_ratios(batch["logp"], batch["behavior_logp"], batch["length"]))
    mask = real(batch["length"])
    want = np.exp(batch["logp"].astype(np.float64) - batch["behavior_logp"])
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-6)
    assert (got[~mask] == 0).all()


@PROPS
@given(
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
    terminal=st.lists(st.booleans(), min_size=B, max_size=B),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    lam=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    rho_clip=st.sampled_from([0.5, 1.0, 2.0, 1e9]),
    c_clip=st.sampled_from([0.5, 1.0, 2.0]),
    pg_clip=st.sampled_from([0.5, 1.0, 3.0]),
    seed=st.integers(0, 2**31),
)
def test_retrace_targets_deltas_and_advantages_match_loops(
    lengths, terminal, gamma, lam, rho_clip, c_clip, pg_clip, seed
):
    batch = random_batch(seed, lengths, terminal)
    args = [batch[k] for k in ("logp", "behavior_logp", "values", "rewards", "length", "terminal")]
    hyper = (gamma, lam, rho_clip, c_clip, pg_clip)
    got = [np.asarray(x) for x in _traces(*args, *map(np.float32, hyper))]
    want = traces_ref(*args, *hyper)
    mask = real(lengths)
    for name, g, w in zip(("rho", "targets", "delta", "advantage"), got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
        assert (g[~mask] == 0).all(), f"{name} is not exactly 0 on padded steps"


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_on_policy_full_traces_are_monte_carlo_returns(gamma, seed):
    """lambda = 1, on-policy, clips far above 1: v_t = r_t + gamma v_{t+1} = discounted returns."""
    batch = random_batch(seed)
    logp, values, rewards = batch["logp"], batch["values"], batch["rewards"]
    length, terminal = batch["length"], batch["terminal"]
    _, targets, delta, adv = _traces(
        logp, logp, values, rewards, length, terminal, *map(np.float32, (gamma, 1.0, 1e6, 1e6, 1e6))
    )
    returns = np.asarray(jax.jit(discounted_returns)(rewards, values, length, terminal, gamma))
    mask = real(length)
    np.testing.assert_allclose(np.asarray(targets), returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(adv)[mask], (returns - values[:, :-1])[mask], rtol=1e-5, atol=1e-5)
    # with rho = 1 the deltas are the plain one-step TD errors r_t + gamma (1 - d_t) V(s_{t+1}) - V(s_t)
    last = np.arange(T)[None, :] == length[:, None] - 1
    bootstrap = np.where(mask & ~(last & terminal[:, None]), gamma * values[:, 1:], 0.0)
    td = np.where(mask, rewards + bootstrap - values[:, :-1], 0.0)
    np.testing.assert_allclose(np.asarray(delta), td, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [1.0, 0.7])
@pytest.mark.parametrize("terminal", [False, True], ids=["truncated", "terminal"])
def test_matches_rlax_vtrace_on_full_length_episodes(terminal, lam):
    """rlax is time-major over one sequence: v_tm1 = V(s_t), v_t = V(s_{t+1}), r_t = r_t, rho_tm1 = rho_t,
    discount_t = gamma (1 - d_t) (0 on the last step of a terminal episode), and it cuts traces at
    min(1, rho), so c_clip = 1. It bootstraps from v_t[-1] = V(s_T) after the last step, which is our
    truncated end when length = T. We vmap it over the batch. errors = targets - V(s_t) for any lambda;
    rlax's pg advantage bootstraps from lambda v_{t+1} + (1 - lambda) V(s_{t+1}) (ours from v_{t+1}), so
    the advantages agree for lambda = 1 and differ by min(pg_clip, rho) gamma (1-lambda) (v_{t+1} - V(s_{t+1}))
    otherwise."""
    gamma, rho_clip, pg_clip = 0.93, 1.5, 1.2
    batch = random_batch(7, [T] * B, [terminal] * B, spread=1.0)
    logp, behavior, values, rewards = batch["logp"], batch["behavior_logp"], batch["values"], batch["rewards"]
    length, term = batch["length"], batch["terminal"]
    if terminal:
        values[:, T] = 0.0  # rlax multiplies it by a zero discount; ours never reads it
    rho, targets, _, adv = (
        np.asarray(x)
        for x in _traces(
            logp,
            behavior,
            values,
            rewards,
            length,
            term,
            *map(np.float32, (gamma, lam, rho_clip, 1.0, pg_clip)),
        )
    )
    assert (rho > rho_clip).any() and (rho < 1.0).any()  # both clips are exercised
    discount = np.full((B, T), gamma, np.float32)
    if terminal:
        discount[:, -1] = 0.0

    def one(v_tm1, v_t, r_t, discount_t, rho_tm1):
        return rlax.vtrace_td_error_and_advantage(
            v_tm1,
            v_t,
            r_t,
            discount_t,
            rho_tm1,
            lam,
            clip_rho_threshold=rho_clip,
            clip_pg_rho_threshold=pg_clip,
        )

    out = jax.vmap(one)(values[:, :-1], values[:, 1:], rewards, discount, rho.astype(np.float32))
    errors, pg_adv = np.asarray(out.errors), np.asarray(out.pg_advantage)
    np.testing.assert_allclose(targets - values[:, :-1], errors, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, errors + values[:, :-1], rtol=1e-5, atol=1e-5)
    next_targets = np.concatenate([targets[:, 1:], values[:, T:]], axis=1)  # v_T = V(s_T)
    shift = np.minimum(pg_clip, rho) * discount * (1 - lam) * (next_targets - values[:, 1:])
    np.testing.assert_allclose(adv, pg_adv + shift, rtol=1e-5, atol=1e-5)
    if lam == 1.0:
        np.testing.assert_allclose(adv, pg_adv, rtol=1e-5, atol=1e-5)
    else:
        assert np.abs(shift).max() > 1e-3  # the difference is real, not a vacuous check


# ---- the loss -----------------------------------------------------------------------------------------
CONFIGS = {
    "default": LossParams(),
    "retrace": LossParams(
        gamma=0.9, lambda_=0.8, rho_clip=1e9, c_clip=1.0, pg_rho_clip=2.0, entropy_coef=0.05
    ),
    "filtered": LossParams(gamma=1.0, value_coef=1.3, advantage_threshold=0.2, c_clip=1.5),
    "binarized": LossParams(
        rho_clip=2.0,
        binarize_advantage=True,
        actor_weighting="binary",
        advantage_threshold=0.0,
        entropy_coef=0.0,
    ),
    "binary_ratio": LossParams(
        pg_rho_clip=1.5, binarize_advantage=True, actor_weighting="binary_ratio", advantage_threshold=0.1
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_aride_loss_metrics_priorities_and_gradients_match_loops(name, weighted):
    cfg = CONFIGS[name]
    batch = random_batch(1)
    rng = np.random.default_rng(2)
    weights = rng.uniform(0.2, 1.0, B).astype(np.float32) if weighted else None
    keep = np.array([True, False, True, True, False, True]) if weighted else None
    total, metrics = call_loss(batch, cfg, weights, keep)
    want, prio, grads, _ = loss_ref(batch, cfg, weights, keep)
    assert float(total) == pytest.approx(want["loss"], rel=1e-5, abs=1e-5)
    for key, value in want.items():
        assert float(metrics[key]) == pytest.approx(value, rel=1e-4, abs=1e-5), key
    for key, value in prio.items():
        assert metrics[key].shape == (B,)
        np.testing.assert_allclose(np.asarray(metrics[key]), value, rtol=1e-4, atol=1e-5, err_msg=key)
    got = loss_grads(batch, cfg, weights=weights, keep=keep)
    np.testing.assert_allclose(got["logp"], grads["logp"], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(got["entropy"], grads["entropy"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["values"], grads["values"], rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(got["behavior_logp"], 0.0)  # ratios are constants


def test_gradients_stop_at_targets_advantages_and_padding():
    cfg = CONFIGS["retrace"]
    batch = random_batch(3)
    mask = real(batch["length"])
    actor = loss_grads(batch, cfg, "policy_loss")
    critic = loss_grads(batch, cfg, "value_loss")
    total = loss_grads(batch, cfg, "loss")
    np.testing.assert_array_equal(actor["values"], 0.0)  # the advantage is a constant
    np.testing.assert_array_equal(critic["logp"], 0.0)  # the targets are constants
    assert np.abs(actor["logp"]).sum() > 0 and np.abs(critic["values"]).sum() > 0
    for name in ("logp", "entropy"):
        assert (total[name][~mask] == 0).all(), name
    for b in range(B):  # only V(s_t) of real steps is a prediction; V(s_L) and beyond only feed targets
        assert (total["values"][b, batch["length"][b] :] == 0).all()


def test_filtered_steps_and_dropped_trajectories_get_no_actor_gradient():
    cfg = LossParams(advantage_threshold=0.3)
    batch = random_batch(4)
    mask = real(batch["length"])
    _, _, _, adv = loss_ref(batch, cfg)
    g = loss_grads(batch, cfg, "policy_loss")["logp"]
    passes = mask & (adv > 0.3)
    assert passes.any() and (mask & ~passes).any()
    assert (g[~passes] == 0).all() and (g[passes] != 0).all()
    count = mask.sum()
    np.testing.assert_allclose(g[passes], -adv[passes] / count, rtol=1e-4)  # kept steps are not rescaled
    # the instruction-level filter drops whole trajectories from the actor, never from the critic
    keep = np.array([True, False, True, False, True, True])
    dropped = loss_grads(batch, cfg, keep=keep)
    full = loss_grads(batch, cfg)
    assert (dropped["logp"][~keep] == 0).all() and np.abs(full["logp"][~keep]).sum() > 0
    np.testing.assert_array_equal(dropped["logp"][keep], full["logp"][keep])
    np.testing.assert_array_equal(dropped["values"], full["values"])
    np.testing.assert_array_equal(dropped["entropy"], full["entropy"])


def test_binarized_advantage_is_an_indicator():
    batch = random_batch(5)
    mask = real(batch["length"])
    _, _, _, adv = loss_ref(batch, LossParams())
    binary = LossParams(binarize_advantage=True, actor_weighting="binary")
    g = loss_grads(batch, binary, "policy_loss")["logp"]
    want = np.where(mask & (adv > 0), -1.0 / mask.sum(), 0.0)
    assert (mask & (adv > 0)).any() and (mask & (adv <= 0)).any()
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=0)
    # filtering is decided on the raw advantage, before binarization
    g = loss_grads(batch, replace(binary, advantage_threshold=0.5), "policy_loss")["logp"]
    np.testing.assert_allclose(g, np.where(mask & (adv > 0.5), -1.0 / mask.sum(), 0.0), rtol=1e-6, atol=0)


def test_importance_weights_scale_each_trajectory_linearly():
    cfg = CONFIGS["retrace"]
    batch = random_batch(6)
    weights = np.array([0.5, 1.0, 0.0, 2.0, 0.25, 0.75], np.float32)
    _, m = call_loss(batch, cfg, weights)
    _, m1 = call_loss(batch, cfg, np.ones(B, np.float32))
    _, m_default = call_loss(batch, cfg)  # weights=None means all ones
    for key in m1:
        np.testing.assert_array_equal(np.asarray(m_default[key]), np.asarray(m1[key]), err_msg=key)
    parts = [call_loss(batch, cfg, np.eye(B, dtype=np.float32)[b])[1] for b in range(B)]
    for key in ("policy_loss", "value_loss"):
        mixed = sum(float(weights[b]) * float(parts[b][key]) for b in range(B))
        assert float(m[key]) == pytest.approx(mixed, rel=1e-5, abs=1e-6), key
    assert float(m["entropy"]) == pytest.approx(float(m1["entropy"]), rel=1e-6)  # the bonus is unweighted
    for key in (
        "priority_delta",
        "priority_rho_clipped",
        "priority_entropy",
    ):  # priorities do not depend on weights
        np.testing.assert_array_equal(np.asarray(m[key]), np.asarray(m1[key]))
    g = loss_grads(batch, cfg, weights=weights)
    g1 = loss_grads(batch, cfg)
    for name in ("logp", "values"):
        np.testing.assert_allclose(g[name][:, :T], weights[:, None] * g1[name][:, :T], rtol=1e-5, atol=1e-8)
    assert (g["logp"][2] == 0).all() and np.abs(g1["logp"][2]).sum() > 0


def test_nan_past_the_end_changes_nothing():
    """Padded steps (and V(s_L) of terminal episodes) may hold anything, NaN included."""
    cfg = CONFIGS["filtered"]
    clean = random_batch(8, garbage="big")
    dirty = random_batch(8, garbage="nan")
    _, m_clean = call_loss(clean, cfg)
    _, m_dirty = call_loss(dirty, cfg)
    for key in m_clean:
        np.testing.assert_allclose(np.asarray(m_dirty[key]), np.asarray(m_clean[key]), rtol=1e-6, err_msg=key)
    g_clean, g_dirty = loss_grads(clean, cfg), loss_grads(dirty, cfg)
    for name in GRAD_ARGS:
        assert np.isfinite(g_dirty[name]).all(), name
        np.testing.assert_allclose(g_dirty[name], g_clean[name], rtol=1e-6, err_msg=name)


def test_empty_batch_is_zero_not_nan():
    batch = random_batch(9, [0] * B, [True] * B)
    total, metrics = call_loss(batch, LossParams())
    assert float(total) == 0.0
    for key, value in metrics.items():
        assert (np.asarray(value) == 0).all(), key
    assert all(np.isfinite(g).all() for g in loss_grads(batch, LossParams()).values())


def test_instruction_keep_is_a_closed_interval():
    got = aride.instruction_keep(jnp.array([0.0, 0.1, 0.5, 0.9, 1.0]), 0.1, 0.9)
    np.testing.assert_array_equal(np.asarray(got), [False, True, True, True, False])


@pytest.mark.parametrize(
    "bad", [{"gamma": 1.5}, {"lambda_": -0.1}, {"rho_clip": 0.0}, {"advantage_threshold": math.inf}]
)
def test_config_rejects_nonsense(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LossParams(**bad)


def test_without_the_correction_every_ratio_is_one_as_if_on_policy():
    """off_policy_correction=False (the ablation) gives exactly the loss of the same batch with mu := pi,
    where every rho is 1; with the correction on, the stale batch's loss differs."""
    batch = random_batch(8, garbage="nan")
    on_policy = {**batch, "behavior_logp": np.where(real(batch["length"]), batch["logp"], np.nan)}
    _, ablated = call_loss(batch, LossParams(off_policy_correction=False))
    _, reference = call_loss(on_policy, LossParams())
    _, corrected = call_loss(batch, LossParams())
    for key in set(reference) - {"behavior_kl"}:  # behavior_kl describes the data, not the loss
        np.testing.assert_allclose(
            np.asarray(ablated[key]), np.asarray(reference[key]), rtol=1e-6, err_msg=key
        )
    assert float(reference["rho_mean"]) == pytest.approx(1.0)
    assert float(reference["behavior_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(ablated["behavior_kl"]) == pytest.approx(float(corrected["behavior_kl"]))
    assert float(corrected["behavior_kl"]) > 1e-3
    assert abs(float(corrected["value_loss"]) - float(reference["value_loss"])) > 1e-3
