"""A hashing word tokenizer: stable across processes and machines, nothing to download.

Words are whitespace-separated tokens with surrounding punctuation stripped and a possessive "'s"
dropped, so "newegg.com,", "7:30", "555-0134", "Wi-Fi" and "Garcia's" become "newegg.com", "7:30",
"555-0134", "Wi-Fi" and "Garcia": the units a policy types into a text field. Tokens without a letter or
digit ("&", "-") are skipped. Each word, lower-cased, maps to `1 + crc32(word) % (vocab_size - 1)`,
leaving id 0 for padding. Collisions are rare at the default vocabulary size and harmless for a policy
that also sees word-overlap features.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

PAD_ID = 0
_PUNCTUATION = "\"'`.,;:!?()[]{}<>%*"


def surface_spans(text: str) -> list[tuple[int, int]]:
    """Where each word of `surface_words` sits in `text`: (start, end) character offsets, so that pieces
    of a tokenizer that reads the raw text can be matched to word slots."""
    out = []
    for token in re.finditer(r"\S+", text):
        start, end = token.span()
        while start < end and text[start] in _PUNCTUATION:
            start += 1
        while end > start and text[end - 1] in _PUNCTUATION:
            end -= 1
        if text[start:end].lower().endswith("'s"):
            end -= 2
            while end > start and text[end - 1] in _PUNCTUATION:
                end -= 1
        if any(c.isalnum() for c in text[start:end]):
            out.append((start, end))
    return out


def surface_words(text: str) -> list[str]:
    """The words of `text` as written (case kept): what the typed-text pointer can type."""
    return [text[start:end] for start, end in surface_spans(text)]


def words(text: str) -> list[str]:
    """The lower-cased words the tokenizer hashes."""
    return [w.lower() for w in surface_words(text)]


def word_id(word: str, vocab_size: int) -> int:
    return 1 + zlib.crc32(word.encode("utf-8")) % (vocab_size - 1)


def encode(text: str, max_len: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [max_len] int32 (0 = padding) and a validity mask [max_len] bool; long text is cut."""
    ids = np.zeros(max_len, np.int32)
    toks = words(text)[:max_len]
    for i, w in enumerate(toks):
        ids[i] = word_id(w, vocab_size)
    mask = np.zeros(max_len, bool)
    mask[: len(toks)] = True
    return ids, mask
