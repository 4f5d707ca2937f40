"""Pretrained backbones read from local checkpoints (nothing is ever downloaded).

Each backbone has three parts: a config read from `config.json`, an NNX module whose parameters carry
logical axis names (`axes.py` maps them onto a device mesh), and a loader that maps the checkpoint's
tensor names onto the module; a wrong checkpoint fails with one message naming the file and the missing
or mismatched tensor. Today: the BERT family of text encoders (`bert.py`) and the Llama family of
decoders (`llama.py`: Llama 2/3, SmolLM2, Qwen2/2.5, Qwen3), loaded from Hugging Face folders or GGUF
files through `pretrained.load_pretrained`, with LoRA (`lora.py`), generation (`generate.py`) and
snapshots of what training changes (`decoder_snapshot.py`).
"""

from common.backbones.checkpoint import CheckpointError

__all__ = ["CheckpointError"]
