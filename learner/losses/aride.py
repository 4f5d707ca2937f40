"""A-RIDE losses: Retrace(lambda) critic targets, clipped policy-gradient advantages, DPER priorities.

A-RIDE is the off-policy actor-critic of DistRL (Wang et al. 2024, "DistRL: An Asynchronous Distributed
Reinforcement Learning Framework for On-Device Control Agents"). Trajectories come from stale actor
snapshots (the behavior policy mu) and are trained on by the newest learner policy pi, so every
multi-step quantity is corrected with truncated importance ratios, as in Retrace (Munos et al. 2016,
"Safe and Efficient Off-Policy Reinforcement Learning") and V-trace (Espeholt et al. 2018, "IMPALA").

Batches are batch-major and padded, as everywhere in the learner: per-step arrays are [B, T] and real
for t < length[b]; values are [B, T + 1] with values[b, t] = V(s_t), where V(s_L) (L = length[b]) is the
critic on the observation after the last step. terminal[b] says the episode ended in a terminal state
(no bootstrap); otherwise it was truncated (step limit, device fault) and bootstraps from V(s_L).
Anything stored beyond a trajectory's end (and V(s_L) of a terminal one) is ignored, even NaN.

With rho_t = pi(a_t|s_t) / mu(a_t|s_t) and d_t = 1 only on the last step of a terminal episode:

    rho_bar_t = min(rho_clip, rho_t)          c_t = lambda * min(c_clip, rho_t)
    delta_t   = rho_bar_t * (r_t + gamma * (1 - d_t) * V(s_{t+1}) - V(s_t))
    v_t       = V(s_t) + delta_t + gamma * (1 - d_t) * c_t * (v_{t+1} - V(s_{t+1})),   v_L = V(s_L)
    A_t       = min(pg_rho_clip, rho_t) * (r_t + gamma * (1 - d_t) * v_{t+1} - V(s_t))

Unrolled, v_t = V(s_t) + sum_{k >= t} gamma^{k-t} (prod_{i=t}^{k-1} c_i) delta_k: the V-trace target of
Espeholt et al. (2018, eq. 1), which with rho_clip = infinity is Retrace(lambda) (Munos et al. 2016,
eq. 4) for a state-value critic. On-policy with lambda = 1 and large clips, v_t is the discounted
Monte-Carlo return (with bootstrap from V(s_L) on truncation). The recursion runs over the whole
episode (the reference code's 3-step look-ahead is deliberately not copied).

Losses (count = number of real steps in the batch, w_b the prioritized-replay importance weights):

    actor   = -sum_{b,t} mask * keep_b * f_bt * w_b * sg(A~_bt) * log pi(a_t|s_t) / count
              - entropy_coef * sum_{b,t} mask * H(pi(.|s_t)) / count
    critic  = 0.5 * sum_{b,t} mask * w_b * (sg(v_t) - V(s_t))^2 / count
    total   = actor + value_coef * critic

sg is stop-gradient (targets and advantages are constants; the importance ratios too). The 0.5 keeps
the critic gradient w_b * (V - v) / count, as in learner/losses/a2c.py, so value_coef means the same in
both losses. The entropy bonus is neither weighted nor filtered: it is a regularizer of the current
policy on every visited state, not an estimate that prioritized sampling biases.

Options from DigiRL (Bai et al. 2024) and DistRL, all off in LossParams (the learner turns binarization on
after a warm-up on demonstrations, learner/config.py:LossSettings.binarize_advantage):
- advantage filtering, `advantage_threshold`: f_bt = 1[A_bt > threshold] (DigiRL: threshold 0, keep only
  positive advantages); filtered steps still count in `count`, so filtering never rescales kept steps;
- advantage binarization, `binarize_advantage`: the actor never pushes a sampled action down; how it
  weighs the steps instead is `actor_weighting` (learner/losses/actor_weighting.py, with the maths):
  "binary" A~ = 1[A > 0] (DigiRL's form, which drops the importance ratio, since rho > 0; the default,
  by measurement), "binary_ratio" A~ = min(pg_rho_clip, rho) * 1[A > 0] (it ignores nothing), or "vmpo"
  (V-MPO / AWR: softmax weights exp((q - V) / eta) on the better half of the steps, times the clipped
  ratio, plus a KL(mu || pi) penalty). Filtering, when on, is decided on the unbinarized A first;
- instruction-level critic filter: `Batch.keep` [B] bool, a per-trajectory flag (for example
  `instruction_keep(V_instr(c), low, high)`: the instruction-level value estimate says the task is
  neither solved nor hopeless, so its trajectories are informative); it multiplies the actor loss only,
  so the critic still learns from every trajectory;
- no correction, `off_policy_correction=False`: rho_t = 1 on every real step (so rho_bar = 1, c = lambda
  and the policy-gradient weight is 1), the ablation that treats replayed data as on-policy.

Per-trajectory priorities for distributed prioritized replay (DPER), each [B], over real steps
(0 for an empty trajectory, learner.losses.base.PriorityTerms): delta = mean |delta_t| (the rho_bar-clipped
TD error above), rho_clipped = mean rho_bar_t, entropy =
mean H(pi(.|s_t)) (the exact entropy of the current policy on the states visited: the H of DistRL's
priority, computed exactly rather than estimated by the taken action's -log pi, which adds the noise of
one sampled action).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.batch import Batch
from learner.losses.actor_weighting import actor_coefficients, trust_region_penalty, weight_metrics
from learner.losses.base import LossOutput, LossParams, PriorityTerms
from learner.losses.shared import behavior_cloning, step_mask


def _continues(length: jax.Array, terminal: jax.Array, num_steps: int) -> jax.Array:
    """[B, T] bool: 1 - d_t on real steps, i.e. False on the last step of a terminal episode and on padding."""
    t = jnp.arange(num_steps)[None, :]
    last = t == length[:, None] - 1
    return (t < length[:, None]) & ~(last & terminal[:, None])


def _next_values(values: jax.Array, length: jax.Array, terminal: jax.Array) -> jax.Array:
    """[B, T]: V(s_{t+1}) where it is used (real steps that continue), 0 elsewhere (no NaN leaks in)."""
    return jnp.where(_continues(length, terminal, values.shape[1] - 1), values[:, 1:], 0.0)


def importance_ratios(logp: jax.Array, behavior_logp: jax.Array, length: jax.Array) -> jax.Array:
    """rho_t = exp(log pi(a_t|s_t) - log mu(a_t|s_t)) on real steps, 0 on padded steps. [B, T]."""
    mask = step_mask(length, logp.shape[1])
    rho = jnp.exp(jnp.where(mask, logp - behavior_logp, 0.0))
    return jnp.where(mask, rho, 0.0)


def retrace_targets(
    rho: jax.Array,
    values: jax.Array,
    rewards: jax.Array,
    length: jax.Array,
    terminal: jax.Array,
    gamma: float,
    lambda_: float = 1.0,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Retrace(lambda) / V-trace targets v_t and clipped TD errors delta_t, both [B, T], 0 on padding.

        delta_t = min(rho_clip, rho_t) * (r_t + gamma (1 - d_t) V(s_{t+1}) - V(s_t))
        v_t - V(s_t) = delta_t + gamma (1 - d_t) lambda min(c_clip, rho_t) (v_{t+1} - V(s_{t+1}))

    with v_L = V(s_L), so the recursion starts at the last real step (Munos et al. 2016, eq. 4;
    Espeholt et al. 2018, eq. 1 and its remark on lambda). rho [B, T] unclipped ratios, values [B, T + 1],
    rewards [B, T], length [B] int, terminal [B] bool. The scalars may be traced. No stop-gradient here:
    the loss stops gradients on its inputs.
    """
    num_steps = rewards.shape[1]
    mask = step_mask(length, num_steps)
    cont = _continues(length, terminal, num_steps)
    rho = jnp.where(mask, rho, 0.0)
    v_now = jnp.where(mask, values[:, :-1], 0.0)
    v_next = _next_values(values, length, terminal)
    r = jnp.where(mask, rewards, 0.0)
    delta = jnp.where(mask, jnp.minimum(rho_clip, rho) * (r + gamma * v_next - v_now), 0.0)
    trace = jnp.where(cont, gamma * lambda_ * jnp.minimum(c_clip, rho), 0.0)

    def back(acc, xs):
        delta_t, trace_t, real_t = xs
        acc = jnp.where(real_t, delta_t + trace_t * acc, 0.0)  # acc_t = v_t - V(s_t); 0 past the end
        return acc, acc

    init = jnp.zeros(rewards.shape[:1], delta.dtype)
    _, diff = jax.lax.scan(back, init, (delta.T, trace.T, mask.T), reverse=True)
    targets = jnp.where(mask, v_now + diff.T, 0.0)
    return targets, delta


def q_advantages(
    targets: jax.Array,
    values: jax.Array,
    rewards: jax.Array,
    length: jax.Array,
    terminal: jax.Array,
    gamma: float,
) -> jax.Array:
    """q_t - V(s_t) = r_t + gamma (1 - d_t) v_{t+1} - V(s_t), [B, T], 0 on padding: the advantage before
    its ratio weight (what "vmpo" ranks, learner/losses/actor_weighting.py).

    v_{t+1} is the Retrace target of the next step, and V(s_L) after the last step of a truncated episode
    (Espeholt et al. 2018, section 4.2: q_s = r_s + gamma v_{s+1}). Note rlax's
    `vtrace_td_error_and_advantage` with lambda_ < 1 bootstraps from lambda v_{t+1} + (1 - lambda) V(s_{t+1})
    instead; the two agree for lambda = 1.
    """
    num_steps = rewards.shape[1]
    mask = step_mask(length, num_steps)
    t = jnp.arange(num_steps)[None, :]
    last = t == length[:, None] - 1
    shifted = jnp.concatenate([targets[:, 1:], jnp.zeros_like(targets[:, :1])], axis=1)
    v_next = jnp.where(last, _next_values(values, length, terminal), shifted)
    v_next = jnp.where(_continues(length, terminal, num_steps), v_next, 0.0)
    v_now = jnp.where(mask, values[:, :-1], 0.0)
    r = jnp.where(mask, rewards, 0.0)
    return jnp.where(mask, r + gamma * v_next - v_now, 0.0)


def pg_advantages(
    rho: jax.Array,
    targets: jax.Array,
    values: jax.Array,
    rewards: jax.Array,
    length: jax.Array,
    terminal: jax.Array,
    gamma: float,
    pg_rho_clip: float = 1.0,
) -> jax.Array:
    """A_t = min(pg_rho_clip, rho_t) * (q_t - V(s_t)) (q_advantages), [B, T], 0 on padding."""
    mask = step_mask(length, rewards.shape[1])
    q_minus_v = q_advantages(targets, values, rewards, length, terminal, gamma)
    rho = jnp.where(mask, rho, 0.0)
    return jnp.where(mask, jnp.minimum(pg_rho_clip, rho) * q_minus_v, 0.0)


def shape_advantages(
    advantage: jax.Array, mask: jax.Array, threshold: float | None = None, binarize: bool = False
) -> tuple[jax.Array, jax.Array]:
    """DigiRL-style options: -> (advantage the actor uses, [B, T] bool: the step trains the actor).

    With a threshold only steps with A > threshold train the actor; with binarize the actor uses 1[A > 0].
    Both 0 / False on padded steps.
    """
    trains = mask if threshold is None else mask & (advantage > threshold)
    used = (advantage > 0).astype(advantage.dtype) if binarize else advantage
    return jnp.where(trains, used, 0.0), trains


def instruction_keep(instruction_value: jax.Array, low: float, high: float) -> jax.Array:
    """An instruction-level critic filter: keep trajectories whose instruction value is in [low, high].

    instruction_value [B] is V(instruction) from an instruction-level critic (the estimated success rate
    of the task); tasks it calls almost surely solved or hopeless carry little policy-gradient signal.
    Pass the result as the batch's `keep` to `aride_loss`.
    """
    return (instruction_value >= low) & (instruction_value <= high)


def _ratios_and_targets(
    acted_logp: jax.Array, values: jax.Array, batch: Batch, cfg: LossParams
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(rho, Retrace targets v_t, clipped TD errors delta_t), all [B, T] and constants (stop-gradient):
    the off-policy correction both A-RIDE losses share. acted_logp is log pi on the observations mu saw."""
    mask = step_mask(batch.length, acted_logp.shape[1])
    acted = jax.lax.stop_gradient(jnp.where(mask, acted_logp, 0.0))
    rho = importance_ratios(acted, jax.lax.stop_gradient(batch.behavior_logp), batch.length)
    if not cfg.off_policy_correction:
        rho = jnp.where(mask, 1.0, rho)
    targets, delta = retrace_targets(
        rho, jax.lax.stop_gradient(values), batch.reward, batch.length, batch.terminal,
        cfg.gamma, cfg.lambda_, cfg.rho_clip, cfg.c_clip,
    )  # fmt: skip
    return rho, targets, delta


def aride_loss(
    logp: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    batch: Batch,
    cfg: LossParams,
    ratio_logp: jax.Array | None = None,
) -> LossOutput:
    """Total A-RIDE loss and metrics (see the module docstring for every formula).

    logp / entropy [B, T] (log pi of the actions taken, exact H(pi)); values [B, T + 1]; ratio_logp [B, T]
    log pi on the observations mu saw (common.policies.Evaluation; defaults to logp), which every
    importance ratio uses, so augmenting `obs` after acting cannot bias rho; from the batch:
    behavior_logp (log mu), reward, length, terminal, weights (replay importance weights) and keep (the
    instruction-level filter on the actor). Gradients flow into logp (actor), entropy (bonus) and
    values[:, :-1] on real steps (critic) only.

    Metrics: scalars loss, policy_loss, value_loss, entropy, advantage_mean (raw A), target_mean,
    rho_mean (unclipped), rho_clipped_fraction (share of real steps with rho > rho_clip),
    actor_step_fraction (share of real steps that train the actor; for "vmpo" its kept half),
    behavior_kl (how far pi has moved from mu: the mean of rho - 1 - log rho over real steps, an unbiased
    estimate of KL(mu || pi) from mu's actions, Schulman's "k3"; it ignores `off_policy_correction`),
    kl_penalty ("vmpo"'s vmpo_kl_coef * behavior_kl, in the loss; 0 otherwise), actor_weight_sum and
    actor_ess (learner/losses/actor_weighting.py:weight_metrics). Priority terms for the replay
    (PriorityTerms, [B] each, 0 for empty trajectories): mean |delta|, mean rho_bar, mean H.
    """
    rewards, length, terminal = batch.reward, batch.length, batch.terminal
    num_steps = rewards.shape[1]
    mask = step_mask(length, num_steps)
    maskf = mask.astype(jnp.float32)
    count = jnp.maximum(maskf.sum(), 1.0)
    per_traj = jnp.maximum(maskf.sum(axis=1), 1.0)
    w = jnp.asarray(batch.weights, jnp.float32)
    kept = jnp.asarray(batch.keep, bool)

    logp_real = jnp.where(mask, logp, 0.0)  # padded garbage (even NaN) stays out of values and gradients
    sg_values = jax.lax.stop_gradient(values)
    acted = logp if ratio_logp is None else ratio_logp  # log pi on what mu saw: every ratio uses it
    rho, targets, delta = _ratios_and_targets(acted, values, batch, cfg)
    q_minus_v = q_advantages(targets, sg_values, rewards, length, terminal, cfg.gamma)
    advantage = pg_advantages(rho, targets, sg_values, rewards, length, terminal, cfg.gamma, cfg.pg_rho_clip)
    used, trains = shape_advantages(advantage, mask, cfg.advantage_threshold, cfg.binarize_advantage)
    actor_coef, trains = actor_coefficients(used, q_minus_v, rho, trains & kept[:, None], w, count, cfg)

    policy_loss = -jnp.sum(actor_coef * logp_real) / count
    mean_entropy = jnp.sum(jnp.where(mask, entropy, 0.0)) / count
    v_now = jnp.where(mask, values[:, :-1], 0.0)
    value_loss = 0.5 * jnp.sum(jnp.where(mask, w[:, None] * (targets - v_now) ** 2, 0.0)) / count
    kl_penalty = trust_region_penalty(logp, acted, batch.behavior_logp, mask, cfg)  # 0 but for "vmpo"
    total = policy_loss - cfg.entropy_coef * mean_entropy + cfg.value_coef * value_loss + kl_penalty

    def mean(x):
        return jnp.sum(jnp.where(mask, x, 0.0)) / count

    def traj_mean(x):
        return jnp.sum(jnp.where(mask, x, 0.0), axis=1) / per_traj

    rho_bar = jnp.minimum(cfg.rho_clip, rho)
    log_rho = jnp.where(mask, jax.lax.stop_gradient(acted) - batch.behavior_logp, 0.0)
    metrics = {
        "loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        "advantage_mean": mean(advantage),
        "target_mean": mean(targets),
        "rho_mean": mean(rho),
        "rho_clipped_fraction": mean((rho > cfg.rho_clip).astype(jnp.float32)),
        "actor_step_fraction": mean(trains.astype(jnp.float32)),
        "behavior_kl": mean(jnp.expm1(log_rho) - log_rho),
        "kl_penalty": kl_penalty,
        **weight_metrics(actor_coef, count),
    }
    priorities = PriorityTerms(
        delta=traj_mean(jnp.abs(delta)),
        rho_clipped=traj_mean(rho_bar),
        entropy=traj_mean(jax.lax.stop_gradient(entropy)),
    )
    return LossOutput(total, metrics, priorities)


def imitation_loss(
    logp: jax.Array,
    values: jax.Array,
    batch: Batch,
    cfg: LossParams,
    ratio_logp: jax.Array | None = None,
) -> LossOutput:
    """An imitation update of A-RIDE: weighted behavior cloning for the actor
    (learner.losses.shared.behavior_cloning), and for the critic the same Retrace targets as `aride_loss`.

    Demonstrations carry the demonstrator's exact log-probabilities (mu), so they are off-policy data
    that Retrace corrects like any other: the critic keeps estimating V of the learner's policy pi rather
    than of the demonstrator (regressing on the demonstrations' Monte-Carlo returns would bias every
    advantage towards the oracle's success rate). Importance weights are not applied (demonstrations
    are drawn uniformly). Metrics: loss, bc_loss, value_loss, rho_mean.
    """
    length = batch.length
    mask = step_mask(length, logp.shape[1])
    count = jnp.maximum(mask.sum(), 1)
    rho, targets, _ = _ratios_and_targets(logp if ratio_logp is None else ratio_logp, values, batch, cfg)
    v_now = jnp.where(mask, values[:, :-1], 0.0)
    value_loss = 0.5 * jnp.sum(jnp.where(mask, (targets - v_now) ** 2, 0.0)) / count
    bc = behavior_cloning(logp, batch)
    total = bc + cfg.value_coef * value_loss
    rho_mean = jnp.sum(rho) / count
    return LossOutput(
        total, {"loss": total, "bc_loss": bc, "value_loss": value_loss, "rho_mean": rho_mean}, None
    )
