"""The envelope every message of the learner <-> actor protocol shares, and the field checks its kinds use.

Every message is a msgpack map with `v` (PROTOCOL_VERSION) and `kind` (one of KINDS): `parse` decodes one
and checks that envelope, `message` builds one. `ProtocolError` carries the code the learner counts;
`require` and its kin check one field of a decoded map. The message kinds (common/protocol/messages.py),
TRAJ episodes (episodes.py), the inference service's kinds (inference.py) and PARAMS (params.py) all
build on this module, which imports none of them. docs/PROTOCOL.md §3.2 is the normative description.
"""

from __future__ import annotations

from typing import Any

from common import wire

PROTOCOL_VERSION = 4
"""2: acknowledged delivery (HELLO `instance`, grants), snapshot checksums, instr_feats [Li, 3].
3: TRAJ episodes packed: their task names, and one array table + one bin for all their arrays (§3.5, §6).
4: per-step arrays with a row shape ([sum of T, *row shape]: e.g. generated token ids) and the behaviour
policy's own per-step log-probabilities (`EpisodeSpec.choice_shapes`, `step_logps`, §6).
The inference service's ACT and ACTED (common/protocol/inference.py, §12) came without a new version: they
travel only on the service's own socket, which a learner without the service does not have.
A learner's ingest serves version 3 peers where their layout is unchanged (common/protocol/compat.py)."""

HELLO, WELCOME, TRAJ, ACK = "HELLO", "WELCOME", "TRAJ", "ACK"
PARAM_REQ, PARAMS, HEARTBEAT, ERROR = "PARAM_REQ", "PARAMS", "HEARTBEAT", "ERROR"
ACT, ACTED = "ACT", "ACTED"
KINDS = frozenset({HELLO, WELCOME, TRAJ, ACK, PARAM_REQ, PARAMS, HEARTBEAT, ERROR, ACT, ACTED})
MAX_TEXT = 256
MAX_INSTANCE = 64
"""Longest actor `instance` string (the reference actor sends 32 hex characters)."""


class ProtocolError(ValueError):
    """A message that breaks the protocol; `code` is the counter name in the learner's `rejected` tally."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


def message(kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "kind": kind, **fields}


def parse(data: bytes | memoryview, versions: tuple[int, ...] = (PROTOCOL_VERSION,)) -> dict[str, Any]:
    """Decode one single-frame message and check its envelope (map, a version of `versions`, known kind).
    Only the learner's ingest passes more than this side's own version (common/protocol/compat.py)."""
    try:
        msg = wire.decode(data)
    except wire.WireError as e:
        raise ProtocolError("bad_encoding", str(e)) from e
    return check_envelope(msg, versions)


def check_envelope(msg: Any, versions: tuple[int, ...] = (PROTOCOL_VERSION,)) -> dict[str, Any]:
    """`msg` if it is a map with a `v` of `versions` (this side's own unless told) and a known `kind`;
    ProtocolError otherwise."""
    if not isinstance(msg, dict):
        raise ProtocolError("bad_envelope", f"a message must be a map, got {type(msg).__name__}")
    version = msg.get("v")
    if type(version) is not int or version not in versions:
        speaks = " or ".join(map(str, sorted(versions)))
        raise ProtocolError("bad_version", f"protocol version {short(version)}, this side speaks {speaks}")
    kind = msg.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ProtocolError("unknown_kind", f"unknown message kind {short(kind)}")
    return msg


def short(value: Any) -> str:
    """`repr(value)` cut to 60 characters, for a reason that quotes what a peer sent."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def require(msg: dict[str, Any], name: str, typ: type | tuple[type, ...], where: str | None = None) -> Any:
    """A required field of the given type (bool is never accepted as a number); `where` names the container."""
    value = msg.get(name)
    types = typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(value, typ) or (isinstance(value, bool) and bool not in types):
        where = where or str(msg.get("kind"))
        raise ProtocolError("bad_field", f"{where} needs field {name!r} of type {_typename(typ)}")
    return value


def optional(msg: dict[str, Any], name: str, typ: type | tuple[type, ...], default: Any) -> Any:
    """An optional field: `default` when absent, else checked as `require` checks it."""
    return default if name not in msg else require(msg, name, typ)


def at_least(msg: dict[str, Any], name: str, lowest: int) -> int:
    """A required int field that must be `lowest` or more (`bad_field`)."""
    value = require(msg, name, int)
    if value < lowest:
        raise ProtocolError("bad_field", f"{msg.get('kind')} {name} must be at least {lowest}, got {value}")
    return value


def _typename(typ: type | tuple[type, ...]) -> str:
    return "/".join(t.__name__ for t in typ) if isinstance(typ, tuple) else typ.__name__


def actor_id_of(msg: dict[str, Any]) -> int:
    """The `actor_id` every message after HELLO carries. The learner checks it (and that it is this
    connection's) before anything else of the message, so it is read on its own."""
    return require(msg, "actor_id", int)
