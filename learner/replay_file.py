"""A replay buffer on disk, so a resumed learner continues with the same replay (items and priorities).

The file is a trajectory file (common/trajectory_file.py), records in this order:
    header  {v, kind: "REPLAY", format, model: ModelConfig dict, max_steps, episodes: n, newest_version}
    TRAJ    messages of up to 64 episodes (protocol.Traj packs them), the stored episodes oldest first
    state   {v, kind: "REPLAY_STATE", format, **PrioritizedReplay.state_dict()}: slots, versions,
            priorities, tree leaves, generations, free stack (wire arrays), counts, rng state as JSON, ...
Loading validates every episode exactly as the learner validates an actor's TRAJ (their policy versions
against the header's newest_version) and fills the buffer only once the whole file has been read.
Format 3 files hold protocol version 4 TRAJ records (packed episodes, per-step arrays of any row shape,
each in the dtype it was validated in); format 2 files, version 3 ones, and format 1 files, version 2 ones,
are still read (common/trajectory_file.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

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
from learner.replay import PrioritizedReplay

FORMAT = 3
"""Written: 3 (TRAJ records of protocol version 4). Read: READABLE_FORMATS."""
READABLE_FORMATS = (1, 2, 3)
REPLAY, REPLAY_STATE = "REPLAY", "REPLAY_STATE"
EPISODES_PER_MESSAGE = 64
BYTES_PER_MESSAGE = 16 << 20  # well under wire.MAX_MESSAGE_BYTES


def save_replay(
    path: Path, replay: PrioritizedReplay[protocol.Episode], model_cfg: ModelConfig, max_steps: int
) -> None:
    """Write the buffer to `path` atomically (a temporary file renamed over it): a crash mid-write leaves
    the previous file, never a half-written one."""
    path = Path(path)
    items, state = replay.state_dict()
    _check_items(items, max_steps)
    newest = max((int(ep.steps["policy_version"].max()) for ep in items), default=0)
    header = protocol.message(
        REPLAY,
        format=FORMAT,
        model=model_cfg.to_dict(),
        max_steps=max_steps,
        episodes=len(items),
        newest_version=newest,
    )
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            _write(f, header, items, state)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
) -> int:
    """Fill `replay` (same capacity) from a file written by `save_replay`; returns the number of episodes.
    Any fault (missing, truncated, another format or model, an invalid episode or state) raises with the
    path in the message and leaves `replay` untouched. With `max_steps`, longer episodes are refused too."""
    path = Path(path)
    records = read_records(path)
    header = read_header(path, records, REPLAY)
    fmt = header.get("format")
    if fmt not in READABLE_FORMATS or type(fmt) is not int:
        raise ValueError(f"{path}: replay file format {fmt!r}, this learner reads {READABLE_FORMATS}")
    check_model(path, header, model_cfg)
    limit = header_int(path, header, "max_steps", minimum=1)
    limit = limit if max_steps is None else min(limit, max_steps)
    episodes = _read_all_episodes(path, records, header, model_cfg, limit)
    state = _read_state(path, records, fmt)
    try:
        replay.load_state_dict(episodes, state)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    return len(episodes)


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
