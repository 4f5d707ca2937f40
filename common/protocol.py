"""Messages of the learner <-> actor protocol: one dataclass per kind, validators and the parameter
snapshot frames.

Every message is a msgpack map with `v` (PROTOCOL_VERSION) and `kind`; `parse` decodes one and checks
that envelope. Each single-frame kind then has a frozen dataclass (`Hello`, `Welcome`, `Traj`, `Ack`,
`ParamReq`, `ActorHeartbeat`, `Heartbeat`, `Error`): `from_msg` is the one parser of that kind (every
field it holds checked, ProtocolError with the code the learner counts), `to_msg` its wire map. TRAJ
episodes travel packed (`pack_episodes`: their task names, and one array table and one bin for all their
arrays), are unpacked without a copy (`unpack_episodes`) and checked by `validate_episodes`
(`Traj.validate`); PARAMS, multipart, by `params_frames` / `parse_params`. docs/PROTOCOL.md is the
normative description; this module is its implementation, shared by both sides.
"""

from __future__ import annotations

import bisect
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common import wire
from common.config import ModelConfig
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS, Trajectory

PROTOCOL_VERSION = 3
"""2: acknowledged delivery (HELLO `instance`, grants), snapshot checksums, instr_feats [Li, 3].
3: TRAJ episodes packed: their task names, and one array table + one bin for all their arrays (§3.5, §6)."""

HELLO, WELCOME, TRAJ, ACK = "HELLO", "WELCOME", "TRAJ", "ACK"
PARAM_REQ, PARAMS, HEARTBEAT, ERROR = "PARAM_REQ", "PARAMS", "HEARTBEAT", "ERROR"
KINDS = frozenset({HELLO, WELCOME, TRAJ, ACK, PARAM_REQ, PARAMS, HEARTBEAT, ERROR})

# Per-step arrays of an episode: name -> dtype. Observations carry one more row (the final one).
ESTIMATE_ARRAYS = {"value": "<f4", "entropy": "<f4"}
"""Optional per-step arrays of an episode: the behaviour policy's critic V(s_t) and its exact entropy at
s_t, computed on the forward pass that chose the action. Sent together or not at all."""
STEP_ARRAYS = {
    "action_type": "<i4",
    "element": "<i4",
    "word": "<i4",
    "direction": "<i4",
    "behavior_logp": "<f4",
    "reward": "<f4",
    "policy_version": "<i4",
}
MAX_EPISODES_PER_BATCH = 256
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
        return cls(
            run_id, actor_id, policy_version, acked_upto, grant, heartbeat_every, model, max_steps, mode
        )

    def to_msg(self) -> dict[str, Any]:
        mode = {} if self.mode is None else {"mode": self.mode}
        return message(
            WELCOME, run_id=self.run_id, actor_id=self.actor_id, policy_version=self.policy_version,
            acked_upto=self.acked_upto, grant=self.grant, heartbeat_every=self.heartbeat_every,
            model=self.model.to_dict(), max_steps=self.max_steps, **mode,
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
    map, or a list of `episode_fields` / `trajectory_fields` maps (packed by `to_msg`)."""

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Traj:
        actor_id = actor_id_of(msg)
        seq = require(msg, "seq", int)
        if seq < 1:
            raise ProtocolError("bad_field", f"TRAJ seq must be at least 1, got {seq}")
        return cls(actor_id, seq, msg.get("episodes"))

    def validate(
        self,
        feature_spec: dict[str, tuple[tuple[int, ...], str]],
        max_steps: int,
        newest_version: int,
        vocab_size: int,
        text_vocab_size: int = 0,
    ) -> list[Episode]:
        """The episodes, each checked as `validate_episodes` checks a TRAJ's (`episodes` as it came: a
        list is refused, never packed here)."""
        msg = message(TRAJ, actor_id=self.actor_id, seq=self.seq, episodes=self.episodes)
        return validate_episodes(msg, feature_spec, max_steps, newest_version, vocab_size, text_vocab_size)

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


@dataclass
class Episode:
    """One validated episode as the learner stores it (arrays are read-only views of the message)."""

    task: str
    success: bool
    truncated: bool
    obs: dict[str, np.ndarray]
    """Featurized observations, [T + 1, ...]: one per step plus the final one."""
    steps: dict[str, np.ndarray]
    """STEP_ARRAYS, [T] each."""
    estimates: dict[str, np.ndarray] = field(default_factory=dict)
    """ESTIMATE_ARRAYS the actor sent, [T] each: its own V(s_t) and policy entropy, from which the learner
    computes the episode's priority when it enters the replay (learner/replay.py:initial_priority).
    Empty when the sender had none (demonstrations, an older actor)."""

    @property
    def length(self) -> int:
        return int(self.steps["reward"].shape[0])


def episode_fields(
    task: str,
    success: bool,
    truncated: bool,
    obs: dict[str, np.ndarray],
    steps: dict[str, np.ndarray],
    estimates: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """One episode as a sender holds it until it goes out (with ESTIMATE_ARRAYS when `estimates` are
    given): `task`, `success`, `truncated`, `obs` (a map of arrays) and the per-step arrays. A TRAJ
    carries a list of them packed (`pack_episodes`, which `Traj.to_msg` calls)."""
    estimates = estimates or {}
    return {
        "task": task,
        "success": success,
        "truncated": truncated,
        "obs": {k: np.ascontiguousarray(v) for k, v in obs.items()},
        **{k: np.ascontiguousarray(steps[k], dtype=np.dtype(dt)) for k, dt in STEP_ARRAYS.items()},
        **{
            k: np.ascontiguousarray(estimates[k], dtype=np.dtype(dt))
            for k, dt in ESTIMATE_ARRAYS.items()
            if estimates
        },
    }


def trajectory_fields(traj: Trajectory) -> dict[str, Any]:
    """The `episode_fields` of a finished Trajectory (its final observation included)."""
    if traj.final_features is None or not traj.steps:
        raise ValueError("a trajectory needs at least one step and its final observation")
    obs = {
        k: np.stack([s.features[k] for s in traj.steps] + [traj.final_features[k]])
        for k in traj.final_features
    }
    steps = {
        "action_type": [s.choice.action_type for s in traj.steps],
        "element": [s.choice.element for s in traj.steps],
        "word": [s.choice.word for s in traj.steps],
        "direction": [s.choice.direction for s in traj.steps],
        "behavior_logp": [s.behavior_logp for s in traj.steps],
        "reward": [s.reward for s in traj.steps],
        "policy_version": [s.policy_version for s in traj.steps],
    }
    arrays = {k: np.asarray(v, np.dtype(STEP_ARRAYS[k])) for k, v in steps.items()}
    known = all(s.value is not None and s.entropy is not None for s in traj.steps)
    estimates = (
        {"value": [s.value for s in traj.steps], "entropy": [s.entropy for s in traj.steps]}
        if known
        else None
    )
    return episode_fields(traj.task, traj.success, traj.truncated, obs, arrays, estimates)


# ---- TRAJ episodes, packed (docs/PROTOCOL.md §3.5, §6) --------------------------------------------------
EPISODE_ARRAYS = {"success": "|b1", "truncated": "|b1", "length": "<i4"}
"""Per-episode arrays of a packed TRAJ, [n] each: whether the task was accomplished, whether the episode
was cut short (the learner bootstraps from its final observation), and its steps T."""
OBS_PREFIX = "obs/"
"""Observation arrays are named `obs/<key>` in the array table; the other arrays by their own names."""


def pack_episodes(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The wire form of a TRAJ's `episodes` (docs/PROTOCOL.md §6): `task`, one name per episode, and one
    array table and one bin (`arrays`, `data`, §3.5) for all the episodes' arrays: EPISODE_ARRAYS [n],
    then each per-step array [sum of T] and each `obs/<key>` [sum of (T + 1), ...], every episode's rows
    one after the other in episode order. Each of the ESTIMATE_ARRAYS goes along when every episode has it.
    The data is copied once, straight into place (`wire.encode` copies it once more, into the message)."""
    if not episodes:
        raise ValueError("a TRAJ carries at least one episode")
    names = [*STEP_ARRAYS, *(name for name in ESTIMATE_ARRAYS if all(name in ep for ep in episodes))]
    columns: dict[str, Any] = {
        "success": np.array([ep["success"] for ep in episodes], bool),
        "truncated": np.array([ep["truncated"] for ep in episodes], bool),
        "length": np.array([len(ep["reward"]) for ep in episodes], np.int32),
        **{name: [ep[name] for ep in episodes] for name in names},
        **{OBS_PREFIX + key: [ep["obs"][key] for ep in episodes] for key in episodes[0]["obs"]},
    }
    table, data = wire.pack_arrays(columns)
    return {"task": [ep["task"] for ep in episodes], "arrays": table, "data": data}


@dataclass(frozen=True)
class PackedEpisodes:
    """A TRAJ's `episodes` map with its task names checked and its arrays unpacked: read-only views of the
    message's bin, one per field for all the episodes (not yet checked against the model)."""

    task: list[str]
    arrays: dict[str, np.ndarray]
    """By table name: EPISODE_ARRAYS [n], the per-step arrays, `obs/<key>` (every episode's rows in order)."""


def unpack_episodes(packed: Any) -> PackedEpisodes:
    """The episodes of a TRAJ as they came (the `episodes` map): `task` an array of 1 to
    MAX_EPISODES_PER_BATCH str (`bad_field`), `arrays` an array and `data` a bin (`bad_field`), and a table
    that fits its bin (`bad_encoding`, §3.5). The arrays are views of the bin: nothing is copied."""
    where = "TRAJ episodes"
    if not isinstance(packed, dict):
        raise ProtocolError("bad_field", f"TRAJ needs field 'episodes' of type map, got {_short(packed)}")
    task = require(packed, "task", list, where)
    if not 1 <= len(task) <= MAX_EPISODES_PER_BATCH:
        raise ProtocolError(
            "bad_field", f"a TRAJ carries 1 to {MAX_EPISODES_PER_BATCH} episodes, got {len(task)}"
        )
    if set(map(type, task)) != {str}:  # (cheaper than a loop over them)
        i = next(i for i, name in enumerate(task) if type(name) is not str)
        raise ProtocolError("bad_field", f"episode {i} needs field 'task' of type str")
    table = require(packed, "arrays", list, where)
    data = require(packed, "data", (bytes, bytearray, memoryview), where)
    try:
        arrays = wire.unpack_arrays(table, data)
    except wire.WireError as e:
        raise ProtocolError("bad_encoding", f"{where}: {e}") from e
    return PackedEpisodes(task, arrays)


def validate_episodes(
    msg: dict[str, Any],
    feature_spec: dict[str, tuple[tuple[int, ...], str]],
    max_steps: int,
    newest_version: int,
    vocab_size: int,
    text_vocab_size: int = 0,
) -> list[Episode]:
    """Check every field, dtype, shape, range and number of a TRAJ message; raise ProtocolError on the first
    fault. `text_vocab_size`: the text encoder's WordPiece vocabulary (needed when `feature_spec` has its ids).
    The episodes' arrays are views of the message's packed bin (nothing is copied), checked for the whole
    batch at once; a fault names the first episode it is in."""
    packed = unpack_episodes(msg.get("episodes"))
    arrays, n = packed.arrays, len(packed.task)
    every = {name: _column(arrays, name, dtype, (n,), "count") for name, dtype in EPISODE_ARRAYS.items()}
    lengths = every["length"]
    if lengths.min() < 1 or lengths.max() > max_steps:
        i = int(np.argmax((lengths < 1) | (lengths > max_steps)))
        raise ProtocolError("bad_array", f"episode {i} has {lengths[i]} steps, allowed 1 to {max_steps}")
    step_ends = np.cumsum(lengths, dtype=np.int64).tolist()
    row_ends = [end + i + 1 for i, end in enumerate(step_ends)]
    total = step_ends[-1]
    steps = {name: _column(arrays, name, dtype, (total,), "steps") for name, dtype in STEP_ARRAYS.items()}
    obs_keys = {name[len(OBS_PREFIX) :] for name in arrays if name.startswith(OBS_PREFIX)}
    if obs_keys != set(feature_spec):
        raise ProtocolError(
            "bad_field", f"TRAJ obs arrays are {sorted(obs_keys)}, expected {sorted(feature_spec)}"
        )
    obs = {
        name: _column(arrays, OBS_PREFIX + name, dtype, (row_ends[-1], *shape), "steps + 1 each")
        for name, (shape, dtype) in feature_spec.items()
    }
    _check_ranges(steps, obs, feature_spec, newest_version, vocab_size, step_ends, row_ends)
    if "instr_wp" in obs:
        _check_word_pieces(obs, feature_spec, text_vocab_size, row_ends)
    estimates = _estimates(arrays, total, step_ends)
    success, truncated = every["success"].tolist(), every["truncated"].tolist()
    episodes = []
    first_step = 0
    for i, end in enumerate(step_ends):
        first_row, end_row = first_step + i, end + i + 1
        episodes.append(
            Episode(
                packed.task[i][:MAX_TEXT],
                success[i],
                truncated[i],
                {name: arr[first_row:end_row] for name, arr in obs.items()},
                {name: arr[first_step:end] for name, arr in steps.items()},
                {name: arr[first_step:end] for name, arr in estimates.items()},
            )
        )
        first_step = end
    return episodes


def _episode_of(bad: np.ndarray, ends: list[int]) -> int:
    """The episode of the first row where `bad` (a boolean array over all the episodes' rows) holds."""
    rows = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim > 1 else bad
    return bisect.bisect_right(ends, int(np.argmax(rows)))


def _column(arrays: dict[str, np.ndarray], name: str, dtype: str, shape: tuple[int, ...], rows: str):
    """One field of all the episodes, of its dtype and shape (`rows`: what its first axis counts)."""
    arr = arrays.get(name)
    if arr is None:
        raise ProtocolError("bad_field", f"TRAJ episodes need array {name!r}")
    if arr.dtype.str != dtype:
        raise ProtocolError("bad_array", f"TRAJ {name} has dtype {arr.dtype.str}, expected {dtype}")
    if arr.shape != shape:
        raise ProtocolError(
            "bad_array", f"TRAJ {name} has shape {arr.shape}, expected {shape} (the episodes' {rows})"
        )
    return arr


def _estimates(arrays: dict[str, np.ndarray], total: int, ends: list[int]) -> dict[str, np.ndarray]:
    """The batch's ESTIMATE_ARRAYS, checked: both or neither, [total steps] each, finite, entropy >= 0."""
    present = [name for name in ESTIMATE_ARRAYS if name in arrays]
    if not present:
        return {}
    if len(present) != len(ESTIMATE_ARRAYS):
        raise ProtocolError("bad_field", f"TRAJ sends {present} without {sorted(ESTIMATE_ARRAYS)}")
    out = {name: _column(arrays, name, dtype, (total,), "steps") for name, dtype in ESTIMATE_ARRAYS.items()}
    for name, arr in out.items():
        finite = np.isfinite(arr)
        if not finite.all():
            raise ProtocolError(
                "non_finite", f"episode {_episode_of(~finite, ends)} {name} has NaN or infinity"
            )
    entropy = out["entropy"]
    if entropy.min() < -1e-3:  # float rounding of a near-deterministic policy's entropy is tolerated
        raise ProtocolError("bad_array", f"episode {_episode_of(entropy < -1e-3, ends)} entropy must be >= 0")
    return out


def _check_ranges(steps, obs, feature_spec, newest_version, vocab_size, step_ends, row_ends) -> None:
    limits = {
        "action_type": NUM_ACTION_TYPES,
        "element": feature_spec["elem_mask"][0][0],
        "word": feature_spec["instr_mask"][0][0],
        "direction": NUM_SWIPE_DIRECTIONS,
    }
    for name, upper in limits.items():
        a = steps[name]
        if a.min() < 0 or a.max() >= upper:
            i = _episode_of((a < 0) | (a >= upper), step_ends)
            raise ProtocolError("bad_array", f"episode {i} {name} outside [0, {upper})")
    for name in ("behavior_logp", "reward"):
        finite = np.isfinite(steps[name])
        if not finite.all():
            i = _episode_of(~finite, step_ends)
            raise ProtocolError("non_finite", f"episode {i} {name} has NaN or infinity")
    logp = steps["behavior_logp"]
    if logp.max() > 1e-3:
        i = _episode_of(logp > 1e-3, step_ends)
        raise ProtocolError("bad_array", f"episode {i} behavior_logp must be <= 0")
    versions = steps["policy_version"]
    if versions.min() < 0:
        i = _episode_of(versions < 0, step_ends)
        raise ProtocolError("bad_array", f"episode {i} has a negative policy_version")
    if versions.max() > newest_version:
        i = _episode_of(versions > newest_version, step_ends)
        raise ProtocolError("future_version", f"episode {i} policy_version is newer than {newest_version}")
    for name, arr in obs.items():
        if arr.dtype.kind == "f":
            finite = np.isfinite(arr)
            if not finite.all():
                i = _episode_of(~finite, row_ends)
                raise ProtocolError("non_finite", f"episode {i} obs {name} has NaN or infinity")
    for name in ("instr_tokens", "elem_tokens"):
        _check_ids(obs[name], 0, vocab_size, name, row_ends)


def _check_ids(arr: np.ndarray, low: int, high: int, name: str, ends: list[int]) -> None:
    """Every id of `arr` in [low, high), or `bad_array` naming the first episode with one outside."""
    if arr.min() < low or arr.max() >= high:
        i = _episode_of((arr < low) | (arr >= high), ends)
        raise ProtocolError("bad_array", f"episode {i} {name} has ids outside [{low}, {high})")


def _check_word_pieces(obs, feature_spec, text_vocab_size, row_ends) -> None:
    """WordPiece ids inside the encoder's vocabulary, and each piece's word slot -1 (none) or a real slot:
    the encoder's embedding lookup would otherwise read past its table without an error."""
    if text_vocab_size < 1:
        raise ValueError("validating WordPiece ids needs the text encoder's vocabulary size")
    for name in ("instr_wp", "elem_wp"):
        _check_ids(obs[name], 0, text_vocab_size, name, row_ends)
    slots = feature_spec["instr_mask"][0][0]
    word = obs["instr_wp_word"]
    if word.min() < -1 or word.max() >= slots:
        i = _episode_of((word < -1) | (word >= slots), row_ends)
        raise ProtocolError("bad_array", f"episode {i} instr_wp_word outside [-1, {slots})")


# ---- parameter snapshots: [header, array bytes...] -------------------------------------------------
def params_frames(version: int, flat: dict[str, np.ndarray]) -> list[Any]:
    """PARAMS as frames: a msgpack header then one raw little-endian buffer per array (sent zero-copy)."""
    names = sorted(flat)
    arrays = [np.asarray(flat[n], order="C") for n in names]
    buffers = [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays]
    header = message(
        PARAMS,
        version=version,
        names=names,
        dtypes=[a.dtype.str for a in arrays],
        shapes=[list(a.shape) for a in arrays],
        crc32=snapshot_crc32(buffers),
    )
    return [wire.encode(header), *buffers]


def snapshot_crc32(buffers: list[bytes | memoryview]) -> int:
    """CRC-32 of the array bytes in frame order: a snapshot damaged on the way is never loaded."""
    crc = 0
    for buf in buffers:
        crc = zlib.crc32(buf, crc)
    return crc


def parse_params(frames: list[bytes | memoryview]) -> tuple[int, dict[str, np.ndarray]]:
    """Inverse of params_frames; raises ProtocolError on any inconsistency."""
    if not frames:
        raise ProtocolError("bad_params", "empty PARAMS message")
    head = parse(frames[0])
    if head["kind"] != PARAMS:
        raise ProtocolError("bad_params", f"expected PARAMS, got {head['kind']}")
    version = require(head, "version", int)
    names, dtypes, shapes = (require(head, k, list) for k in ("names", "dtypes", "shapes"))
    if not len(names) == len(dtypes) == len(shapes) == len(frames) - 1:
        raise ProtocolError("bad_params", "PARAMS header and frame count disagree")
    crc = require(head, "crc32", int)
    if snapshot_crc32(frames[1:]) != crc:
        raise ProtocolError("bad_params", f"PARAMS v{version} fails its checksum: damaged or incomplete")
    flat = {}
    for name, dtype, shape, buf in zip(names, dtypes, shapes, frames[1:], strict=True):
        if (
            not isinstance(dtype, str)
            or dtype not in wire.ALLOWED_DTYPES
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProtocolError("bad_params", f"PARAMS array {name!r} has a bad dtype or shape")
        dt = np.dtype(dtype)
        if math.prod(shape) * dt.itemsize != len(buf):
            raise ProtocolError("bad_params", f"PARAMS array {name!r} has {len(buf)} bytes for shape {shape}")
        flat[str(name)] = np.frombuffer(buf, dtype=dt).reshape(shape)
    return version, flat
