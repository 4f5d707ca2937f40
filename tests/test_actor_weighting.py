"""A-RIDE's binarized actor weightings ("binary_ratio", "vmpo") against float64 loops, and their flags."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from learner.config import LossSettings, parse_args
from learner.losses import DEFAULTS, LossParams
from tests.test_aride import B, T, call_loss, loss_grads, loss_ref, random_batch, real, traces_ref

RATIO = LossParams(binarize_advantage=True, actor_weighting="binary_ratio", pg_rho_clip=1.5)
VMPO = LossParams(
    binarize_advantage=True, actor_weighting="vmpo", pg_rho_clip=1.5, vmpo_eta=0.7, vmpo_kl_coef=0.3
)
WEIGHTS = np.array([0.5, 1.0, 0.3, 0.9, 0.25, 0.75], np.float32)
KEEP = np.array([True, True, False, True, True, True])


def actor_ref(batch, cfg: LossParams, weights=None, keep=None):
    """(policy_loss, kl_penalty, d loss / d logp [B, T], steps that train the actor) with plain loops in
    float64, straight from the formulas of learner/losses/actor_weighting.py."""
    w = np.ones(B) if weights is None else np.asarray(weights, float)
    kept = np.ones(B, bool) if keep is None else np.asarray(keep, bool)
    length, logp, mu = batch["length"], batch["logp"].astype(float), batch["behavior_logp"].astype(float)
    hyper = (cfg.gamma, cfg.lambda_, cfg.rho_clip, cfg.c_clip, cfg.pg_rho_clip)
    args = [batch[k] for k in ("logp", "behavior_logp", "values", "rewards", "length", "terminal")]
    rho, _, _, adv = traces_ref(*args, *hyper)
    count = max(int(sum(length)), 1)
    eligible = [
        (b, t)
        for b in range(B)
        for t in range(int(length[b]))
        if kept[b] and (cfg.advantage_threshold is None or adv[b, t] > cfg.advantage_threshold)
    ]
    grad, coef = np.zeros((B, T)), {}
    if cfg.actor_weighting == "binary_ratio":
        for b, t in eligible:
            coef[b, t] = w[b] * min(cfg.pg_rho_clip, rho[b, t]) * (1.0 if adv[b, t] > 0 else 0.0) / count
    else:
        q_minus_v = {(b, t): adv[b, t] / min(cfg.pg_rho_clip, rho[b, t]) for b, t in eligible}
        ranked = sorted(eligible, key=lambda bt: (-q_minus_v[bt], bt[0] * T + bt[1]))
        top = ranked[: (len(eligible) + 1) // 2]
        u = {
            bt: w[bt[0]] * min(cfg.pg_rho_clip, rho[bt]) * math.exp(q_minus_v[bt] / cfg.vmpo_eta)
            for bt in top
        }
        total = sum(u.values())
        coef = {bt: u[bt] / total for bt in top}
    policy = -sum(c * logp[bt] for bt, c in coef.items())
    for bt, c in coef.items():
        grad[bt] -= c
    kl = 0.0
    if cfg.actor_weighting == "vmpo":
        for b in range(B):
            for t in range(int(length[b])):
                log_r = logp[b, t] - mu[b, t]
                kl += (math.exp(log_r) - 1.0 - log_r) / count
                grad[b, t] += cfg.vmpo_kl_coef * (math.exp(log_r) - 1.0) / count
    trains = np.zeros((B, T), bool)
    for b, t in coef if cfg.actor_weighting == "vmpo" else eligible:
        trains[b, t] = True
    return policy, cfg.vmpo_kl_coef * kl if cfg.actor_weighting == "vmpo" else 0.0, grad, trains


def mixed_batch(seed: int = 11):
    """Padding, terminal and truncated episodes, ratios on both sides of 1 and past the clip."""
    batch = random_batch(seed)
    length, terminal = batch["length"], batch["terminal"]
    mask = real(length)
    rho = np.exp(batch["logp"].astype(float) - batch["behavior_logp"])[mask]
    assert terminal.any() and (~terminal).any() and (length < T).any()
    assert (rho > 1.5).any() and (rho < 1.0).any()
    return batch


@pytest.mark.parametrize(
    "cfg", [RATIO, VMPO, replace(VMPO, advantage_threshold=-0.5)], ids=["ratio", "vmpo", "vmpo_thr"]
)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_loss_and_logp_gradient_match_float64_loops(cfg, weighted):
    batch = mixed_batch()
    weights, keep = (WEIGHTS, KEEP) if weighted else (None, None)
    policy, kl, grad, trains = actor_ref(batch, cfg, weights, keep)
    common, _, _, _ = loss_ref(
        batch, replace(cfg, binarize_advantage=False), weights, keep
    )  # critic, entropy
    total, metrics = call_loss(batch, cfg, weights, keep)
    want = policy + kl - cfg.entropy_coef * common["entropy"] + cfg.value_coef * common["value_loss"]
    assert float(metrics["policy_loss"]) == pytest.approx(policy, rel=1e-4, abs=1e-6)
    assert float(metrics["kl_penalty"]) == pytest.approx(kl, rel=1e-4, abs=1e-7)
    assert float(total) == pytest.approx(want, rel=1e-4, abs=1e-6)
    count = real(batch["length"]).sum()
    assert float(metrics["actor_step_fraction"]) == pytest.approx(trains.sum() / count)
    got = loss_grads(batch, cfg, weights=weights, keep=keep)
    np.testing.assert_allclose(got["logp"], grad, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(got["behavior_logp"], 0.0)  # mu is data
    assert (got["logp"][~real(batch["length"])] == 0).all()


def test_vmpo_weights_sum_to_one_on_the_better_half():
    batch = mixed_batch()
    cfg = replace(VMPO, vmpo_kl_coef=0.0)
    _, _, grad, trains = actor_ref(batch, cfg, WEIGHTS, KEEP)
    _, metrics = call_loss(batch, cfg, WEIGHTS, KEEP)
    eligible = real(batch["length"]) & KEEP[:, None]
    assert trains.sum() == (eligible.sum() + 1) // 2 and not (trains & ~eligible).any()
    g = loss_grads(batch, cfg, "policy_loss", WEIGHTS, KEEP)["logp"]
    assert (g[~trains] == 0).all() and (g[trains] < 0).all()
    assert float(metrics["actor_weight_sum"]) == pytest.approx(1.0, rel=1e-5)  # sum psi = 1
    psi = -grad[trains]
    ess = psi.sum() ** 2 / (psi**2).sum() / real(batch["length"]).sum()
    assert float(metrics["actor_ess"]) == pytest.approx(ess, rel=1e-4)
    # replay weights are self-normalised: scaling them all changes nothing
    _, scaled = call_loss(batch, cfg, WEIGHTS * 3.0, KEEP)
    assert float(scaled["policy_loss"]) == pytest.approx(float(metrics["policy_loss"]), rel=1e-5)


def test_vmpo_is_stable_at_a_tiny_temperature():
    """exp((q - V) / eta) overflows float32 without the max subtracted; with it, the best step takes it all."""
    batch = mixed_batch()
    cfg = replace(VMPO, vmpo_eta=1e-3, vmpo_kl_coef=0.0)
    _, _, _, trains = actor_ref(batch, replace(cfg, vmpo_eta=1.0))  # the kept half (eta 1e-3 overflows here)
    g = loss_grads(batch, cfg, "policy_loss")["logp"]
    assert np.isfinite(g).all()
    rho, _, _, adv = traces_ref(
        *[batch[k] for k in ("logp", "behavior_logp", "values", "rewards", "length", "terminal")],
        cfg.gamma, cfg.lambda_, cfg.rho_clip, cfg.c_clip, cfg.pg_rho_clip,
    )  # fmt: skip
    q_minus_v = np.where(real(batch["length"]), adv / np.minimum(1.5, rho), -np.inf)
    best = np.unravel_index(np.argmax(q_minus_v), q_minus_v.shape)
    assert trains[best] and g[best] == pytest.approx(-1.0, rel=1e-5)
    assert np.count_nonzero(g) == 1


def test_binary_ratio_is_binary_exactly_on_policy_and_not_off_policy():
    batch = mixed_batch()
    binary = replace(RATIO, actor_weighting="binary", pg_rho_clip=1.0)
    ratio = replace(RATIO, pg_rho_clip=1.0)
    on_policy = {**batch, "behavior_logp": np.where(real(batch["length"]), batch["logp"], np.nan)}
    for name, data in (("on-policy", on_policy), ("off-policy", batch)):
        _, m_binary = call_loss(data, binary, WEIGHTS)
        _, m_ratio = call_loss(data, ratio, WEIGHTS)
        g_binary = loss_grads(data, binary, weights=WEIGHTS)["logp"]
        g_ratio = loss_grads(data, ratio, weights=WEIGHTS)["logp"]
        if name == "on-policy":
            np.testing.assert_array_equal(g_ratio, g_binary)
            for key in m_binary:
                np.testing.assert_array_equal(
                    np.asarray(m_ratio[key]), np.asarray(m_binary[key]), err_msg=key
                )
        else:
            assert np.abs(g_ratio - g_binary).max() > 1e-3
            assert float(m_ratio["policy_loss"]) != pytest.approx(float(m_binary["policy_loss"]), rel=1e-3)


def test_an_empty_batch_is_zero_for_every_weighting():
    batch = random_batch(9, [0] * B, [True] * B)
    for cfg in (RATIO, VMPO):
        total, metrics = call_loss(batch, cfg)
        assert float(total) == 0.0
        for key, value in metrics.items():
            assert (np.asarray(value) == 0).all(), key
        assert all(np.isfinite(g).all() for g in loss_grads(batch, cfg).values())


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"actor_weighting": "awr"}, "actor_weighting"),
        ({"vmpo_eta": 0.0}, "vmpo_eta"),
        ({"vmpo_kl_coef": -1.0}, "vmpo_kl_coef"),
    ],
)
def test_params_and_flags_reject_nonsense(bad, says):
    with pytest.raises(ValueError, match=says):
        LossParams(**bad)
    with pytest.raises(ValueError, match="--" + says.replace("_", "-")):
        LossSettings(**bad)


def test_flags_choose_the_weighting_and_default_to_the_losses_defaults():
    loss = LossSettings()
    assert (loss.actor_weighting, loss.vmpo_eta, loss.vmpo_kl_coef) == (
        DEFAULTS.actor_weighting,
        DEFAULTS.vmpo_eta,
        DEFAULTS.vmpo_kl_coef,
    )
    assert DEFAULTS.actor_weighting == "binary"  # chosen by `python -m benchmarks actor_loss` (BENCHMARKS.md)
    cfg = parse_args(["--actor-weighting", "vmpo", "--vmpo-eta", "0.25", "--vmpo-kl-coef", "2"]).loss
    assert (cfg.actor_weighting, cfg.vmpo_eta, cfg.vmpo_kl_coef) == ("vmpo", 0.25, 2.0)
