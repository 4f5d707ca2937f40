"""The learner's train step on parameters that hold LoRA adapters (learner/training/train_step.py `split_trained`):
only the adapters are differentiated and updated, the base stays bit for bit, and the optimizer state
covers the adapters alone (Adam's moments: the adapters' size, not the base's); the sharded step
(learner/training/mesh.py) does the same. Without adapters nothing changes (the rest of the suite).

The policy here is a tiny decoder whose "choice" is the next token: the evaluation's log-prob is the
decoder's log-softmax at that token, so the token-level loss of the LM family (issue 32) is what moves."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.llama import Decoder
from common.backbones.decoder.lora import LoraConfig, split_trained
from common.policies import Evaluation
from learner.losses.base import LossOutput, LossParams
from learner.training import mesh as M
from learner.training import sharding as S
from learner.training.sharded_step import make_sharded_train_step
from learner.training.train_step import make_optimizer, make_train_step
from tests.decoder_reference import VARIANTS


class TokenBatch(NamedTuple):
    """The fields the step reads of a Batch, for a next-token choice."""

    obs: dict[str, Any]
    choice: dict[str, Any]
    acted_obs: Any


def evaluate(graphdef, params, obs, choice, acted_obs) -> Evaluation:
    model = nnx.merge(graphdef, params)
    tokens = obs["tokens"]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits, _ = model(tokens, positions, jnp.ones(tokens.shape, bool))
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), choice["token"][..., None], axis=-1)[..., 0]
    zeros = jnp.zeros_like(logp)
    return Evaluation(logp, zeros, jnp.zeros((*logp.shape[:-1], logp.shape[-1] + 1)), logp)


def nll(evaluation: Evaluation, batch, params: LossParams) -> LossOutput:
    loss = -evaluation.logp.mean()
    return LossOutput(loss, {"loss": loss}, None)


def setup():
    cfg = DecoderConfig.from_dict(VARIANTS["llama_tied"], where="test")
    graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0), lora=LoraConfig(rank=2)))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (4, 6)), jnp.int32)
    batch = TokenBatch({"tokens": tokens}, {"token": jnp.roll(tokens, -1, axis=1)}, None)
    return graphdef, params, batch


def sizes(tree) -> int:
    return sum(x.size for x in jax.tree.leaves(tree))


def adapter_size(params) -> int:
    """Computed here, not by the code under test."""
    return sizes(nnx.split_state(params, nnx.LoRAParam, ...)[0])


def test_only_the_adapters_train_and_hold_optimizer_state():
    graphdef, params, batch = setup()
    adapters, base = split_trained(params)
    assert base is not None and sizes(adapters) < sizes(base) / 5
    before = jax.tree.map(np.asarray, params)
    optimizer = make_optimizer(1e-2, 1.0)
    opt_state = optimizer.init(adapters)
    step = make_train_step(graphdef, optimizer, nll, LossParams(), evaluate)
    losses = []
    for _ in range(3):
        params, opt_state, metrics, _ = step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0]  # it learns, through the adapters alone
    after_adapters, after_base = split_trained(params)
    for old, new in zip(jax.tree.leaves(split_trained(before)[1]), jax.tree.leaves(after_base), strict=True):
        np.testing.assert_array_equal(old, np.asarray(new))
    moved = [
        np.abs(np.asarray(n) - o).max()
        for o, n in zip(
            jax.tree.leaves(split_trained(before)[0]), jax.tree.leaves(after_adapters), strict=True
        )
    ]
    assert min(moved) > 0  # every adapter matrix, A and B alike, moved
    assert (
        sizes(opt_state) < 3 * adapter_size(params) + 10
    )  # two Adam moments (and counts) of the adapters only


def test_the_sharded_step_trains_the_adapters_alone_too():
    graphdef, params, batch = setup()
    mesh = M.make_mesh(M.MeshConfig(data=1, model=1))
    specs = S.param_specs(params, mesh, "fsdp")
    optimizer = optax.adam(1e-2)
    placed = S.shard_params(params, mesh, specs)
    opt_state = S.init_opt_state(optimizer, placed, mesh, specs)
    assert sizes(opt_state) < 3 * adapter_size(params) + 10
    step = make_sharded_train_step(graphdef, optimizer, nll, LossParams(), evaluate, mesh, specs)
    plain = make_train_step(graphdef, optimizer, nll, LossParams(), evaluate)
    want, _, _, _ = plain(jax.tree.map(jnp.array, params), optimizer.init(split_trained(params)[0]), batch)
    got, _, _, _ = step(placed, opt_state, batch)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
