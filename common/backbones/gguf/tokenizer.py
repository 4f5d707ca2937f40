"""A `tokenizers` byte-level BPE tokenizer rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.

A GGUF file carries its tokenizer as data: the vocabulary (`tokens`), the BPE `merges`, each token's type
(normal, control, user-defined, ...), the special ids, and a `pre` name that selects llama.cpp's
pre-tokenizer: the regular expressions that cut text into words before BPE runs (llama.cpp,
`src/llama-vocab.cpp`, `llm_tokenizer_bpe`). The expressions below are llama.cpp's, applied one after the
other as its `unicode_regex_split` does, so the rebuilt tokenizer gives llama.cpp's ids. Only the 'gpt2'
(byte-level BPE) tokenizer model is rebuilt; SentencePiece ('llama') files and unknown pre types are refused
by name rather than tokenised subtly wrong.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from common.backbones.checkpoint import CheckpointError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": (_DEFAULT, False),
    "llama3": ((_LLAMA3,), True),
    "llama-v3": ((_LLAMA3,), True),
    "llama-bpe": ((_LLAMA3,), True),
    "falcon3": ((_LLAMA3,), True),
    "smollm": ((r"\p{N}", _GPT2), False),
    "starcoder": ((r"\p{N}", _GPT2), False),
    "refact": ((r"\p{N}", _GPT2), False),
    "gpt-2": ((_GPT2,), False),
    "phi-2": ((_GPT2,), False),
    "mpt": ((_GPT2,), False),
    "olmo": ((_GPT2,), False),
    "qwen2": ((_QWEN2,), False),
    "stablelm2": ((_QWEN2,), False),
    "deepseek-r1-qwen": ((_QWEN2,), False),
}
"""`tokenizer.ggml.pre` -> (llama.cpp's split expressions, in order; whether BPE takes a word found whole in the
vocabulary before merging, llama.cpp's `ignore_merges`)."""

CONTROL, USER_DEFINED = 3, 4
"""llama.cpp token types: control tokens (<|im_start|>, <|endoftext|>) and user-defined added tokens."""


def _pre_tokenizer(pre: str, where: str) -> tuple[pre_tokenizers.PreTokenizer, bool]:
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"{where}: tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    expressions, ignore_merges = PRE_TOKENIZERS[pre]
    splits = [pre_tokenizers.Split(Regex(expr), behavior="isolated") for expr in expressions]
    # after the words are cut, only the byte -> printable-character mapping of byte-level BPE remains
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([*splits, byte_level]), ignore_merges


def _merges(metadata: dict, where: str) -> list[tuple[str, str]]:
    """Merges as pairs; llama.cpp splits each "left right" at the first space after the first character."""
    out = []
    for merge in metadata.get("tokenizer.ggml.merges", []):
        cut = merge.find(" ", 1)
        if cut < 0:
            raise CheckpointError(f"{where}: tokenizer.ggml.merges entry {merge!r} is not two tokens")
        out.append((merge[:cut], merge[cut + 1 :]))
    return out


def build_tokenizer(metadata: dict, add_bos: bool, where: str) -> Tokenizer:
    """The byte-level BPE tokenizer of a GGUF file's metadata, with its control and user-defined tokens
    matched whole in text (so '<|im_start|>' is one id), and, when `add_bos`, a post-processor that puts
    the bos token first for consumers of the saved tokenizer.json."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(
            f"{where}: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise CheckpointError(f"{where}: GGUF metadata has no tokenizer.ggml.tokens")
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    pre, ignore_merges = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"), where)
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=_merges(metadata, where), ignore_merges=ignore_merges)
    )
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    types = metadata.get("tokenizer.ggml.token_type", [])
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
    )
    tokenizer.add_tokens(
        [
            AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types)
            if t == USER_DEFINED
        ]
    )
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if add_bos and bos is not None:
        tokenizer.post_processor = bos_post_processor(tokens[int(bos)], int(bos))
    return tokenizer


def bos_post_processor(token: str, token_id: int) -> processors.TemplateProcessing:
    """The post-processor a Hugging Face tokenizer.json uses to put bos first (Llama's layout)."""
    return processors.TemplateProcessing(
        single=f"{token}:0 $A:0", pair=f"{token}:0 $A:0 {token}:1 $B:1", special_tokens=[(token, token_id)]
    )


def special_ids(metadata: dict) -> tuple[int | None, tuple[int, ...], int | None]:
    """(bos id, eos ids, pad id) of the metadata; llama.cpp's end-of-turn and end-of-message ids also end
    generation, so they join the eos ids after the eos id itself."""
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    eos: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    pad = metadata.get("tokenizer.ggml.padding_token_id")
    return (None if bos is None else int(bos)), tuple(eos), (None if pad is None else int(pad))


def add_bos_default(metadata: dict) -> bool:
    """Whether encoding starts with bos: `tokenizer.ggml.add_bos_token` when present, else llama.cpp's
    default for the pre type (True for the Llama 3 family, False for other byte-level BPE vocabularies)."""
    if "tokenizer.ggml.add_bos_token" in metadata:
        return bool(metadata["tokenizer.ggml.add_bos_token"])
    return metadata.get("tokenizer.ggml.pre") in ("llama3", "llama-v3", "llama-bpe", "falcon3")
