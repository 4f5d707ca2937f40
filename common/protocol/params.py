"""PARAMS, the one multipart message: a msgpack header, then one raw little-endian buffer per array, with a
CRC-32 over the array bytes so a damaged snapshot is never loaded (docs/PROTOCOL.md)."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from common import wire
from common.protocol.envelope import PARAMS, ProtocolError, message, parse, require


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
