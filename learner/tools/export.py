"""`python -m learner export SOURCE OUT_DIR`: a decoder as a Hugging Face folder that transformers or vLLM
serve as they are.

SOURCE is a run folder holding a decoder snapshot (RUN_DIR/decoder.safetensors), a snapshot file itself,
or any checkpoint `load_pretrained` reads ("default", a Hugging Face folder, a .gguf file: exporting one
of those converts it, e.g. the packaged GGUF into safetensors). LoRA adapters are merged into the base
weights. OUT_DIR gets config.json, model.safetensors (Hugging Face tensor names), generation_config.json,
and the tokenizer (tokenizer.json, tokenizer_config.json with the chat template). The folder is written
next to OUT_DIR and renamed into place, so an interrupted export leaves no half folder behind.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from common.backbones.checkpoint import CheckpointError
from learner.serving.snapshots import DECODER_SNAPSHOT


@dataclass(frozen=True)
class ExportConfig:
    """Write a decoder (LoRA merged) as a Hugging Face checkpoint folder."""

    source: Annotated[str, tyro.conf.Positional]
    """A run folder with decoder.safetensors, a decoder snapshot file, 'default', a Hugging Face folder or a .gguf file."""
    out_dir: Annotated[Path, tyro.conf.Positional]
    """The folder to write (must not exist yet, unless --force)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The dtype of the written weights (torch_dtype in config.json)."""
    force: bool = False
    """Replace OUT_DIR if it exists."""


def load_source(source: str):
    """(Pretrained, merged Decoder) for any SOURCE the command takes."""
    from common.backbones.decoder import snapshot as decoder_snapshot
    from common.backbones.decoder.weights import merge_lora
    from common.backbones.pretrained import load_pretrained

    path = Path(source)
    snapshot = path / DECODER_SNAPSHOT if path.is_dir() and (path / DECODER_SNAPSHOT).is_file() else None
    if path.is_file() and path.suffix == ".safetensors":
        snapshot = path
    if snapshot is None:
        loaded = load_pretrained(source)
        return loaded, loaded.model
    meta, flat = decoder_snapshot.read(snapshot)
    loaded = load_pretrained(meta["base"], lora=meta["lora"])
    decoder_snapshot.apply(loaded.model, meta["lora"], flat, where=str(snapshot))
    return loaded, merge_lora(loaded.model) if meta["lora"] else loaded.model


def write_folder(out: Path, loaded, model, dtype: str) -> None:
    """Config, weights, generation config and tokenizer into `out` (which must exist and be empty)."""
    import numpy as np
    from safetensors.numpy import save_file

    from common.backbones.decoder.weights import to_tensors

    config = {**loaded.config.to_dict(), "torch_dtype": dtype}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = to_tensors(model)
    if dtype == "bfloat16":  # safetensors.numpy has no bfloat16: store via ml_dtypes (jax's own)
        import ml_dtypes

        tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "model.safetensors").chmod(
        0o644
    )  # safetensors creates it private; a served folder is read by others
    eos = list(loaded.config.eos_token_id)
    generation = {
        "bos_token_id": loaded.config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if loaded.tokenizer is not None:
        loaded.tokenizer.save(out)


def export(cfg: ExportConfig) -> Path:
    """Run the command; returns the folder written."""
    out = cfg.out_dir
    if out.exists() and not cfg.force:
        raise CheckpointError(f"{out}: already exists (choose another folder, or --force to replace it)")
    loaded, model = load_source(cfg.source)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write_folder(staging, loaded, model, cfg.dtype)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def main(cfg: ExportConfig) -> int:
    """Exit status: 0, or 2 with one line when the source cannot be read or the target is taken."""
    try:
        out = export(cfg)
    except (CheckpointError, ValueError) as err:
        print(f"python -m learner export: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} (config.json, model.safetensors, tokenizer)", file=sys.stderr)
    return 0
