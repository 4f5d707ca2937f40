"""The fixed batch and the update loop of tests/test_update_pin.py (kept apart: the restructuring changes
only these few lines, never the pinned numbers)."""

from __future__ import annotations

import numpy as np
import optax

from common.config import ModelConfig
from common.policies import PointerPolicy
from common.policies.pointer import featurize
from learner.batch import example_batch
from learner.losses import LossParams, get_loss
from learner.training.train_step import make_train_step


def pinned_batch(cfg: ModelConfig, seed: int, batch_size: int = 4, max_steps: int = 5):
    """A batch of random but valid episodes: random observations and masks, choices inside the masks,
    behaviour log-probs, rewards, lengths, terminal flags and replay weights."""
    rng = np.random.default_rng(seed)
    batch = example_batch(
        featurize.feature_spec(cfg),
        batch_size,
        max_steps,
        choices=featurize.episode_spec(cfg, 0).choice_arrays(),
    )
    for v in batch.obs.values():
        if v.dtype == bool:
            v[...] = rng.random(v.shape) < 0.7
            v[..., 0] = True
        elif v.dtype.kind == "f":
            v[...] = rng.standard_normal(v.shape)
        else:
            v[...] = rng.integers(0, cfg.vocab_size, v.shape)
    b, t = batch.reward.shape
    choice = batch.choice
    choice["action_type"][...] = rng.integers(0, 7, (b, t))
    choice["element"][...] = rng.integers(0, cfg.max_elements, (b, t))
    choice["word"][...] = rng.integers(0, cfg.max_instruction_tokens, (b, t))
    rows, steps = np.indices((b, t))
    batch.obs["elem_mask"][rows, steps, choice["element"]] = True  # every choice is one the policy could make
    batch.obs["instr_mask"][rows, steps, choice["word"]] = True
    choice["direction"][...] = rng.integers(0, 4, (b, t))
    batch.behavior_logp[...] = -rng.uniform(0.1, 3.0, (b, t))
    batch.reward[...] = rng.uniform(-0.1, 1.0, (b, t))
    batch.length[...] = rng.integers(1, t + 1, b)
    batch.terminal[...] = rng.random(b) < 0.5
    batch.weights[...] = rng.uniform(0.2, 1.0, b)
    return batch


def run_updates(cfg: ModelConfig, batch, algorithm: str, imitation: bool, updates: int):
    """`updates` updates from seed-0 parameters with the loss's default settings (entropy 0.01); returns
    (params, the last metrics as floats)."""
    policy = PointerPolicy(cfg)
    graphdef, params = policy.create(0)
    # Plain SGD after the clip, not the learner's Adam: a parameter's change is then linear in its gradient,
    # so float reassociation (another CPU, another XLA) moves the fingerprint by ~1e-8, while Adam turned
    # the sign of near-zero gradients into whole steps (3e-3 relative between two machines).
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
    opt_state = optimizer.init(params)
    loss = get_loss(algorithm)
    step = make_train_step(
        graphdef, optimizer, loss.imitation if imitation else loss.rl, LossParams(), policy.evaluate
    )
    metrics = {}
    for _ in range(updates):
        params, opt_state, metrics, _ = step(params, opt_state, batch)
    return params, {k: float(np.mean(v)) for k, v in metrics.items() if np.ndim(v) == 0}
