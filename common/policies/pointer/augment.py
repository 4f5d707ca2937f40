"""Word renaming: train the policy to act on words it has never seen.

A phone agent must type and tap values that were not in its training data (a new contact name, a new
search query). With a few values per task template, a policy learns to point at *which word* ("Paris")
rather than *where the word sits* ("the words after 'Search for'"), and fails on every new value.

`rename_words` renames a random share of the distinct words of each episode to random vocabulary ids,
consistently: the same word gets the same new id in the instruction and on every screen of the episode,
at every step. Everything the featurizer derives from word identity (an instruction word is visible on
screen, an element's label overlaps the instruction) therefore stays true, and the renamed episode is a
valid episode of the same task with unseen values. The words an episode types (found in a text field at
some step) have their own rate: they are the values. The other words are renamed too, so the policy
also learns not to depend on any single word. This is word dropout (Iyyer et al. 2015) and
entity anonymization (Hermann et al. 2015), done so that the episode stays consistent.

With a pretrained text encoder the features also carry the words' WordPiece ids, and renaming only the
hashed ids would leave the encoder's states of the value in place: the policy would learn to read "Paris"
through the encoder and fail on a new city. So a renamed *value* (an instruction word the episode types)
also gets new pieces (given a `PieceTable` of the encoder's vocabulary), the same ones wherever that
word's pieces stand in a label of the episode: each piece becomes a random real piece of the same kind
(word start or `##` continuation, letters or digits), so "tanaka" may become "vel ##ham" (velham): a
plausible word the encoder has states for, never the value itself. Punctuation and special pieces stay.
Other renamed words (`rate`: word dropout) keep their pieces: they say what to do, and the encoder
should go on reading that while their hashed ids do not.

The randomness comes from a seed per batch, so a resumed run renames exactly as an uninterrupted one.
The learner asks for it through the family's `augment` hook (common/policies/family.py:Augments), keeps
the observations as acted on beside the renamed ones (Batch.acted_obs), and computes the importance
ratios on those (learner/training/train_step.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from common.policies.pointer.text_encoder import word_pieces

TOKEN_KEYS = ("instr_tokens", "elem_tokens", "hist_tokens")
"""Featurized arrays that hold hashed word ids (0 is padding), renamed alike (hist_tokens only with a
memory, ModelConfig.history: the labels an episode's actions aimed at are renamed as the same words on
screen are)."""

KEEP, WORD, NUMBER, WORD_CONT, NUMBER_CONT = range(5)
"""Kinds of WordPiece: kept as is (punctuation, special, mixed), a word start of letters, of digits, and
the `##` continuations of each; a renamed piece becomes a random piece of its own kind."""


@dataclasses.dataclass(frozen=True)
class PieceTable:
    """The kind of every WordPiece id of an encoder's vocabulary, and the ids of each kind to draw from."""

    kind: np.ndarray
    """[vocab] int8: KEEP, WORD, NUMBER, WORD_CONT or NUMBER_CONT."""
    choices: tuple[np.ndarray, ...]
    """Per kind, the ids of that kind (empty for KEEP): what a renamed piece of the kind may become."""

    @property
    def continuation(self) -> np.ndarray:
        """[vocab] bool: the piece continues the word before it (a `##` piece)."""
        return (self.kind == WORD_CONT) | (self.kind == NUMBER_CONT)

    @classmethod
    def from_vocabulary(cls, pieces: Sequence[str]) -> PieceTable:
        """From the vocabulary in id order (tokenizer.json's). Word starts of one character are not drawn
        (single letters read as initials, not as a new word), but are renamed like any other."""
        kind = np.full(len(pieces), KEEP, np.int8)
        draw = np.zeros(len(pieces), bool)
        for i, piece in enumerate(pieces):
            cont = piece.startswith("##")
            body = piece[2:] if cont else piece
            if body.isascii() and body.isalpha():
                kind[i] = WORD_CONT if cont else WORD
            elif body.isascii() and body.isdigit():
                kind[i] = NUMBER_CONT if cont else NUMBER
            draw[i] = cont or len(body) > 1 or kind[i] == NUMBER
        choices = tuple(
            np.flatnonzero((kind == k) & draw).astype(np.int32) if k != KEEP else np.zeros(0, np.int32)
            for k in range(5)
        )
        for k in (WORD, NUMBER, WORD_CONT, NUMBER_CONT):
            if not len(choices[k]):  # a vocabulary without such pieces: keep them
                kind[kind == k] = KEEP
        return cls(kind, choices)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective, well-mixed 64-bit hash (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@functools.lru_cache(maxsize=4)
def piece_table(text_encoder: str) -> PieceTable:
    """The PieceTable of a `--model.text-encoder`'s tokenizer (read once per process)."""
    return PieceTable.from_vocabulary(word_pieces(text_encoder).vocabulary())


def rename_words(
    obs: dict[str, np.ndarray],
    rate: float,
    vocab_size: int,
    seed: int | Sequence[int],
    typed_rate: float | None = None,
    pieces: PieceTable | None = None,
) -> dict[str, np.ndarray]:
    """Copy of `obs` (featurized observations with a leading episode axis) with words renamed.

    Each distinct word id of episode b is renamed with probability `rate` (`typed_rate` for the words
    the episode types: instruction words that are in a text field at some step, instr_feats[..., 1]),
    independently per episode, to `1 + h % (vocab_size - 1)` for a hash h of (id, episode seed); padding
    (0) stays 0. With `pieces` and WordPiece arrays in `obs`, the renamed words the episode types get new
    pieces too (`rename_pieces`); other renamed words keep theirs. Arrays other than TOKEN_KEYS and the
    renamed WordPiece ids (instr_wp, elem_wp) are shared, not copied.
    """
    typed_rate = rate if typed_rate is None else typed_rate
    for name, value in (("rate", rate), ("typed rate", typed_rate)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"word rename {name} must be in [0, 1], got {value}")
    if rate == 0.0 and typed_rate == 0.0:
        return obs
    episodes = obs[TOKEN_KEYS[0]].shape[0]
    episode_seed = np.random.default_rng(seed).integers(0, 2**63, size=episodes, dtype=np.uint64)
    with_pieces = pieces is not None and "instr_wp" in obs
    typed = _typed_ids(obs) if typed_rate != rate or with_pieces else None
    out = dict(obs)
    with np.errstate(over="ignore"):
        for key in (k for k in TOKEN_KEYS if k in obs):
            ids = np.asarray(obs[key])
            salt = episode_seed.reshape((episodes,) + (1,) * (ids.ndim - 1))
            h = _mix(ids.astype(np.uint64) * _GOLDEN ^ salt)
            renamed = (1 + _mix(h) % np.uint64(vocab_size - 1)).astype(ids.dtype)
            threshold = _threshold(rate)
            if typed is not None:
                is_typed = np.stack([np.isin(ids[b], typed[b]) for b in range(episodes)])
                threshold = np.where(is_typed, _threshold(typed_rate), threshold)
            chosen = (h < threshold) & (ids != 0)
            out[key] = np.where(chosen, renamed, ids)
            if key == "instr_tokens" and with_pieces:
                renamed_values = chosen & is_typed
    if with_pieces and renamed_values.any():
        out.update(rename_pieces(obs, renamed_values, pieces, episode_seed))
    return out


def rename_pieces(
    obs: dict[str, np.ndarray], renamed_slots: np.ndarray, pieces: PieceTable, episode_seed: np.ndarray
) -> dict[str, np.ndarray]:
    """New instr_wp and elem_wp in which the pieces of the instruction words marked in `renamed_slots`
    ([episodes, steps, Li] bool) are replaced, consistently within an episode.

    Piece j of word w becomes a piece of its kind chosen by a hash of (w's hashed id, j, episode seed), so
    the same word gets the same pieces at every step. In the labels, every whole-word occurrence of a
    renamed word's original pieces (the same pieces in a row, not followed by a `##` piece) is replaced by
    its new pieces.
    """
    ids, slot = np.asarray(obs["instr_wp"]), np.asarray(obs["instr_wp_word"])
    words = np.asarray(obs["instr_tokens"]).astype(np.uint64)
    episodes, lp = ids.shape[0], ids.shape[-1]
    safe_slot = np.maximum(slot, 0)
    piece_renamed = (slot >= 0) & np.take_along_axis(renamed_slots, safe_slot, axis=-1)
    word_of_piece = np.take_along_axis(words, safe_slot, axis=-1)
    # position of each piece inside its word: pieces of one word are contiguous
    starts = np.ones(slot.shape, bool)
    starts[..., 1:] = slot[..., 1:] != slot[..., :-1]
    index = np.broadcast_to(np.arange(lp), slot.shape)
    position = index - np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
    salt = episode_seed.reshape((episodes,) + (1,) * (ids.ndim - 1))
    with np.errstate(over="ignore"):
        h = _mix(_mix(word_of_piece * _GOLDEN ^ salt) + position.astype(np.uint64))
    new_ids = np.where(piece_renamed, _draw(pieces, ids, h), ids)
    return {
        "instr_wp": new_ids,
        "elem_wp": _rename_in_labels(obs["elem_wp"], ids, new_ids, slot, piece_renamed, pieces),
    }


def _draw(pieces: PieceTable, ids: np.ndarray, h: np.ndarray) -> np.ndarray:
    """For each piece id, a piece of its kind picked by the 64-bit hash h (KEEP pieces unchanged)."""
    kind = pieces.kind[ids]
    out = ids.copy()
    for k, choices in enumerate(pieces.choices):
        where = kind == k
        if k != KEEP and where.any():
            out[where] = choices[(h[where] % np.uint64(len(choices))).astype(np.int64)]
    return out


def _rename_in_labels(
    labels: np.ndarray,
    ids: np.ndarray,
    new_ids: np.ndarray,
    slot: np.ndarray,
    piece_renamed: np.ndarray,
    pieces: PieceTable,
) -> np.ndarray:
    """labels [episodes, steps, E, Lq] with each renamed word's old pieces replaced by its new ones. The
    instruction is the same at every step of an episode, so its first step says which words changed."""
    labels = np.asarray(labels)
    out = labels.copy()
    lq = labels.shape[-1]
    continues = pieces.continuation[
        np.concatenate([labels[..., 1:], np.zeros((*labels.shape[:-1], 1), labels.dtype)], axis=-1)
    ]
    for b in range(labels.shape[0]):
        renamed = piece_renamed[b, 0]
        for w in np.unique(slot[b, 0][renamed]):
            at = slot[b, 0] == w
            old, new = ids[b, 0][at], new_ids[b, 0][at]
            k = len(old)
            if k > lq:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(labels[b], k, axis=-1)
            match = (windows == old).all(-1) & ~continues[b][..., k - 1 : k - 1 + windows.shape[-2]]
            for j in range(k):
                target = out[b][..., j : j + match.shape[-1]]
                target[match] = new[j]
    return out


def _threshold(rate: float) -> np.uint64:
    """h < _threshold(rate) has probability `rate` for a uniform 64-bit h."""
    return np.uint64(min(int(rate * 2.0**64), 2**64 - 1))


def _typed_ids(obs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Per episode, the ids of instruction words that are in a text field at some step."""
    tokens, in_field = np.asarray(obs["instr_tokens"]), np.asarray(obs["instr_feats"])[..., 1] > 0
    return [np.unique(tokens[b][in_field[b] & (tokens[b] != 0)]) for b in range(tokens.shape[0])]
