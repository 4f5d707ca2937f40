"""The preamble every lm prompt starts with, computed once per update (packing.share_prefix, the decoder's
`prefix`): cutting it from the rows and running it as one shared row gives the same log-probs, values,
loss, gradients and priorities as the whole rows, with the frozen trunk recomputed or cached; a batch with
a prompt that does not start with it is left whole.

The batch and tiny decoder (2 blocks, LoRA on the top one) are tests/test_lm_trunk.py's; the reference is
the packed update without the cut, which tests/test_lm_packing.py checks against the padded layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.backbones.decoder.llama import SharedPrefix
from common.backbones.decoder.lora import split_trained
from common.params_file import params_to_flat
from common.policies.lm import packing
from common.policies.lm.family import PROMPT_QUANTUM
from common.policies.lm.network import prompt_layout
from common.policies.lm.trunk import TrunkCache
from learner.losses import LOSSES, LossParams
from learner.training.train_step import make_optimizer, make_train_step
from tests.test_lm_trunk import LENGTHS, TOL, _evaluate, batch, lm  # noqa: F401 (fixtures)


def test_rows_after_a_shared_prefix_equal_the_whole_rows(lm):  # noqa: F811
    """Decoder.states of rows without their common first P tokens, given them as a SharedPrefix, equals
    the whole rows' states on the rest (with the trunk recomputed and from Decoder.trunk)."""
    _, graphdef, params = lm
    decoder = nnx.merge(graphdef, params).decoder
    rng = np.random.default_rng(3)
    p, n = 9, 30
    head = rng.integers(1, 1000, p)
    ids = np.concatenate([np.broadcast_to(head, (3, p)), rng.integers(1, 1000, (3, n - p))], axis=1)
    lengths = np.array([30, 20, 12])  # left-padded: row i's real tokens are its last lengths[i]
    for i, m in enumerate(lengths):
        ids[i, n - m : n - m + p] = head
        ids[i, : n - m] = 0
    mask, positions = prompt_layout(jnp.asarray(lengths), n)
    whole, _ = decoder.states(jnp.asarray(ids, jnp.int32), positions, mask)
    rest_mask, rest_positions = prompt_layout(jnp.asarray(lengths - p), n)
    rest = jnp.asarray(np.where(rest_mask, ids, 0), jnp.int32)
    shared, _ = decoder.states(rest, rest_positions + p, rest_mask, prefix=SharedPrefix(jnp.asarray(head)))
    real = np.asarray(rest_mask)
    np.testing.assert_allclose(np.asarray(shared)[real], np.asarray(whole)[real], atol=1e-5)
    trunk = decoder.trunk(rest, rest_positions + p, rest_mask)  # wrong for the rows: they need the prefix
    full_trunk = decoder.trunk(jnp.asarray(ids, jnp.int32), positions, mask)
    prefix_trunk = full_trunk[0, :p]
    cut = jnp.where(rest_mask[..., None], full_trunk, 0.0)
    with_trunk, _ = decoder.states(
        rest, rest_positions + p, rest_mask, trunk=cut, prefix=SharedPrefix(jnp.asarray(head), prefix_trunk)
    )
    np.testing.assert_allclose(np.asarray(with_trunk)[real], np.asarray(whole)[real], atol=1e-5)
    assert not np.allclose(np.asarray(trunk)[real], np.asarray(cut)[real], atol=1e-3)  # the prefix matters
    with pytest.raises(ValueError, match="shared prefix"):
        decoder.states(rest, rest_positions + p, rest_mask, trunk=cut, prefix=SharedPrefix(jnp.asarray(head)))


def _shared(lm, batch, cached: bool):  # noqa: F811
    policy, graphdef, params = lm
    """(the packed observations, the same with the trunk from the cache when `cached` and the preamble cut)."""
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    source = TrunkCache(graphdef, 2**30).add(packed, batch.choice, params) if cached else packed
    return packed, packing.share_prefix(source, policy.prompts.preamble, PROMPT_QUANTUM)


@pytest.mark.parametrize("cached", [False, True])
def test_scores_with_the_prefix_cut_equal_the_whole_rows(lm, batch, cached):  # noqa: F811
    policy, _, _ = lm
    packed, shared = _shared(lm, batch, cached)
    p = len(policy.prompts.preamble)
    assert p > 20 and shared["prefix_ids"].shape == (len(LENGTHS), p)
    assert np.array_equal(
        shared["prompt_length"], np.where(packed["prompt_length"] > 0, packed["prompt_length"] - p, 0)
    )
    assert shared["prompt_ids"].shape[-1] <= packed["prompt_ids"].shape[-1]
    want, got = _evaluate(lm, packed, batch.choice), _evaluate(lm, shared, batch.choice)
    for name in ("logp", "entropy", "values", "ratio_logp"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=TOL, err_msg=name)
    assert np.abs(want.values).max() > 0


def test_a_prompt_without_the_preamble_leaves_the_batch_whole(lm, batch):  # noqa: F811
    policy, _, _ = lm
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    foreign = {**packed, "prompt_ids": packed["prompt_ids"].copy()}
    row = packed["prompt_ids"][1, 0]
    foreign["prompt_ids"][1, 0, row.shape[-1] - packed["prompt_length"][1, 0]] += 1  # its first id
    assert packing.share_prefix(foreign, policy.prompts.preamble, PROMPT_QUANTUM) is foreign
    assert packing.share_prefix(packed, policy.prompts.preamble[:0], PROMPT_QUANTUM) is packed


@pytest.mark.parametrize("imitation", [False, True])
def test_the_update_with_the_prefix_cut_and_the_trunk_cached_is_the_same(lm, batch, imitation):  # noqa: F811
    policy, graphdef, params = lm
    loss = LOSSES["aride"].imitation if imitation else LOSSES["aride"].rl
    optimizer = make_optimizer(1e-2, 1.0)
    step = make_train_step(graphdef, optimizer, loss, LossParams(), policy.evaluate)
    results = []
    for obs in _shared(lm, batch, True):  # whole rows recomputed, then cut rows on the cached trunk
        p = jax.tree.map(lambda x: x.copy(), params)
        opt_state = optimizer.init(split_trained(p)[0])
        results.append(jax.device_get(step(p, opt_state, batch._replace(obs=obs))))
    (p_want, _, m_want, t_want), (p_got, _, m_got, t_got) = results
    assert int(m_want["skipped_nonfinite"]) == 0 and float(m_want["grad_norm"]) > 0
    for k in m_want:
        np.testing.assert_allclose(m_got[k], m_want[k], rtol=1e-4, atol=TOL, err_msg=k)
    if not imitation:
        for got, want in zip(t_got, t_want, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=TOL)
    flat_want, flat_got = params_to_flat(p_want), params_to_flat(p_got)
    for k in flat_want:
        np.testing.assert_allclose(flat_got[k], flat_want[k], rtol=1e-4, atol=1e-6, err_msg=k)
