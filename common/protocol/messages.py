"""Messages of the learner <-> actor protocol: one frozen dataclass per single-frame kind.

Each single-frame kind has a frozen dataclass (`Hello`, `Welcome`, `Traj`, `Ack`, `ParamReq`,
`ActorHeartbeat`, `Heartbeat`, `Error`): `from_msg` is the one parser of that kind (every field it holds
checked, ProtocolError with the code the learner counts), `to_msg` its wire map. The envelope (`v`, `kind`),
ProtocolError and the field checks are common/protocol/envelope.py's; a TRAJ's episodes are packed,
unpacked and validated in common/protocol/episodes.py; PARAMS, multipart, in common/protocol/params.py.
docs/PROTOCOL.md is the normative description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common import wire
from common.config import ModelConfig
from common.protocol.envelope import (
    ACK,
    ERROR,
    HEARTBEAT,
    HELLO,
    MAX_INSTANCE,
    MAX_TEXT,
    PARAM_REQ,
    TRAJ,
    WELCOME,
    ProtocolError,
    actor_id_of,
    at_least,
    message,
    optional,
    require,
    short,
)
from common.protocol.episodes import Episode, EpisodeSpec, pack_episodes, validate_packed


def error(code: str, reason: str, seq: int | None = None) -> bytes:
    """An encoded ERROR reply (`Error`); `seq` when the refused message was a TRAJ that carried one."""
    return wire.encode(Error(code, reason, seq).to_msg())


# ---- messages: one frozen dataclass per kind ------------------------------------------------------
# `from_msg` builds one from a map that `parse` returned, after checking every field it uses (in the
# order of docs/PROTOCOL.md §7, raising ProtocolError with the code the learner counts); `to_msg` is its
# wire map, field for field what both sides have always sent. Fields this side does not use are ignored
# (§3.1), so a newer peer may add some.


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
        num_envs = at_least(msg, "num_envs", 1)
        instance = require(msg, "instance", str)
        if not 1 <= len(instance) <= MAX_INSTANCE:
            raise ProtocolError("bad_field", f"HELLO instance must have 1 to {MAX_INSTANCE} characters")
        first_unacked = at_least(msg, "first_unacked", 1)
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
        actor_id = at_least(msg, "actor_id", 1)
        policy_version = require(msg, "policy_version", int)
        acked_upto = at_least(msg, "acked_upto", 0)
        grant = at_least(msg, "grant", 0)
        heartbeat_every = require(msg, "heartbeat_every", (int, float))
        try:
            model = ModelConfig.from_dict(require(msg, "model", dict))
        except ValueError as e:  # unknown or non-positive fields
            raise ProtocolError("bad_field", f"WELCOME model: {e}") from e
        max_steps = at_least(msg, "max_steps", 1)
        mode = optional(msg, "mode", str, None)
        if mode is not None and mode not in MODES:
            raise ProtocolError("bad_field", f"WELCOME mode must be one of {MODES}, got {short(mode)}")
        text_vocab_size = at_least(msg, "text_vocab_size", 0) if "text_vocab_size" in msg else 0
        inference_port = at_least(msg, "inference_port", 0) if "inference_port" in msg else 0
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
        return validate_packed(self.episodes, spec, max_steps, newest_version)

    def to_msg(self) -> dict[str, Any]:
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
        accepted = optional(msg, "accepted", int, 0)
        duplicate = optional(msg, "duplicate", bool, False)
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
        seq = optional(msg, "seq", int, None)
        return cls(code, reason, seq)

    def to_msg(self) -> dict[str, Any]:
        seq = {} if self.seq is None else {"seq": self.seq}
        return message(ERROR, code=self.code, reason=self.reason, **seq)


FROM_LEARNER = {WELCOME: Welcome, ACK: Ack, HEARTBEAT: Heartbeat, ERROR: Error}
"""The parser of each single-frame kind a learner sends (PARAMS, multipart, is `parse_params`)."""
