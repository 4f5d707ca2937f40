"""The learner's train step and the actor's batched inference, per call and per sample.

Reference in the same process: a plain jitted matmul chain with the model's width, so the table also
says what fraction of this machine's dense throughput the step reaches (ratios survive noisy machines).
"""

from __future__ import annotations

import time

import jax

from actors.envs.standin import StandInPhoneEnv
from actors.policy_runner import PolicyRunner, stack
from benchmarks import data, encoder_rows
from benchmarks.report import best_seconds, matmul_gflops
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy
from common.policies.family import Augmentation
from learner.batch import augmented, collate
from learner.losses import LOSSES, LossParams
from learner.training.train_step import make_optimizer, make_train_step


def _step_seconds(step, state: list, batch, repeats: int) -> float:
    """Best seconds per call of a jitted update on `batch` (compiled first; `state` is threaded through)."""

    def one_update():
        state[0], state[1], m, _ = step(state[0], state[1], batch)
        jax.block_until_ready(m)

    one_update()
    return best_seconds(one_update, repeats, inner=3)


def run(quick: bool) -> list[dict]:
    cfg = ModelConfig()
    repeats = 3 if quick else 10
    steps, batch = 8, 32
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    optimizer = make_optimizer(1e-3, 1.0)
    opt_state = optimizer.init(params)
    evaluate = policy.evaluate
    train_step = make_train_step(graphdef, optimizer, LOSSES["a2c"].rl, LossParams(), evaluate)
    batch_data = collate(data.episodes(cfg, batch, steps), steps)
    t0 = time.perf_counter()
    cost = train_step.lower(params, opt_state, batch_data).compile().cost_analysis()
    compile_s = time.perf_counter() - t0
    cost = cost[0] if isinstance(cost, list) else cost
    step_gflop = float(cost.get("flops", 0.0)) / 1e9
    params, opt_state, *_ = train_step(params, opt_state, batch_data)
    jax.block_until_ready(params)
    state = [params, opt_state]

    def one_update():
        state[0], state[1], m, _ = train_step(state[0], state[1], batch_data)
        jax.block_until_ready(m)

    step_s = best_seconds(one_update, repeats, inner=3)
    ref_gflops = matmul_gflops(cfg.d_model, repeats)
    rows = [
        {
            "path": "learner train step",
            "batch": f"{batch} eps x {steps + 1} obs",
            "ms_per_call": step_s * 1e3,
            "samples_per_s": batch * steps / step_s,
            "compile_s": compile_s,
            "step_gflops": step_gflop / step_s,
            "ref_matmul_gflops": ref_gflops,
            "vs_matmul": step_gflop / step_s / ref_gflops,
        }
    ]
    # A-RIDE with word renaming: the importance ratios need a second forward pass (no gradient) over the
    # observations the actors saw (Batch.acted_obs); its cost against the same step without it.
    aride_step = make_train_step(graphdef, optimizer, LOSSES["aride"].rl, LossParams(), evaluate)
    renaming = Augmentation(0.0, 0.5)  # the pointer policy's word renaming (its values only)
    renamed = augmented(batch_data, policy, renaming, seed=0)
    plain_s, acted_s = (_step_seconds(aride_step, state, b, repeats) for b in (batch_data, renamed))
    for label, seconds in (("A-RIDE train step", plain_s), ("A-RIDE train step, renamed words", acted_s)):
        rows.append(
            {
                "path": label,
                "batch": f"{batch} eps x {steps + 1} obs",
                "ms_per_call": seconds * 1e3,
                "samples_per_s": batch * steps / seconds,
                "vs_a_ride_without_renaming": seconds / plain_s,
            }
        )
    # Host-side batch preparation on the learner's critical path: padding, then word renaming.
    episodes = data.episodes(cfg, batch, steps)

    def prepare():
        prepared = collate(episodes, steps)
        policy.augment(prepared.obs, renaming, seed=0)

    prep_s = best_seconds(prepare, repeats, inner=3)
    rows.append(
        {
            "path": "learner batch prep (collate + word renaming)",
            "batch": f"{batch} eps x {steps + 1} obs",
            "ms_per_call": prep_s * 1e3,
            "samples_per_s": batch * steps / prep_s,
            "vs_train_step": prep_s / step_s,
        }
    )
    if encoder_rows.available():  # the text encoder's rows (benchmarks/encoder_rows.py)
        rows.extend(encoder_rows.learner_rows(quick))
    runner = PolicyRunner(cfg, 0)
    runner.load(0, params_to_flat(state[0]))
    for n in (1, 16) if quick else (1, 16, 64):
        env = StandInPhoneEnv()
        feats = stack([policy.featurize(env.reset(seed=i)[0]) for i in range(n)])
        t0 = time.perf_counter()
        runner.act(feats)
        compile_s = time.perf_counter() - t0
        act_s = best_seconds(lambda f=feats: runner.act(f), repeats, inner=10)
        obs = env.reset(seed=0)[0]
        feat_s = best_seconds(lambda o=obs: policy.featurize(o), repeats, inner=50)
        rows.append(
            {
                "path": "actor batched inference",
                "batch": f"{n} envs",
                "ms_per_call": act_s * 1e3,
                "samples_per_s": n / act_s,
                "compile_s": compile_s,
                "featurize_ms_per_obs": feat_s * 1e3,
            }
        )
    return rows
