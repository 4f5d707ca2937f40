"""The lm family's cached frozen trunk (common/policies/lm/trunk.py): the adapted blocks started from the
cached output of the blocks below them give the same log-probs, values, loss, gradients and priorities as
the whole decoder, whether the rows were computed now or kept from another batch, and the cache keeps to
its byte budget. And the preamble every prompt starts with, cut from the rows and run once as a shared row
(segments.packed_sequences, the decoder's `prefix`; the cache's fill and the actor's prefill too): the
same states and scores; a batch with a prompt that does not start with it stays whole.

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
from common.policies.lm.family import PROMPT_QUANTUM, _Packing
from common.policies.lm.network import prompt_layout
from common.policies.lm.segments import SEGMENT_WIDTH
from common.policies.lm.trunk import EXACT_ROWS, TrunkCache
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


def _host(lm, cache: TrunkCache | None, batch) -> dict:
    """The learner's host step (the family's `_Packing`) with `cache`, or without a trunk cache."""
    policy, _, params = lm
    return _Packing(cache, policy.prompts.preamble)(batch.obs, None, batch.choice, params)[0]


def _cache(lm, budget: int = 2**30) -> TrunkCache:
    policy, graphdef, _ = lm
    return TrunkCache(graphdef, budget, PROMPT_QUANTUM, policy.prompts.preamble)  # as the learner's


def _assert_same_scores(got, want) -> None:
    for name in ("logp", "entropy", "values", "ratio_logp"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=TOL, err_msg=name)
    assert np.abs(want.values).max() > 0 and np.all(np.isfinite(want.logp))


def test_cached_scores_equal_the_recomputed_ones(lm, batch):
    recomputed = _host(lm, None, batch)
    cache = _cache(lm)
    cached = _host(lm, cache, batch)
    rows = int((packing.pack(batch.obs)["train_rows"] >= 0).sum()) + len(LENGTHS)
    assert cache.misses == rows and cache.hits == 0 and cache.evicted == 0
    assert cached["steps_trunk"].shape == (*cached["steps_ids"].shape, 32) and "trunk_prefix" in cached
    _assert_same_scores(_evaluate(lm, cached, batch.choice), _evaluate(lm, recomputed, batch.choice))
    # Drawn again: every row from the cache, nothing computed, the same inputs.
    again = _host(lm, cache, batch)
    assert cache.hits == rows and cache.misses == rows
    for name in ("steps_trunk", "finals_trunk", "trunk_prefix"):
        np.testing.assert_array_equal(again[name], cached[name])


def test_rows_kept_from_one_batch_score_the_same_in_another(lm, batch):
    """Rows kept from the whole batch, drawn again in a batch of the last episode alone (laid out
    elsewhere): they come from the cache and score as recomputed."""
    cache = _cache(lm)
    _host(lm, cache, batch)
    alone = jax.tree.map(lambda x: x[2:], batch)
    misses = cache.misses
    cached = _host(lm, cache, alone)
    assert cache.misses == misses  # all kept
    _assert_same_scores(
        _evaluate(lm, cached, alone.choice), _evaluate(lm, _host(lm, None, alone), alone.choice)
    )


@pytest.mark.parametrize("imitation", [False, True])
def test_the_update_has_the_same_loss_gradients_and_priorities(lm, batch, imitation):
    """One A-RIDE update (its priorities included) and one imitation update, on the trunk from the cache
    and recomputed."""
    assert_same_update(lm, batch, imitation, _host(lm, None, batch), _host(lm, _cache(lm), batch))


def test_the_cache_stays_within_its_budget_and_evicts_the_least_recently_drawn(lm, batch):
    packed = packing.pack(batch.obs)
    full = _cache(lm)
    _, _, params = lm
    want = full.row_states(packed, batch.choice, params)
    sizes = sorted(a.nbytes for a in full._rows.values())
    budget = sum(sizes[:3])  # room for about three of the ten rows
    small = _cache(lm, budget)
    shapes, compute = [], small._compute_after
    small._compute_after = lambda params, ids, *rest: shapes.append(ids.shape) or compute(params, ids, *rest)
    got = small.row_states(packed, batch.choice, params)
    assert 0 < small.bytes <= budget and small.evicted == len(sizes) - len(small._rows) > 0
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        np.testing.assert_array_equal(g, w)  # evicted or not, the same states
    kept = list(small._rows)
    small.row_states(packed, batch.choice, params)
    assert small.bytes <= budget and small.misses > len(sizes)  # evicted rows were computed again
    # Few shapes compile: rows packed SEGMENT_WIDTH wide, exactly as many as needed up to EXACT_ROWS.
    assert len(shapes) == 2 and all(r <= EXACT_ROWS and w == SEGMENT_WIDTH for r, w in shapes)
    assert kept[-1] in small._rows or small.evicted > len(sizes) - len(kept)
    stats = small.stats()
    assert stats["trunk_cache_mb"] == small.bytes / 2**20 and stats["trunk_misses"] == small.misses
    none = _cache(lm, 0)
    for g, w in zip(none.row_states(packed, batch.choice, params)[0], want[0], strict=True):
        np.testing.assert_array_equal(g, w)
    assert none.bytes == 0 and not none._rows
    misses = full.misses
    full.clear()  # the benchmark's first draw again: every row computed, the same states
    assert full.bytes == 0 and not full._rows
    for g, w in zip(full.row_states(packed, batch.choice, params)[0], want[0], strict=True):
        np.testing.assert_array_equal(g, w)
    assert full.misses == 2 * misses and full.bytes > 0


# ---- the preamble every prompt starts with, computed once (segments.packed_sequences, Decoder.states(prefix=))


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
    _, graphdef, params = lm
    packed = packing.pack(batch.obs)
    want = TrunkCache(graphdef, 2**30).row_states(packed, batch.choice, params)  # no preamble: whole rows
    cache = _cache(lm)
    cache._compute = None  # the whole-row computation: must not run
    got = cache.row_states(packed, batch.choice, params)
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        np.testing.assert_allclose(g, w, atol=TOL)
    assert np.abs(want[1][0]).max() > 0
    foreign = _foreign(packed)
    whole = _cache(lm)
    whole._compute_after = None  # the prefix path: must not run for this batch
    for g, w in zip(
        whole.row_states(foreign, batch.choice, params)[0],
        TrunkCache(graphdef, 2**30).row_states(foreign, batch.choice, params)[0],
        strict=True,
    ):
        np.testing.assert_array_equal(g, w)


def _foreign(obs: dict) -> dict:
    """`obs` with the first id of episode 1's first prompt changed: that prompt no longer starts with the
    preamble."""
    foreign = {**obs, "prompt_ids": obs["prompt_ids"].copy()}
    row = obs["prompt_ids"][1, 0]
    foreign["prompt_ids"][1, 0, row.shape[-1] - obs["prompt_length"][1, 0]] += 1
    return foreign


@pytest.mark.parametrize("cached", [False, True])
def test_a_prompt_without_the_preamble_leaves_the_rows_whole(lm, batch, cached):
    """The host step cuts the preamble only when every prompt starts with it; otherwise the rows stay
    whole (no `prefix_ids`), and score as the padded layout does."""
    foreign = batch._replace(obs=_foreign(batch.obs))
    host = _host(lm, _cache(lm) if cached else None, foreign)
    assert "prefix_ids" not in host and "trunk_prefix" not in host
    assert "prefix_ids" in _host(lm, None, batch)
    got, padded = _evaluate(lm, host, batch.choice), _evaluate(lm, foreign.obs, batch.choice)
    for b, (n, terminal) in enumerate(zip(LENGTHS, TERMINAL, strict=True)):  # the rows a loss reads
        for name in ("logp", "entropy", "ratio_logp"):
            np.testing.assert_allclose(getattr(got, name)[b, :n], getattr(padded, name)[b, :n], atol=TOL)
        read = n if terminal else n + 1
        np.testing.assert_allclose(got.values[b, :read], padded.values[b, :read], atol=TOL)


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
