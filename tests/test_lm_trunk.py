"""The lm family's cached frozen trunk (common/policies/lm/trunk.py): the adapted blocks started from the
cached output of the blocks below them give the same log-probs, values, loss, gradients and priorities as
the whole decoder, whether the rows were computed now or kept from a batch of another width, and the cache
keeps to its byte budget. And the preamble every prompt starts with, cut from the rows and run once as a
shared row (packing.share_prefix, the decoder's `prefix`; the actor's prefill too): the same scores and
update, with the trunk recomputed or cached; a batch with a prompt that does not start with it stays whole.

A tiny random decoder of 2 blocks with SmolLM2's tokenizer (tests/lm_backbone.py), LoRA on the top one, so
the trunk is the bottom block; the batch is test_lm_packing's (three episodes of real SimPhone screens,
actions sampled by the family's constrained act, one terminal). The reference is the uncached packed
update, which tests/test_lm_packing.py checks against the padded layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.backbones.decoder.llama import SharedPrefix
from common.config import ModelConfig
from common.policies import make_policy
from common.policies.lm import packing
from common.policies.lm.family import PROMPT_QUANTUM
from common.policies.lm.network import prompt_layout
from common.policies.lm.trunk import TrunkCache
from tests.lm_backbone import tiny_lm_folder
from tests.test_lm_packing import _episode_screens, assert_same_update, collated_batch

LENGTHS, TERMINAL, MAX_STEPS = (4, 2, 1), (False, True, False), 4
TOL = 2e-5


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    backbone = str(tiny_lm_folder(tmp_path_factory.mktemp("tiny-lm")))
    cfg = ModelConfig(kind="lm", backbone=backbone, lora_rank=4, lora_layers=1, lm_prompt_tokens=512)
    policy = make_policy(cfg)
    agent = nnx.merge(*policy.create(0))
    assert agent.decoder.frozen_layers == 1  # of 2: the trunk is the bottom block
    rng = np.random.default_rng(1)
    # A random value head and adapters (B starts at 0): the adapted block then differs from the base.
    for var in (agent.value.kernel, *[v for _, v in nnx.iter_graph(agent) if isinstance(v, nnx.LoRAParam)]):
        var[...] = jnp.asarray(rng.standard_normal(var[...].shape) * 0.1, jnp.float32)
    graphdef, params = nnx.split(agent)
    return policy, graphdef, params


@pytest.fixture(scope="module")
def batch(lm):
    return collated_batch(lm, LENGTHS, TERMINAL)


def test_the_adapted_blocks_on_the_trunk_equal_the_whole_decoder(lm):
    """Decoder.states from Decoder.trunk equals the whole pass, and a real token's trunk state does not
    depend on how much left padding its prompt has (what lets the cache place it at any width)."""
    _, graphdef, params = lm
    decoder = nnx.merge(graphdef, params).decoder
    ids = jnp.asarray(np.random.default_rng(2).integers(1, 1000, (3, 40)), jnp.int32)
    mask, positions = prompt_layout(jnp.asarray([40, 17, 1]), 40)
    whole, _ = decoder.states(ids, positions, mask)
    trunk = decoder.trunk(ids, positions, mask)
    above, _ = decoder.states(ids, positions, mask, trunk=trunk, remat=True)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(above)[real], np.asarray(whole)[real], atol=1e-5)
    assert not np.allclose(np.asarray(trunk), np.asarray(whole), atol=1e-2)  # the top block did something
    # The second prompt's 17 tokens with 23 slots less of padding: the same trunk states.
    short_mask, short_positions = prompt_layout(jnp.asarray([17]), 17)
    short = decoder.trunk(ids[1:2, 23:], short_positions, short_mask)
    np.testing.assert_allclose(np.asarray(short)[0], np.asarray(trunk)[1, 23:], atol=1e-5)
    with pytest.raises(ValueError, match="trunk states must be"):
        decoder.states(ids, positions, mask, trunk=trunk[:, :39])


def _evaluate(lm, obs, choice):
    policy, graphdef, params = lm
    return jax.device_get(
        jax.jit(lambda p, o, c: policy.evaluate(graphdef, p, o, c, None))(params, obs, choice)
    )


def test_cached_scores_equal_the_recomputed_ones(lm, batch):
    _, graphdef, params = lm
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    cache = TrunkCache(graphdef, 2**30)
    cached = cache.add(packed, batch.choice, params)
    rows = int((packed["train_rows"] >= 0).sum()) + len(LENGTHS)
    assert cache.misses == rows and cache.hits == 0 and cache.evicted == 0
    assert cached["trunk_rows"].shape[:2] == packed["train_rows"].shape
    want, got = _evaluate(lm, packed, batch.choice), _evaluate(lm, cached, batch.choice)
    for name in ("logp", "entropy", "values", "ratio_logp"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=TOL, err_msg=name)
    assert np.abs(want.values).max() > 0 and np.all(np.isfinite(want.logp))
    # Drawn again: every row from the cache, nothing computed, the same inputs.
    again = cache.add(packed, batch.choice, params)
    assert cache.hits == rows and cache.misses == rows
    np.testing.assert_array_equal(again["trunk_rows"], cached["trunk_rows"])
    np.testing.assert_array_equal(again["trunk_final"], cached["trunk_final"])


def test_rows_kept_at_one_width_score_the_same_at_another(lm, batch):
    """Rows kept from a batch trimmed to the longest prompt (one width) placed in a batch of the last
    episode alone left at the full budget (another width): they come from the cache and score as
    recomputed."""
    _, graphdef, params = lm
    cache = TrunkCache(graphdef, 2**30)
    narrow = packing.pack(batch.obs, PROMPT_QUANTUM)
    cache.add(narrow, batch.choice, params)
    alone = jax.tree.map(lambda x: x[2:], batch)
    packed = packing.pack(alone.obs, 512)  # no trimming
    assert packed["prompt_ids"].shape[-1] == 512 > narrow["prompt_ids"].shape[-1]
    misses = cache.misses
    cached = cache.add(packed, alone.choice, params)
    assert cache.misses == misses  # all kept
    want, got = _evaluate(lm, packed, alone.choice), _evaluate(lm, cached, alone.choice)
    for name in ("logp", "entropy", "values"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=TOL, err_msg=name)


def test_the_update_has_the_same_loss_gradients_and_priorities(lm, batch):
    """One A-RIDE update (its priorities included); the imitation update on the cached trunk is compared
    below, with the preamble cut as the learner's host step cuts it."""
    _, graphdef, params = lm
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    assert_same_update(
        lm, batch, False, packed, TrunkCache(graphdef, 2**30).add(packed, batch.choice, params)
    )


def test_the_cache_stays_within_its_budget_and_evicts_the_least_recently_drawn(lm, batch):
    _, graphdef, params = lm
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    full = TrunkCache(graphdef, 2**30)
    want = full.add(packed, batch.choice, params)
    sizes = sorted(a.nbytes for a in full._rows.values())
    budget = sum(sizes[:3])  # room for about three of the ten rows
    small = TrunkCache(graphdef, budget)
    shapes, compute = [], small._compute
    small._compute = lambda params, prompt, *rest: (
        shapes.append(prompt.shape) or compute(params, prompt, *rest)
    )
    got = small.add(packed, batch.choice, params)
    assert 0 < small.bytes <= budget and small.evicted == len(sizes) - len(small._rows) > 0
    np.testing.assert_array_equal(got["trunk_rows"], want["trunk_rows"])  # evicted or not, the same inputs
    np.testing.assert_array_equal(got["trunk_final"], want["trunk_final"])
    kept = list(small._rows)
    small.add(packed, batch.choice, params)
    assert small.bytes <= budget and small.misses > len(sizes)  # evicted rows were computed again
    # Few shapes compile: rows padded to a power of two (at least ROW_BUCKET), widths to the quantum.
    assert len(shapes) == 2 and all(
        r >= 8 and r & (r - 1) == 0 and w % PROMPT_QUANTUM == 0 for r, w in shapes
    )
    assert kept[-1] in small._rows or small.evicted > len(sizes) - len(kept)
    stats = small.stats()
    assert stats["trunk_cache_mb"] == small.bytes / 2**20 and stats["trunk_misses"] == small.misses
    none = TrunkCache(graphdef, 0)
    np.testing.assert_array_equal(none.add(packed, batch.choice, params)["trunk_rows"], want["trunk_rows"])
    assert none.bytes == 0 and not none._rows
    misses = full.misses
    full.clear()  # the benchmark's first draw again: every row computed, the same states
    assert full.bytes == 0 and not full._rows
    np.testing.assert_array_equal(full.add(packed, batch.choice, params)["trunk_rows"], want["trunk_rows"])
    assert full.misses == 2 * misses and full.bytes > 0


# ---- the preamble every prompt starts with, computed once (packing.share_prefix, Decoder.states(prefix=))


def test_rows_after_a_shared_prefix_equal_the_whole_rows(lm):
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


def test_the_cache_fills_rows_after_the_preamble_as_the_whole_rows(lm, batch):
    """TrunkCache with the preamble (as the learner builds it) computes the preamble once per fill and
    each row after it (Decoder.trunk_after): the same states as the whole rows' trunk, and the whole
    rows are never computed; a batch with a prompt that does not start with the preamble is filled whole."""
    policy, graphdef, params = lm
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    want = TrunkCache(graphdef, 2**30).add(packed, batch.choice, params)
    cache = TrunkCache(graphdef, 2**30, PROMPT_QUANTUM, policy.prompts.preamble)
    widths, after = [], cache._compute_after
    cache._compute = None  # the whole-row computation: must not run
    cache._compute_after = lambda params, prompt, *rest: (
        widths.append(prompt.shape[-1]) or after(params, prompt, *rest)
    )
    got = cache.add(packed, batch.choice, params)
    assert widths and max(widths) < packed["prompt_ids"].shape[-1]  # rows without the preamble
    for name in ("trunk_rows", "trunk_final"):
        np.testing.assert_allclose(got[name], want[name], atol=TOL, err_msg=name)
    assert np.abs(want["trunk_final"]).max() > 0
    foreign = {**packed, "prompt_ids": packed["prompt_ids"].copy()}
    row = packed["prompt_ids"][1, 0]
    foreign["prompt_ids"][1, 0, row.shape[-1] - packed["prompt_length"][1, 0]] += 1  # its first id
    whole = TrunkCache(graphdef, 2**30, PROMPT_QUANTUM, policy.prompts.preamble)
    whole._compute_after = None  # the prefix path: must not run for this batch
    np.testing.assert_array_equal(
        whole.add(foreign, batch.choice, params)["trunk_rows"],
        TrunkCache(graphdef, 2**30).add(foreign, batch.choice, params)["trunk_rows"],
    )


def _shared(lm, batch, cached: bool):
    policy, graphdef, params = lm
    """(the packed observations, the same with the trunk from the cache when `cached` and the preamble cut)."""
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    cache = TrunkCache(graphdef, 2**30, PROMPT_QUANTUM, policy.prompts.preamble)  # as the learner's
    source = cache.add(packed, batch.choice, params) if cached else packed
    return packed, packing.share_prefix(source, policy.prompts.preamble, PROMPT_QUANTUM)


@pytest.mark.parametrize("cached", [False, True])
def test_scores_with_the_prefix_cut_equal_the_whole_rows(lm, batch, cached):
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


def test_a_prompt_without_the_preamble_leaves_the_batch_whole(lm, batch):
    policy, _, _ = lm
    packed = packing.pack(batch.obs, PROMPT_QUANTUM)
    foreign = {**packed, "prompt_ids": packed["prompt_ids"].copy()}
    row = packed["prompt_ids"][1, 0]
    foreign["prompt_ids"][1, 0, row.shape[-1] - packed["prompt_length"][1, 0]] += 1  # its first id
    assert packing.share_prefix(foreign, policy.prompts.preamble, PROMPT_QUANTUM) is foreign
    assert packing.share_prefix(packed, policy.prompts.preamble[:0], PROMPT_QUANTUM) is packed


@pytest.mark.parametrize("imitation", [False, True])
def test_the_update_with_the_prefix_cut_and_the_trunk_cached_is_the_same(lm, batch, imitation):
    assert_same_update(lm, batch, imitation, *_shared(lm, batch, True))


def test_the_actor_computes_the_preamble_once_and_acts_as_on_whole_prompts(lm):
    """The family's `inputs` cuts the preamble (`prefix_ids`); prefill runs it as one row and decoding
    continues from it: the actions sampled with the same key, their token log-probs, entropies and the values
    are those of the whole prompts, so the learner's ratios stay 1 (greedy decoding takes the same path)."""
    policy, graphdef, params = lm
    features = [policy.featurize(obs) for obs in _episode_screens(5, 5)]
    stacked = {k: np.stack([f[k] for f in features]) for k in features[0]}
    inputs = policy.inputs(stacked)
    p = len(policy.prompts.preamble)
    assert inputs["prefix_ids"].shape == (p,)
    np.testing.assert_array_equal(inputs["prompt_length"], stacked["prompt_length"] - p)
    act = jax.jit(lambda x, key: policy.act(graphdef, params, x, key, False))
    shared = jax.device_get(act(inputs, jax.random.key(3)))
    whole = jax.device_get(act(stacked, jax.random.key(3)))  # untrimmed, nothing cut
    np.testing.assert_array_equal(shared.choice["action_tokens"], whole.choice["action_tokens"])
    np.testing.assert_allclose(shared.choice["token_logp"], whole.choice["token_logp"], atol=1e-5)
    np.testing.assert_allclose(shared.value, whole.value, atol=1e-5)
    np.testing.assert_allclose(shared.entropy, whole.entropy, atol=1e-4)
    assert np.abs(whole.value).max() > 0
    # Prompts from another builder are left whole.
    foreign = {**stacked, "prompt_ids": stacked["prompt_ids"] + (stacked["prompt_ids"] > 0)}
    assert "prefix_ids" not in policy.inputs(foreign)
