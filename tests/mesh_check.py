"""Checks of learner.training.mesh on 8 forced CPU devices; run by tests/test_mesh.py as a subprocess.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python -m tests.mesh_check

The device count must be set before jax initializes, hence the separate process. Prints one JSON object
(the last line of stdout) that the test asserts on.

The optimizer is the learner's (global-norm clipping + AdamW, the same state layout) but with Adam's
eps at 1e-3 instead of 1e-8: some gradients are analytically zero (the attention key bias: softmax is
shift-invariant) and numerically float noise, which Adam with a tiny eps scales up to about the learning
rate, so any change of summation order (as sharding makes) would move those parameters by up to 1e-3.
"""

from __future__ import annotations

import json
import math
import time

import jax
import numpy as np
import optax

from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import PointerPolicy
from common.policies.pointer import featurize
from common.policies.pointer import network as model
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS
from learner.batch import Batch, example_batch
from learner.losses import LOSSES as REGISTRY
from learner.losses import LossParams
from learner.training import mesh as M
from learner.training import sharding as S
from learner.training.sharded_step import make_sharded_train_step
from learner.training.train_step import make_train_step

TINY = ModelConfig(vocab_size=512, d_model=32, num_heads=4, num_layers=1, mlp_dim=128)
BATCH, MAX_STEPS, STEPS = 8, 4, 2
# (data, model, param_sharding, loss): the actor-critic loss everywhere, and A-RIDE (the loss the learner
# trains with, whose metrics include [B] replay priorities) on the 2-D FSDP + tensor-parallel layout.
LAYOUTS = [
    (1, 1, "replicated", "actor_critic"),
    (8, 1, "replicated", "actor_critic"),
    (8, 1, "fsdp", "actor_critic"),
    (4, 2, "model", "actor_critic"),
    (4, 2, "fsdp", "aride"),
]
LOSSES = {"actor_critic": REGISTRY["a2c"].rl, "aride": REGISTRY["aride"].rl}


def loss_args(loss: str, cfg: ModelConfig = TINY) -> tuple:
    """(loss function, its params, the pointer policy's evaluate): what make_train_step takes after the
    optimizer."""
    return LOSSES[loss], LossParams(), PointerPolicy(cfg).evaluate


def random_batch(cfg: ModelConfig, seed: int) -> Batch:
    """example_batch's shapes filled with random valid values (chosen arguments point at valid slots)."""
    rng = np.random.default_rng(seed)
    # (the choices need no WordPiece bound: any >= 1 will do for a config with a text encoder)
    choices = featurize.episode_spec(cfg, 1).choice_arrays()
    b = example_batch(featurize.feature_spec(cfg), BATCH, MAX_STEPS, choices=choices)
    obs = b.obs
    obs["instr_tokens"][:] = rng.integers(0, cfg.vocab_size, obs["instr_tokens"].shape)
    obs["instr_mask"][:] = rng.random(obs["instr_mask"].shape) < 0.7
    obs["instr_feats"][:] = rng.standard_normal(obs["instr_feats"].shape)
    obs["elem_tokens"][:] = rng.integers(0, cfg.vocab_size, obs["elem_tokens"].shape)
    obs["elem_mask"][:] = rng.random(obs["elem_mask"].shape) < 0.7
    obs["elem_feats"][:] = rng.standard_normal(obs["elem_feats"].shape)
    shape = (BATCH, MAX_STEPS)
    c = b.choice
    c["action_type"][:] = rng.integers(0, NUM_ACTION_TYPES, shape)
    c["element"][:] = rng.integers(0, cfg.max_elements, shape)
    c["word"][:] = rng.integers(0, cfg.max_instruction_tokens, shape)
    c["direction"][:] = rng.integers(0, NUM_SWIPE_DIRECTIONS, shape)
    bi, ti = np.meshgrid(np.arange(BATCH), np.arange(MAX_STEPS), indexing="ij")
    obs["elem_mask"][bi, ti, c["element"]] = True
    obs["instr_mask"][bi, ti, c["word"]] = True
    b.behavior_logp[:] = -rng.random(shape) * 3
    b.reward[:] = rng.standard_normal(shape)
    b.length[:] = rng.integers(1, MAX_STEPS + 1, BATCH)
    b.terminal[:] = rng.random(BATCH) < 0.5
    b.weights[:] = rng.uniform(0.5, 1.5, BATCH)  # replay importance weights
    return b


def run_steps(step, params, opt_state, batches, place=lambda b: b):
    """-> (params, opt_state, [every metric of every step as host arrays])."""
    history = []
    for batch in batches:
        params, opt_state, metrics, terms = step(params, opt_state, place(batch))
        if terms is not None:
            metrics = {**metrics, **{f"priority_{k}": v for k, v in terms._asdict().items()}}
        history.append({k: np.asarray(v, np.float64) for k, v in metrics.items()})
    return params, opt_state, history


def metric_diff(got: list[dict], want: list[dict]) -> float:
    """Largest difference over all metrics (scalars and [B] priorities), relative above magnitude 1."""
    assert [set(g) for g in got] == [set(w) for w in want]
    return max(
        float(np.max(np.abs(g[k] - w[k]) / np.maximum(1.0, np.abs(w[k]))))
        for g, w in zip(got, want, strict=True)
        for k in w
    )


def divisor(axes, mesh_shape: dict[str, int]) -> int:
    """How many shards a dim gets: a spec entry is None, an axis name or a list of names."""
    names = [] if axes is None else [axes] if isinstance(axes, str) else axes
    return math.prod(mesh_shape[a] for a in names)


def spec_of(x) -> list:
    return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]


def check_layout(data, model_axis, mode, loss, graphdef, optimizer, batches, ref) -> dict:
    mesh = M.make_mesh(M.MeshConfig(data=data, model=model_axis, param_sharding=mode))
    _, params = model.create(TINY, 0)
    specs = S.param_specs(params, mesh, mode)
    params = S.shard_params(params, mesh, specs)
    opt_state = S.init_opt_state(optimizer, params, mesh, specs)
    first_leaf = jax.tree.leaves(params)[0]
    step = make_sharded_train_step(graphdef, optimizer, *loss_args(loss), mesh, specs)
    t0 = time.perf_counter()
    new_params, new_opt, history = run_steps(
        step, params, opt_state, batches, lambda b: S.shard_batch(b, mesh)
    )
    elapsed = time.perf_counter() - t0
    flat = params_to_flat(new_params)
    diff = max(float(np.max(np.abs(flat[k] - ref["params"][k]))) for k in flat)

    named = dict(
        zip(
            [S.param_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_params)[0]],
            jax.tree.leaves(new_params),
            strict=True,
        )
    )
    sharded = {}
    for name, x in named.items():
        spec = spec_of(x)
        if not any(spec):
            continue
        mesh_shape = dict(mesh.shape)
        padded = [*spec, *[None] * (x.ndim - len(spec))]
        expected = [n // divisor(axes, mesh_shape) for n, axes in zip(x.shape, padded, strict=True)]
        sharded[name] = {
            "spec": spec,
            "shape": list(x.shape),
            "shard_shapes": sorted({tuple(s.data.shape) for s in x.addressable_shards}),
            "expected_shard_shape": expected,
        }
    # Adam's moments must sit where their parameter sits.
    adam = new_opt[1][0]
    moments_follow = all(
        mu.sharding == p.sharding and nu.sharding == p.sharding
        for mu, nu, p in zip(
            jax.tree.leaves(adam.mu), jax.tree.leaves(adam.nu), jax.tree.leaves(new_params), strict=True
        )
    )
    return {
        "mesh": [data, model_axis],
        "mode": mode,
        "loss": loss,
        "losses": [float(m["loss"]) for m in history],
        "ref_losses": [float(m["loss"]) for m in ref["history"]],
        "max_metric_diff": metric_diff(history, ref["history"]),
        "metric_keys": sorted(history[0]),
        "max_param_diff": diff,
        "sharded": {
            k: {**v, "shard_shapes": [list(s) for s in v["shard_shapes"]]} for k, v in sharded.items()
        },
        "moments_follow_params": moments_follow,
        "count_replicated": str(adam.count.sharding.spec),
        "donated": first_leaf.is_deleted(),
        "seconds": elapsed,
    }


def check_text_encoder(optimizer) -> dict:
    """The fine-tuned text encoder inside the A-RIDE step on the ('data' 4, 'model' 2) FSDP mesh, against
    the unsharded step: a tiny random BERT checkpoint (tests/test_bert_sharding.py's shape) in a policy
    with --model.train-text-encoder, batches with renamed (other) WordPiece ids in the acted observations,
    so the second, gradient-free encoding runs too. Also reports each encoder parameter's spec next to
    bert.partition_specs' (the encoder's own logical axis names)."""
    import tempfile
    from pathlib import Path

    from common.backbones import bert
    from common.policies.pointer import text_encoder
    from tests.test_bert_encoder import random_tensors, write_checkpoint
    from tests.test_bert_sharding import SHARD_CONFIG
    from tests.test_text_encoder import write_tokenizer

    folder = write_checkpoint(Path(tempfile.mkdtemp()) / "enc", SHARD_CONFIG, random_tensors(SHARD_CONFIG))
    write_tokenizer(folder)
    cfg = text_encoder.resolve(
        ModelConfig(
            **{
                **TINY.to_dict(),
                "text_encoder": str(folder),
                "train_text_encoder": True,
                "max_instruction_pieces": 12,  # the tiny checkpoint has 16 positions
                "max_element_pieces": 5,
            },
        )
    )
    rng = np.random.default_rng(7)
    batches = []
    for seed in range(STEPS):
        b = random_batch(cfg, seed)
        lp = cfg.max_instruction_pieces
        b.obs["instr_wp"][:] = rng.integers(1, SHARD_CONFIG["vocab_size"], b.obs["instr_wp"].shape)
        b.obs["instr_wp"][..., lp // 2 :] = 0  # padding
        slots = np.minimum(np.arange(lp) // 2, cfg.max_instruction_tokens - 1)
        b.obs["instr_wp_word"][:] = np.where(b.obs["instr_wp"] != 0, slots, -1)
        b.obs["elem_wp"][:] = rng.integers(0, SHARD_CONFIG["vocab_size"], b.obs["elem_wp"].shape)
        acted = {**b.obs, "elem_wp": np.roll(b.obs["elem_wp"], 1, axis=0)}  # other pieces: renamed
        batches.append(b._replace(acted_obs=acted))
    graphdef, params = model.create(cfg, 0)
    ref_step = make_train_step(graphdef, optimizer, *loss_args("aride", cfg))
    ref_params, _, ref_history = run_steps(ref_step, params, optimizer.init(params), batches)
    ref_flat = params_to_flat(ref_params)
    _, init = model.create(cfg, 0)
    init_flat = params_to_flat(init)
    mesh = M.make_mesh(M.MeshConfig(data=4, model=2, param_sharding="fsdp"))
    _, params = model.create(cfg, 0)
    specs = S.param_specs(params, mesh, "fsdp")
    params = S.shard_params(params, mesh, specs)
    opt_state = S.init_opt_state(optimizer, params, mesh, specs)
    step = make_sharded_train_step(graphdef, optimizer, *loss_args("aride", cfg), mesh, specs)
    new_params, _, history = run_steps(step, params, opt_state, batches, lambda b: S.shard_batch(b, mesh))
    flat = params_to_flat(new_params)
    encoder_names = [k for k in flat if k.startswith("text/encoder/")]
    want_specs = bert.partition_specs(new_params["text"]["encoder"], mesh)
    want = {
        f"text/encoder/{S.param_name(p)}": [a for a in spec]
        for p, spec in jax.tree_util.tree_flatten_with_path(want_specs)[0]
    }
    named = dict(
        zip(
            [S.param_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_params)[0]],
            jax.tree.leaves(new_params),
            strict=True,
        )
    )
    return {
        "losses": [float(m["loss"]) for m in history],
        "ref_losses": [float(m["loss"]) for m in ref_history],
        "max_metric_diff": metric_diff(history, ref_history),
        "max_param_diff": max(float(np.max(np.abs(flat[k] - ref_flat[k]))) for k in flat),
        "encoder_change": max(float(np.max(np.abs(ref_flat[k] - init_flat[k]))) for k in encoder_names),
        "encoder_specs": {k: spec_of(named[k]) for k in encoder_names},
        "logical_specs": want,
        "split_encoder_params": sum(any(spec_of(named[k])) for k in encoder_names),
    }


def check_errors() -> dict:
    errors = {}
    cases = {
        "data3": lambda: M.make_mesh(M.MeshConfig(data=3)),
        "model3": lambda: M.make_mesh(M.MeshConfig(model=3)),
        "data16": lambda: M.make_mesh(M.MeshConfig(data=16)),
        "data4_model4": lambda: M.make_mesh(M.MeshConfig(data=4, model=4)),
        "bad_mode": lambda: M.MeshConfig(param_sharding="tensor"),
        "batch6_on_data4": lambda: S.shard_batch(
            example_batch(
                featurize.feature_spec(TINY),
                6,
                MAX_STEPS,
                choices=featurize.episode_spec(TINY, 0).choice_arrays(),
            ),
            M.make_mesh(M.MeshConfig(data=4)),
        ),
    }
    for name, fn in cases.items():
        try:
            fn()
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    return errors


def main() -> None:
    assert len(jax.devices()) == 8, jax.devices()
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, eps=1e-3))
    batches = [random_batch(TINY, seed) for seed in range(STEPS)]
    graphdef, init_params = model.create(TINY, 0)
    init_flat = params_to_flat(init_params)
    refs, moved = {}, {}
    for loss in sorted({layout[3] for layout in LAYOUTS}):
        _, params = model.create(TINY, 0)
        ref_step = make_train_step(graphdef, optimizer, *loss_args(loss))  # the unsharded step
        params, _, history = run_steps(ref_step, params, optimizer.init(params), batches)
        refs[loss] = {"params": params_to_flat(params), "history": history}
        moved[loss] = max(float(np.max(np.abs(refs[loss]["params"][k] - init_flat[k]))) for k in init_flat)
    layouts = [check_layout(*layout, graphdef, optimizer, batches, refs[layout[3]]) for layout in LAYOUTS]
    result = {
        "devices": len(jax.devices()),
        "ref_param_change": moved,
        "layouts": layouts,
        "errors": check_errors(),
        "text_encoder": check_text_encoder(optimizer),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
