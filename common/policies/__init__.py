"""Policy families, picked by `--model.kind` (ModelConfig.kind): the interface is common/policies/family.py.

`make_policy(cfg)` builds the family the config names: a built-in one ("pointer", the default, or "lm") or, for a
family in the user's own code, `package.module:ClassName` (imported here, on the learner and on every
actor alike: the learner sends the kind in WELCOME), whose class takes the ModelConfig. `PRESETS` are the
model configs `--model-preset` names (the pointer policy's large preset for accelerators).
"""

from __future__ import annotations

import importlib

from common.config import ModelConfig
from common.policies.evaluation import Evaluation
from common.policies.family import Acted, PolicyFamily, ResolvesConfig
from common.policies.pointer.family import PointerPolicy
from common.policies.pointer.sizes import large_model_config

__all__ = [
    "BUILT_IN",
    "PRESETS",
    "Acted",
    "Evaluation",
    "PointerPolicy",
    "PolicyFamily",
    "make_policy",
    "resolved_config",
]


def _lm(cfg: ModelConfig) -> PolicyFamily:
    from common.policies.lm.family import LMPolicy  # imported when used: it reads checkpoints

    return LMPolicy(cfg)


BUILT_IN = {"pointer": PointerPolicy, "lm": _lm}
"""The families this package ships, by --model.kind: the pointer policy, and the language-model agent
(common/policies/lm)."""

PRESETS = {"large": large_model_config}
"""--model-preset name -> the ModelConfig it stands for (common/policies/pointer/sizes.py)."""


def make_policy(cfg: ModelConfig) -> PolicyFamily:
    """The family `cfg.kind` names; ValueError with the known kinds when it names none."""
    kind = cfg.kind
    if kind in BUILT_IN:
        return BUILT_IN[kind](cfg)
    module_name, _, class_name = kind.partition(":")
    if not class_name:
        raise ValueError(f"--model.kind must be one of {sorted(BUILT_IN)} or module:Class, got {kind!r}")
    try:
        family = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--model.kind {kind}: cannot import it ({e})") from e
    return family(cfg)


def resolved_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` completed from the files its family reads (`ResolvesConfig`: the pointer policy's text
    encoder, its folder and checksum checked); `cfg` itself for a family that reads none."""
    policy = make_policy(cfg)
    return policy.resolved_config() if isinstance(policy, ResolvesConfig) else cfg
