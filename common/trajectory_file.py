"""Files of episodes in the wire format (demonstrations today, saved replays later).

A file is a sequence of records, each a u32 little-endian byte count followed by one wire message
(common/wire.py): first a header map with `kind` "DEMOS" (`model`: the ModelConfig the observations were
featurized for, `max_steps`, and free-form provenance such as `tasks` and `split`), then TRAJ messages.
Reading validates every episode exactly as the learner validates an actor's TRAJ.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from common import featurize, protocol, wire
from common.config import ModelConfig


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


def load_episodes(path: Path, model: ModelConfig) -> list[protocol.Episode]:
    """Read an episode file; refuse it if it was featurized for another model or is damaged."""
    records = read_records(path)
    try:
        header = wire.decode(next(records))
    except (StopIteration, wire.WireError) as e:
        raise ValueError(f"{path}: not a demos file ({e or 'empty'})") from e
    if not isinstance(header, dict) or header.get("kind") != "DEMOS":
        raise ValueError(f"{path}: not a demos file (no DEMOS header)")
    if ModelConfig.from_dict(header["model"]) != model:
        raise ValueError(f"{path}: recorded for model {header['model']}, the learner uses {model.to_dict()}")
    episodes = []
    for record in records:
        msg = protocol.parse(record)
        episodes += protocol.validate_episodes(
            msg,
            featurize.feature_spec(model),
            header["max_steps"],
            newest_version=0,
            vocab_size=model.vocab_size,
        )
    return episodes
