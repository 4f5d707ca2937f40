"""msgpack encoding with numpy arrays as an ExtType, unpacked with explicit limits and no pickle.

Array ext payload (ext code 1), all little-endian:
    u8  len(dtype)      then the dtype string in ASCII (numpy notation, e.g. "<f4", "|u1", "|b1")
    u8  ndim            then ndim x u64 dimensions
    raw C-order bytes   exactly prod(shape) * itemsize of them

Decoding returns a read-only `np.frombuffer` view of the ext payload: the array data is not copied
again after msgpack hands the payload over.

Packed arrays (docs/PROTOCOL.md §3.5; TRAJ episodes since protocol version 3): many named arrays in one
msgpack bin, described by a table of `[name, dtype, shape, offset]` entries. `pack_arrays` writes them
(concatenating lists of arrays straight into place), `unpack_arrays` checks the table against the bin and
returns read-only views of it. A long bin (`BY_REFERENCE_BYTES` or more) in a map is written by `encode`
with a single copy, straight into the message bytes.
"""

from __future__ import annotations

import math
import os
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
MAX_PACKED_ARRAYS = 256
"""Most entries in one packed-array table (docs/PROTOCOL.md §3.4)."""
PACKED_ALIGN = 8
"""Every packed array starts at a multiple of this many bytes into its bin (zero padding between)."""
BY_REFERENCE_BYTES = 1 << 16
"""bytes / bytearray / memoryview values at least this long, in a map (or a map in a map), are copied by
`encode` once, straight into the message, instead of through msgpack's buffer."""
_DTYPES = {s: np.dtype(s) for s in ALLOWED_DTYPES}
_TIMESTAMP = msgpack.Timestamp


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
        if type(value) is _TIMESTAMP:
            raise WireError("msgpack ext type -1 (timestamp) is not allowed")


def _check_map(mapping: dict) -> dict:
    _no_timestamps(mapping.values())
    return mapping


def _check_list(items: list) -> list:
    _no_timestamps(items)
    return items


def _ext_hook(code: int, data: bytes) -> Any:
    if code != ARRAY_EXT_CODE:
        raise WireError(f"unknown msgpack ext code {code}")
    return unpack_array(data)


def encode(message: dict[str, Any]) -> bytes:
    """Serialize a message map; numpy arrays become array ext values.

    A map holding a long buffer (`BY_REFERENCE_BYTES` or more: packed arrays' data), directly or in a
    map inside it, is written piece by piece and joined, so the buffer is copied once, straight into
    the message; the entries leading to it are written first, so that `decode` takes it without a copy.
    The result is a valid msgpack map with the same entries (in another order)."""
    if type(message) is dict:
        parts = _parts(message, msgpack.Packer(default=_default, use_bin_type=True))
        if parts is not None:
            return b"".join(parts)
    return msgpack.packb(message, default=_default, use_bin_type=True)


def _long_buffer(value: Any) -> int:
    """The byte length of a buffer `encode` writes by reference, else 0."""
    if type(value) is bytes or type(value) is bytearray:
        return len(value) if len(value) >= BY_REFERENCE_BYTES else 0
    if type(value) is memoryview and value.c_contiguous and value.nbytes >= BY_REFERENCE_BYTES:
        return value.nbytes
    return 0


def _parts(mapping: dict, packer: msgpack.Packer) -> list | None:
    """The msgpack encoding of a map holding a long buffer, as pieces to join: the map header, then the
    entries holding long buffers (a bin 32 header and the buffer itself, or a map of them), then the other
    entries (one msgpack call). None when the map holds no long buffer."""
    first: list = []
    rest: list = []
    for key, value in mapping.items():
        size = _long_buffer(value)
        if size:
            if size >= 1 << 32:
                raise ValueError(f"a bin of {size} bytes is over msgpack's limit")
            first += [packer.pack(key), struct.pack(">BI", 0xC6, size), value]
            continue
        inner = _parts(value, packer) if type(value) is dict else None
        if inner is None:
            rest.append((key, value))
        else:
            first += [packer.pack(key), *inner]
    if not first:
        return None
    n = len(mapping)
    head = (
        struct.pack("B", 0x80 | n)
        if n < 16
        else struct.pack(">BH", 0xDE, n)
        if n < 1 << 16
        else struct.pack(">BI", 0xDF, n)
    )
    if not rest:
        return [head, *first]
    tail = memoryview(packer.pack_map_pairs(rest))
    return [head, *first, tail[1 if len(rest) < 16 else 3 if len(rest) < 1 << 16 else 5 :]]


def decode(data: bytes | memoryview, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Deserialize one message with hard limits on sizes; raises WireError on anything malformed.

    A map whose first entry (or the first entry of a map that is its first entry, and so on) is a bin of
    BY_REFERENCE_BYTES or more, as `encode` writes packed arrays, gives that bin as a read-only memoryview
    of `data` instead of a copy (so `data` must not change afterwards; a bytearray is always copied).
    Anything else decodes exactly as msgpack decodes it."""
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) >= BY_REFERENCE_BYTES and (
        type(data) is bytes or (type(data) is memoryview and data.format == "B" and data.c_contiguous)
    ):
        found = _leading_bin(data)
        if found is not None:
            return _decode_around(data, *found, max_bytes)
    return _unpack(data, max_bytes, _ext_hook)


def _unpack(data: bytes | memoryview, max_bytes: int, ext_hook: Any) -> Any:
    # Every encoding of an ext -1 (timestamp) holds the byte 0xff (its type): bytes without one need no
    # hooks looking for Timestamps (a cheap scan, and the hooks are most of the cost of a TRAJ's head).
    hooks = type(data) is not bytes or b"\xff" in data
    try:
        value = msgpack.unpackb(
            data,
            ext_hook=ext_hook,
            object_hook=_check_map if hooks else None,
            list_hook=_check_list if hooks else None,
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


_MAX_LEADING_DEPTH = 4


def _leading_bin(data: bytes | memoryview) -> tuple[int, int, list[str]] | None:
    """Where the long bin `encode` writes first sits: (first byte, end, keys of the maps leading to it),
    read from the raw bytes; None when the message does not start that way."""
    try:
        pos = 0
        path = []
        for _ in range(_MAX_LEADING_DEPTH):
            tag = data[pos]
            if 0x81 <= tag <= 0x8F:
                pos += 1
            elif tag in (0xDE, 0xDF) and any(data[pos + 1 : pos + (3 if tag == 0xDE else 5)]):
                pos += 3 if tag == 0xDE else 5
            else:
                return None
            tag = data[pos]
            if 0xA0 <= tag <= 0xBF:
                start, size = pos + 1, tag & 0x1F
            elif tag == 0xD9:
                start, size = pos + 2, data[pos + 1]
            else:
                return None
            path.append(bytes(data[start : start + size]).decode("utf-8"))
            pos = start + size
            if data[pos] == 0xC6:
                (size,) = struct.unpack_from(">I", data, pos + 1)
                start = pos + 5
                if size < BY_REFERENCE_BYTES or start + size > len(data):
                    return None
                return start, start + size, path
    except (IndexError, UnicodeDecodeError, struct.error):
        return None
    return None


class _Placeholder:
    """Stands, while the rest of a message is decoded, where its leading bin was."""


_PLACEHOLDER_TAG = bytes(b % 255 for b in os.urandom(16))
"""The payload of the ext 127 put where a leading bin was cut out: never sent, so no peer can forge it
(and without a 0xff byte, so that it never makes `_unpack` look for timestamps)."""


def _decode_around(data: bytes | memoryview, start: int, end: int, path: list[str], max_bytes: int) -> Any:
    """Decode the message with its leading bin cut out (an ext 127 with a secret random tag in its place),
    then put a view of the bin where the tag decoded, unless a later duplicate key replaced it."""
    view = memoryview(data)
    placeholder = _Placeholder()

    def ext_hook(code: int, payload: bytes) -> Any:
        return placeholder if code == 127 and payload == _PLACEHOLDER_TAG else _ext_hook(code, payload)

    head = b"".join((view[: start - 5], b"\xd8\x7f", _PLACEHOLDER_TAG, view[end:]))
    value = _unpack(head, max_bytes, ext_hook)
    container = value
    for key in path[:-1]:
        container = container.get(key) if type(container) is dict else None
    if type(container) is dict and container.get(path[-1]) is placeholder:
        container[path[-1]] = view[start:end].toreadonly()
    return value


# ---- packed arrays (docs/PROTOCOL.md §3.5) ------------------------------------------------------------
def pack_arrays(arrays: dict[str, Any]) -> tuple[list[list], memoryview]:
    """The table and the data bin of packed arrays: each array's C-order little-endian elements, in the
    order given, each starting at the next multiple of PACKED_ALIGN bytes (zero padding). A value that is a
    list or tuple of arrays is packed as one array, their concatenation along the first axis, copied
    straight into place (the columns of many episodes). Returns (table, read-only view of the data);
    TypeError for a dtype the wire does not allow (or parts of different dtypes), more than MAX_ARRAY_NDIM
    dimensions or more than MAX_PACKED_ARRAYS arrays."""
    if len(arrays) > MAX_PACKED_ARRAYS:
        raise TypeError(f"at most {MAX_PACKED_ARRAYS} packed arrays, got {len(arrays)}")
    layout = []
    end = 0
    for name, value in arrays.items():
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError(f"packed array {name!r}: nothing to concatenate")
            value = list(value)
            first = np.asarray(value[0])
            try:
                rows = sum(map(len, value))  # every part's length (np.concatenate checks the rest)
            except TypeError as e:
                raise TypeError(f"packed array {name!r}: 0-d parts cannot be concatenated") from e
            shape, dtype = (rows, *first.shape[1:]), first.dtype
        else:
            value = np.asarray(value)
            shape, dtype = value.shape, value.dtype
        dtype = _little_endian(dtype)
        if dtype.str not in ALLOWED_DTYPES:
            raise TypeError(f"packed array {name!r}: dtype {dtype} is not allowed on the wire")
        if len(shape) > MAX_ARRAY_NDIM:
            raise TypeError(f"packed array {name!r}: at most {MAX_ARRAY_NDIM} dimensions, got {len(shape)}")
        offset = -(-end // PACKED_ALIGN) * PACKED_ALIGN
        layout.append((name, value, shape, dtype, offset))
        end = offset + math.prod(shape) * dtype.itemsize
    data = np.empty(end, np.uint8)
    table = []
    written = 0
    for name, value, shape, dtype, offset in layout:
        data[written:offset] = 0
        out = np.ndarray(shape, dtype, data, offset)
        if isinstance(value, list):
            try:
                np.concatenate(value, axis=0, out=out, casting="equiv")
            except (TypeError, ValueError) as e:
                raise TypeError(f"packed array {name!r}: parts that do not concatenate: {e}") from e
        else:
            out[...] = value
        table.append([name, dtype.str, list(shape), offset])
        written = offset + out.nbytes
    return table, memoryview(data).toreadonly()


def _little_endian(dtype: np.dtype) -> np.dtype:
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder != "little"):
        return dtype.newbyteorder("<")
    return dtype


def unpack_arrays(table: Any, data: Any) -> dict[str, np.ndarray]:
    """The arrays of a packed table and its data bin, as read-only views of `data` (no copy). WireError
    unless the table is a list of at most MAX_PACKED_ARRAYS `[name, dtype, shape, offset]` entries with
    unique str names, allowed dtypes, shapes of at most MAX_ARRAY_NDIM ints >= 0, each array at the first
    multiple of PACKED_ALIGN after the previous one's end (no overlap, no gap), and `data` ends exactly
    where the last array does."""
    if type(table) is not list:
        raise WireError(f"a packed-array table must be an array, got {type(table).__name__}")
    if len(table) > MAX_PACKED_ARRAYS:
        raise WireError(f"{len(table)} packed arrays, at most {MAX_PACKED_ARRAYS} allowed")
    if not isinstance(data, bytes):  # as decoded it is; a buffer built here is viewed read-only too
        if not isinstance(data, bytearray | memoryview) or not memoryview(data).c_contiguous:
            raise WireError(f"packed-array data must be bin, got {type(data).__name__}")
        data = memoryview(data).cast("B").toreadonly()
    size = len(data)
    arrays: dict[str, np.ndarray] = {}
    end = 0
    for i, entry in enumerate(table):
        if type(entry) is not list or len(entry) != 4:
            raise WireError(
                f"packed array {i}: an entry is [name, dtype, shape, offset], got {_brief(entry)}"
            )
        name, dtype_str, shape, offset = entry
        if type(name) is not str:
            raise WireError(f"packed array {i}: the name must be a str, got {_brief(name)}")
        dtype = _DTYPES.get(dtype_str) if type(dtype_str) is str else None
        if dtype is None:
            raise WireError(f"packed array {name!r}: dtype {_brief(dtype_str)} is not allowed")
        if type(shape) is not list or len(shape) > MAX_ARRAY_NDIM:
            raise WireError(
                f"packed array {name!r}: the shape must be an array of at most {MAX_ARRAY_NDIM} ints"
            )
        count = 1
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise WireError(f"packed array {name!r}: dimension {_brief(dim)} is not an int >= 0")
            count *= dim
        start = (end + PACKED_ALIGN - 1) & -PACKED_ALIGN
        if type(offset) is not int or offset != start:
            raise WireError(
                f"packed array {name!r} at offset {_brief(offset)}: it must start at {start}, the first "
                f"multiple of {PACKED_ALIGN} after the previous array"
            )
        end = offset + count * dtype.itemsize
        if end > size:
            raise WireError(f"packed array {name!r} needs bytes {offset} to {end}, the data has {size}")
        if name in arrays:
            raise WireError(f"packed array {name!r} appears twice")
        try:
            arrays[name] = np.ndarray(shape, dtype, data, offset)
        except (ValueError, TypeError, OverflowError) as e:  # no bytes but dimensions numpy cannot hold
            raise WireError(f"packed array {name!r} of shape {_brief(shape)}: {e}") from e
    if end != size:
        raise WireError(f"packed-array data has {size} bytes, its arrays end at byte {end}")
    return arrays


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
