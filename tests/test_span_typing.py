"""Typing by span (--model.span-words S > 1): the typed-text choice is a (first word, length) span in one
categorical, so a phrase is one action. Its logits against a reference loop, its encoding, the action it
makes, and oracle demonstrations that type whole phrases with exact behaviour log-probs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.tools.demos import DemosConfig, load_demos, write_demos
from common.config import ModelConfig
from common.policies import PointerPolicy
from common.policies.pointer import demos, featurize
from common.policies.pointer import network as model
from common.types import ActionType, Observation, PolicyChoice

CFG = ModelConfig(span_words=3)
SMALL = ModelConfig(vocab_size=97, max_instruction_tokens=5, max_elements=4, max_element_tokens=3, d_model=16,
                    num_heads=2, num_layers=1, mlp_dim=32, span_words=3)  # fmt: skip


def test_span_logits_are_start_plus_end_and_only_inside_the_instruction():
    net = model.PhonePolicy(SMALL, nnx.Rngs(0))
    rng = np.random.default_rng(0)
    words = rng.normal(size=(2, 5, 16)).astype(np.float32)
    mask = np.array([[True] * 5, [True, True, False, False, False]])
    logits, valid = jax.device_get(net._typed_text(words, mask))
    start = np.asarray(net.word_pointer(words))[..., 0]
    end = np.asarray(net.word_end_pointer(words))[..., 0]
    for b in range(2):
        n = mask[b].sum()
        for i in range(5):
            for length in range(1, 4):
                k = featurize.span_choice(i, length, SMALL)
                last = i + length - 1
                assert valid[b, k] == (last < n), (b, i, length)
                if last < 5:
                    np.testing.assert_allclose(logits[b, k], start[b, i] + end[b, last], rtol=1e-5, atol=1e-6)


def test_span_choices_encode_first_and_length_and_count_what_fits():
    for choice in range(16 * 3):
        assert featurize.span_choice(*featurize.span_of(choice, CFG), CFG) == choice
    for n in range(0, 17):
        brute = sum(1 for i in range(n) for k in range(1, 4) if i + k <= n)
        assert featurize.valid_spans(n, CFG) == brute
    with pytest.raises(ValueError, match="types 1 to 3"):
        featurize.span_choice(0, 4, CFG)
    one = ModelConfig()
    assert featurize.span_of(7, one) == (7, 1) and featurize.valid_spans(9, one) == 9  # word by word


def test_a_span_types_its_words_in_one_action():
    obs = Observation("Text Aiko Tanaka: Running late", ())
    policy = PointerPolicy(CFG)
    action = policy.to_action(
        obs, PolicyChoice(int(ActionType.TYPE), word=featurize.span_choice(3, 2, CFG)).as_dict()
    )
    assert action.text == "Running late" and action.note == "Running late"
    past = policy.to_action(
        obs, PolicyChoice(int(ActionType.TYPE), word=featurize.span_choice(4, 3, CFG)).as_dict()
    )
    assert past.text == ""  # a span past the instruction types nothing


def test_the_random_action_is_uniform_over_the_valid_spans():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(3000):
        c = demos._random_choice(rng, 4, 5, CFG)
        first, length = featurize.span_of(c.word, CFG)
        assert first + length <= 5
        seen.add(c.word)
    assert len(seen) == featurize.valid_spans(5, CFG) == 12
    type_choice = PolicyChoice(int(ActionType.TYPE), word=0)
    total = sum(demos._random_prob(dataclasses.replace(type_choice, word=w), 4, 5, CFG) for w in seen)
    assert total == pytest.approx(1 / 7)  # the type's share, spread over the valid spans


def test_oracle_demonstrations_type_whole_phrases_and_replay(tmp_path):
    out = tmp_path / "d.msgpack"
    stats = write_demos(DemosConfig(out=out, episodes=40, seed=4, model=CFG), log=lambda _: None)
    assert stats["written"] == 40 and stats["successes"] == 40
    episodes = load_demos(out, CFG)
    lengths = [
        featurize.span_of(int(w), CFG)[1]
        for ep in episodes
        for a, w in zip(ep.steps["action_type"], ep.steps["word"], strict=True)
        if a == ActionType.TYPE
    ]
    assert max(lengths) == 3  # phrases typed three words at a time
    env, policy, seed = SimPhoneEnv(SimPhoneConfig(max_steps=20)), PointerPolicy(CFG), 4 * 1_000_003
    for ep in episodes:  # the recorded choices reproduce each episode's success
        seed += 1
        obs, _ = env.reset(seed=seed)
        for t in range(ep.length):
            choice = {k: int(ep.steps[k][t]) for k in ("action_type", "element", "word", "direction")}
            obs, _, terminated, _, info = env.step(policy.to_action(obs, choice))
        assert info["success"] and terminated
