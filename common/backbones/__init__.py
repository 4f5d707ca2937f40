"""Pretrained backbones read from local Hugging Face checkpoint folders (nothing is ever downloaded).

A backbone module is built from a folder's `config.json` and filled from its `model.safetensors`; a
wrong folder fails with one message naming the folder and the missing or mismatched tensor. Today: the
BERT family of text encoders (`common.backbones.bert`). A vision tower or a decoder goes in a module of
its own with the same three parts: a config read from `config.json`, an NNX module, and a loader that
maps the checkpoint's tensor names onto the module.
"""

from common.backbones.checkpoint import CheckpointError

__all__ = ["CheckpointError"]
