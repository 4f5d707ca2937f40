"""Checkpoints: a resumed run takes exactly the steps an uninterrupted one takes; bad checkpoints fail loudly."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from common import featurize, model
from common.config import ModelConfig
from learner.algorithm import LossConfig
from learner.batch import example_batch
from learner.checkpoint import Checkpointer, TrainState, rng_state, set_rng_state
from learner.train_step import make_optimizer, make_train_step

CFG = ModelConfig(vocab_size=256, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)


def _batch(rng: np.random.Generator) -> dict:
    batch = example_batch(featurize.feature_spec(CFG), 4, 3)
    batch["obs"]["instr_tokens"][:] = rng.integers(1, 256, batch["obs"]["instr_tokens"].shape)
    batch["obs"]["instr_mask"][:] = True
    batch["obs"]["elem_mask"][..., :3] = True
    batch["obs"]["elem_feats"][:] = rng.random(batch["obs"]["elem_feats"].shape)
    batch["length"][:] = rng.integers(1, 4, 4)
    batch["reward"][:] = rng.random((4, 3)) < 0.3
    batch["behavior_logp"][:] = -rng.random((4, 3))
    batch["action_type"][:] = rng.integers(0, 7, (4, 3))
    return batch


def _fresh():
    graphdef, params = model.create(CFG, 0)
    optimizer = make_optimizer(1e-2, 1.0)
    return make_train_step(graphdef, optimizer, LossConfig()), params, optimizer.init(params)


def test_resume_matches_an_uninterrupted_run(tmp_path):
    step, params, opt_state = _fresh()
    rng = np.random.default_rng(5)
    for _ in range(6):
        params, opt_state, _ = step(params, opt_state, _batch(rng))
    want = model.params_to_flat(params)

    step, params, opt_state = _fresh()
    rng = np.random.default_rng(5)
    for _ in range(3):
        params, opt_state, _ = step(params, opt_state, _batch(rng))
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(TrainState(params, opt_state, 3, 1, rng_state(rng)), {"model": CFG.to_dict()})
    ckpt.close()

    step, template_params, template_opt = _fresh()
    restored = Checkpointer(tmp_path / "ckpt").restore(
        TrainState(template_params, template_opt, 0, 0, rng_state(np.random.default_rng())), CFG.to_dict()
    )
    assert (restored.update, restored.policy_version) == (3, 1)
    rng = np.random.default_rng(0)
    set_rng_state(rng, restored.rng)
    params, opt_state = restored.params, restored.opt_state
    for _ in range(3):
        params, opt_state, _ = step(params, opt_state, _batch(rng))
    got = model.params_to_flat(params)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_bad_checkpoints_are_refused(tmp_path):
    _, params, opt_state = _fresh()
    template = TrainState(params, opt_state, 0, 0, rng_state(np.random.default_rng()))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Checkpointer(tmp_path / "empty").restore(template, CFG.to_dict())
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(dataclasses.replace(template, update=1), {"model": CFG.to_dict()})
    ckpt.close()
    other = dataclasses.replace(CFG, d_model=32).to_dict()
    with pytest.raises(ValueError, match="written for model"):
        Checkpointer(tmp_path / "ckpt").restore(template, other)
    assert jax.tree.leaves(params)  # nothing was consumed or overwritten
