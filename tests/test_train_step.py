"""The jitted update: it learns on a finite batch and never lets a non-finite loss touch the parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import PointerPolicy
from common.policies.pointer import featurize
from common.policies.pointer import network as model
from learner.batch import example_batch
from learner.losses import LOSSES, LossParams
from learner.training.train_step import make_optimizer, make_train_step

CFG = ModelConfig(vocab_size=256, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)
EVALUATE = PointerPolicy(CFG).evaluate


def a2c_step(graphdef, optimizer, **kw):
    return make_train_step(graphdef, optimizer, LOSSES["a2c"].rl, LossParams(), EVALUATE, **kw)


def _setup(reward: float):
    graphdef, params = model.create(CFG, 0)
    optimizer = make_optimizer(1e-2, 1.0)
    opt_state = optimizer.init(params)
    step = a2c_step(graphdef, optimizer)
    batch = example_batch(
        featurize.feature_spec(CFG), 4, 3, choices=featurize.episode_spec(CFG, 0).choice_arrays()
    )
    batch.obs["instr_mask"][..., 0] = True
    batch.obs["elem_mask"][..., 0] = True
    batch.length[:] = 3
    batch.reward[:, -1] = reward
    batch.behavior_logp[:] = -1.0
    before = jax.tree.map(np.array, params_to_flat(params))
    return step, params, opt_state, batch, before


def test_finite_batch_updates_parameters():
    step, params, opt_state, batch, before = _setup(1.0)
    params, _, metrics, _ = step(params, opt_state, batch)
    after = params_to_flat(params)
    assert int(metrics["skipped_nonfinite"]) == 0
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_nonfinite_loss_is_skipped_and_parameters_stay():
    step, params, opt_state, batch, before = _setup(float("nan"))
    params, opt_state, metrics, _ = step(params, opt_state, batch)
    assert int(metrics["skipped_nonfinite"]) == 1
    after = params_to_flat(params)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(opt_state))


def test_learning_rate_follows_the_cosine_schedule():
    """With a constant gradient Adam's step is about the learning rate, so the step sizes trace the
    schedule: lr at first, lr * (f + (1 - f)(1 + cos(pi t / T)) / 2) at update t, f * lr from T on."""
    import jax.numpy as jnp
    import optax

    lr, decay, final = 0.1, 10, 0.2
    sizes = {}
    for updates in (0, decay):
        optimizer = make_optimizer(lr, max_grad_norm=1e9, decay_updates=updates, final_fraction=final)
        params = {"w": jnp.zeros(())}
        state = optimizer.init(params)
        steps = []
        for _ in range(decay + 3):
            update, state = optimizer.update({"w": jnp.ones(())}, state, params)
            params = optax.apply_updates(params, update)
            steps.append(-float(update["w"]))
        sizes[updates] = np.array(steps)
    np.testing.assert_allclose(sizes[0], lr, rtol=1e-3)  # constant
    t = np.arange(decay + 3)
    want = lr * (final + (1 - final) * 0.5 * (1 + np.cos(np.pi * np.minimum(t, decay) / decay)))
    np.testing.assert_allclose(sizes[decay], want, rtol=1e-3)
    # Both forms keep one state layout (checkpoints and eval build the optimizer without the schedule).
    layout = [
        jax.tree.structure(make_optimizer(lr, 1.0, decay_updates=d).init({"w": jnp.zeros(())}))
        for d in (0, 5)
    ]
    assert layout[0] == layout[1]


def test_the_instruction_filter_reaches_the_a_ride_actor_loss():
    """batch.keep (collate's default: all True) is the instruction-level filter of A-RIDE's loss."""
    graphdef, params = model.create(CFG, 0)
    optimizer = make_optimizer(1e-2, 1.0)
    step = make_train_step(graphdef, optimizer, LOSSES["aride"].rl, LossParams(), EVALUATE)
    _, _, _, batch, _ = _setup(1.0)
    kept = step(jax.tree.map(jnp.copy, params), optimizer.init(params), batch)[2]
    assert float(kept["actor_step_fraction"]) == 1.0 and float(kept["policy_loss"]) != 0.0
    batch.keep[:] = [True, False, False, False]
    one = step(jax.tree.map(jnp.copy, params), optimizer.init(params), batch)[2]
    assert float(one["actor_step_fraction"]) == 0.25
    batch.keep[:] = False
    none = step(jax.tree.map(jnp.copy, params), optimizer.init(params), batch)[2]
    assert float(none["actor_step_fraction"]) == 0.0 and float(none["policy_loss"]) == 0.0
    assert float(none["value_loss"]) == float(kept["value_loss"])  # the critic still learns from all


def test_update_scale_shrinks_the_step_and_keeps_the_optimizer_state():
    """update_scale (--rl-lr-scale) multiplies the applied step, not the gradient: the parameter change
    is exactly that fraction of the unscaled one, and Adam's moments come out the same."""
    graphdef, params = model.create(CFG, 0)
    optimizer = make_optimizer(1e-2, 1.0)
    _, _, _, batch, before = _setup(1.0)
    out = {}
    for scale in (1.0, 0.25):
        step = a2c_step(graphdef, optimizer, update_scale=scale)
        start = jax.tree.map(jnp.array, params)  # the step donates its inputs
        new, state, *_ = step(start, optimizer.init(start), batch)
        flat = params_to_flat(new)
        out[scale] = ({k: np.asarray(flat[k]) - before[k] for k in before}, jax.tree.leaves(state))
    moved = [k for k in before if np.abs(out[1.0][0][k]).max() > 0]
    assert moved
    for k in moved:
        np.testing.assert_allclose(out[0.25][0][k], 0.25 * out[1.0][0][k], rtol=1e-4, atol=1e-9)
    for a, b in zip(out[1.0][1], out[0.25][1], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_weight_decay_is_decoupled_and_real():
    """--weight-decay is AdamW's: on the first update (same gradient, same Adam step) the decayed run ends
    exactly lr * wd * theta further towards 0 than the plain one, for every parameter."""
    graphdef, params = model.create(CFG, 0)
    _, _, _, batch, before = _setup(1.0)
    lr, wd = 1e-2, 0.1
    out = {}
    for decay in (0.0, wd):
        optimizer = make_optimizer(lr, 1.0, weight_decay=decay)
        start = jax.tree.map(jnp.array, params)
        new, *_ = a2c_step(graphdef, optimizer)(start, optimizer.init(start), batch)
        out[decay] = params_to_flat(new)
    for k in before:
        np.testing.assert_allclose(out[wd][k], out[0.0][k] - lr * wd * before[k], rtol=1e-5, atol=1e-7)
    assert any(np.abs(before[k]).max() > 0.1 for k in before)  # the check has something to see
