"""Messages of the inference service (issue 33, docs/PROTOCOL.md §12): an actor in `--inference remote` mode
sends its ready environments' featurized observations (ACT) and gets back what its own policy would have
given it (ACTED): each row's choice, the behaviour log-probs, the value, the entropy and the version of the
parameters that produced them. Both are single-frame msgpack maps with the usual envelope; their arrays
are packed in one table and one bin (§3.5), as a TRAJ's are.

    ACT   {v, kind: "ACT", actor_id, id, arrays, data}    arrays: obs/<key> [n, *shape] (the family's
                                                          observation arrays, `EpisodeSpec.observations`)
    ACTED {v, kind: "ACTED", id, version, arrays, data}    arrays: each choice array [n, ...] (with the
                                                          family's step_logps), logp, value, entropy [n]

`id` is the actor's request number, echoed so a late answer to an abandoned request is recognised and
dropped. A refused ACT is answered with an ERROR carrying the code (§7) and `seq` = the request's id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from common import wire
from common.protocol.envelope import ACT, ACTED, ProtocolError, actor_id_of, message, require
from common.protocol.episodes import OBS_PREFIX, EpisodeSpec, _check_observations

MAX_ROWS = 1024
"""Most observations one ACT may carry (an actor's environments)."""
ACTED_ARRAYS = ("logp", "value", "entropy")
"""The float32 [n] arrays of every ACTED, after the family's choice arrays."""


def _arrays(msg: dict[str, Any]) -> dict[str, np.ndarray]:
    """The message's packed arrays: `arrays` a list and `data` a bin (`bad_field`), the table fitting its
    bin (`bad_encoding`, §3.5)."""
    table = require(msg, "arrays", list)
    data = require(msg, "data", (bytes, bytearray, memoryview))
    try:
        return wire.unpack_arrays(table, data)
    except wire.WireError as e:
        raise ProtocolError("bad_encoding", f"{msg.get('kind')}: {e}") from e


@dataclass(frozen=True)
class Act:
    """ACT (actor -> inference service): observations to act on, validated against the family's spec."""

    actor_id: int
    id: int
    obs: dict[str, np.ndarray]
    """The family's observation arrays, [n, *shape] each (read-only views of the message)."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any], spec: EpisodeSpec) -> Act:
        """Every field checked: ids (`bad_field`), the table (`bad_encoding`), exactly the spec's
        observation arrays in their dtypes and row shapes with 1 to MAX_ROWS rows (`bad_field`), floats
        finite (`non_finite`) and ids in their ranges (`bad_array`)."""
        actor_id = actor_id_of(msg)
        request = require(msg, "id", int)
        if request < 0:
            raise ProtocolError("bad_field", f"ACT id must be >= 0, got {request}")
        arrays = _arrays(msg)
        want = spec.observations
        names = {name[len(OBS_PREFIX) :] for name in arrays if name.startswith(OBS_PREFIX)}
        if names != set(want) or len(arrays) != len(want):
            raise ProtocolError(
                "bad_field", f"ACT arrays are {sorted(arrays)}, expected obs/ + {sorted(want)}"
            )
        rows = arrays[OBS_PREFIX + next(iter(want))].shape[:1]
        if not rows or not 1 <= rows[0] <= MAX_ROWS:
            raise ProtocolError("bad_field", f"ACT carries 1 to {MAX_ROWS} observations, got {rows}")
        obs = {}
        for name, (shape, dtype) in want.items():
            a = arrays[OBS_PREFIX + name]
            if a.dtype != np.dtype(dtype) or a.shape != (rows[0], *shape):
                raise ProtocolError(
                    "bad_field",
                    f"ACT obs/{name} is {a.dtype.str} {list(a.shape)}, expected {dtype} {[rows[0], *shape]}",
                )
            obs[name] = a
        _check_observations(obs, spec.id_ranges, [rows[0]])
        return cls(actor_id, request, obs)

    def to_msg(self) -> dict[str, Any]:
        table, data = wire.pack_arrays({OBS_PREFIX + k: v for k, v in self.obs.items()})
        return message(ACT, actor_id=self.actor_id, id=self.id, arrays=table, data=data)


@dataclass(frozen=True)
class ActedReply:
    """ACTED (inference service -> actor): the rows' choices, in the order of the ACT's observations."""

    id: int
    version: int
    """The parameters' version that acted (the actor labels the steps with it)."""
    arrays: dict[str, np.ndarray]
    """The family's choice arrays [n, ...] and ACTED_ARRAYS [n]."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any], spec: EpisodeSpec, rows: int) -> ActedReply:
        """Checked against what was asked: `rows` rows of the family's choices, in range, and finite
        float32 log-probs (<= 0), values and entropies (ProtocolError, `bad_field` / `bad_array`)."""
        request, version = require(msg, "id", int), require(msg, "version", int)
        arrays = _arrays(msg)
        want = {**spec.choice_arrays(), **{name: ((), "<f4") for name in ACTED_ARRAYS}}
        if set(arrays) != set(want):
            raise ProtocolError("bad_field", f"ACTED arrays are {sorted(arrays)}, expected {sorted(want)}")
        for name, (shape, dtype) in want.items():
            a = arrays[name]
            if a.dtype != np.dtype(dtype) or a.shape != (rows, *shape):
                raise ProtocolError("bad_field", f"ACTED {name} is {a.dtype.str} {list(a.shape)}")
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise ProtocolError("non_finite", f"ACTED {name} has NaN or infinity")
        for name, (_, upper) in spec.choices.items():
            if arrays[name].size and (arrays[name].min() < 0 or arrays[name].max() >= upper):
                raise ProtocolError("bad_array", f"ACTED {name} outside [0, {upper})")
        return cls(request, version, arrays)

    def to_msg(self) -> dict[str, Any]:
        table, data = wire.pack_arrays(self.arrays)
        return message(ACTED, id=self.id, version=self.version, arrays=table, data=data)
