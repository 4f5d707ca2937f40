"""A replay buffer on disk, so a resumed learner continues with the same replay (items and priorities).

The file is a trajectory file (common/trajectory_file.py), records in this order:
    header  {v, kind: "REPLAY", format, model: ModelConfig dict, max_steps, episodes: n in the file,
            referenced: n in the log, newest_version}
    TRAJ    messages of up to 64 episodes (protocol.Traj packs them): the items the file holds, oldest first
    state   {v, kind: "REPLAY_STATE", format, **PrioritizedReplay.state_dict(), caps}: slots, versions,
            priorities, tree leaves, generations, free stack, origins (wire arrays), counts, rng state as
            JSON, ...; `caps`, each item's newest policy version
Format 4 saves incrementally: an item the write-ahead log holds (its `origins` row is (record, index))
is not written again, only referenced; the file holds the others (demonstrations, a run without a log:
origins -1) and the state. Loading reads the referenced records back from the log (`LoggedEpisodes`,
learner/ingest/settler.py), validated as on arrival and capped at the item's `caps` (recovery may
have capped a re-sent batch's versions), and fills the buffer only once everything has been read.
Every episode is validated exactly as the learner validates an actor's TRAJ (in-file ones against the
header's newest_version). Format 3 files (every item in the file, protocol version 4 TRAJ records), 2
(version 3) and 1 (version 2) are still read (common/trajectory_file.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from common import protocol, wire
from common.config import ModelConfig
from common.trajectory_file import (
    check_model,
    episode_spec,
    header_int,
    read_episodes,
    read_header,
    read_records,
    write_record,
)
from learner.replay.prioritized import PrioritizedReplay

FORMAT = 4
"""Written: 4 (items the log holds by reference). Read: READABLE_FORMATS."""
READABLE_FORMATS = (1, 2, 3, 4)
REPLAY, REPLAY_STATE = "REPLAY", "REPLAY_STATE"
EPISODES_PER_MESSAGE = 64
BYTES_PER_MESSAGE = 16 << 20  # well under wire.MAX_MESSAGE_BYTES

Logged = Callable[[np.ndarray, np.ndarray], list[protocol.Episode]]
"""The episodes at (record, index) rows of a write-ahead log, validated and capped at the given newest
policy versions (learner/ingest/settler.py `LoggedEpisodes`); ValueError for one it lacks."""


@dataclasses.dataclass(frozen=True)
class ReplaySnapshot:
    """What a save writes, taken from the buffer at one instant (cheap: array copies and references to
    immutable episodes), so the file can be written on another thread while the buffer changes."""

    in_file: list[protocol.Episode]
    state: dict[str, Any]
    newest_version: int
    referenced: int


def snapshot(
    replay: PrioritizedReplay[protocol.Episode], max_steps: int, by_reference: bool
) -> ReplaySnapshot:
    """The buffer now; `by_reference`: the items the log holds are referenced, not copied (the log must
    keep their records: learner/replay/prioritized.py `oldest_origin`)."""
    items, state = replay.state_dict()
    _check_items(items, max_steps)
    caps = np.array([int(ep.steps["policy_version"].max(initial=0)) for ep in items], np.int64)
    referenced = state["origins"][:, 0] >= 0 if by_reference else np.zeros(len(items), bool)
    state["origins"] = np.where(referenced[:, None], state["origins"], -1)
    state["caps"] = caps
    in_file = [ep for ep, ref in zip(items, referenced.tolist(), strict=True) if not ref]
    return ReplaySnapshot(in_file, state, int(caps.max(initial=0)), int(referenced.sum()))


def write_snapshot(path: Path, snap: ReplaySnapshot, model_cfg: ModelConfig, max_steps: int) -> int:
    """Write `snap` to `path` atomically (a temporary file renamed over it): a crash mid-write leaves the
    previous file, never a half-written one. Returns the file's size in bytes."""
    path = Path(path)
    header = protocol.message(
        REPLAY,
        format=FORMAT,
        model=model_cfg.to_dict(),
        max_steps=max_steps,
        episodes=len(snap.in_file),
        referenced=snap.referenced,
        newest_version=snap.newest_version,
    )
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            _write(f, header, snap.in_file, snap.state)
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size


def save_replay(
    path: Path,
    replay: PrioritizedReplay[protocol.Episode],
    model_cfg: ModelConfig,
    max_steps: int,
    by_reference: bool = False,
) -> int:
    """`snapshot` then `write_snapshot`, on this thread; the file's size in bytes."""
    return write_snapshot(path, snapshot(replay, max_steps, by_reference), model_cfg, max_steps)


def _write(f: BinaryIO, header: dict[str, Any], items: list[protocol.Episode], state: dict[str, Any]) -> None:
    write_record(f, wire.encode(header))
    for seq, chunk in enumerate(_chunks(items), 1):
        fields = [ep.wire_fields() for ep in chunk]  # arrays in the dtypes and row shapes validated
        write_record(f, wire.encode(protocol.Traj(actor_id=0, seq=seq, episodes=fields).to_msg()))
    write_record(f, wire.encode(protocol.message(REPLAY_STATE, format=FORMAT, **state)))
    f.flush()
    os.fsync(f.fileno())


def load_replay(
    path: Path,
    replay: PrioritizedReplay[protocol.Episode],
    model_cfg: ModelConfig,
    *,
    max_steps: int | None = None,
    logged: Logged | None = None,
) -> int:
    """Fill `replay` (same capacity) from a file written by `save_replay`; returns the number of episodes.
    `logged` reads the items a format 4 file references back from the write-ahead log. Any fault
    (missing, truncated, another format or model, an invalid episode or state, a referenced record the
    log lacks) raises with the path in the message and leaves `replay` untouched. With `max_steps`,
    longer episodes are refused too."""
    path = Path(path)
    records = read_records(path)
    header = read_header(path, records, REPLAY)
    fmt = header.get("format")
    if fmt not in READABLE_FORMATS or type(fmt) is not int:
        raise ValueError(f"{path}: replay file format {fmt!r}, this learner reads {READABLE_FORMATS}")
    check_model(path, header, model_cfg)
    limit = header_int(path, header, "max_steps", minimum=1)
    limit = limit if max_steps is None else min(limit, max_steps)
    in_file = _read_all_episodes(path, records, header, model_cfg, limit)
    state = _read_state(path, records, fmt)
    referenced = header_int(path, header, "referenced") if fmt >= 4 else 0
    episodes = _merged(path, in_file, referenced, state, logged, limit)
    try:
        replay.load_state_dict(episodes, state)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    return len(episodes)


def _merged(
    path: Path,
    in_file: list[protocol.Episode],
    referenced: int,
    state: dict[str, Any],
    logged: Logged | None,
    max_steps: int,
) -> list[protocol.Episode]:
    """Every item, oldest first: the file's own and the log's (read back and capped) where `origins` says."""
    if not referenced:
        return in_file
    origins, caps = state.get("origins"), state.get("caps")
    n = len(in_file) + referenced
    for name, value, shape in (("origins", origins, (n, 2)), ("caps", caps, (n,))):
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu" or value.shape != shape:
            raise ValueError(f"{path}: the replay state's {name} must be an integer array of shape {shape}")
    from_log = origins[:, 0] >= 0
    if int(from_log.sum()) != referenced:
        raise ValueError(
            f"{path}: its header references {referenced} episodes, its state {int(from_log.sum())}"
        )
    if logged is None:
        raise ValueError(
            f"{path}: it references {referenced} episodes in the write-ahead log, and no log was given"
        )
    try:
        read_back = iter(logged(origins[from_log], caps[from_log]))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    own = iter(in_file)
    out = []
    for is_logged in from_log.tolist():
        ep = next(read_back) if is_logged else next(own)
        if ep.length > max_steps:
            raise ValueError(
                f"{path}: a referenced episode of {ep.length} steps exceeds max_steps {max_steps}"
            )
        out.append(ep)
    return out


def _check_items(items: list[Any], max_steps: int) -> None:
    for ep in items:
        if not isinstance(ep, protocol.Episode):
            raise TypeError(f"a replay file holds Episodes, the buffer holds a {type(ep).__name__}")
        if ep.length > max_steps:
            raise ValueError(f"an episode of {ep.length} steps exceeds max_steps {max_steps}")


def _chunks(items: list[protocol.Episode]) -> Iterator[list[protocol.Episode]]:
    """Consecutive runs of episodes small enough for one TRAJ message (count and bytes)."""
    chunk: list[protocol.Episode] = []
    size = 0
    for ep in items:
        nbytes = sum(a.nbytes for a in (*ep.obs.values(), *ep.steps.values()))
        if chunk and (len(chunk) == EPISODES_PER_MESSAGE or size + nbytes > BYTES_PER_MESSAGE):
            yield chunk
            chunk, size = [], 0
        chunk.append(ep)
        size += nbytes
    if chunk:
        yield chunk


def _read_all_episodes(
    path: Path, records: Iterator[bytes], header: dict[str, Any], model_cfg: ModelConfig, max_steps: int
) -> list[protocol.Episode]:
    count = header_int(path, header, "episodes")
    newest = header_int(path, header, "newest_version")
    spec = episode_spec(model_cfg)
    episodes: list[protocol.Episode] = []
    index = 0
    while len(episodes) < count:
        record = next(records, None)
        index += 1
        if record is None:
            raise ValueError(f"{path}: truncated: it ends after {len(episodes)} of its {count} episodes")
        episodes += read_episodes(path, index, record, spec, max_steps, newest)
    if len(episodes) != count:
        raise ValueError(f"{path}: holds {len(episodes)} episodes, its header says {count}")
    return episodes


def _read_state(path: Path, records: Iterator[bytes], fmt: int) -> dict[str, Any]:
    record = next(records, None)
    if record is None:
        raise ValueError(f"{path}: truncated: the replay state record is missing")
    try:
        state = wire.decode(record)
    except wire.WireError as e:
        raise ValueError(f"{path}: unreadable replay state record: {e}") from e
    if not isinstance(state, dict) or state.get("kind") != REPLAY_STATE or state.get("format") != fmt:
        raise ValueError(f"{path}: the record after the episodes is not a {REPLAY_STATE} of format {fmt}")
    if next(records, None) is not None:
        raise ValueError(f"{path}: unexpected records after the replay state")
    return state
