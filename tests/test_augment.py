"""Word renaming (learner/augment.py): consistent within an episode, independent across episodes, at the
asked rate, and reproducible from its seed."""

from __future__ import annotations

import numpy as np
import pytest

from actors.demos import DemosConfig, load_demos, write_demos
from common.config import ModelConfig
from learner.augment import TOKEN_KEYS, rename_words
from learner.batch import collate

CFG = ModelConfig()


@pytest.fixture(scope="module")
def demo_batch(tmp_path_factory):
    """A real collated batch: 16 oracle episodes of SimPhone `general`."""
    out = tmp_path_factory.mktemp("demos") / "d.msgpack"
    write_demos(DemosConfig(out=out, episodes=16, seed=5), log=lambda _: None)
    return collate(load_demos(out, CFG), max_steps=16)


def _mapping(old: np.ndarray, new: np.ndarray) -> dict[int, set[int]]:
    """Every old id of one episode -> the set of ids it became."""
    pairs: dict[int, set[int]] = {}
    for key in TOKEN_KEYS:
        for a, b in zip(old[key].ravel(), new[key].ravel(), strict=True):
            pairs.setdefault(int(a), set()).add(int(b))
    return pairs


def test_each_word_is_renamed_the_same_way_everywhere_in_its_episode(demo_batch):
    obs = demo_batch.obs
    renamed = rename_words(obs, 0.5, CFG.vocab_size, seed=7)
    changed_words = collisions = 0
    for b in range(obs["instr_tokens"].shape[0]):
        old = {k: obs[k][b] for k in TOKEN_KEYS}
        new = {k: renamed[k][b] for k in TOKEN_KEYS}
        mapping = _mapping(old, new)
        assert mapping.pop(0) == {0}  # padding stays padding
        assert all(len(targets) == 1 for targets in mapping.values())  # a function of the word...
        images = [next(iter(t)) for t in mapping.values()]
        collisions += len(images) - len(set(images))  # ...that keeps distinct words apart, but for
        assert all(1 <= i < CFG.vocab_size for i in images)
        changed_words += sum(old_id != new_id for old_id, new_id in zip(mapping, images, strict=True))
    assert changed_words > 0
    # chance hits of a renamed word on another word's id: about 1 in 4095 per pair of words
    assert collisions <= 0.01 * changed_words


def test_visible_instruction_words_stay_visible_after_renaming(demo_batch):
    """The featurizer's word-identity cues (instr_feats: the word is on screen) remain true."""
    obs = demo_batch.obs
    renamed = rename_words(obs, 0.5, CFG.vocab_size, seed=8)
    checked = 0
    for b in range(obs["instr_tokens"].shape[0]):
        for t in range(int(demo_batch.length[b]) + 1):
            screen = set(renamed["elem_tokens"][b, t].ravel().tolist())
            for i in np.flatnonzero(obs["instr_feats"][b, t, :, 0]):
                assert renamed["instr_tokens"][b, t, i] in screen
                checked += 1
    assert checked > 50


def test_share_of_renamed_words_matches_the_rate():
    episodes, words = 400, 50
    ids = np.tile(np.arange(1, words + 1, dtype=np.int32), (episodes, 1))  # 50 distinct words per episode
    obs = {"instr_tokens": ids, "elem_tokens": ids[:, :, None]}
    for rate in (0.1, 0.3, 0.9):
        changed = rename_words(obs, rate, CFG.vocab_size, seed=1)["instr_tokens"] != ids
        n = episodes * words
        # A renamed id equals the old one with probability 1/4095, far below the 5-sigma bound.
        assert abs(changed.mean() - rate) < 5 * np.sqrt(rate * (1 - rate) / n)
        # Episodes choose independently: not every episode renames the same words.
        assert len({row.tobytes() for row in changed}) > episodes // 2


def test_typed_words_are_renamed_at_their_own_rate():
    episodes, words = 400, 40
    ids = np.tile(np.arange(1, words + 1, dtype=np.int32), (episodes, 2, 1))  # [episode, step, word]
    feats = np.zeros((episodes, 2, words, 3), np.float32)
    feats[:, 1, : words // 2, 1] = 1.0  # the first 20 words are in a text field at the second step
    obs = {"instr_tokens": ids, "instr_feats": feats, "elem_tokens": ids[:, :, :6, None]}
    out = rename_words(obs, 0.1, CFG.vocab_size, seed=3, typed_rate=0.8)
    changed = out["instr_tokens"][:, 0] != ids[:, 0]
    n = episodes * words // 2
    for share, rate in ((changed[:, : words // 2].mean(), 0.8), (changed[:, words // 2 :].mean(), 0.1)):
        assert abs(share - rate) < 5 * np.sqrt(rate * (1 - rate) / n)
    # still one new id per word, in the instruction (both steps) and on screen
    np.testing.assert_array_equal(out["instr_tokens"][:, 0], out["instr_tokens"][:, 1])
    np.testing.assert_array_equal(out["elem_tokens"][:, :, :, 0], out["instr_tokens"][:, :, :6])


def test_renaming_is_reproducible_from_its_seed_and_off_at_rate_zero(demo_batch):
    obs = demo_batch.obs
    a = rename_words(obs, 0.3, CFG.vocab_size, seed=[0, 12, 0])
    b = rename_words(obs, 0.3, CFG.vocab_size, seed=[0, 12, 0])
    c = rename_words(obs, 0.3, CFG.vocab_size, seed=[0, 13, 0])
    for key in TOKEN_KEYS:
        np.testing.assert_array_equal(a[key], b[key])
        assert (a[key] != c[key]).any()
        assert a[key].dtype == obs[key].dtype and a[key].shape == obs[key].shape
    assert a["elem_feats"] is obs["elem_feats"]  # only word ids change
    assert rename_words(obs, 0.0, CFG.vocab_size, seed=0) is obs
    everything = rename_words(obs, 1.0, CFG.vocab_size, seed=0)
    real = obs["instr_tokens"] != 0
    assert (everything["instr_tokens"][real] != obs["instr_tokens"][real]).mean() > 0.99


@pytest.mark.parametrize(("rate", "typed_rate"), [(-0.1, None), (1.5, None), (0.2, 1.1), (0.2, -1.0)])
def test_rates_outside_zero_one_are_refused(rate, typed_rate):
    obs = {k: np.ones((1, 2), np.int32) for k in TOKEN_KEYS}
    with pytest.raises(ValueError, match="rate must be in"):
        rename_words(obs, rate, CFG.vocab_size, seed=0, typed_rate=typed_rate)
