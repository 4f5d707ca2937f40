"""`python -m benchmarks gpu`: what a machine with an accelerator gives the `lm` family (issue 47, item 4), as
one prepared script of at most 8 minutes, so a GPU lent for a quarter of an hour is spent measuring.

1. **Decoder train step**: tokens per second and model FLOPs utilization (MFU) of one jitted update
   (next-token cross-entropy through the whole decoder, Adam, LoRA rank 8 on the top 8 blocks and full
   fine-tuning) on [batch, length] tokens, for SmolLM2-135M (the packaged weights) and a Qwen2.5-1.5B-sized
   configuration (random weights: the speed does not depend on them), parameters in bfloat16 and float32.
   MFU = 6 N tokens / seconds / the device's dense bfloat16 peak (PEAK_TFLOPS by device name; N the
   decoder's parameters without the embedding table; 6 N is a full fine-tuning step's matmul FLOPs, so a
   LoRA step, whose frozen weights get no gradient, is flattered by up to a third; `xla_tflops` is XLA's
   own count of what the step computed). Without a known peak (a CPU) MFU is left empty.
2. **The recipe with many actors**: `python -m learner --model.kind lm --local-actors N` for a few
   minutes on the host's cores (the learner on the accelerator, each actor on one core), then the greedy
   evaluation of its checkpoint (`python -m learner eval`): updates made, episodes, and greedy success.

`--dry-run` runs every part at tiny sizes on CPU (a 2-block decoder, a tiny random backbone over
SmolLM2's tokenizer for the run, seconds instead of minutes) and is what the suite runs
(tests/test_benchmarks.py), so the script is known to work before a GPU is lent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "TPU v5e": 197.0, "TPU v4": 275.0}
"""Dense bfloat16 peak TFLOP/s by a substring of jax's device_kind (SXM parts; vendors' data sheets)."""

QWEN25_15B = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "num_hidden_layers": 28,
    "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "eos_token_id": 151645,
}  # fmt: skip
"""Qwen2.5-1.5B-Instruct's config.json shape fields (random weights here: the speed is the shape's)."""

TINY = {
    "model_type": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "max_position_embeddings": 2048, "tie_word_embeddings": True, "eos_token_id": 2,
}  # fmt: skip
"""The dry run's decoder."""

RUN_S = 240
"""Seconds of the recipe run on an accelerator machine (its start-up and the evaluation come on top)."""


def peak_tflops(device_kind: str) -> float | None:
    """The dense bfloat16 peak of a device by its jax device_kind, None when unknown (CPUs)."""
    return next((peak for name, peak in PEAK_TFLOPS.items() if name.lower() in device_kind.lower()), None)


def _decoder(config: dict | None, dtype: str, lora):
    """SmolLM2 (config None: the packaged weights) or a random decoder of `config`."""
    import jax.numpy as jnp
    from flax import nnx

    from common.backbones.decoder.config import DecoderConfig
    from common.backbones.decoder.llama import Decoder
    from common.backbones.pretrained import load_pretrained

    if config is None:
        return load_pretrained("default", param_dtype=dtype, lora=lora).model
    cfg = DecoderConfig.from_dict(config, "benchmarks/gpu.py")
    return Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.dtype(dtype), lora=lora)


def train_row(name: str, config: dict | None, dtype: str, lora_rank: int, batch: int, length: int) -> dict:
    """One train step's tokens/s and MFU (module docstring, part 1; decoder_speed's step)."""
    import jax
    from flax import nnx

    from benchmarks.decoder_speed import timed_train_step
    from common.backbones.decoder.lora import LoraConfig

    lora = LoraConfig(rank=lora_rank, last_layers=8) if lora_rank else None
    model = _decoder(config, dtype, lora)
    cfg = model.cfg
    base = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))  # the adapters are not N
    n = sum(x.size for x in jax.tree.leaves(base)) - cfg.vocab_size * cfg.hidden_size
    step = timed_train_step(model, lora is not None, batch, length, 3)
    seconds = step["seconds"]
    peak = peak_tflops(jax.devices()[0].device_kind)
    model_tflops = 6 * n * batch * length / seconds / 1e12
    return {
        "kind": "train step",
        "model": name,
        "dtype": dtype,
        "lora_rank": lora_rank,
        "batch": batch,
        "length": length,
        "params_m": n / 1e6,
        "compile_s": step["compile_s"],
        "step_ms": seconds * 1e3,
        "tokens_per_s": batch * length / seconds,
        "model_tflops": model_tflops,
        "xla_tflops": step["gflop"] / seconds / 1e3,
        "mfu": model_tflops / peak if peak else None,
    }


def recipe_row(dry_run: bool, workdir: Path) -> dict:
    """The lm recipe with one actor per spare core, then its greedy evaluation (module docstring, part 2)."""
    actors = 2 if dry_run else max(2, (os.cpu_count() or 4) - 2)
    run_dir = workdir / "run"
    learner = [sys.executable, "-m", "learner", "--model.kind", "lm", "--local-actors", str(actors)]
    learner += [
        "--run-dir",
        str(run_dir),
        "--envs-per-actor",
        "4",
        "--time-limit",
        str(120 if dry_run else RUN_S),
    ]
    evaluate = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(run_dir), "--split", "train"]
    evaluate += ["--episodes", "8" if dry_run else "100", "--json", str(workdir / "eval.json")]
    if dry_run:
        backbone = _tiny_backbone(workdir / "tiny")
        learner += ["--model.backbone", str(backbone), "--warmup-demos", "12", "--validation-demos", "4"]
        learner += ["--model.lm-prompt-tokens", "128", "--max-steps", "4", "--model.lora-layers", "1"]
        learner += ["--max-updates", "3"]  # ends by updates, not by the time a busy machine gives it
    t0 = time.perf_counter()
    subprocess.run(learner, check=True, stdout=subprocess.DEVNULL, timeout=RUN_S + 600)
    run_s = time.perf_counter() - t0
    subprocess.run(evaluate, check=True, stdout=subprocess.DEVNULL, timeout=1200)
    final = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    result = json.loads((workdir / "eval.json").read_text())
    return {
        "kind": "recipe run",
        "actors": actors,
        "run_s": run_s,
        "updates": final["update"],
        "imitation_updates": final["imitation_updates"],
        "episodes": final["episodes"],
        "validation_nll": final.get("validation/nll"),
        "greedy_train_success": result["success"],
        "eval_episodes": result["episodes"],
    }


def _tiny_backbone(folder: Path) -> Path:
    """A 2-block random decoder over SmolLM2's tokenizer (tests/lm_backbone.py's), for the dry run."""
    from tests.lm_backbone import tiny_lm_folder

    return tiny_lm_folder(folder)


def run(quick: bool, dry_run: bool = False) -> list[dict]:
    """Part 1 at SmolLM2 and Qwen2.5-1.5B sizes (the dry run: the tiny decoder), then part 2."""
    if dry_run:
        sizes = [("tiny", TINY, 2, 32)]
    else:
        sizes = [("SmolLM2-135M", None, 16, 512), ("Qwen2.5-1.5B-sized", QWEN25_15B, 8, 512)]
    rows = []
    for name, config, batch, length in sizes:
        for dtype in ("bfloat16", "float32"):
            for rank in (8, 0):
                if quick and (dtype, rank) != ("bfloat16", 8):
                    continue
                rows.append(train_row(name, config, dtype, rank, batch, length))
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(recipe_row(dry_run, Path(tmp)))
    return rows
