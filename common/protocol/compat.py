"""Peers of the previous protocol version: which ones a learner can serve, and its replies in their form.

Version 4 changed one thing on the wire (docs/PROTOCOL.md, top): a policy family's per-step arrays may have
a row shape and it may send per-step log-prob arrays (`EpisodeSpec.choice_shapes`, `step_logps`). A family
without either (the pointer family) lays its episodes out exactly as version 3 did, so a version 3 actor
of it can take part, if what it is told is in its own version: every reply carries `v` = 3 (a version 3
actor refuses any other `v`), and WELCOME's `model` only the fields a version 3 actor knows (it refuses
unknown ones). A run whose family needs version 4's layout, or whose model sets a field version 3 does
not know, refuses a version 3 peer with `bad_version` and says why. Version 2 (unpacked TRAJ episodes) is
refused always.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common import wire
from common.config import ModelConfig
from common.protocol.envelope import PROTOCOL_VERSION, WELCOME
from common.protocol.episodes import EpisodeSpec

PREVIOUS_VERSION = 3
PEER_VERSIONS = (PREVIOUS_VERSION, PROTOCOL_VERSION)
"""The versions a learner's ingest parses (`protocol.parse(raw, PEER_VERSIONS)`); whether it serves a
version 3 peer depends on its run (`refusal`)."""
V3_MODEL_FIELDS = frozenset({
    "kind", "vocab_size", "max_instruction_tokens", "max_elements", "max_element_tokens", "d_model",
    "num_heads", "num_layers", "mlp_dim", "text_encoder", "text_encoder_weights", "train_text_encoder",
    "text_dim", "text_encoder_sha256", "max_instruction_pieces", "max_element_pieces",
})  # fmt: skip
"""The ModelConfig fields of version 3's code (its `ModelConfig.from_dict` refuses any other): a version 3
actor builds its model from these alone, so the others must be at their defaults."""


def refusal(version: int, spec: EpisodeSpec, model: ModelConfig) -> str:
    """Why a learner whose family declares `spec` and whose model is `model` cannot serve a peer speaking
    `version` (one of PEER_VERSIONS); "" when it can."""
    if version == PROTOCOL_VERSION:
        return ""
    shaped = sorted({*spec.choice_shapes, *spec.step_logps})
    if shaped:
        return (
            f"protocol version {version} cannot carry this run's per-step arrays {shaped} (row shapes and "
            f"step log-probs came in version {PROTOCOL_VERSION}): its {model.kind!r} policy family needs "
            f"version {PROTOCOL_VERSION}"
        )
    defaults = ModelConfig()
    newer = sorted(
        f.name
        for f in dataclasses.fields(ModelConfig)
        if f.name not in V3_MODEL_FIELDS and getattr(model, f.name) != getattr(defaults, f.name)
    )
    if newer:
        return (
            f"this run's model sets {newer}, which a protocol version {version} actor does not know: it needs "
            f"version {PROTOCOL_VERSION}"
        )
    return ""


def in_version(msg: dict[str, Any], version: int) -> dict[str, Any]:
    """`msg` as a peer speaking `version` reads it: `v` = version, and a WELCOME's `model` cut to the
    fields that version knows (the others are at their defaults when `refusal` is "")."""
    if version == PROTOCOL_VERSION:
        return msg
    out = {**msg, "v": version}
    if msg.get("kind") == WELCOME:
        out["model"] = {k: v for k, v in msg["model"].items() if k in V3_MODEL_FIELDS}
    return out


def params_in_version(frames: list[Any], version: int) -> list[Any]:
    """PARAMS frames (`params_frames`) whose header says `version`: the array frames are the same objects
    (sent without a copy), only the small header is encoded again. PARAMS is laid out alike in 3 and 4."""
    if version == PROTOCOL_VERSION:
        return frames
    return [wire.encode({**wire.decode(frames[0]), "v": version}), *frames[1:]]
