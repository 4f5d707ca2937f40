"""TRAJ episodes: the sender's field maps (`episode_fields`), their packed wire form (`pack_episodes`: task
names, one array table and one bin for all their arrays), unpacked without a copy (`unpack_episodes`) and
checked (`validate_episodes`) into the `Episode`s the learner stores (docs/PROTOCOL.md §3.5, §6).

What a policy family's episodes carry (observation arrays, choice arrays with their bounds and row shapes,
the behaviour policy's own per-step log-probabilities, id ranges) comes in an `EpisodeSpec` the family
declares (`featurize.episode_spec` for the default pointer family), so this module checks episodes without
knowing the family.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common import wire
from common.protocol.envelope import MAX_TEXT, ProtocolError, require, short

# Per-step arrays of an episode: name -> dtype. Observations carry one more row (the final one).
BASE_STEP_ARRAYS = {"behavior_logp": "<f4", "reward": "<f4", "policy_version": "<i4"}
"""The per-step arrays of every family's episodes, after the family's choice arrays and step_logps
(`EpisodeSpec`): log mu of the choice taken, the reward, and the policy version that chose it."""
ESTIMATE_ARRAYS = {"value": "<f4", "entropy": "<f4"}
"""Optional per-step arrays of an episode: the behaviour policy's critic V(s_t) and its exact entropy at
s_t, computed on the forward pass that chose the action. Sent together or not at all."""
STEP_ARRAYS = {"action_type": "<i4", "element": "<i4", "word": "<i4", "direction": "<i4", **BASE_STEP_ARRAYS}
"""Every per-step array of the default (pointer) family's episodes, in wire order: its choices (the
`featurize.episode_spec` ones), then BASE_STEP_ARRAYS. Another family's are `spec.step_arrays()`."""
CHOICE_DTYPE = "<i4"
"""The dtype `episode_fields` gives choice arrays when no EpisodeSpec names theirs (every choice of the
pointer family is one)."""
STEP_LOGP_DTYPE = "<f4"
"""The dtype of every `EpisodeSpec.step_logps` array (behavior_logp's)."""
MAX_EPISODES_PER_BATCH = 256
EPISODE_KEYS = ("task", "success", "truncated", "obs")
"""The keys of an `episode_fields` map that are not per-step arrays."""
EPISODE_ARRAYS = {"success": "|b1", "truncated": "|b1", "length": "<i4"}
"""Per-episode arrays of a packed TRAJ, [n] each: whether the task was accomplished, whether the episode
was cut short (the learner bootstraps from its final observation), and its steps T."""


@dataclass(frozen=True)
class EpisodeSpec:
    """What a policy family's episodes carry, so the protocol checks them without knowing the family."""

    observations: dict[str, tuple[tuple[int, ...], str]]
    """Featurized observation arrays: name -> (per-row shape, dtype str); [T + 1, *shape] per episode."""
    choices: dict[str, tuple[str, int]]
    """Per-step choice arrays, in wire order: name -> (dtype str, exclusive upper bound); every value (each
    element of a shaped one) in [0, bound)."""
    id_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Integer observation arrays whose values must lie in [low, high): an embedding lookup past its
    table would read garbage without an error."""
    choice_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Row shape of a choice array (e.g. (A,) for A generated token ids): [T, *shape] per episode. A choice
    absent here is one value per step."""
    step_logps: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per-step STEP_LOGP_DTYPE arrays of the behaviour policy's own log-probabilities (e.g. one per
    generated token), in wire order after the choices: name -> row shape. Each value finite and <= 0 (1e-3
    tolerated), like behavior_logp; the losses never read them, a family's evaluate may (Batch.choice)."""
    step_check: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], np.ndarray] | None = field(
        default=None, compare=False
    )
    """A family's own check of choices beyond their bounds and shapes (the lm family: that the action tokens
    are a sentence of its grammar). Given every step's arrays [N, ...] and the observation each step acted
    on [N, ...], bool [N]: False refuses the TRAJ (`bad_choice`)."""

    def __post_init__(self) -> None:
        reserved = {*BASE_STEP_ARRAYS, *ESTIMATE_ARRAYS, *EPISODE_ARRAYS, *EPISODE_KEYS}
        for name, (dtype, bound) in self.choices.items():
            if name in reserved or np.dtype(dtype).kind not in "iu" or bound < 1:
                raise ValueError(
                    f"choice {name!r} needs a name of its own, an integer dtype and a bound >= 1, got "
                    f"{dtype!r} and {bound}"
                )
        if unknown := sorted(set(self.choice_shapes) - set(self.choices)):
            raise ValueError(f"choice_shapes names {unknown}, which are not choices")
        for name in self.step_logps:
            if name in reserved or name in self.choices:
                raise ValueError(f"step log-prob array {name!r} needs a name of its own")
        for name, shape in (*self.choice_shapes.items(), *self.step_logps.items()):
            if not isinstance(shape, tuple) or not all(type(n) is int and n >= 1 for n in shape):
                raise ValueError(f"{name!r} needs a row shape of ints >= 1 (a tuple), got {shape!r}")
        for name, (low, high) in self.id_ranges.items():
            shape_dtype = self.observations.get(name)
            if shape_dtype is None or np.dtype(shape_dtype[1]).kind not in "iu" or low >= high:
                raise ValueError(f"id range {name!r} needs an integer observation array and low < high")

    def step_arrays(self) -> dict[str, str]:
        """Every per-step array, name -> dtype, in wire order: the choices, the step_logps, then
        BASE_STEP_ARRAYS."""
        return {name: dtype for name, (_, dtype) in self.step_shapes().items()}

    def step_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every per-step array, name -> (row shape, dtype), in wire order (`step_arrays`): an episode's is
        [T, *row shape], a Batch's [B, T, *row shape]."""
        return {**self.choice_arrays(), **{name: ((), dtype) for name, dtype in BASE_STEP_ARRAYS.items()}}

    def choice_arrays(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The arrays a Batch's `choice` holds, name -> (row shape, dtype): the choices, then the step_logps
        (what `learner.batch.example_batch` takes)."""
        return {
            **{name: (self.choice_shapes.get(name, ()), dtype) for name, (dtype, _) in self.choices.items()},
            **{name: (shape, STEP_LOGP_DTYPE) for name, shape in self.step_logps.items()},
        }


@dataclass
class Episode:
    """One validated episode as the learner stores it (arrays are read-only views of the message)."""

    task: str
    success: bool
    truncated: bool
    obs: dict[str, np.ndarray]
    """Featurized observations, [T + 1, ...]: one per step plus the final one."""
    steps: dict[str, np.ndarray]
    """The spec's step arrays (its choices, its step_logps, then BASE_STEP_ARRAYS), [T, *row shape] each
    (`EpisodeSpec.step_shapes`)."""
    estimates: dict[str, np.ndarray] = field(default_factory=dict)
    """ESTIMATE_ARRAYS the actor sent, [T] each: its own V(s_t) and policy entropy, from which the learner
    computes the episode's priority when it enters the replay (learner/replay/prioritized.py:initial_priority).
    Empty when the sender had none (demonstrations, an older actor)."""

    @property
    def length(self) -> int:
        return int(self.steps["reward"].shape[0])

    def wire_fields(self) -> dict[str, Any]:
        """The stored episode as a sender's `episode_fields` map, its arrays as they are (validated, so in
        the spec's dtypes and row shapes) and without estimates: what a replay file writes."""
        head = {"task": self.task, "success": self.success, "truncated": self.truncated, "obs": self.obs}
        return {**head, **self.steps}


def episode_fields(
    task: str,
    success: bool,
    truncated: bool,
    obs: dict[str, np.ndarray],
    steps: dict[str, Any],
    estimates: dict[str, np.ndarray] | None = None,
    spec: EpisodeSpec | None = None,
) -> dict[str, Any]:
    """One episode as a sender holds it until it goes out (with ESTIMATE_ARRAYS when `estimates` are
    given): `task`, `success`, `truncated`, `obs` (a map of arrays) and the per-step arrays, [T, *row
    shape] each: the choice arrays, the step_logps, then BASE_STEP_ARRAYS in their dtypes. With a spec,
    its `step_shapes()` in their dtypes: a step array may be given as a list of per-step rows (lists or
    arrays), stacked here, and one of another row shape is refused (ValueError). Without one, every other
    array of `steps`, in its order, is a choice of CHOICE_DTYPE. A TRAJ carries a list of them packed
    (`pack_episodes`, which `Traj.to_msg` calls)."""
    estimates = estimates or {}
    if spec is not None:
        arrays = {name: (shape, np.dtype(dt)) for name, (shape, dt) in spec.step_shapes().items()}
    else:
        names = [k for k in steps if k not in BASE_STEP_ARRAYS] + list(BASE_STEP_ARRAYS)
        arrays = {k: (None, np.dtype(BASE_STEP_ARRAYS.get(k, CHOICE_DTYPE))) for k in names}
    return {
        "task": task,
        "success": success,
        "truncated": truncated,
        "obs": {k: np.ascontiguousarray(v) for k, v in obs.items()},
        **{k: _step_array(k, steps[k], shape, dt) for k, (shape, dt) in arrays.items()},
        **{
            k: np.ascontiguousarray(estimates[k], dtype=np.dtype(dt))
            for k, dt in ESTIMATE_ARRAYS.items()
            if estimates
        },
    }


def _step_array(name: str, values: Any, row_shape: tuple[int, ...] | None, dtype: np.dtype) -> np.ndarray:
    """One per-step array, [T, *row_shape] in `dtype` (any row shape when `row_shape` is None)."""
    arr = np.ascontiguousarray(values, dtype=dtype)
    if row_shape is not None and arr.shape[1:] != row_shape:
        raise ValueError(f"per-step array {name!r} has rows of shape {arr.shape[1:]}, expected {row_shape}")
    return arr


# ---- TRAJ episodes, packed (docs/PROTOCOL.md §3.5, §6) --------------------------------------------------
OBS_PREFIX = "obs/"
"""Observation arrays are named `obs/<key>` in the array table; the other arrays by their own names."""


def pack_episodes(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The wire form of a TRAJ's `episodes` (docs/PROTOCOL.md §6): `task`, one name per episode, and one
    array table and one bin (`arrays`, `data`, §3.5) for all the episodes' arrays: EPISODE_ARRAYS [n],
    then each per-step array [sum of T, *row shape] and each `obs/<key>` [sum of (T + 1), ...], every episode's rows
    one after the other in episode order. The per-step arrays are the first episode's (its keys other than
    EPISODE_KEYS, in their order), which every episode must have; each of the ESTIMATE_ARRAYS goes along
    when every episode has it. The data is copied once, straight into place (`wire.encode` copies it once
    more, into the message)."""
    if not episodes:
        raise ValueError("a TRAJ carries at least one episode")
    steps = [name for name in episodes[0] if name not in EPISODE_KEYS and name not in ESTIMATE_ARRAYS]
    for i, ep in enumerate(episodes):
        if missing := [name for name in steps if name not in ep]:
            raise ValueError(f"episode {i} lacks the per-step arrays {missing} that episode 0 has")
    names = [*steps, *(name for name in ESTIMATE_ARRAYS if all(name in ep for ep in episodes))]
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
        raise ProtocolError("bad_field", f"TRAJ needs field 'episodes' of type map, got {short(packed)}")
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
    msg: dict[str, Any], spec: EpisodeSpec, max_steps: int, newest_version: int
) -> list[Episode]:
    """The episodes of a TRAJ message, checked against the policy family's `spec` as `validate_packed`
    checks them."""
    return validate_packed(msg.get("episodes"), spec, max_steps, newest_version)


def validate_packed(packed: Any, spec: EpisodeSpec, max_steps: int, newest_version: int) -> list[Episode]:
    """Check every field, dtype, shape, range and number of a TRAJ's `episodes` map (as it came) against a
    policy family's `spec`; raise ProtocolError on the first fault. The episodes' arrays are views of the
    message's packed bin (nothing is copied), checked for the whole batch at once; a fault names the first
    episode it is in."""
    unpacked = unpack_episodes(packed)
    arrays, n = unpacked.arrays, len(unpacked.task)
    every = {name: _column(arrays, name, dtype, (n,), "count") for name, dtype in EPISODE_ARRAYS.items()}
    lengths = every["length"]
    if lengths.min() < 1 or lengths.max() > max_steps:
        i = int(np.argmax((lengths < 1) | (lengths > max_steps)))
        raise ProtocolError("bad_array", f"episode {i} has {lengths[i]} steps, allowed 1 to {max_steps}")
    step_ends = np.cumsum(lengths, dtype=np.int64).tolist()
    row_ends = [end + i + 1 for i, end in enumerate(step_ends)]
    total = step_ends[-1]
    steps = {
        name: _column(arrays, name, dtype, (total, *shape), "steps")
        for name, (shape, dtype) in spec.step_shapes().items()
    }
    obs = _observations(arrays, spec.observations, row_ends[-1])
    _check_steps(steps, spec, newest_version, step_ends)
    _check_observations(obs, spec.id_ranges, row_ends)
    estimates = _estimates(arrays, total, step_ends)
    _check_family(spec, steps, obs, lengths, step_ends)
    success, truncated = every["success"].tolist(), every["truncated"].tolist()
    episodes = []
    first_step = 0
    for i, end in enumerate(step_ends):
        first_row, end_row = first_step + i, end + i + 1
        episodes.append(
            Episode(
                unpacked.task[i][:MAX_TEXT],
                success[i],
                truncated[i],
                {name: arr[first_row:end_row] for name, arr in obs.items()},
                {name: arr[first_step:end] for name, arr in steps.items()},
                {name: arr[first_step:end] for name, arr in estimates.items()},
            )
        )
        first_step = end
    return episodes


def _check_family(
    spec: EpisodeSpec,
    steps: dict[str, np.ndarray],
    obs: dict[str, np.ndarray],
    lengths: np.ndarray,
    ends: list[int],
) -> None:
    """The family's own check of the choices (`EpisodeSpec.step_check`), if it has one."""
    if spec.step_check is None:
        return
    acted = np.arange(ends[-1]) + np.repeat(np.arange(len(lengths)), lengths)  # the row each step acted on
    ok = np.asarray(spec.step_check(steps, {key: rows[acted] for key, rows in obs.items()}), bool)
    if not ok.all():
        raise ProtocolError(
            "bad_choice", f"episode {_episode_of(~ok, ends)} has a choice its policy family cannot make"
        )


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


def _observations(
    arrays: dict[str, np.ndarray], observations: dict[str, tuple[tuple[int, ...], str]], rows: int
) -> dict[str, np.ndarray]:
    """The spec's observation arrays, [rows, *shape] each in its dtype, and no others."""
    keys = {name[len(OBS_PREFIX) :] for name in arrays if name.startswith(OBS_PREFIX)}
    if keys != set(observations):
        raise ProtocolError(
            "bad_field", f"TRAJ obs arrays are {sorted(keys)}, expected {sorted(observations)}"
        )
    return {
        name: _column(arrays, OBS_PREFIX + name, dtype, (rows, *shape), "steps + 1 each")
        for name, (shape, dtype) in observations.items()
    }


def _check_steps(
    steps: dict[str, np.ndarray], spec: EpisodeSpec, newest_version: int, ends: list[int]
) -> None:
    """Each choice (every element of a shaped one) in [0, its bound); behavior_logp, the step_logps and
    reward finite; behavior_logp and the step_logps <= 0 (1e-3 tolerated for rounding); every
    policy_version in [0, newest_version] (`future_version` above it)."""
    for name, (_, upper) in spec.choices.items():
        a = steps[name]
        if a.min() < 0 or a.max() >= upper:
            i = _episode_of((a < 0) | (a >= upper), ends)
            raise ProtocolError("bad_array", f"episode {i} {name} outside [0, {upper})")
    logps = ["behavior_logp", *spec.step_logps]
    for name in (*logps, "reward"):
        finite = np.isfinite(steps[name])
        if not finite.all():
            i = _episode_of(~finite, ends)
            raise ProtocolError("non_finite", f"episode {i} {name} has NaN or infinity")
    for name in logps:
        logp = steps[name]
        if logp.max() > 1e-3:
            i = _episode_of(logp > 1e-3, ends)
            raise ProtocolError("bad_array", f"episode {i} {name} must be <= 0")
    versions = steps["policy_version"]
    if versions.min() < 0:
        i = _episode_of(versions < 0, ends)
        raise ProtocolError("bad_array", f"episode {i} has a negative policy_version")
    if versions.max() > newest_version:
        i = _episode_of(versions > newest_version, ends)
        raise ProtocolError("future_version", f"episode {i} policy_version is newer than {newest_version}")


def _check_observations(
    obs: dict[str, np.ndarray], id_ranges: dict[str, tuple[int, int]], ends: list[int]
) -> None:
    """Float observations finite (`non_finite`); every id of the spec's `id_ranges` in [low, high)
    (`bad_array`)."""
    for name, arr in obs.items():
        if arr.dtype.kind == "f":
            finite = np.isfinite(arr)
            if not finite.all():
                i = _episode_of(~finite, ends)
                raise ProtocolError("non_finite", f"episode {i} obs {name} has NaN or infinity")
    for name, (low, high) in id_ranges.items():
        arr = obs[name]
        if arr.size and (arr.min() < low or arr.max() >= high):
            i = _episode_of((arr < low) | (arr >= high), ends)
            raise ProtocolError("bad_array", f"episode {i} {name} has ids outside [{low}, {high})")
