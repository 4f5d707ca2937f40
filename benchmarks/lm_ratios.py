"""Per-token against step-level importance weights, measured on a real `lm` run's replay.

`python -m benchmarks.lm_ratios CHECKPOINTS [CHECKPOINTS ...] [--json PATH]`: each CHECKPOINTS is a run dir
or a checkpoints folder; its newest checkpoint's parameters (the learner's pi) score every actor step in the
replay saved with it (the behaviour mu: the snapshot that chose the step, `policy_version`), token by token
(common/policies/lm/network.py:score_actions). Demonstrations (behaviour log-prob 0) are left out.

For a step of K action tokens with per-token ratios rho_k = pi(a_k | prefix) / mu(a_k | prefix):
- the step-level weight is min(1, rho) with rho = prod_k rho_k (what the critic's Retrace traces and the
  priorities use; the actor's "binary_ratio" weight on every token of the step);
- the per-token weight is min(1, rho_k) on token k (what PPO-style token losses use): it ignores how the
  prefix's probability moved, so it is biased off-policy, and it never drops a whole step.

Rows by policy lag (the checkpoint's version minus the step's): steps and tokens; the spread of log rho;
the step ratio's quantiles and maximum (does the product over tokens explode or vanish?); the mean weight
and Kish's effective sample size (ESS: (sum w)^2 / (sum w^2) / n, the share of the data that effectively
carries the gradient) of each form; and the mean gap |w_step - mean_k w_k| on a step.

The rule, fixed before measuring: keep the step-level weight (one weight per unit of credit, the one the
critic already uses, unbiased up to truncation) unless its ESS at the lags a run has is below 0.5 while the
per-token ESS is not, that is unless it throws away more than half of the data.
Lag 0 is also a check: there rho must be 1 (the actor's and the learner's log-probs agree on SmolLM2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from benchmarks.report import emit
from common.policies import make_policy
from common.policies.lm.network import score_actions
from learner.ingest.settler import LoggedEpisodes
from learner.ingest.wal import WriteAheadLog
from learner.replay.prioritized import PrioritizedReplay
from learner.tools.evaluate import restore
from learner.training.checkpoint import Checkpointer

ROWS = 8
"""Steps scored per jitted call (one shape, one compile)."""
LAGS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 1 << 30))


def _actor_steps(checkpoints: Path, update: int, model_cfg, capacity: int, max_steps: int) -> list[dict]:
    """Every actor step of the replay saved with checkpoint `update`: its prompt, action and behaviour."""
    replay = PrioritizedReplay(capacity)
    spec = make_policy(model_cfg).episode_spec()
    wal = WriteAheadLog(checkpoints.parent / "wal", "os")  # read only: the episodes the file references
    logged = LoggedEpisodes(wal, lambda traj, newest: traj.validate(spec, max_steps, newest))
    Checkpointer(checkpoints).restore_replay(update, replay, model_cfg, max_steps=max_steps, logged=logged)
    steps = []
    for ep in replay.items():
        if not np.any(ep.steps["behavior_logp"]):
            continue  # a demonstration: mu is the oracle's
        for t in range(ep.length):
            steps.append({
                **{k: v[t] for k, v in ep.obs.items()},
                **{k: ep.steps[k][t] for k in ("action_tokens", "action_length", "token_logp", "policy_version")},
            })  # fmt: skip
    return steps


def _score(policy, graphdef, params, steps: list[dict]) -> list[np.ndarray]:
    """pi's log-prob of each step's action tokens, [length] each."""
    fn = jax.jit(lambda p, o, c: score_actions(nnx.merge(graphdef, p), policy.decoding, o, c).token_logp)
    out = []
    for start in range(0, len(steps), ROWS):
        chunk = steps[start : start + ROWS]
        chunk = chunk + chunk[:1] * (ROWS - len(chunk))
        obs = {
            k: np.stack([[s[k], s[k]] for s in chunk]) for k in ("prompt_ids", "prompt_length", "n_elements")
        }
        choice = {k: np.stack([[s[k]] for s in chunk]) for k in ("action_tokens", "action_length")}
        logp = np.asarray(fn(params, obs, choice))[:, 0]
        out += [logp[i, : int(s["action_length"])] for i, s in enumerate(chunk)][: len(steps) - start]
        print(f"  scored {min(start + ROWS, len(steps))}/{len(steps)} steps", flush=True)
    return out


def _ess(w: np.ndarray) -> float:
    return float(w.sum() ** 2 / (w**2).sum() / w.size) if w.size and (w**2).sum() > 0 else 0.0


def lag_row(
    name: str, lo: int, hi: int, pi: list[np.ndarray], mu: list[np.ndarray], lags: np.ndarray
) -> dict:
    """The statistics of the docstring over the steps whose lag is in [lo, hi]."""
    picked = [i for i in range(len(lags)) if lo <= lags[i] <= hi]
    token_log = [pi[i] - mu[i] for i in picked]
    step_log = np.array([t.sum() for t in token_log])
    tokens = np.concatenate(token_log) if token_log else np.zeros(0)
    w_step = np.minimum(1.0, np.exp(step_log))
    w_token = np.minimum(1.0, np.exp(tokens))
    gap = [abs(w_step[j] - np.minimum(1.0, np.exp(t)).mean()) for j, t in enumerate(token_log)]
    rho = np.exp(step_log)
    q = np.quantile(rho, [0.05, 0.5, 0.95]) if rho.size else [np.nan] * 3
    return {
        "run": name,
        "lag": f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 1 << 29 else f">={lo}"),
        "steps": len(picked),
        "tokens": int(tokens.size),
        "std_log_rho_step": float(step_log.std()) if step_log.size else np.nan,
        "std_log_rho_token": float(tokens.std()) if tokens.size else np.nan,
        "rho_step_p05": float(q[0]),
        "rho_step_p50": float(q[1]),
        "rho_step_p95": float(q[2]),
        "rho_step_max": float(rho.max()) if rho.size else np.nan,
        "max_abs_log_rho": float(np.abs(tokens).max()) if tokens.size else np.nan,
        "w_step_mean": float(w_step.mean()) if w_step.size else np.nan,
        "w_token_mean": float(w_token.mean()) if w_token.size else np.nan,
        "ess_step": _ess(w_step),
        "ess_token": _ess(w_token),
        "gap_mean": float(np.mean(gap)) if gap else np.nan,
    }


def measure(path: Path) -> list[dict]:
    restored = restore(path)
    directory, state = restored.directory, restored.state
    run_cfg = Checkpointer(directory).config()
    steps = _actor_steps(
        directory, state.update, restored.model_cfg, int(run_cfg["replay_capacity"]), restored.max_steps
    )
    print(f"{directory}: update {state.update}, policy v{state.policy_version}, {len(steps)} actor steps")
    policy = make_policy(restored.model_cfg)
    graphdef, _ = policy.abstract()
    pi = _score(policy, graphdef, state.params, steps)
    mu = [np.asarray(s["token_logp"])[: int(s["action_length"])] for s in steps]
    lags = np.array([state.policy_version - int(s["policy_version"]) for s in steps])
    name = f"{directory.parent.name}@{state.update}"
    return [lag_row(name, lo, hi, pi, mu, lags) for lo, hi in LAGS if np.any((lags >= lo) & (lags <= hi))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "checkpoints", nargs="+", type=Path, help="run dirs or checkpoints folders of lm runs"
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = [row for path in args.checkpoints for row in measure(path)]
    emit("lm_ratios", rows, args.json)


if __name__ == "__main__":
    main()
