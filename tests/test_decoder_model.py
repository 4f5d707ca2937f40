"""The Llama-family decoder (common/backbones/decoder/llama.py) against the float64 numpy reference of
tests/decoder_reference.py, on tiny random Hugging Face folders of each kind: Llama with tied embeddings,
Qwen2 with q/k/v biases and a separate head, Qwen3 with per-head q/k norms and head_dim != hidden / heads,
and Llama 3's RoPE scaling. Also: left-padded rows, KV-cached decoding equal to the full pass, bfloat16."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.backbones.decoder import llama
from common.backbones.decoder.weights import load_folder
from tests.decoder_reference import (
    VARIANTS,
    left_padded_batch,
    random_hf_tensors,
    reference_logits,
    write_hf_folder,
)

LENGTHS = [8, 5, 1]
"""Real tokens per row of the test batch (one full row, one left-padded, one a single token)."""


@nnx.jit
def _run(model, tokens, positions, mask, cache):
    return model(tokens, positions, mask, cache)


def forward(model: llama.Decoder, tokens, mask, positions, cache=None):
    """One jitted call (the way generation runs it; compiled once per config and shape), logits as numpy."""
    logits, cache = _run(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), cache)
    return np.asarray(logits), cache


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (config dict, tensors, folder)."""
    out = {}
    for seed, (name, config) in enumerate(VARIANTS.items()):
        tensors = random_hf_tensors(config, seed)
        out[name] = (config, tensors, write_hf_folder(tmp_path_factory.mktemp(name), config, tensors))
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_the_float64_reference(checkpoints, variant):
    config, tensors, folder = checkpoints[variant]
    _, model = load_folder(folder)
    tokens, mask, positions = left_padded_batch(config["vocab_size"], LENGTHS, 8, seed=3)
    logits, cache = forward(model, tokens, mask, positions)
    want = reference_logits(config, tensors, tokens, mask)
    assert cache is None and logits.dtype == np.float32 and logits.shape == (3, 8, config["vocab_size"])
    assert np.isfinite(logits).all()  # padded queries too
    np.testing.assert_allclose(logits[mask], want[mask], atol=1e-4, rtol=1e-5)


def test_left_padding_does_not_change_a_rows_logits(checkpoints):
    """The padded row's real tokens give the logits they give alone, unpadded (mask and positions work)."""
    config, _, folder = checkpoints["qwen2_bias"]
    _, model = load_folder(folder)
    tokens, mask, positions = left_padded_batch(config["vocab_size"], LENGTHS, 8, seed=3)
    padded, _ = forward(model, tokens, mask, positions)
    alone, _ = forward(model, tokens[1:2, 3:], mask[1:2, 3:], positions[1:2, 3:])
    np.testing.assert_allclose(padded[1, 3:], alone[0], atol=1e-5)


def test_llama3_scaling_changes_the_frequencies_as_the_reference_does(checkpoints):
    from tests.decoder_reference import reference_inv_freq

    config = VARIANTS["llama3_scaled"]
    cfg = load_folder(checkpoints["llama3_scaled"][2])[0]
    got = llama.rope_frequencies(cfg)
    np.testing.assert_allclose(got, reference_inv_freq(config), rtol=1e-6)
    plain = reference_inv_freq({**config, "rope_scaling": None})
    kept, scaled = np.isclose(got, plain), np.isclose(got, plain / 8)
    assert kept.sum() == 1 and scaled.sum() == 5 and (~kept & ~scaled).sum() == 2  # all three cases


def test_kv_cached_decoding_equals_the_full_pass(checkpoints):
    """Prefill 2 columns, then 2 more, then one at a time, into a cache with spare slots: every step's
    logits equal the full pass's at the real positions, and the cache's bookkeeping is the contract's."""
    config, _, folder = checkpoints["qwen3_qknorm"]
    cfg, model = load_folder(folder)
    tokens, mask, positions = left_padded_batch(config["vocab_size"], LENGTHS, 8, seed=5)
    full, _ = forward(model, tokens, mask, positions)
    cache = llama.init_cache(cfg, batch=3, max_len=11)
    steps = []
    for start, stop in [(0, 2), (2, 4), (4, 5), (5, 6), (6, 7), (7, 8)]:
        part = slice(start, stop)
        logits, cache = forward(model, tokens[:, part], mask[:, part], positions[:, part], cache)
        steps.append(logits)
        assert int(cache.end) == stop
    cached = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(cached[mask], full[mask], atol=2e-5)
    assert np.isfinite(cached).all()
    want_valid = np.concatenate([mask, np.zeros((3, 3), bool)], axis=1)
    np.testing.assert_array_equal(np.asarray(cache.valid), want_valid)
    assert cache.keys.shape == (2, 3, 11, cfg.num_key_value_heads, cfg.head_dim)


def test_bfloat16_parameters_run_in_bfloat16_and_stay_close(checkpoints):
    config, _, folder = checkpoints["qwen3_qknorm"]
    _, model32 = load_folder(folder)
    cfg, model16 = load_folder(folder, param_dtype=jnp.bfloat16)
    dtypes = {v.get_value().dtype for _, v in nnx.to_flat_state(nnx.state(model16))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    tokens, mask, positions = left_padded_batch(config["vocab_size"], LENGTHS, 8, seed=3)
    want, _ = forward(model32, tokens, mask, positions)
    got, _ = forward(model16, tokens, mask, positions)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    err = np.abs(got[mask] - want[mask]).max() / np.abs(want[mask]).max()
    assert 0 < err < 0.05, err  # bfloat16's 8-bit mantissa, not float32's exactness
    cache = llama.init_cache(cfg, 3, 8, jnp.bfloat16)
    cached, _ = forward(model16, tokens, mask, positions, cache)
    assert np.abs(cached[mask] - got[mask]).max() / np.abs(want[mask]).max() < 0.05


def test_bad_inputs_are_refused(checkpoints):
    cfg, model = load_folder(checkpoints["llama_tied"][2])
    tokens, mask, positions = left_padded_batch(64, [3, 2], 4)
    with pytest.raises(ValueError, match="must all be"):
        model(jnp.asarray(tokens), jnp.asarray(positions[:, :3]), jnp.asarray(mask))
    with pytest.raises(ValueError, match="cannot take"):
        model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), llama.init_cache(cfg, 2, 3))
