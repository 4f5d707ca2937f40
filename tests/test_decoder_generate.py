"""Generation (common/backbones/generate.py) against the float64 reference of tests/decoder_reference.py:
greedy continuations and their log-probabilities, sampled tokens' log-probabilities at the temperature
they were drawn at, a token mask that every sample obeys (log-probabilities under the masked
distribution), prompts of different lengths batched together, stopping at end-of-sequence, and clear
errors for bad input. The reference recomputes the whole prefix at every step, so it shares nothing with
the KV cache, the left padding or the bucketing it checks."""

from __future__ import annotations

import numpy as np
import pytest

from common.backbones.generate import Generator
from common.backbones.pretrained import load_pretrained
from tests.decoder_reference import VARIANTS, random_hf_tensors, reference_logits, write_hf_folder

PROMPTS = [[5, 9, 14, 3, 22, 7, 40], [11, 4], [30, 31, 32, 33]]
"""Three prompts of different lengths: one batch left-pads them."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """variant -> (config dict, tensors, Generator over the loaded folder)."""
    out = {}
    for seed, name in enumerate(("llama_tied", "qwen2_bias", "qwen3_qknorm")):
        config = VARIANTS[name]
        tensors = random_hf_tensors(config, seed + 10)
        folder = write_hf_folder(tmp_path_factory.mktemp(name), config, tensors)
        out[name] = (config, tensors, Generator(load_pretrained(folder).model))
    return out


def reference_step_logp(config, tensors, prefix: list[int], temperature: float, allowed=None) -> np.ndarray:
    """Float64 log-probabilities of the next token after `prefix`: the last position's logits, masked and
    divided by the temperature (1 when greedy)."""
    tokens = np.asarray([prefix])
    logits = reference_logits(config, tensors, tokens, np.ones_like(tokens, bool))[0, -1]
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    scaled = logits / (temperature if temperature > 0 else 1.0)
    return scaled - np.logaddexp.reduce(scaled)


@pytest.mark.parametrize("variant", ["llama_tied", "qwen2_bias", "qwen3_qknorm"])
def test_greedy_continuations_and_logprobs_equal_the_reference(tiny, variant):
    config, tensors, generator = tiny[variant]
    done = generator.generate(PROMPTS, max_new_tokens=5)
    for prompt, completion in zip(PROMPTS, done, strict=True):
        assert completion.prompt_ids == prompt and completion.stop == "length"
        prefix = list(prompt)
        for token, logp in zip(completion.tokens, completion.logprobs, strict=True):
            want = reference_step_logp(config, tensors, prefix, 0.0)
            assert token == int(np.argmax(want))
            assert logp == pytest.approx(want[token], abs=1e-3)
            prefix.append(token)


def test_sampled_logprobs_are_under_the_tempered_distribution(tiny):
    config, tensors, generator = tiny["qwen2_bias"]
    done = generator.generate(PROMPTS[:2], max_new_tokens=4, temperature=0.7, seed=3)
    again = generator.generate(PROMPTS[:2], max_new_tokens=4, temperature=0.7, seed=3)
    assert [c.tokens for c in done] == [c.tokens for c in again]  # seeded
    for prompt, completion in zip(PROMPTS, done, strict=False):
        prefix = list(prompt)
        for token, logp in zip(completion.tokens, completion.logprobs, strict=True):
            assert logp == pytest.approx(reference_step_logp(config, tensors, prefix, 0.7)[token], abs=1e-3)
            prefix.append(token)
    greedy = generator.generate(PROMPTS[:2], max_new_tokens=4)
    assert [c.tokens for c in done] != [c.tokens for c in greedy]  # it did sample


def test_a_token_mask_constrains_every_sample_and_its_logprob(tiny):
    config, tensors, generator = tiny["llama_tied"]
    allowed = np.zeros(config["vocab_size"], bool)
    allowed[[6, 8, 13, 21]] = True
    seen = []

    def mask(step, generated):
        seen.append((step, generated.shape))
        return np.broadcast_to(allowed, (len(PROMPTS), len(allowed)))

    done = generator.generate(PROMPTS, max_new_tokens=3, temperature=1.5, seed=1, token_mask=mask)
    assert [s for s, _ in seen] == [0, 1, 2] and seen[2][1][1] == 2
    for prompt, completion in zip(PROMPTS, done, strict=True):
        assert set(completion.tokens) <= {6, 8, 13, 21}
        prefix = list(prompt)
        for token, logp in zip(completion.tokens, completion.logprobs, strict=True):
            want = reference_step_logp(config, tensors, prefix, 1.5, allowed)
            assert logp == pytest.approx(want[token], abs=1e-3)
            prefix.append(token)


def test_an_end_of_sequence_token_stops_its_row_only(tiny):
    _, _, generator = tiny["llama_tied"]
    free = generator.generate(PROMPTS, max_new_tokens=4)
    eos = free[0].tokens[1]
    done = generator.generate(PROMPTS, max_new_tokens=4, eos_ids=[eos])
    assert done[0].stop == "eos"
    for before, after in zip(free, done, strict=True):
        cut = before.tokens.index(eos) + 1 if eos in before.tokens else 4
        assert after.tokens == before.tokens[:cut]
        assert after.stop == ("eos" if eos in before.tokens else "length")


def test_bad_input_gets_a_clear_error(tiny):
    _, _, generator = tiny["llama_tied"]
    with pytest.raises(ValueError, match="at least one token"):
        generator.generate([[1, 2], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generator.generate([[1, 64]], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.generate([[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match="allows no token"):
        generator.generate([[1]], max_new_tokens=2, token_mask=lambda t, g: np.zeros((1, 64), bool))
