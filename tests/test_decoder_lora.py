"""LoRA on the decoder (common/backbones/decoder/lora.py): fresh adapters (B = 0) leave the base's logits exactly;
the filters split adapters from base weights; after training-like changes to B, the merged plain decoder
equals the adapted one; gradients reach only what the ADAPTERS filter selects."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.backbones.decoder.lora import ADAPTERS, BASE, PROJECTIONS, LoraConfig, lora_delta
from common.backbones.decoder.weights import checkpoint_layout, load_folder, merge_lora, to_tensors
from tests.decoder_reference import VARIANTS, left_padded_batch, write_hf_folder
from tests.test_decoder_model import forward

CONFIG = VARIANTS["qwen2_bias"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_hf_folder(tmp_path_factory.mktemp("qwen2"), CONFIG)


def batch():
    return left_padded_batch(CONFIG["vocab_size"], [8, 5, 1], 8, seed=3)


def flat(state) -> dict:
    return {path: v.get_value() for path, v in nnx.to_flat_state(state)}


def randomize_b(model) -> None:
    """Stand-in for training: every B gets random values (A is random already)."""
    rng = np.random.default_rng(1)
    for _, variable in nnx.to_flat_state(nnx.state(model, ADAPTERS)):
        if variable.get_value().shape[0] == 4:  # B: [rank, d_out]
            variable.set_value(
                jnp.asarray(rng.standard_normal(variable.get_value().shape) * 0.3, jnp.float32)
            )


def test_fresh_adapters_leave_the_base_logits_exactly(folder):
    tokens, mask, positions = batch()
    _, base = load_folder(folder)
    _, adapted = load_folder(folder, lora=LoraConfig(rank=4))
    want, _ = forward(base, tokens, mask, positions)
    got, _ = forward(adapted, tokens, mask, positions)
    np.testing.assert_array_equal(got, want)


def test_filters_split_adapters_from_base_weights(folder):
    cfg, model = load_folder(folder, lora=LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj")))
    adapters, base = flat(nnx.state(model, ADAPTERS)), flat(nnx.state(model, BASE))
    assert set(base) == set(checkpoint_layout(cfg))  # every base weight, no adapter
    assert all(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(nnx.state(model, ADAPTERS)))
    want = {
        ("layers", n, part, proj, ab)
        for n in range(cfg.num_hidden_layers)
        for part, proj in (("self_attn", "q_proj"), ("self_attn", "v_proj"), ("mlp", "down_proj"))
        for ab in ("lora_a", "lora_b")
    }
    assert set(adapters) == want
    a, b = (
        adapters[("layers", 0, "self_attn", "q_proj", "lora_a")],
        adapters[("layers", 0, "self_attn", "q_proj", "lora_b")],
    )
    assert a.shape == (32, 4) and b.shape == (4, 32) and not b.any() and a.std() > 0
    # plain nnx.Param would take the adapters too (LoRAParam subclasses it): why BASE exists
    assert len(flat(nnx.state(model, nnx.Param))) == len(base) + len(adapters)


def test_merged_equals_unmerged_after_b_changes(folder):
    tokens, mask, positions = batch()
    _, base = load_folder(folder)
    _, model = load_folder(folder, lora=LoraConfig(rank=4, alpha=8.0))
    randomize_b(model)
    unmerged, _ = forward(model, tokens, mask, positions)
    base_logits, _ = forward(base, tokens, mask, positions)
    assert np.abs(unmerged - base_logits)[mask].max() > 1e-2  # the adapters do something
    merged_model = merge_lora(model)
    assert merged_model.lora is None and not flat(nnx.state(merged_model, ADAPTERS))
    merged, _ = forward(merged_model, tokens, mask, positions)
    np.testing.assert_allclose(merged[mask], unmerged[mask], atol=1e-4, rtol=1e-5)
    exported = to_tensors(model)  # merges first
    np.testing.assert_array_equal(
        exported["model.layers.1.mlp.up_proj.weight"],
        to_tensors(merged_model)["model.layers.1.mlp.up_proj.weight"],
    )


def test_gradients_reach_only_the_adapters(folder):
    tokens, mask, positions = batch()
    _, model = load_folder(folder, lora=LoraConfig(rank=4, targets=("o_proj",)))

    def loss(model):
        logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1))

    grads = flat(nnx.jit(nnx.grad(loss, argnums=nnx.DiffState(0, ADAPTERS)))(model))
    assert {path[-1] for path in grads} == {"lora_a", "lora_b"} and len(grads) == 4
    # with B = 0, only B moves first (A's gradient is A's contribution times B)
    assert all(np.abs(g).max() > 0 for p, g in grads.items() if p[-1] == "lora_b")
    assert all(not np.asarray(g).any() for p, g in grads.items() if p[-1] == "lora_a")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"rank": 0}, "positive integer"),
        ({"rank": 4, "alpha": 0.0}, "alpha must be positive"),
        ({"rank": 4, "targets": ("q_proj", "lm_head")}, "subset of"),
        ({"rank": 4, "targets": ()}, "non-empty"),
    ],
)
def test_bad_lora_configs_are_refused(kwargs, says):
    with pytest.raises(ValueError, match=says):
        LoraConfig(**kwargs)
    assert set(PROJECTIONS) == set(LoraConfig(rank=2).targets)


def test_the_adapter_delta_s_gradient_is_the_plain_one():
    """lora_delta writes its gradient out (so XLA:CPU transposes the thin factors, not the activations):
    against a float64 numpy reference of d/dx, d/da, d/db of sum(w * (x a) b), batched tokens [2, 5, d]."""
    rng = np.random.default_rng(4)
    x, a, b, w = (rng.standard_normal(s) for s in ((2, 5, 6), (6, 3), (3, 7), (2, 5, 7)))
    grads = jax.grad(
        lambda x, a, b: jnp.sum(jnp.asarray(w, jnp.float32) * lora_delta(x, a, b)), argnums=(0, 1, 2)
    )(*(jnp.asarray(t, jnp.float32) for t in (x, a, b)))
    gb = w @ b.T  # [2, 5, 3]
    want = (gb @ a.T, np.einsum("tnr,tni->ir", gb, x), np.einsum("tni,ir,tno->ro", x, a, w))
    for got, ref in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lora_delta(x, a, b)), x @ a @ b, rtol=1e-5, atol=1e-5)
