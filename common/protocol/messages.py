"""Messages of the learner <-> actor protocol: one frozen dataclass per single-frame kind, the envelope and
the field checks they share.

Every message is a msgpack map with `v` (PROTOCOL_VERSION) and `kind`; `parse` decodes one and checks
that envelope. Each single-frame kind then has a frozen dataclass (`Hello`, `Welcome`, `Traj`, `Ack`,
`ParamReq`, `ActorHeartbeat`, `Heartbeat`, `Error`): `from_msg` is the one parser of that kind (every
field it holds checked, ProtocolError with the code the learner counts), `to_msg` its wire map. A TRAJ's
episodes are packed, unpacked and validated in common/protocol/episodes.py; PARAMS, multipart, in
common/protocol/params.py. docs/PROTOCOL.md is the normative description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common import wire
from common.config import ModelConfig

if TYPE_CHECKING:
    from common.protocol.episodes import Episode, EpisodeSpec

PROTOCOL_VERSION = 4
"""2: acknowledged delivery (HELLO `instance`, grants), snapshot checksums, instr_feats [Li, 3].
3: TRAJ episodes packed: their task names, and one array table + one bin for all their arrays (§3.5, §6).
4: per-step arrays with a row shape ([sum of T, *row shape]: e.g. generated token ids) and the behaviour
policy's own per-step log-probabilities (`EpisodeSpec.choice_shapes`, `step_logps`, §6).
The inference service's ACT and ACTED (common/protocol/inference.py, §12) came without a new version: they
travel only on the service's own socket, which a learner without the service does not have."""

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


def error(code: str, reason: str, seq: int | None = None) -> bytes:
    """An encoded ERROR reply (`Error`); `seq` when the refused message was a TRAJ that carried one."""
    return wire.encode(Error(code, reason, seq).to_msg())


def parse(data: bytes | memoryview) -> dict[str, Any]:
    """Decode one single-frame message and check its envelope (map, version, known kind)."""
    try:
        msg = wire.decode(data)
    except wire.WireError as e:
        raise ProtocolError("bad_encoding", str(e)) from e
    return check_envelope(msg)


def check_envelope(msg: Any) -> dict[str, Any]:
    """`msg` if it is a map with this side's `v` and a known `kind`; ProtocolError otherwise."""
    if not isinstance(msg, dict):
        raise ProtocolError("bad_envelope", f"a message must be a map, got {type(msg).__name__}")
    version = msg.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            "bad_version", f"protocol version {_short(version)}, this side speaks {PROTOCOL_VERSION}"
        )
    kind = msg.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ProtocolError("unknown_kind", f"unknown message kind {_short(kind)}")
    return msg


def _short(value: Any) -> str:
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


def _optional(msg: dict[str, Any], name: str, typ: type | tuple[type, ...], default: Any) -> Any:
    """An optional field: `default` when absent, else checked as `require` checks it."""
    return default if name not in msg else require(msg, name, typ)


def _at_least(msg: dict[str, Any], name: str, lowest: int) -> int:
    value = require(msg, name, int)
    if value < lowest:
        raise ProtocolError("bad_field", f"{msg.get('kind')} {name} must be at least {lowest}, got {value}")
    return value


def _typename(typ: type | tuple[type, ...]) -> str:
    return "/".join(t.__name__ for t in typ) if isinstance(typ, tuple) else typ.__name__


# ---- messages: one frozen dataclass per kind ------------------------------------------------------
# `from_msg` builds one from a map that `parse` returned, after checking every field it uses (in the
# order of docs/PROTOCOL.md §7, raising ProtocolError with the code the learner counts); `to_msg` is its
# wire map, field for field what both sides have always sent. Fields this side does not use are ignored
# (§3.1), so a newer peer may add some.


def actor_id_of(msg: dict[str, Any]) -> int:
    """The `actor_id` every message after HELLO carries. The learner checks it (and that it is this
    connection's) before anything else of the message, so it is read on its own."""
    return require(msg, "actor_id", int)


@dataclass(frozen=True)
class Hello:
    """HELLO (actor -> learner): an actor process introduces itself on a new connection."""

    actor: str
    """Display name (cut to MAX_TEXT characters when parsed)."""
    num_envs: int
    instance: str
    """The actor process's random id, the same on every connection: its batches are numbered per instance."""
    first_unacked: int
    """The lowest batch seq the actor still holds (or its next one)."""
    pid: int | None = None
    """Informational; not checked, None when absent or not an int."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Hello:
        actor = require(msg, "actor", str)[:MAX_TEXT]
        num_envs = _at_least(msg, "num_envs", 1)
        instance = require(msg, "instance", str)
        if not 1 <= len(instance) <= MAX_INSTANCE:
            raise ProtocolError("bad_field", f"HELLO instance must have 1 to {MAX_INSTANCE} characters")
        first_unacked = _at_least(msg, "first_unacked", 1)
        pid = msg.get("pid")
        return cls(actor, num_envs, instance, first_unacked, pid if type(pid) is int else None)

    def to_msg(self) -> dict[str, Any]:
        pid = {} if self.pid is None else {"pid": self.pid}
        return message(
            HELLO, actor=self.actor, num_envs=self.num_envs, **pid, instance=self.instance,
            first_unacked=self.first_unacked,
        )  # fmt: skip


MODES = ("async", "sync")
"""WELCOME `mode` values: DistRL's continuous collection (the default) or DigiRL's rounds."""


@dataclass(frozen=True)
class Welcome:
    """WELCOME (learner -> actor), the reply to HELLO: the actor's id and what the run expects of it."""

    run_id: str
    """New for every learner process: a different one means the learner restarted."""
    actor_id: int
    policy_version: int
    """The newest published parameter version."""
    acked_upto: int
    """Every batch of the actor's instance with seq <= this is stored."""
    grant: int
    """The highest batch seq the actor may send."""
    heartbeat_every: float
    """Seconds between the learner's unsolicited HEARTBEATs."""
    model: ModelConfig
    max_steps: int
    """Longest episode the learner accepts."""
    mode: str | None = None
    """"async" or "sync"; None (absent on the wire) means async."""
    text_vocab_size: int = 0
    """The text encoder's WordPiece vocabulary: TRAJ's WordPiece ids must lie in [0, it); 0 (absent on the
    wire) without a text encoder."""
    inference_port: int = 0
    """The port of the learner's inference service (learner/serving/inference.py) on the ingest's host; 0 (absent on
    the wire) when it has none."""

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Welcome:
        run_id = require(msg, "run_id", str)
        actor_id = _at_least(msg, "actor_id", 1)
        policy_version = require(msg, "policy_version", int)
        acked_upto = _at_least(msg, "acked_upto", 0)
        grant = _at_least(msg, "grant", 0)
        heartbeat_every = require(msg, "heartbeat_every", (int, float))
        try:
            model = ModelConfig.from_dict(require(msg, "model", dict))
        except ValueError as e:  # unknown or non-positive fields
            raise ProtocolError("bad_field", f"WELCOME model: {e}") from e
        max_steps = _at_least(msg, "max_steps", 1)
        mode = _optional(msg, "mode", str, None)
        if mode is not None and mode not in MODES:
            raise ProtocolError("bad_field", f"WELCOME mode must be one of {MODES}, got {_short(mode)}")
        text_vocab_size = _at_least(msg, "text_vocab_size", 0) if "text_vocab_size" in msg else 0
        inference_port = _at_least(msg, "inference_port", 0) if "inference_port" in msg else 0
        return cls(
            run_id, actor_id, policy_version, acked_upto, grant, heartbeat_every, model, max_steps, mode,
            text_vocab_size, inference_port,
        )  # fmt: skip

    def to_msg(self) -> dict[str, Any]:
        mode = {} if self.mode is None else {"mode": self.mode}
        text = {"text_vocab_size": self.text_vocab_size} if self.text_vocab_size else {}
        inference = {"inference_port": self.inference_port} if self.inference_port else {}
        return message(
            WELCOME, run_id=self.run_id, actor_id=self.actor_id, policy_version=self.policy_version,
            acked_upto=self.acked_upto, grant=self.grant, heartbeat_every=self.heartbeat_every,
            model=self.model.to_dict(), max_steps=self.max_steps, **mode, **text, **inference,
        )  # fmt: skip


@dataclass(frozen=True)
class Traj:
    """TRAJ (actor -> learner): one batch of finished episodes under the actor's next sequence number.

    `episodes` stays as it came (the packed wire map, unchecked) until `validate`: the learner checks the
    episodes only of a batch it has not stored before (a re-sent duplicate is acknowledged unchecked).
    A sender may give the episodes as a list of `episode_fields` maps: `to_msg` packs them."""

    actor_id: int
    seq: int
    """1, 2, 3, ... per actor instance, kept when the batch is sent again."""
    episodes: Any
    """Parsed: the packed `episodes` map as it came (`pack_episodes`), not yet validated. To send: that
    map, or a list of `episode_fields` maps (packed by `to_msg`)."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Traj:
        actor_id = actor_id_of(msg)
        seq = require(msg, "seq", int)
        if seq < 1:
            raise ProtocolError("bad_field", f"TRAJ seq must be at least 1, got {seq}")
        return cls(actor_id, seq, msg.get("episodes"))

    def validate(
        self,
        spec: EpisodeSpec,
        max_steps: int,
        newest_version: int,
    ) -> list[Episode]:
        """The episodes, checked against the policy family's `spec` straight from the parsed `episodes`
        (as `validate_episodes` checks a TRAJ's; a list is refused, never packed here)."""
        from common.protocol.episodes import validate_packed  # (episodes.py imports this module)

        return validate_packed(self.episodes, spec, max_steps, newest_version)

    def to_msg(self) -> dict[str, Any]:
        from common.protocol.episodes import pack_episodes  # (episodes.py imports this module)

        episodes = self.episodes
        if isinstance(episodes, list) and episodes and all(isinstance(ep, dict) for ep in episodes):
            episodes = pack_episodes(episodes)
        return message(TRAJ, actor_id=self.actor_id, seq=self.seq, episodes=episodes)


@dataclass(frozen=True)
class Ack:
    """ACK (learner -> actor), the reply to an accepted TRAJ: the batch is stored (or was already)."""

    seq: int
    accepted: int
    """Episodes stored: all of the batch's, or 0 for a duplicate (parsed as 0 when absent)."""
    duplicate: bool
    """The seq was stored before: the batch was sent again (parsed as False when absent)."""
    grant: int
    """The highest batch seq the actor may send now."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Ack:
        seq = require(msg, "seq", int)
        accepted = _optional(msg, "accepted", int, 0)
        duplicate = _optional(msg, "duplicate", bool, False)
        grant = require(msg, "grant", int)
        return cls(seq, accepted, duplicate, grant)

    def to_msg(self) -> dict[str, Any]:
        return message(ACK, seq=self.seq, accepted=self.accepted, duplicate=self.duplicate, grant=self.grant)


@dataclass(frozen=True)
class ParamReq:
    """PARAM_REQ (actor -> learner): send me the newest snapshot (the reply is PARAMS on the DEALER)."""

    actor_id: int
    have_version: int = -1
    """The version the actor holds (-1: none). Informational: not checked, -1 when absent or not an int."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> ParamReq:
        have = msg.get("have_version")
        return cls(actor_id_of(msg), have if type(have) is int else -1)

    def to_msg(self) -> dict[str, Any]:
        return message(PARAM_REQ, actor_id=self.actor_id, have_version=self.have_version)


@dataclass(frozen=True)
class ActorHeartbeat:
    """HEARTBEAT (actor -> learner): this actor is alive; the learner answers with a `Heartbeat`."""

    actor_id: int

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> ActorHeartbeat:
        return cls(actor_id_of(msg))

    def to_msg(self) -> dict[str, Any]:
        return message(HEARTBEAT, actor_id=self.actor_id)


@dataclass(frozen=True)
class Heartbeat:
    """HEARTBEAT (learner -> actor), the reply to the actor's and unsolicited every second: the learner is
    alive, which process it is, its newest version and the actor's grant."""

    run_id: str
    policy_version: int
    grant: int

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Heartbeat:
        run_id = require(msg, "run_id", str)
        policy_version = require(msg, "policy_version", int)
        grant = require(msg, "grant", int)
        return cls(run_id, policy_version, grant)

    def to_msg(self) -> dict[str, Any]:
        return message(HEARTBEAT, run_id=self.run_id, policy_version=self.policy_version, grant=self.grant)


@dataclass(frozen=True)
class Error:
    """ERROR (learner -> actor), the reply to a refused message: a code of §7 and why."""

    code: str
    reason: str
    seq: int | None = None
    """The refused batch, when the message was a TRAJ with an int seq."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Error:
        code = require(msg, "code", str)
        reason = require(msg, "reason", str)
        seq = _optional(msg, "seq", int, None)
        return cls(code, reason, seq)

    def to_msg(self) -> dict[str, Any]:
        seq = {} if self.seq is None else {"seq": self.seq}
        return message(ERROR, code=self.code, reason=self.reason, **seq)


FROM_LEARNER = {WELCOME: Welcome, ACK: Ack, HEARTBEAT: Heartbeat, ERROR: Error}
"""The parser of each single-frame kind a learner sends (PARAMS, multipart, is `parse_params`)."""
