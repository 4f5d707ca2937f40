"""Sequences packed end to end (common/policies/lm/segments.py, `Decoder.states(segments=)`): the layout
puts every sequence whole into one row without overlap, and each packed sequence gets the decoder states
it has alone in its own row (with a shared prefix, and through `trunk_after` for the cache's fill); the
host step's indices point at each step's last prompt token.

A tiny random decoder of 2 blocks (tests/lm_backbone.py), LoRA on the top one; the reference is each
sequence computed alone, left-padded in a row of its own (the decoder's plain path, no segments).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.backbones.decoder.llama import SharedPrefix, init_cache
from common.config import ModelConfig
from common.policies import make_policy
from common.policies.lm import packing, segments
from common.policies.lm.network import prompt_layout
from tests.lm_backbone import tiny_lm_folder
from tests.test_lm_packing import collated_batch

TOL = 2e-5


def test_the_layout_puts_every_sequence_whole_into_one_row():
    lengths = [5, 9, 3, 7, 2, 8]
    where = segments.layout(lengths, 12, 4, groups=2)
    assert where.width == 12 and where.rows % 2 == 0
    taken = np.zeros((where.rows, where.width), int)
    for n, r, c in zip(lengths, where.row, where.col, strict=True):
        assert c + n <= where.width
        taken[r, c : c + n] += 1
    assert taken.max() == 1 and taken.sum() == sum(lengths)  # no overlap, nothing lost
    assert where.rows == 4  # first fit, longest first: 9+3, 8+2, 7+5, and a row of padding for 2 groups
    seqs = [np.arange(n) + 100 * i for i, n in enumerate(lengths)]
    ids = where.place(seqs, np.int32)
    for got, want in zip(where.take(ids), seqs, strict=True):
        np.testing.assert_array_equal(got, want)
    numbered, positions = where.segments(), where.positions(3)
    for i, (n, start) in enumerate(zip(lengths, where.starts, strict=True)):
        assert np.all(numbered.reshape(-1)[start : start + n] == i + 1)
        np.testing.assert_array_equal(positions.reshape(-1)[start : start + n], 3 + np.arange(n))
    assert (numbered > 0).sum() == sum(lengths)
    # A sequence longer than the width widens the rows to it, rounded up to the quantum.
    assert segments.layout([13, 2], 12, 4).width == 16
    assert segments.bound(13, 12, 4, 5) == 2 * 5  # widths 12 and 16, up to 5 rows each
    # The final rows: the quantum times a power of two, at most the budget rounded up to the quantum.
    assert [segments.final_width(n, 352, 64) for n in (1, 64, 65, 129, 257, 352)] == [
        64,
        64,
        128,
        256,
        384,
        384,
    ]
    assert segments.final_widths(352, 64) == 4


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    backbone = str(tiny_lm_folder(tmp_path_factory.mktemp("tiny-lm")))
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=4, lora_layers=1))
    agent = nnx.merge(*policy.create(0))
    rng = np.random.default_rng(1)
    for var in [v for _, v in nnx.iter_graph(agent) if isinstance(v, nnx.LoRAParam)]:
        var[...] = jnp.asarray(rng.standard_normal(var[...].shape) * 0.1, jnp.float32)
    return agent.decoder


def _alone(decoder, seq: np.ndarray, offset: int, prefix: np.ndarray | None, trunk: bool) -> np.ndarray:
    """One sequence's states in a row of its own, left-padded to 40: the plain path."""
    width = 40
    ids = np.zeros((1, width), np.int32)
    ids[0, width - len(seq) :] = seq
    mask, positions = prompt_layout(jnp.asarray([len(seq)]), width)
    if trunk:
        out = decoder.trunk_after(jnp.asarray(ids), positions + offset, mask, prefix)[0]
    else:
        shared = None if prefix is None else SharedPrefix(jnp.asarray(prefix))
        out = decoder.states(jnp.asarray(ids), positions + offset, mask, prefix=shared)[0]
    return np.asarray(out)[0, width - len(seq) :]


@pytest.mark.parametrize("trunk", [False, True])
@pytest.mark.parametrize("with_prefix", [False, True])
def test_each_packed_sequence_gets_the_states_it_has_alone(decoder, trunk, with_prefix):
    rng = np.random.default_rng(2)
    prefix = rng.integers(1, 1000, 6) if with_prefix else None
    p = 0 if prefix is None else len(prefix)
    lengths = [17, 5, 11, 30, 1, 9]
    seqs = [rng.integers(1, 1000, n) for n in lengths]
    where = segments.layout(lengths, 32, 8)
    numbered = jnp.asarray(where.segments())
    args = (jnp.asarray(where.place(seqs, np.int32)), jnp.asarray(where.positions(p)), numbered > 0)
    if trunk:
        packed = decoder.trunk_after(*args, prefix, numbered)[0]
        unsegmented = decoder.trunk_after(*args, prefix)[0]
    else:
        shared = None if prefix is None else SharedPrefix(jnp.asarray(prefix))
        packed = decoder.states(*args, prefix=shared, segments=numbered)[0]
        unsegmented = decoder.states(*args, prefix=shared)[0]
    got = where.take(np.asarray(packed))
    for seq, states in zip(seqs, got, strict=True):
        np.testing.assert_allclose(states, _alone(decoder, seq, p, prefix, trunk), atol=TOL)
    # Without the segments a sequence reads the ones before it in its row: not the same states.
    assert not np.allclose(
        np.concatenate(where.take(np.asarray(unsegmented))), np.concatenate(got), atol=1e-3
    )
    with pytest.raises(ValueError, match="segments"):
        decoder.states(*args, init_cache(decoder.cfg, where.rows, 64), segments=numbered)


def test_the_host_step_points_at_each_step_s_last_prompt_token(tmp_path):
    """segments.packed_sequences: `steps_at` + j reads action token j - 1 (the prompt's last token for
    j = 0), `finals_at` each final row's last prompt token, the preamble cut from every prompt."""
    backbone = str(tiny_lm_folder(tmp_path))
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=4, lm_prompt_tokens=512))
    graphdef, params = nnx.split(nnx.merge(*policy.create(0)))
    batch = collated_batch((policy, graphdef, params), (4, 2, 1), (False, True, False))
    packed = packing.pack(batch.obs)
    preamble = policy.prompts.preamble
    obs = segments.packed_sequences(packed, batch.choice, preamble, 64)
    assert obs["prefix_ids"].shape == (3, len(preamble))
    ids = obs["steps_ids"].reshape(-1)
    train = packed["train_rows"].reshape(-1)
    rows = packed["prompt_length"].shape[1]
    for slot, row in enumerate(train):
        if row < 0:
            continue
        b, t = divmod(int(row), rows)
        prompt = batch.obs["prompt_ids"][b, t, -int(batch.obs["prompt_length"][b, t]) :]
        n = int(batch.choice["action_length"][b, t])
        at = int(obs["steps_at"].reshape(-1)[slot])
        assert ids[at] == prompt[-1]
        np.testing.assert_array_equal(ids[at + 1 : at + 1 + n], batch.choice["action_tokens"][b, t, :n])
        start = at - (len(prompt) - len(preamble)) + 1
        np.testing.assert_array_equal(ids[start : at + 1], prompt[len(preamble) :])
    finals = obs["finals_ids"].reshape(-1)
    for b, row in enumerate(packed["final_rows"]):
        prompt = batch.obs["prompt_ids"].reshape(-1, batch.obs["prompt_ids"].shape[-1])[row]
        assert finals[obs["finals_at"][b]] == prompt[-1]
