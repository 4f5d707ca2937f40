"""The hashing tokenizer, featurize (against hand-computed features) and learner.batch.collate."""

from __future__ import annotations

import dataclasses
import itertools
import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.envs.standin import StandInPhoneEnv
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize, tokenizer
from common.protocol import Episode
from common.types import Action, ActionType, Observation, UIElement
from learner.batch import collate

ROOT = Path(__file__).resolve().parents[1]
CFG = ModelConfig(max_instruction_tokens=6, max_elements=4, max_element_tokens=3)
V = CFG.vocab_size
PROPS = settings(derandomize=True, max_examples=150, deadline=None)


# ---- an independent tokenizer reference ---------------------------------------------------------------
def crc32_ref(data: bytes) -> int:
    """Bitwise CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as in zlib and PNG."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def words_ref(text: str) -> list[str]:
    """Whitespace tokens, surrounding punctuation and a possessive 's removed, kept if alphanumeric."""
    punct = "\"'`.,;:!?()[]{}<>%*"
    out = []
    for token in text.lower().split():
        while token and token[0] in punct:
            token = token[1:]
        while token and token[-1] in punct:
            token = token[:-1]
        if token.endswith("'s"):
            token = token[:-2].strip(punct)
        if any(ch.isalnum() for ch in token):
            out.append(token)
    return out


def id_ref(word: str, vocab: int = V) -> int:
    return 1 + crc32_ref(word.encode()) % (vocab - 1)


def test_crc32_reference_has_the_published_check_values():
    assert crc32_ref(b"123456789") == 0xCBF43926
    assert crc32_ref(b"hello") == 0x3610A686


def test_word_ids_are_fixed():
    assert tokenizer.word_id("hello", 4096) == 1 + 0x3610A686 % 4095 == 1991
    assert tokenizer.word_id("123456789", 4096) == 1 + 0xCBF43926 % 4095
    for w in ("wi", "fi", "settings", "bluetooth", "0", "x"):
        for vocab in (2, 3, 64, 4096, 1 << 20):
            assert tokenizer.word_id(w, vocab) == id_ref(w, vocab)
    assert tokenizer.word_id("anything", 2) == 1  # the smallest vocabulary: one bucket besides padding


def test_words():
    assert tokenizer.words("Turn ON Wi-Fi, now!! 5G_x") == ["turn", "on", "wi-fi", "now", "5g_x"]
    assert tokenizer.words("Go to newegg.com, & call 555-0134 at 7:30 (Garcia's)") == [
        "go", "to", "newegg.com", "call", "555-0134", "at", "7:30", "garcia",
    ]  # fmt: skip
    assert tokenizer.surface_words("Text Maria Garcia: 'On my way'") == [
        "Text",
        "Maria",
        "Garcia",
        "On",
        "my",
        "way",
    ]
    assert tokenizer.words("  ") == []
    assert tokenizer.words("Search for 'tokyo' in the Browser") == [
        "search",
        "for",
        "tokyo",
        "in",
        "the",
        "browser",
    ]


def test_encode_pads_and_truncates():
    ids, mask = tokenizer.encode("Open the Clock app", 6, V)
    assert ids.dtype == np.int32 and mask.dtype == bool and ids.shape == mask.shape == (6,)
    np.testing.assert_array_equal(ids, [id_ref("open"), id_ref("the"), id_ref("clock"), id_ref("app"), 0, 0])
    np.testing.assert_array_equal(mask, [True, True, True, True, False, False])
    ids, mask = tokenizer.encode("one two three four five", 3, V)
    np.testing.assert_array_equal(ids, [id_ref("one"), id_ref("two"), id_ref("three")])
    assert mask.all()
    ids, mask = tokenizer.encode("!!", 4, V)
    assert (ids == tokenizer.PAD_ID).all() and not mask.any()


@PROPS
@given(text=st.text(alphabet=st.sampled_from("ab1 's:\"().,-%S"), max_size=40))
def test_surface_spans_locate_the_reference_words(text):
    spans = tokenizer.surface_spans(text)
    assert [text[a:b].lower() for a, b in spans] == words_ref(text)
    assert all(a < b <= c for (a, b), (c, _) in itertools.pairwise(spans))


@PROPS
@given(
    text=st.text(alphabet=st.sampled_from(string.ascii_letters + string.digits + " -,.!é\tÄ"), max_size=60),
    max_len=st.integers(1, 12),
    vocab=st.sampled_from([2, 17, 4096]),
)
def test_encode_matches_reference(text, max_len, vocab):
    ids, mask = tokenizer.encode(text, max_len, vocab)
    want = [id_ref(w, vocab) for w in words_ref(text)][:max_len]
    n = len(want)
    assert ids[:n].tolist() == want
    assert (ids[n:] == 0).all() and (ids[:n] >= 1).all() and (ids < vocab).all()
    assert mask.tolist() == [True] * n + [False] * (max_len - n)
    again = tokenizer.encode(text, max_len, vocab)
    assert (again[0] == ids).all() and (again[1] == mask).all()


def test_ids_are_stable_across_processes():
    """No per-process salt (Python's str hash is salted): other interpreters agree with this one."""
    text = "Turn on Bluetooth and search for pizza"
    code = f"from common.policies.pointer import tokenizer; print(tokenizer.encode({text!r}, 8, 4096)[0].tolist())"
    want = tokenizer.encode(text, 8, 4096)[0].tolist()
    for salt in ("1", "987654"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(want)


# ---- featurize ----------------------------------------------------------------------------------------
_TEXT, _SWITCH, _EDIT = "android.widget.TextView", "android.widget.Switch", "android.widget.EditText"
ELEMENTS = (
    UIElement(_TEXT, text="12:00", bounds=(0, 0, 1080, 80)),
    UIElement(_SWITCH, text="Wi-Fi", bounds=(0, 300, 1080, 500), clickable=True, checked=True),
    UIElement(_SWITCH, text="Bluetooth", bounds=(0, 500, 1080, 700), clickable=True, scrollable=True),
    UIElement(
        _EDIT,
        text="Turn notes",
        bounds=(40, 300, 1040, 440),
        clickable=True,
        focused=True,
    ),
    UIElement(_TEXT, text="Please wait", bounds=(0, 900, 540, 1000)),  # beyond max_elements=4
    UIElement(_TEXT, text="Wi-Fi", bounds=(0, 1000, 540, 1100)),
)
OBS = Observation("Turn on Wi-Fi please", ELEMENTS, (1080, 2400))


def assert_matches_spec(feats: dict[str, np.ndarray], cfg: ModelConfig = CFG, lead: tuple[int, ...] = ()):
    spec = featurize.feature_spec(cfg)
    assert set(feats) == set(spec)
    for name, (shape, dtype) in spec.items():
        assert feats[name].shape == (*lead, *shape), name
        assert feats[name].dtype.str == dtype, name


def test_feature_spec_shapes():
    spec = featurize.feature_spec(CFG)
    assert spec == {
        "instr_tokens": ((6,), "<i4"),
        "instr_mask": ((6,), "|b1"),
        "instr_feats": ((6, 3), "<f4"),
        "elem_tokens": ((4, 3), "<i4"),
        "elem_mask": ((4,), "|b1"),
        "elem_feats": ((4, 10), "<f4"),
    }


def test_featurize_hand_computed():
    f = featurize.featurize(OBS, CFG)
    assert_matches_spec(f)
    words = ["turn", "on", "wi-fi", "please"]
    np.testing.assert_array_equal(f["instr_tokens"], [*(id_ref(w) for w in words), 0, 0])
    np.testing.assert_array_equal(f["instr_mask"], [True] * 4 + [False] * 2)
    # visible: turn (element 3), wi-fi (element 1); "please" only on element 4, which is cut
    np.testing.assert_array_equal(f["instr_feats"][:, 0], [1, 0, 1, 0, 0, 0])
    # typed: "turn" is in the EditText (element 3), so "on" is the word right after the typed ones
    np.testing.assert_array_equal(f["instr_feats"][:, 1], [1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(f["instr_feats"][:, 2], [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(f["elem_mask"], [True] * 4)
    np.testing.assert_array_equal(
        f["elem_tokens"],
        [
            [id_ref("12:00"), 0, 0],
            [id_ref("wi-fi"), 0, 0],
            [id_ref("bluetooth"), 0, 0],
            [id_ref("turn"), id_ref("notes"), 0],
        ],
    )
    #           left     top         right       bottom      click chk foc scr edit overlap
    want = [
        [0.0, 0.0, 1.0, 80 / 2400, 0, 0, 0, 0, 0, 0.0],
        [0.0, 300 / 2400, 1.0, 500 / 2400, 1, 1, 0, 0, 0, 1.0],
        [0.0, 500 / 2400, 1.0, 700 / 2400, 1, 0, 0, 1, 0, 0.0],
        [40 / 1080, 300 / 2400, 1040 / 1080, 440 / 2400, 1, 0, 1, 0, 1, 0.5],
    ]
    np.testing.assert_allclose(f["elem_feats"], np.array(want, np.float32), rtol=1e-6)


def test_a_hint_names_its_field_but_is_not_typed_text():
    field = UIElement(_EDIT, hint="Search or type URL", focused=True, bounds=(0, 0, 10, 10))
    f = featurize.featurize(Observation("Search for jazz", (field,)), CFG)
    assert f["elem_tokens"][0, 0] == id_ref("search")  # the label falls back to the hint
    np.testing.assert_array_equal(f["instr_feats"][:3, 0], [1, 0, 0])  # "search" is visible...
    assert not f["instr_feats"][:, 1:].any()  # ...but nothing is typed yet
    typed = dataclasses.replace(field, text="jazz")
    f = featurize.featurize(Observation("Search for jazz", (typed,)), CFG)
    np.testing.assert_array_equal(f["instr_feats"][:3, 1], [0, 0, 1])
    np.testing.assert_array_equal(f["instr_feats"][:3, 2], [0, 0, 0])


def test_overlap_feature():
    elements = (
        UIElement(_TEXT, text="Airplane mode"),  # all words in the instruction
        UIElement(_TEXT, text="Camera"),  # unrelated
        UIElement(_TEXT, text="airplane CAMERA"),  # half, case-insensitive
        UIElement(_TEXT),  # no label
    )
    f = featurize.featurize(Observation("Turn off airplane MODE", elements), CFG)
    np.testing.assert_array_equal(f["elem_feats"][:, 9], [1.0, 0.0, 0.5, 0.0])
    # the overlap looks at the whole instruction, even beyond the kept instruction tokens
    long = "one two three four five six seven camera"
    f = featurize.featurize(Observation(long, elements), CFG)
    assert f["elem_feats"][1, 9] == 1.0


def test_more_elements_than_max_are_cut_and_fewer_are_padded():
    many = tuple(UIElement(_TEXT, text=f"item{i}", bounds=(0, i, 10, i + 1)) for i in range(10))
    f = featurize.featurize(Observation("tap item7", many), CFG)
    assert f["elem_mask"].all()
    np.testing.assert_array_equal(f["elem_tokens"][:, 0], [id_ref(f"item{i}") for i in range(4)])
    assert f["instr_feats"][1, 0] == 0  # item7 is not among the kept elements
    few = featurize.featurize(Observation("tap item1", many[:2]), CFG)
    np.testing.assert_array_equal(few["elem_mask"], [True, True, False, False])
    assert (few["elem_tokens"][2:] == 0).all() and (few["elem_feats"][2:] == 0).all()
    assert few["instr_feats"][1, 0] == 1
    empty = featurize.featurize(Observation("", ()), CFG)
    assert_matches_spec(empty)
    assert not empty["elem_mask"].any() and not empty["instr_mask"].any()
    assert all((v == 0).all() for v in empty.values())


def test_instruction_words_and_truncation():
    text = "Search for jazz in the Browser right now"
    assert featurize.instruction_words(text, CFG) == ["Search", "for", "jazz", "in", "the", "Browser"]
    f = featurize.featurize(Observation(text, ()), CFG)
    assert f["instr_mask"].all() and (f["instr_tokens"] == [id_ref(w) for w in words_ref(text)[:6]]).all()


def _env_observations(n: int) -> list[Observation]:
    env = StandInPhoneEnv(max_steps=50)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    out = [obs]
    for _ in range(n - 1):
        el = obs.elements[rng.integers(len(obs.elements))]
        action = (
            Action.tap_element(el, obs.screen_size) if rng.random() < 0.8 else Action(ActionType.PRESS_HOME)
        )
        obs, _, term, trunc, _ = env.step(action)
        if term or trunc:
            obs, _ = env.reset()
        out.append(obs)
    return out


def test_featurize_env_observations_and_stack():
    observations = _env_observations(12)
    feats = [featurize.featurize(o, CFG) for o in observations]
    for f in feats:
        assert_matches_spec(f)
        box = f["elem_feats"][f["elem_mask"], :4]
        assert ((box >= 0) & (box <= 1)).all()
        assert set(np.unique(f["elem_feats"][:, 4:9])) <= {0.0, 1.0}
    stacked = featurize.stack(feats)
    assert_matches_spec(stacked, lead=(12,))
    for i, f in enumerate(feats):
        for k in f:
            np.testing.assert_array_equal(stacked[k][i], f[k])


# ---- collate ------------------------------------------------------------------------------------------
def _episode(
    rng: np.random.Generator, observations: list[Observation], truncated: bool, success: bool = False
) -> Episode:
    n = len(observations) - 1
    obs = featurize.stack([featurize.featurize(o, CFG) for o in observations])
    steps = {
        "action_type": rng.integers(0, 7, n),
        "element": rng.integers(1, 4, n),
        "word": rng.integers(1, 6, n),
        "direction": rng.integers(1, 4, n),
        "behavior_logp": -rng.random(n) - 0.1,
        "reward": rng.random(n) + 0.1,
        "policy_version": rng.integers(1, 9, n),
    }
    steps = {k: np.asarray(v, np.dtype(protocol.STEP_ARRAYS[k])) for k, v in steps.items()}
    return Episode("toggle", success, truncated, obs, steps)


def test_collate_pads_with_zeros():
    rng = np.random.default_rng(1)
    observations = _env_observations(20)
    max_steps = 5
    # terminal = not truncated, whether or not the task succeeded (status_complete ends without success)
    lengths, truncs, wins = [1, 3, 5, 2], [False, True, True, False], [True, False, False, False]
    episodes, start = [], 0
    for n, tr, win in zip(lengths, truncs, wins, strict=True):
        episodes.append(_episode(rng, observations[start : start + n + 1], tr, win))
        start += n + 1
    batch = collate(episodes, max_steps)
    b = len(episodes)
    np.testing.assert_array_equal(batch.length, lengths)
    assert batch.length.dtype == np.int32
    np.testing.assert_array_equal(batch.terminal, [not t for t in truncs])
    assert batch.terminal.dtype == bool
    assert_matches_spec(batch.obs, lead=(b, max_steps + 1))
    column = lambda name: batch.choice[name] if name in batch.choice else getattr(batch, name)  # noqa: E731
    assert set(batch.choice) == {"action_type", "element", "word", "direction"}
    for name, dtype in protocol.STEP_ARRAYS.items():
        assert column(name).shape == (b, max_steps) and column(name).dtype.str == dtype
    for i, ep in enumerate(episodes):
        n = lengths[i]
        for name in protocol.STEP_ARRAYS:
            for t in range(max_steps):
                want = ep.steps[name][t] if t < n else 0
                assert column(name)[i, t] == want, (name, i, t)
        for name, arr in batch.obs.items():
            for t in range(max_steps + 1):
                if t <= n:  # the final observation (row n) is kept for bootstrapping
                    np.testing.assert_array_equal(arr[i, t], ep.obs[name][t])
                else:
                    assert not arr[i, t].any(), (name, i, t)


def test_collate_of_validated_wire_episodes():
    """The learner's path: episode_fields -> wire -> validate_episodes -> collate."""
    rng = np.random.default_rng(2)
    observations = _env_observations(8)
    eps = [_episode(rng, observations[:4], False), _episode(rng, observations[4:], True)]
    msg = protocol.Traj(
        1, 1, [protocol.episode_fields(e.task, e.success, e.truncated, e.obs, e.steps) for e in eps]
    ).to_msg()
    valid = protocol.validate_episodes(
        protocol.parse(wire.encode(msg)), featurize.episode_spec(CFG, text_vocab_size=0), 4, 10
    )
    batch = collate(valid, 4)
    np.testing.assert_array_equal(batch.length, [3, 3])
    np.testing.assert_array_equal(batch.terminal, [True, False])
    np.testing.assert_array_equal(batch.reward[:, :3], np.stack([e.steps["reward"] for e in eps]))
    assert (batch.reward[:, 3] == 0).all()
    batch.reward[0, 0] = 123.0  # the batch owns its memory (validated arrays are read-only views)
    assert valid[0].steps["reward"][0] != 123.0


def test_elements_without_words():
    els = (UIElement(_TEXT, bounds=(0, 0, 10, 10)), UIElement(_TEXT, text="...", bounds=(0, 0, 10, 10)))
    f = featurize.featurize(Observation("go", els), CFG)
    np.testing.assert_array_equal(f["elem_mask"], [True, True, False, False])
    assert (f["elem_tokens"] == 0).all() and (f["elem_feats"][:, 9] == 0).all()


def test_memory_holds_the_last_actions_most_recent_first():
    """ModelConfig.history: what each remembered action aimed at (its note) as words, its kind one-hot and
    its age, written out by hand; older actions beyond the window are gone, and the step count goes on."""
    cfg = dataclasses.replace(CFG, history=2)
    history = [
        Action(ActionType.TAP, 0.5, 0.1, note="Settings"),
        Action(ActionType.SWIPE, note="up"),
        Action(ActionType.TAP, 0.5, 0.2, note="Network & internet"),
    ]
    f = featurize.featurize(OBS, cfg, history)
    assert_matches_spec(f, cfg)
    np.testing.assert_array_equal(
        f["hist_tokens"], [[id_ref("network"), id_ref("internet"), 0], [id_ref("up"), 0, 0]]
    )
    want = np.zeros((2, featurize.NUM_HISTORY_FEATURES), np.float32)
    want[0, ActionType.TAP], want[0, -1] = 1, 0.5
    want[1, ActionType.SWIPE], want[1, -1] = 1, 1.0
    np.testing.assert_array_equal(f["hist_feats"], want)
    np.testing.assert_array_equal(f["hist_mask"], [True, True])
    np.testing.assert_allclose(f["episode_step"], [3 / featurize.STEP_SCALE])
    first = featurize.featurize(OBS, cfg)  # the first step: nothing remembered
    assert not first["hist_mask"].any() and not first["hist_tokens"].any() and first["episode_step"][0] == 0
    assert "hist_tokens" not in featurize.featurize(OBS, CFG, history)  # no memory: the screen only
