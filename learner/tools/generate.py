"""`python -m learner generate`: does a checkpoint load, and what does it say?

Loads a decoder ("default" = the packaged SmolLM2, a Hugging Face folder or a .gguf file), continues one
prompt and prints the text; `--json` also writes the prompt ids, the generated ids and each generated
token's log-probability (common/backbones/generate.py says under which distribution), for checks against
another implementation.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.backbones.checkpoint import CheckpointError
from common.backbones.pretrained import DEFAULT, Pretrained


@dataclass(frozen=True)
class GenerateConfig:
    """Load a pretrained decoder and continue one prompt."""

    model: str = DEFAULT
    """'default' (the packaged SmolLM2-135M-Instruct), a Hugging Face checkpoint folder, or a .gguf file."""
    prompt: str | None = None
    """Text to continue; wrapped in the checkpoint's chat template as a user message unless --no-chat."""
    prompt_ids: str | None = None
    """Comma-separated token ids, used exactly as given (no chat template, no BOS added)."""
    no_chat: bool = False
    """Tokenize --prompt as it is, without the chat template."""
    system: str | None = None
    """A system message for the chat template (default: the template's own, if it has one)."""
    max_new_tokens: int = 64
    """Most tokens to generate (fewer when an end-of-sequence token comes first)."""
    temperature: float = 0.0
    """0 decodes greedily; above 0 samples from the distribution at this temperature."""
    seed: int = 0
    """Seed of the sampling."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter and compute dtype."""
    json: Path | None = None
    """Also write prompt_ids, tokens, logprobs, text (and stop, seconds) to this file."""

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise SystemExit("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
        if self.max_new_tokens < 1:
            raise SystemExit(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise SystemExit(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")


def parse_ids(text: str) -> list[int]:
    """'1, 2,3' -> [1, 2, 3] (SystemExit naming the bad entry)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SystemExit("--prompt-ids is empty")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise SystemExit(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def prompt_ids(cfg: GenerateConfig, loaded: Pretrained) -> list[int]:
    """The token ids to continue: as given, or the prompt tokenized (inside the chat template unless
    --no-chat or the tokenizer has no template)."""
    if cfg.prompt_ids is not None:
        return parse_ids(cfg.prompt_ids)
    tokenizer = loaded.require_tokenizer()
    text = cfg.prompt
    if not cfg.no_chat and tokenizer.chat_template:
        text = tokenizer.chat_prompt(cfg.prompt, system=cfg.system)
    return tokenizer.encode(text)


def generate(cfg: GenerateConfig) -> dict:
    """Run the command; the result (the --json content) is also returned."""
    from common.backbones.generate import Generator
    from common.backbones.pretrained import load_pretrained

    started = time.perf_counter()
    loaded = load_pretrained(cfg.model, param_dtype=cfg.dtype)
    ids = prompt_ids(cfg, loaded)
    print(
        f"loaded {loaded.path} ({loaded.config.model_type}, {loaded.config.num_hidden_layers} layers) "
        f"in {time.perf_counter() - started:.1f} s; prompt {len(ids)} tokens",
        file=sys.stderr,
    )
    eos = loaded.tokenizer.eos_ids if loaded.tokenizer else loaded.config.eos_token_id
    started = time.perf_counter()
    (done,) = Generator(loaded.model).generate(
        [ids], cfg.max_new_tokens, temperature=cfg.temperature, eos_ids=eos, seed=cfg.seed
    )
    seconds = time.perf_counter() - started
    text = loaded.tokenizer.decode(done.tokens, skip_special=True) if loaded.tokenizer else None
    result = {
        "prompt_ids": ids,
        "tokens": done.tokens,
        "logprobs": done.logprobs,
        "text": text,
        "stop": done.stop,
        "seconds": round(seconds, 3),
    }
    print(text if text is not None else " ".join(map(str, done.tokens)))
    print(
        f"{len(done.tokens)} tokens in {seconds:.1f} s (compilation included); stop: {done.stop}",
        file=sys.stderr,
    )
    if cfg.json is not None:
        cfg.json.parent.mkdir(parents=True, exist_ok=True)
        cfg.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(cfg: GenerateConfig) -> int:
    """The command's exit status: 0, or 2 with one line for a checkpoint that cannot be used."""
    try:
        generate(cfg)
    except (CheckpointError, ValueError) as err:
        print(f"python -m learner generate: {err}", file=sys.stderr)
        return 2
    return 0
