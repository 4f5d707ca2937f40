"""TRAJ episodes: the sender's field maps (`episode_fields`), their packed wire form (`pack_episodes`: task
names, one array table and one bin for all their arrays), unpacked without a copy (`unpack_episodes`) and
checked (`validate_episodes`) into the `Episode`s the learner stores (docs/PROTOCOL.md §3.5, §6).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common import wire
from common.protocol.messages import MAX_TEXT, ProtocolError, _short, require
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS, Trajectory

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
