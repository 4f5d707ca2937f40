"""msgpack encoding with numpy arrays as an ExtType, unpacked with explicit limits and no pickle.

Array ext payload (ext code 1), all little-endian:
    u8  len(dtype)      then the dtype string in ASCII (numpy notation, e.g. "<f4", "|u1", "|b1")
    u8  ndim            then ndim x u64 dimensions
    raw C-order bytes   exactly prod(shape) * itemsize of them

Decoding returns a read-only `np.frombuffer` view of the ext payload: the array data is not copied
again after msgpack hands the payload over.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import msgpack
import numpy as np

ARRAY_EXT_CODE = 1
ALLOWED_DTYPES = frozenset(
    np.dtype(d).str for d in ("bool", "u1", "i1", "u2", "i2", "i4", "u4", "i8", "f2", "f4", "f8")
)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_ARRAY_NDIM = 8
_MAX_CONTAINER_LEN = 1 << 20


class WireError(ValueError):
    """Bytes that are not a valid message of this protocol."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(ARRAY_EXT_CODE, pack_array(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


def pack_array(array: np.ndarray) -> bytes:
    array = np.asarray(array)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder != "little"):
        array = array.astype(array.dtype.newbyteorder("<"))
    dtype = array.dtype.str
    if dtype not in ALLOWED_DTYPES:
        raise TypeError(f"dtype {array.dtype} is not allowed on the wire")
    if array.ndim > MAX_ARRAY_NDIM:
        raise TypeError(f"arrays have at most {MAX_ARRAY_NDIM} dimensions, got {array.ndim}")
    header = struct.pack("<B", len(dtype)) + dtype.encode("ascii")
    header += struct.pack(f"<B{array.ndim}Q", array.ndim, *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def unpack_array(payload: bytes) -> np.ndarray:
    try:
        n = payload[0]
        dtype_str = bytes(payload[1 : 1 + n]).decode("ascii")
        pos = 1 + n
        ndim = payload[pos]
        pos += 1
        if ndim > MAX_ARRAY_NDIM:
            raise WireError(f"array has {ndim} dimensions, at most {MAX_ARRAY_NDIM} allowed")
        shape = struct.unpack_from(f"<{ndim}Q", payload, pos)
        pos += 8 * ndim
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise WireError(f"malformed array header: {e}") from e
    if dtype_str not in ALLOWED_DTYPES:
        raise WireError(f"array dtype {dtype_str!r} is not allowed")
    dtype = np.dtype(dtype_str)
    count = 1
    for dim in shape:
        count *= dim
    if count * dtype.itemsize != len(payload) - pos:
        raise WireError(
            f"array of shape {shape} and dtype {dtype_str} needs {count * dtype.itemsize} bytes, "
            f"got {len(payload) - pos}"
        )
    return np.frombuffer(payload, dtype=dtype, count=count, offset=pos).reshape(shape)


def _no_timestamps(values):
    """msgpack decodes ext -1 to a Timestamp before ext_hook sees it; the protocol allows only ext 1."""
    for value in values:
        if isinstance(value, msgpack.Timestamp):
            raise WireError("msgpack ext type -1 (timestamp) is not allowed")


def _check_map(pairs: list[tuple[Any, Any]]) -> dict:
    _no_timestamps(v for _, v in pairs)
    return dict(pairs)


def _check_list(items: list) -> list:
    _no_timestamps(items)
    return items


def _ext_hook(code: int, data: bytes) -> Any:
    if code != ARRAY_EXT_CODE:
        raise WireError(f"unknown msgpack ext code {code}")
    return unpack_array(data)


def encode(message: dict[str, Any]) -> bytes:
    """Serialize a message map; numpy arrays become array ext values."""
    return msgpack.packb(message, default=_default, use_bin_type=True)


def decode(data: bytes | memoryview, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Deserialize one message with hard limits on sizes; raises WireError on anything malformed."""
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        value = msgpack.unpackb(
            data,
            ext_hook=_ext_hook,
            object_pairs_hook=_check_map,
            list_hook=_check_list,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=_MAX_CONTAINER_LEN,
            max_map_len=_MAX_CONTAINER_LEN,
            max_ext_len=max_bytes,
        )
        _no_timestamps([value])
        return value
    except WireError:
        raise
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, ValueError, ...)
        raise WireError(f"undecodable message: {type(e).__name__}: {e}") from e
