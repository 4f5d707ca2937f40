"""Files of episodes in the wire format: demonstrations (kind DEMOS) and saved replays (kind REPLAY,
learner/replay/file.py).

A file is a sequence of records, each a u32 little-endian byte count followed by one wire message
(common/wire.py): first a header map with `kind` "DEMOS" (`model`: the ModelConfig the observations were
featurized for, `max_steps`, and free-form provenance such as `tasks` and `split`), then TRAJ messages.
Reading validates every episode exactly as the learner validates an actor's TRAJ. TRAJ records carry
the protocol version they were written with: version 4 (packed episodes whose per-step arrays may have a
row shape, docs/PROTOCOL.md §6) since then; older files are still read: version 3 records (packed
episodes, every per-step array one value per step: the same layout) as they are, version 2 ones (a list
of episode maps of array ext values) packed as an actor's would be; then validated the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from common import protocol, wire
from common.config import ModelConfig
from common.policies import make_policy

DEMOS = "DEMOS"
LEGACY_TRAJ_VERSION = 2
"""TRAJ records of files written before protocol version 3: read, by packing their episodes first."""
PACKED_TRAJ_VERSIONS = (3,)
"""Older protocol versions whose TRAJ records are read as they are: their packed episodes are laid out as
today's (version 4 only added row shapes to per-step arrays, which a version 3 sender never had)."""


def write_record(f: BinaryIO, data: bytes) -> None:
    f.write(struct.pack("<I", len(data)))
    f.write(data)


def read_records(path: Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        (size,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + size > len(data):
            raise ValueError(f"{path}: truncated record at byte {pos} (file cut short?)")
        yield data[pos + 4 : pos + 4 + size]
        pos += 4 + size


def read_header(path: Path, records: Iterator[bytes], kind: str) -> dict[str, Any]:
    """The first record as a header map of this `kind`; anything else is another format (or damage)."""
    noun = kind.lower()
    try:
        header = wire.decode(next(records))
    except StopIteration:
        raise ValueError(f"{path}: not a {noun} file (empty)") from None
    except ValueError as e:  # a WireError, or a first record longer than the file: random bytes
        reason = str(e).removeprefix(f"{path}: ")
        raise ValueError(f"{path}: not a {noun} file (unreadable first record: {reason})") from e
    found = header.get("kind") if isinstance(header, dict) else None
    if found != kind:
        raise ValueError(f"{path}: not a {noun} file (header kind {found!r}, expected {kind!r})")
    return header


def header_int(path: Path, header: dict[str, Any], name: str, minimum: int = 0) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{path}: header field {name!r} must be an integer >= {minimum}, got {value!r}")
    return value


def check_model(path: Path, header: dict[str, Any], model: ModelConfig) -> None:
    """Refuse a file featurized for another model (its arrays would not fit this one's inputs)."""
    try:
        saved = ModelConfig.from_dict(header["model"])
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{path}: header has no valid model config ({e!r})") from e
    if saved != model:
        raise ValueError(f"{path}: recorded for model {header['model']}, the learner uses {model.to_dict()}")


def episode_spec(model: ModelConfig) -> protocol.EpisodeSpec:
    """What the episodes of a file featurized for `model` carry (its policy family's `episode_spec`,
    `--model.kind`, common/policies), so reading checks them as the learner checks an actor's TRAJ; built
    once per file."""
    return make_policy(model).episode_spec()


def read_episodes(
    path: Path, index: int, record: bytes, spec: protocol.EpisodeSpec, max_steps: int, newest_version: int
) -> list[protocol.Episode]:
    """The episodes of one TRAJ record, validated exactly as an actor's TRAJ; faults name the file."""
    try:
        msg = parse_record(record)
        if msg["kind"] != protocol.TRAJ:
            raise protocol.ProtocolError("bad_kind", f"expected a TRAJ message, got {msg['kind']}")
        return protocol.validate_episodes(msg, spec, max_steps, newest_version)
    except protocol.ProtocolError as e:
        raise ValueError(f"{path}: record {index}: {e}") from e


def parse_record(record: bytes | memoryview) -> dict[str, Any]:
    """A TRAJ (or other) record as `protocol.parse` gives it; an older readable TRAJ comes back as today's
    version: a version 3 one as it is, a version 2 one with its episodes packed (`protocol.pack_episodes`).
    ProtocolError for anything else `parse` refuses. The write-ahead log's recovery reads its records so
    too (learner/ingest/settler.py), so that batches logged by an older learner survive its upgrade."""
    try:
        msg = wire.decode(record)
    except wire.WireError as e:
        raise protocol.ProtocolError("bad_encoding", str(e)) from e
    if isinstance(msg, dict) and type(msg.get("v")) is int and msg.get("kind") == protocol.TRAJ:
        if msg["v"] == LEGACY_TRAJ_VERSION:
            return _upgrade_legacy_traj(msg)
        if msg["v"] in PACKED_TRAJ_VERSIONS:
            return {**msg, "v": protocol.PROTOCOL_VERSION}
    return protocol.check_envelope(msg)


def _upgrade_legacy_traj(msg: dict[str, Any]) -> dict[str, Any]:
    episodes = msg.get("episodes")
    if not isinstance(episodes, list) or not 1 <= len(episodes) <= protocol.MAX_EPISODES_PER_BATCH:
        raise protocol.ProtocolError("bad_field", "a version 2 TRAJ record needs a list of 1 to 256 episodes")
    for i, ep in enumerate(episodes):
        if not isinstance(ep, dict) or not isinstance(ep.get("obs"), dict):
            raise protocol.ProtocolError("bad_field", f"version 2 episode {i} is not a map with an obs map")
        for name in ("success", "truncated"):
            protocol.require(ep, name, bool, f"version 2 episode {i}")
    try:
        packed = protocol.pack_episodes(episodes)
    except (KeyError, TypeError, ValueError) as e:
        raise protocol.ProtocolError("bad_field", f"version 2 episodes that do not pack: {e!r}") from e
    return {**msg, "v": protocol.PROTOCOL_VERSION, "episodes": packed}


def load_episodes(path: Path, model: ModelConfig) -> list[protocol.Episode]:
    """Read an episode file; refuse it if it was featurized for another model or is damaged."""
    records = read_records(path)
    header = read_header(path, records, DEMOS)
    check_model(path, header, model)
    max_steps = header_int(path, header, "max_steps", minimum=1)
    spec = episode_spec(model)
    episodes = []
    for index, record in enumerate(records, 1):
        episodes += read_episodes(path, index, record, spec, max_steps, newest_version=0)
    return episodes
