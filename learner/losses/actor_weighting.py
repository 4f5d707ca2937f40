"""A-RIDE's actor weights once the advantage is binarized: "binary", "binary_ratio" and "vmpo".

Why this exists: A-RIDE's advantage is A_t = min(pg_rho_clip, rho_t) * (q_t - V(s_t)) with rho_t > 0, so
DigiRL's binarization 1[A_t > 0] = 1[q_t > V(s_t)] drops the importance ratio: a binarized actor is not
off-policy corrected at all, however stale the replayed data. "binary_ratio" and "vmpo" put the ratio back.

Notation as in learner/losses/aride.py: count real steps (t < length[b]), w_b the replay weights,
q_t - V(s_t) = r_t + gamma (1 - d_t) v_{t+1} - V(s_t) (the advantage before its ratio weight, same sign as
A_t), and E the eligible steps: real, in a kept trajectory (the instruction filter keep_b) and passing the
advantage filter (A_t > advantage_threshold, when set). With LossParams.binarize_advantage on:

    binary:        actor = -sum_{t in E} w_b * 1[A_t > 0] * log pi(a_t|s_t) / count
    binary_ratio:  actor = -sum_{t in E} w_b * min(pg_rho_clip, rho_t) * 1[A_t > 0] * log pi(a_t|s_t) / count
    vmpo:          K     = the ceil(|E| / 2) steps of E with the largest q_t - V(s_t) (ties: lower b*T + t)
                   psi_t = u_t / sum_{s in K} u_s,  u_t = w_b * min(pg_rho_clip, rho_t) * exp((q_t - V(s_t)) / eta)
                   actor = -sum_{t in K} psi_t * log pi(a_t|s_t)
                           + kl_coef * sum_{real t} (rho'_t - 1 - log rho'_t) / count

(eta = vmpo_eta, kl_coef = vmpo_kl_coef; psi is computed as a softmax, exp((q_t - V(s_t) - max_K) / eta).)
All weights are constants (stop-gradient); the gradient flows through log pi only.

"binary_ratio" is the truncated importance-sampling form of the binarized policy gradient, the
correction V-trace gives its policy gradient (Espeholt et al. 2018, eq. 4); on-policy (rho = 1) with
pg_rho_clip >= 1 it is "binary" exactly.

"vmpo" is V-MPO (Song et al. 2019, "V-MPO: On-Policy Maximum a Posteriori Policy Optimization for Discrete
and Continuous Control": the top half of the batch's advantages, softmax weights at temperature eta, a
weighted log-likelihood) and AWR (Peng et al. 2019, "Advantage-Weighted Regression": exp(A / beta)
weights), simplified: eta is fixed rather than learned through V-MPO's dual; the trust region is a fixed
penalty on KL(mu || pi) to the behaviour policy, estimated without bias from mu's actions by Schulman's k3,
rather than a Lagrange-multiplied bound on the KL to the previous learner policy; and each step is
weighted by the truncated ratio, the off-policy correction V-MPO (on-policy) does not need. The selection
and the exponent read the unweighted q_t - V(s_t), so the ratio enters once. The replay weights w_b enter
inside the normalisation (self-normalised importance sampling: the weights psi a uniform replay would
give), so sum psi = 1 whatever their scale. The KL term is a regulariser of pi on every visited state,
like the entropy bonus: neither weighted by w_b nor filtered, and it keeps the true ratio under
`off_policy_correction=False` (that ablation sets the correction's ratios to 1, not the trust region's).
rho'_t has the value of rho_t (log pi on what mu saw) and the gradient of log pi(a_t|s_t) on the trained
observations: d/d log pi(a_t|s_t) = kl_coef * (rho_t - 1) / count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.losses.base import LossParams


def top_half(score: jax.Array, eligible: jax.Array) -> jax.Array:
    """[B, T] bool: the ceil(n / 2) eligible steps (n of them) with the largest score, ties to the lower
    flat index b * T + t. V-MPO's selection: learn only from the better half of what was tried."""
    flat = jnp.where(eligible, score, -jnp.inf).ravel()
    order = jnp.argsort(-flat, stable=True)  # best first; ineligible (+inf after negation) last
    rank = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    wanted = (jnp.sum(eligible) + 1) // 2
    return eligible & (rank.reshape(score.shape) < wanted)


def vmpo_weights(
    score: jax.Array, clipped_rho: jax.Array, kept: jax.Array, w: jax.Array, eta: jax.Array | float
) -> jax.Array:
    """[B, T] psi_t = u_t / sum_K u, u_t = w_b * clipped_rho_t * exp(score_t / eta) on kept steps, else 0;
    all 0 when nothing is kept. Subtracting the kept maximum keeps exp <= 1 (no overflow at small eta)."""
    score, clipped_rho = jax.lax.stop_gradient(score), jax.lax.stop_gradient(clipped_rho)
    logits = jnp.where(kept, score / eta, -jnp.inf)
    top = jnp.max(logits)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    u = jnp.where(kept, w[:, None] * clipped_rho * jnp.exp(logits - top), 0.0)
    total = jnp.sum(u)
    return u / jnp.where(total > 0, total, 1.0)


def behavior_kl_k3(
    logp: jax.Array, ratio_logp: jax.Array, behavior_logp: jax.Array, mask: jax.Array
) -> jax.Array:
    """Mean over real steps of k3 = rho' - 1 - log rho', an unbiased estimate of KL(mu || pi) from mu's
    actions whose value uses ratio_logp (log pi on what mu saw) and whose gradient flows through logp."""
    sg = jax.lax.stop_gradient
    logp = jnp.where(mask, logp, 0.0)  # padded garbage (even NaN) stays out of value and gradient
    log_rho = jnp.where(mask, sg(ratio_logp) - sg(behavior_logp), 0.0) + (logp - sg(logp))
    k3 = jnp.where(mask, jnp.expm1(log_rho) - log_rho, 0.0)
    return jnp.sum(k3) / jnp.maximum(jnp.sum(mask), 1)


def trust_region_penalty(
    logp: jax.Array, ratio_logp: jax.Array, behavior_logp: jax.Array, mask: jax.Array, cfg: LossParams
) -> jax.Array:
    """The actor's KL term in the loss: "vmpo"'s vmpo_kl_coef * behavior_kl_k3, 0 for every other form."""
    if cfg.binarize_advantage and cfg.actor_weighting == "vmpo":
        return cfg.vmpo_kl_coef * behavior_kl_k3(logp, ratio_logp, behavior_logp, mask)
    return jnp.zeros((), jnp.float32)


def actor_coefficients(
    used: jax.Array,
    score: jax.Array,
    rho: jax.Array,
    eligible: jax.Array,
    w: jax.Array,
    count: jax.Array,
    cfg: LossParams,
) -> tuple[jax.Array, jax.Array]:
    """-> (c [B, T], the steps that train the actor [B, T] bool), with actor = -sum c * log pi / count.

    used is the advantage as learner.losses.aride.shape_advantages shaped it (A, or 1[A > 0] when
    binarized), score q_t - V(s_t), rho the (constant) ratios, eligible the steps that pass both filters,
    w [B] the replay weights. Signed and "binary": c = w_b * used on eligible steps (the original form,
    unchanged); "binary_ratio" multiplies in min(pg_rho_clip, rho); "vmpo": c = count * psi on its kept
    half, so that c / count = psi.
    """
    if not cfg.binarize_advantage or cfg.actor_weighting == "binary":
        return jnp.where(eligible, w[:, None] * used, 0.0), eligible
    clipped = jnp.minimum(cfg.pg_rho_clip, rho)
    if cfg.actor_weighting == "binary_ratio":
        return jnp.where(eligible, w[:, None] * (used * clipped), 0.0), eligible
    kept = top_half(score, eligible)
    return count * vmpo_weights(score, clipped, kept, w, cfg.vmpo_eta), kept


def weight_metrics(coef: jax.Array, count: jax.Array) -> dict[str, jax.Array]:
    """How the actor spreads its weight (c as in actor_coefficients): actor_weight_sum = sum c / count,
    the total weight on log pi (its gradient's scale; 1 for "vmpo"), and actor_ess = (sum |c|)^2 /
    (sum c^2) / count, the share of real steps that effectively carry the actor's gradient (Kish's
    effective sample size; 0 when none does)."""
    abs_sum = jnp.sum(jnp.abs(coef))
    squares = jnp.sum(coef**2)
    ess = jnp.where(squares > 0, abs_sum**2 / jnp.where(squares > 0, squares, 1.0), 0.0)
    return {"actor_weight_sum": jnp.sum(coef) / count, "actor_ess": ess / count}
