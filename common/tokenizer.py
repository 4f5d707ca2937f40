"""A hashing word tokenizer: stable across processes and machines, nothing to download.

Words are lower-cased runs of letters and digits; each maps to `1 + crc32(word) % (vocab_size - 1)`,
leaving id 0 for padding. Collisions are rare at the default vocabulary size and harmless for a policy
that also sees word-overlap features.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

_WORD = re.compile(r"[a-z0-9]+")
PAD_ID = 0


def words(text: str) -> list[str]:
    """Split text into the words the tokenizer hashes (lower case, letters and digits)."""
    return _WORD.findall(text.lower())


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
