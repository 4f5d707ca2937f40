"""The fixed batch and the update loop of tests/test_update_pin.py (kept apart: the restructuring changes
only these few lines, never the pinned numbers)."""

from __future__ import annotations

import numpy as np

from common import featurize, model
from common.config import ModelConfig
from learner.algorithm import LossConfig
from learner.aride import ARideConfig
from learner.batch import example_batch
from learner.train_step import make_optimizer, make_train_step


def pinned_batch(cfg: ModelConfig, seed: int, batch_size: int = 4, max_steps: int = 5):
    """A batch of random but valid episodes: random observations and masks, choices inside the masks,
    behaviour log-probs, rewards, lengths, terminal flags and replay weights."""
    rng = np.random.default_rng(seed)
    batch = example_batch(featurize.feature_spec(cfg), batch_size, max_steps)
    for v in batch.obs.values():
        if v.dtype == bool:
            v[...] = rng.random(v.shape) < 0.7
            v[..., 0] = True
        elif v.dtype.kind == "f":
            v[...] = rng.standard_normal(v.shape)
        else:
            v[...] = rng.integers(0, cfg.vocab_size, v.shape)
    b, t = batch.reward.shape
    batch.action_type[...] = rng.integers(0, 7, (b, t))
    batch.element[...] = rng.integers(0, cfg.max_elements, (b, t))
    batch.word[...] = rng.integers(0, cfg.max_instruction_tokens, (b, t))
    rows, steps = np.indices((b, t))
    batch.obs["elem_mask"][rows, steps, batch.element] = True  # every choice is one the policy could make
    batch.obs["instr_mask"][rows, steps, batch.word] = True
    batch.direction[...] = rng.integers(0, 4, (b, t))
    batch.behavior_logp[...] = -rng.uniform(0.1, 3.0, (b, t))
    batch.reward[...] = rng.uniform(-0.1, 1.0, (b, t))
    batch.length[...] = rng.integers(1, t + 1, b)
    batch.terminal[...] = rng.random(b) < 0.5
    batch.weights[...] = rng.uniform(0.2, 1.0, b)
    return batch


def run_updates(cfg: ModelConfig, batch, algorithm: str, imitation: bool, updates: int):
    """`updates` updates from seed-0 parameters with the --algorithm's default settings and entropy 0.01;
    returns (params, the last metrics as floats)."""
    graphdef, params = model.create(cfg, 0)
    optimizer = make_optimizer(3e-3, 1.0)
    opt_state = optimizer.init(params)
    loss_cfg = ARideConfig(lambda_=0.95) if algorithm == "aride" else LossConfig()
    step = make_train_step(graphdef, optimizer, loss_cfg, warmup=imitation)
    metrics = {}
    for _ in range(updates):
        params, opt_state, metrics = step(params, opt_state, batch)
    return params, {k: float(np.mean(v)) for k, v in metrics.items() if np.ndim(v) == 0}
