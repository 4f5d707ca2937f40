"""Turn an Observation into fixed-shape arrays the policy network reads.

Shapes (one observation; batches add leading axes):
    instr_tokens [Li] int32   instr_mask [Li] bool   instr_feats [Li, 3] f32
    elem_tokens [E, Le] int32 elem_mask [E] bool     elem_feats [E, 10] f32
instr_feats: the word is visible on screen; it is in a text field (already typed); the word before it is
in a text field. The last two let the typed-text pointer find the next word to type by where it sits
(right after what is typed) rather than by what it is, so it can type values it never saw in training.
elem_feats: box (left, top, right, bottom) / screen size, clickable, checked, focused, scrollable,
editable, and the share of the element's words that occur in the instruction (the grounding cue).

With ModelConfig.history = H > 0, the episode's last H actions, most recent first (the policy's memory):
    hist_tokens [H, Le] int32 (the words of what each action aimed at: the tapped element's label, the
    typed text, the swipe's direction; Action.note, which the pointer family's to_action writes)
    hist_feats [H, NUM_ACTION_TYPES + 1] f32 (the action's kind, one-hot, and its age (i + 1) / H)
    hist_mask [H] bool   episode_step [1] f32 (actions taken so far / 16)

With a text encoder (ModelConfig.text_encoder), also its WordPiece ids (common/policies/pointer/text_encoder.py adds
the encoder's states from them before the policy runs):
    instr_wp [Lp] int32   instr_wp_word [Lp] int32 (the word slot of each piece, -1 for none)
    elem_wp [E, Lq] int32
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from common.config import ModelConfig
from common.policies.pointer import tokenizer
from common.protocol.episodes import EpisodeSpec
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS, Action, Observation

NUM_ELEMENT_FEATURES = 10
NUM_INSTRUCTION_FEATURES = 3
NUM_HISTORY_FEATURES = NUM_ACTION_TYPES + 1
STEP_SCALE = 16.0
"""episode_step = actions taken / STEP_SCALE (about one at a typical step limit)."""


def feature_spec(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype string) of every featurized array; the wire validator checks against it."""
    li, e, le = cfg.max_instruction_tokens, cfg.max_elements, cfg.max_element_tokens
    return {
        "instr_tokens": ((li,), "<i4"),
        "instr_mask": ((li,), "|b1"),
        "instr_feats": ((li, NUM_INSTRUCTION_FEATURES), "<f4"),
        "elem_tokens": ((e, le), "<i4"),
        "elem_mask": ((e,), "|b1"),
        "elem_feats": ((e, NUM_ELEMENT_FEATURES), "<f4"),
        **history_spec(cfg),
        **text_spec(cfg),
    }


def history_spec(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """The memory arrays featurize adds with ModelConfig.history > 0 (none without)."""
    h = cfg.history
    if not h:
        return {}
    return {
        "hist_tokens": ((h, cfg.max_element_tokens), "<i4"),
        "hist_feats": ((h, NUM_HISTORY_FEATURES), "<f4"),
        "hist_mask": ((h,), "|b1"),
        "episode_step": ((1,), "<f4"),
    }


def text_spec(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """The WordPiece arrays featurize adds for a text encoder (none without one)."""
    if not cfg.uses_text_encoder:
        return {}
    return {
        "instr_wp": ((cfg.max_instruction_pieces,), "<i4"),
        "instr_wp_word": ((cfg.max_instruction_pieces,), "<i4"),
        "elem_wp": ((cfg.max_elements, cfg.max_element_pieces), "<i4"),
    }


def episode_spec(cfg: ModelConfig, text_vocab_size: int) -> EpisodeSpec:
    """What the pointer family's episodes carry, for the protocol's checks (common/protocol/episodes.py):
    `feature_spec`'s arrays; its four choices, each below the number of options it picks from; and the ids
    an embedding looks up inside its table: words of the hashing vocabulary, and with a text encoder
    WordPiece ids of its vocabulary (`text_vocab_size`, text_encoder.vocab_size) and word slots -1 (none)
    or a real slot."""
    features = feature_spec(cfg)
    elements, words = cfg.max_elements, cfg.max_instruction_tokens
    ids = {"instr_tokens": (0, cfg.vocab_size), "elem_tokens": (0, cfg.vocab_size)}
    if cfg.history:
        ids["hist_tokens"] = (0, cfg.vocab_size)
    if "instr_wp" in features:
        if text_vocab_size < 1:
            raise ValueError("checking WordPiece ids needs the text encoder's vocabulary size (>= 1)")
        ids.update(instr_wp=(0, text_vocab_size), elem_wp=(0, text_vocab_size), instr_wp_word=(-1, words))
    choices = {
        "action_type": ("<i4", NUM_ACTION_TYPES),
        "element": ("<i4", elements),
        "word": ("<i4", words * cfg.span_words),
        "direction": ("<i4", NUM_SWIPE_DIRECTIONS),
    }
    return EpisodeSpec(dict(features), choices, ids)


def input_spec(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """What the policy reads: feature_spec plus the encoder states text_encoder.TextEmbedder adds."""
    spec = feature_spec(cfg)
    if cfg.uses_text_encoder:
        d = cfg.text_dim
        spec.update(
            instr_text=((cfg.max_instruction_tokens, d), "<f4"),
            instr_sentence=((d,), "<f4"),
            elem_text=((cfg.max_elements, d), "<f4"),
        )
    return spec


def instruction_words(instruction: str, cfg: ModelConfig) -> list[str]:
    """The words (as written) the typed-text pointer indexes into."""
    return tokenizer.surface_words(instruction)[: cfg.max_instruction_tokens]


def span_of(choice: int, cfg: ModelConfig) -> tuple[int, int]:
    """The typed-text choice as (first word, number of words): choice = first * span_words + words - 1
    (with span_words 1, the word itself)."""
    first, extra = divmod(int(choice), cfg.span_words)
    return first, extra + 1


def span_choice(first: int, count: int, cfg: ModelConfig) -> int:
    """Inverse of span_of."""
    if not 1 <= count <= cfg.span_words:
        raise ValueError(f"a span of {count} words; this policy types 1 to {cfg.span_words}")
    return first * cfg.span_words + count - 1


def valid_spans(n_words: int, cfg: ModelConfig) -> int:
    """How many typed-text choices an instruction of n_words words allows (spans inside it)."""
    return sum(min(cfg.span_words, n_words - i) for i in range(n_words))


def featurize(obs: Observation, cfg: ModelConfig, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
    """One observation as the arrays of the module docstring; `history` is the episode's actions so far,
    oldest first (read only with ModelConfig.history > 0)."""
    li, e, le, v = cfg.max_instruction_tokens, cfg.max_elements, cfg.max_element_tokens, cfg.vocab_size
    instr_tokens, instr_mask = tokenizer.encode(obs.instruction, li, v)
    instr_words = set(tokenizer.words(obs.instruction))
    elements = obs.elements[:e]
    width, height = obs.screen_size
    elem_tokens = np.zeros((e, le), np.int32)
    elem_mask = np.zeros(e, bool)
    elem_feats = np.zeros((e, NUM_ELEMENT_FEATURES), np.float32)
    screen_words: set[str] = set()
    field_words: set[str] = set()
    for i, el in enumerate(elements):
        label_words = tokenizer.words(el.label)
        screen_words.update(label_words)
        if "EditText" in el.cls:
            field_words.update(tokenizer.words(el.text))  # what is typed, not the hint
        elem_tokens[i], _ = tokenizer.encode(el.label, le, v)
        elem_mask[i] = True
        left, top, right, bottom = el.bounds
        overlap = sum(w in instr_words for w in label_words) / len(label_words) if label_words else 0.0
        elem_feats[i] = (
            left / width,
            top / height,
            right / width,
            bottom / height,
            el.clickable,
            el.checked,
            el.focused,
            el.scrollable,
            "EditText" in el.cls,
            overlap,
        )
    instr_feats = np.zeros((li, NUM_INSTRUCTION_FEATURES), np.float32)
    for i, w in enumerate(instruction_words(obs.instruction, cfg)):
        instr_feats[i, 0] = w.lower() in screen_words
        instr_feats[i, 1] = w.lower() in field_words
        instr_feats[i, 2] = i > 0 and instr_feats[i - 1, 1]
    out = {
        "instr_tokens": instr_tokens,
        "instr_mask": instr_mask,
        "instr_feats": instr_feats,
        "elem_tokens": elem_tokens,
        "elem_mask": elem_mask,
        "elem_feats": elem_feats,
    }
    if cfg.history:
        out.update(_history(history, cfg))
    if cfg.uses_text_encoder:
        out.update(_word_pieces(obs, elements, cfg))
    return out


def _history(history: Sequence[Action], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The last cfg.history actions, most recent first, as words, kind and age (module docstring)."""
    h, le = cfg.history, cfg.max_element_tokens
    tokens = np.zeros((h, le), np.int32)
    feats = np.zeros((h, NUM_HISTORY_FEATURES), np.float32)
    mask = np.zeros(h, bool)
    for i, action in enumerate(reversed(history[-h:])):
        tokens[i], _ = tokenizer.encode(action.note, le, cfg.vocab_size)
        if int(action.type) < NUM_ACTION_TYPES:  # NOOP (an unparsed lm action) has no kind column
            feats[i, int(action.type)] = 1.0
        feats[i, -1] = (i + 1) / h
        mask[i] = True
    step = np.array([len(history) / STEP_SCALE], np.float32)
    return {"hist_tokens": tokens, "hist_feats": feats, "hist_mask": mask, "episode_step": step}


def _word_pieces(obs: Observation, elements, cfg: ModelConfig) -> dict[str, np.ndarray]:
    from common.policies.pointer.text_encoder import word_pieces

    pieces = word_pieces(cfg.text_encoder)
    if cfg.raw_instruction:
        ids, slot = pieces.raw_instruction(
            obs.instruction, cfg.max_instruction_pieces, cfg.max_instruction_tokens
        )
    else:
        ids, slot = pieces.instruction(
            tuple(tokenizer.surface_words(obs.instruction)),
            cfg.max_instruction_pieces,
            cfg.max_instruction_tokens,
        )
    elem = np.zeros((cfg.max_elements, cfg.max_element_pieces), np.int32)
    for i, el in enumerate(elements):
        elem[i] = pieces.label(el.label, cfg.max_element_pieces)
    return {"instr_wp": ids.copy(), "instr_wp_word": slot.copy(), "elem_wp": elem}


def stack(features: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack per-observation features along a new leading axis."""
    return {k: np.stack([f[k] for f in features]) for k in features[0]}
