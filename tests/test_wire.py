"""The wire format (common.wire: msgpack, array ext values, packed arrays) and the protocol envelope and
validators (common.protocol: packed TRAJ episodes among them)."""

from __future__ import annotations

import re
import struct
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from common.protocol import ProtocolError

CFG = ModelConfig(vocab_size=64, max_instruction_tokens=5, max_elements=4, max_element_tokens=3)
SPEC = featurize.feature_spec(CFG)
EPISODE_SPEC = featurize.episode_spec(CFG, text_vocab_size=0)
MAX_STEPS = 6
NEWEST = 7

SHAPES = [(), (0,), (3, 0, 2), (5,), (2, 3), (1, 2, 1, 2, 1, 2, 1, 2)]
FUZZ = settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


# ---- helpers ------------------------------------------------------------------------------------------
def random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return np.asarray(rng.integers(0, 2, size=shape)).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        arr = np.asarray(rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True), dt)
        if arr.size >= 2:  # the extremes must survive too
            arr.flat[0], arr.flat[-1] = info.min, info.max
        return arr
    arr = np.asarray(rng.standard_normal(size=shape) * 1e3).astype(dt)
    if arr.size >= 4:
        arr.flat[0], arr.flat[1], arr.flat[2], arr.flat[3] = np.inf, -np.inf, np.nan, -0.0
    return arr


def assert_same(got, want, path="msg"):
    """Deep equality that also checks Python types, and for arrays dtype, shape and the exact bytes."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), path
        assert got.dtype == want.dtype, (path, got.dtype, want.dtype)
        assert got.shape == want.shape, (path, got.shape, want.shape)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), path
    elif isinstance(want, bytes | memoryview):  # a bin: a memoryview when decoded without a copy
        assert isinstance(got, bytes | memoryview), (path, type(got))
        assert bytes(got) == bytes(want), path
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (path, got)
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list | tuple):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert type(got) is type(want) and got == want, (path, got, want)


def assert_readonly_view(arr: np.ndarray) -> None:
    """A view (no own data) whose base chain ends in the immutable payload bytes, and read-only."""
    assert arr.base is not None
    assert not arr.flags.owndata
    assert not arr.flags.writeable
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, bytes | memoryview), type(base)
    if arr.size:
        with pytest.raises(ValueError):
            arr.flat[0] = arr.flat[0]


def make_episode(rng: np.random.Generator, length: int, *, truncated: bool = False) -> dict:
    """A valid episode for CFG with `length` steps, as a sender holds it (`protocol.episode_fields`)."""
    obs = {}
    for name, (shape, _) in SPEC.items():
        full = (length + 1, *shape)
        if name.endswith("tokens"):
            obs[name] = rng.integers(0, CFG.vocab_size, size=full).astype(np.int32)
        elif name.endswith("mask"):
            obs[name] = rng.integers(0, 2, size=full).astype(bool)
        else:
            obs[name] = rng.random(size=full).astype(np.float32)
    steps = {
        "action_type": rng.integers(0, 7, length),
        "element": rng.integers(0, CFG.max_elements, length),
        "word": rng.integers(0, CFG.max_instruction_tokens, length),
        "direction": rng.integers(0, 4, length),
        "behavior_logp": -rng.random(length) * 5,
        "reward": rng.random(length),
        "policy_version": rng.integers(0, NEWEST + 1, length),
    }
    return protocol.episode_fields("toggle", not truncated, truncated, obs, steps)


def traj(*episodes: dict) -> dict:
    """A TRAJ of these episodes, packed (`Traj.to_msg`)."""
    return protocol.Traj(3, 11, list(episodes)).to_msg()


def via_wire(msg: dict) -> dict:
    return protocol.parse(wire.encode(msg))


def validate(msg: dict) -> list[protocol.Episode]:
    return protocol.validate_episodes(msg, EPISODE_SPEC, MAX_STEPS, NEWEST)


# ---- round trips --------------------------------------------------------------------------------------
def _messages() -> list[tuple[str, dict]]:
    rng = np.random.default_rng(0)
    return [
        ("HELLO", protocol.message(protocol.HELLO, actor="box-1", num_envs=4, pid=4242)),
        (
            "WELCOME",
            protocol.message(
                protocol.WELCOME,
                run_id="abc123",
                actor_id=7,
                policy_version=-1,
                model=CFG.to_dict(),
                max_steps=MAX_STEPS,
            ),
        ),
        ("TRAJ", traj(make_episode(rng, 1), make_episode(rng, 4, truncated=True), make_episode(rng, 6))),
        ("ACK", protocol.message(protocol.ACK, seq=12, accepted=3)),
        ("PARAM_REQ", protocol.message(protocol.PARAM_REQ, actor_id=7, have_version=-1)),
        ("HEARTBEAT", protocol.message(protocol.HEARTBEAT, actor_id=7, policy_version=5)),
        ("ERROR", protocol.message(protocol.ERROR, code="bad_array", reason="episode 0 reward ünïcode")),
        (
            "extra fields",  # fields the protocol does not list travel unchanged (and are ignored)
            protocol.message(
                protocol.HEARTBEAT,
                actor_id=7,
                extra={
                    "big": 2**64 - 1,
                    "neg": -(2**63),
                    "f": -1.5e300,
                    "none": None,
                    "bin": b"\x00\xff",
                    "nested": [1, "a", [True, False], {"k": 0.25}],
                },
            ),
        ),
    ]


@pytest.mark.parametrize(("kind", "msg"), _messages(), ids=[k for k, _ in _messages()])
def test_message_round_trip(kind, msg):
    got = via_wire(msg)
    assert got["kind"] == msg["kind"] and got["v"] == protocol.PROTOCOL_VERSION
    assert_same(got, msg)


def test_traj_round_trip_validates_to_the_same_episodes():
    rng = np.random.default_rng(1)
    eps = [make_episode(rng, n, truncated=bool(n % 2)) for n in (1, 3, MAX_STEPS)]
    got = validate(via_wire(traj(*eps)))
    assert len(got) == 3
    for ep, want in zip(got, eps, strict=True):
        assert ep.length == want["reward"].shape[0]
        assert (ep.task, ep.success, ep.truncated) == (want["task"], want["success"], want["truncated"])
        assert set(ep.steps) == set(protocol.STEP_ARRAYS)
        for name in protocol.STEP_ARRAYS:
            assert_same(ep.steps[name], want[name])
            assert_readonly_view(ep.steps[name])
        for name in SPEC:
            assert_same(ep.obs[name], want["obs"][name])
            assert_readonly_view(ep.obs[name])


def test_error_helper_round_trip():
    got = protocol.parse(protocol.error("future_version", "too new"))
    assert got == {"v": 4, "kind": "ERROR", "code": "future_version", "reason": "too new"}
    # A refused TRAJ's seq rides along, so the actor knows which batch will never be taken.
    assert protocol.parse(protocol.error("bad_array", "x", seq=7))["seq"] == 7


def _flat_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    shapes = list(SHAPES)
    flat = {}
    for i, dtype in enumerate(sorted(wire.ALLOWED_DTYPES)):
        flat[f"layer{i}/w"] = random_array(rng, dtype, shapes[i % len(shapes)])
    flat["blocks/0/attn/query/kernel"] = rng.standard_normal((4, 2, 3)).astype(np.float32)
    flat["fortran"] = np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32))
    return flat


@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes", "memoryview"])
def test_params_round_trip(as_bytes):
    flat = _flat_params()
    frames = protocol.params_frames(42, flat)
    assert len(frames) == 1 + len(flat)
    # PROTOCOL.md 5: a header with sorted names, dtypes and shapes, then one raw C-order frame per array
    names = sorted(flat)
    assert wire.decode(frames[0]) == {
        "v": 4,
        "kind": "PARAMS",
        "version": 42,
        "names": names,
        "dtypes": [flat[n].dtype.str for n in names],
        "shapes": [list(flat[n].shape) for n in names],
        "crc32": zlib.crc32(b"".join(np.ascontiguousarray(flat[n]).tobytes() for n in names)),
    }
    for name, frame in zip(names, frames[1:], strict=True):
        assert bytes(frame) == np.ascontiguousarray(flat[name]).tobytes()
    if as_bytes:  # what arrives from a socket
        frames = [bytes(f) for f in frames]
    version, got = protocol.parse_params(frames)
    assert version == 42
    assert list(got) == sorted(flat)
    for name, want in flat.items():
        assert_same(got[name], want, name)


@pytest.mark.parametrize("shape", [(), (2, 0), (3, 0, 2)], ids=["0-d", "empty-2d", "empty-3d"])
def test_params_round_trip_scalar_and_empty(shape):
    flat = {"odd": np.full(shape, 2.5, np.float32), "bias": np.zeros((2,), np.float32)}
    _, got = protocol.parse_params([bytes(f) for f in protocol.params_frames(1, flat)])
    assert_same(got["odd"], flat["odd"])


def test_parse_params_refuses_inconsistent_frames():
    flat = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int32)}
    frames = [bytes(f) for f in protocol.params_frames(3, flat)]
    head = msgpack.unpackb(frames[0])

    def with_head(**changes):
        return [wire.encode({**head, **changes}), *frames[1:]]

    bad = {
        "no frames": ([], "bad_params"),
        "missing array frame": (frames[:-1], "bad_params"),
        "extra array frame": ([*frames, b"\0" * 4], "bad_params"),
        "short buffer": ([frames[0], frames[1][:-1], frames[2]], "bad_params"),
        "long buffer": ([frames[0], frames[1], frames[2] + b"\0"], "bad_params"),
        "dtype not allowed": (with_head(dtypes=["<c8", "<i4"]), "bad_params"),
        "negative dim": (with_head(shapes=[[-2, -3], [3]]), "bad_params"),
        "shape disagrees": (with_head(shapes=[[3, 3], [3]]), "bad_params"),
        "one name short": (with_head(names=["a"]), "bad_params"),
        "not PARAMS": ([wire.encode(protocol.message(protocol.ACK, seq=1)), *frames[1:]], "bad_params"),
        "version not int": (with_head(version="3"), "bad_field"),
        "version bool": (with_head(version=True), "bad_field"),
        "names not list": (with_head(names="a"), "bad_field"),
        "header garbage": ([b"\xc1", *frames[1:]], "bad_encoding"),
        "header wrong version": (with_head(v=1), "bad_version"),
        "one flipped byte": ([frames[0], bytes([frames[1][0] ^ 1]) + frames[1][1:], frames[2]], "bad_params"),
        "two arrays swapped": (
            [frames[0], frames[2][:4] + frames[1][4:], frames[1][:4] + frames[2][4:]],
            "bad_params",
        ),
        "checksum missing": (
            [wire.encode({k: v for k, v in head.items() if k != "crc32"}), *frames[1:]],
            "bad_field",
        ),
    }
    for label, (f, code) in bad.items():
        with pytest.raises(ProtocolError) as e:
            protocol.parse_params(f)
        assert e.value.code == code, label


@pytest.mark.parametrize(
    "change", [{"shapes": [6, [3]]}, {"dtypes": [["<f4"], "<i4"]}], ids=["shape", "dtype"]
)
def test_parse_params_malformed_header_entries_raise_protocol_error(change):
    flat = {"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.int32)}
    frames = [bytes(f) for f in protocol.params_frames(3, flat)]
    head = {**msgpack.unpackb(frames[0]), **change}
    with pytest.raises(ProtocolError):
        protocol.parse_params([wire.encode(head), *frames[1:]])


# ---- arrays -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{len(s)}d{'-empty' if 0 in s else ''}" for s in SHAPES])
@pytest.mark.parametrize("dtype", sorted(wire.ALLOWED_DTYPES))
def test_array_round_trip(dtype, shape):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, shape)).encode()))
    arr = random_array(rng, dtype, shape)
    got = wire.decode(wire.encode({"a": arr, "nested": [{"b": arr}]}))
    for out in (got["a"], got["nested"][0]["b"]):
        assert out.dtype == arr.dtype and out.dtype.str == dtype
        assert out.shape == arr.shape
        assert out.tobytes() == arr.tobytes()  # bit-exact, NaN and -0.0 included
        assert_readonly_view(out)


def test_worked_examples_of_the_protocol_document():
    """docs/PROTOCOL.md section 9, byte for byte."""
    hello = bytes.fromhex(
        "86 a176 04 a46b696e64 a548454c4c4f a56163746f72 a26131 a86e756d5f656e7673 10"
        " a8696e7374616e6365 a26931 ad66697273745f756e61636b6564 01"
    )
    assert len(hello) == 61
    fields = {"actor": "a1", "num_envs": 16, "instance": "i1", "first_unacked": 1}
    assert wire.encode(protocol.message(protocol.HELLO, **fields)) == hello
    assert protocol.parse(hello) == {"v": 4, "kind": "HELLO", **fields}
    assert wire.encode(protocol.Hello(**fields).to_msg()) == hello  # the dataclass sends the same bytes
    assert protocol.Hello.from_msg(protocol.parse(hello)) == protocol.Hello(**fields)
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    ext_bytes = bytes.fromhex("c7 2d 01 03 3c6934 02 0200000000000000 0300000000000000")
    ext_bytes += b"".join(struct.pack("<i", i) for i in range(1, 7))
    assert wire.encode({"x": x}) == b"\x81\xa1x" + ext_bytes
    assert_same(wire.decode(b"\x81\xa1x" + ext_bytes), {"x": x})


def test_ext_payload_layout_matches_docstring():
    arr = np.arange(6, dtype="<i2").reshape(2, 3)
    payload = wire.pack_array(arr)
    want = bytes([3]) + b"<i2" + bytes([2]) + struct.pack("<QQ", 2, 3) + arr.tobytes()
    assert payload == want
    packed = msgpack.unpackb(wire.encode({"a": arr}), ext_hook=lambda code, data: (code, data))
    assert packed["a"] == (wire.ARRAY_EXT_CODE, want)


@pytest.mark.parametrize("make", ["strided", "fortran", "transposed"])
def test_non_contiguous_arrays_round_trip(make):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    arr = {"strided": base[::2, 1::2], "fortran": np.asfortranarray(base), "transposed": base.T}[make]
    got = wire.decode(wire.encode({"a": arr}))["a"]
    assert got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("code", ["i2", "u2", "i4", "u4", "i8", "f2", "f4", "f8"])
def test_big_endian_arrays_become_little_endian(code):
    little = random_array(np.random.default_rng(3), "<" + code, (3, 5))
    big = little.astype(">" + code)
    assert big.tobytes() != little.tobytes()
    got = wire.decode(wire.encode({"a": big}))["a"]
    assert got.dtype.str == "<" + code
    assert got.tobytes() == little.tobytes()
    assert wire.pack_array(big) == wire.pack_array(little)


def test_numpy_scalars_become_python_values():
    got = wire.decode(wire.encode({"f": np.float32(1.5), "i": np.int64(-3), "b": np.bool_(True)}))
    assert_same(got, {"f": 1.5, "i": -3, "b": True})


@pytest.mark.parametrize(
    "arr",
    [
        np.array([1, "x", None], dtype=object),
        np.zeros(3, np.complex64),
        np.zeros(3, np.complex128),
        np.array(["ab", "c"]),
        np.array([b"ab"]),
        np.zeros(3, np.uint64),
        np.zeros(2, "datetime64[s]"),
        np.zeros(2, [("a", "<i4"), ("b", "<f4")]),
        np.zeros((1,) * 9, np.float32),
    ],
    ids=["object", "complex64", "complex128", "unicode", "bytes", "uint64", "datetime", "struct", "9d"],
)
def test_disallowed_arrays_are_refused_on_encode(arr):
    with pytest.raises(TypeError):
        wire.encode({"a": arr})
    with pytest.raises(TypeError):
        wire.pack_array(arr)


def test_unknown_python_objects_are_refused_on_encode():
    with pytest.raises(TypeError):
        wire.encode({"a": {1, 2}})
    with pytest.raises(TypeError):
        wire.encode({"a": np.complex64(1j)})


# ---- packed arrays (PROTOCOL.md 3.5) ------------------------------------------------------------------
def _all_kinds_of_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every allowed dtype in every test shape (0-d, empty, up to 8 dimensions)."""
    return {
        f"{dtype}{list(shape)}": random_array(rng, dtype, shape)
        for dtype in sorted(wire.ALLOWED_DTYPES)
        for shape in SHAPES
    }


@pytest.mark.parametrize("long", [False, True], ids=["short", "long (decoded without a copy)"])
def test_packed_arrays_round_trip(long):
    rng = np.random.default_rng(20)
    arrays = _all_kinds_of_arrays(rng)
    if long:  # a bin of 64 KiB or more: `encode` writes it first, `decode` takes it as a view
        arrays = {"filler": np.arange(20_000, dtype="<i4"), **arrays}
    table, data = wire.pack_arrays(arrays)
    encoded = wire.encode({"v": 3, "kind": "X", "packed": {"arrays": table, "data": data}})
    got = wire.decode(encoded)["packed"]
    assert isinstance(got["data"], memoryview if long else bytes)
    assert got["arrays"] == table
    out = wire.unpack_arrays(got["arrays"], got["data"])
    assert list(out) == list(arrays)
    end = 0
    for (name, want), (_, dtype, shape, offset) in zip(arrays.items(), table, strict=True):
        assert offset == -(-end // 8) * 8  # each array at the next multiple of 8 (PROTOCOL.md 3.5)
        assert (dtype, shape) == (want.dtype.str, list(want.shape))
        end = offset + want.nbytes
        assert_same(out[name], want, name)
        assert_readonly_view(out[name])
        if long and out[name].size:  # a view of the received message itself: nothing was copied
            assert np.shares_memory(out[name], np.frombuffer(encoded, np.uint8))
    assert end == len(got["data"])


def test_pack_arrays_concatenates_parts_and_normalizes_them():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    parts = [base[::2, 1::2], np.asfortranarray(base[:1, :3]), base[:2, :3].astype(">f4"), base[:0, :3]]
    table, data = wire.pack_arrays({"rows": parts, "scalar": np.int16(-3), "big": np.arange(3, dtype=">i8")})
    got = wire.unpack_arrays(table, data)
    np.testing.assert_array_equal(got["rows"], np.concatenate([np.asarray(p, "<f4") for p in parts]))
    assert got["rows"].dtype.str == "<f4" and got["rows"].shape == (5, 3)
    assert got["scalar"].shape == () and got["scalar"] == -3
    assert got["big"].dtype.str == "<i8" and got["big"].tolist() == [0, 1, 2]
    assert bytes(data[got["rows"].nbytes : table[1][3]]) == b"\0" * (table[1][3] - got["rows"].nbytes)


@pytest.mark.parametrize(
    ("arrays", "error"),
    [
        ({"a": [np.zeros(2, "<i4"), np.zeros(2, "<i8")]}, TypeError),  # parts of two dtypes
        ({"a": [np.zeros((2, 3), "<i4"), np.zeros((2, 4), "<i4")]}, TypeError),  # rows of two widths
        ({"a": [np.zeros(2, "<i4"), np.int32(1)]}, TypeError),  # a 0-d part
        ({"a": []}, ValueError),
        ({"a": np.zeros(2, np.complex64)}, TypeError),
        ({"a": np.zeros(2, np.uint64)}, TypeError),
        ({"a": np.zeros((1,) * 9, np.float32)}, TypeError),
        ({f"a{i}": np.zeros(0, np.uint8) for i in range(wire.MAX_PACKED_ARRAYS + 1)}, TypeError),
    ],
    ids=["dtypes", "widths", "0-d part", "no parts", "complex", "uint64", "9 dims", "257 arrays"],
)
def test_pack_arrays_refuses_what_the_wire_cannot_carry(arrays, error):
    with pytest.raises(error):
        wire.pack_arrays(arrays)


def test_packed_layout_of_the_protocol_document():
    """PROTOCOL.md 3.5, the example, in both orders, byte for byte."""
    a = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    b = np.array([True, False, True])
    table, data = wire.pack_arrays({"a": a, "b": b})
    assert table == [["a", "<i4", [2, 3], 0], ["b", "|b1", [3], 24]]
    assert bytes(data) == a.tobytes() + b"\x01\x00\x01" and len(data) == 27
    table, data = wire.pack_arrays({"b": b, "a": a})
    assert table == [["b", "|b1", [3], 0], ["a", "<i4", [2, 3], 8]]
    assert bytes(data) == b"\x01\x00\x01" + b"\0" * 5 + a.tobytes() and len(data) == 32


GOOD_TABLE, GOOD_DATA = wire.pack_arrays(
    {"a": np.arange(6, dtype="<i4").reshape(2, 3), "b": np.array([1, 0, 1], bool), "c": np.ones(2, "<f8")}
)
"""a at 0 (24 bytes), b at 24 (3 bytes), c at 32 (16 bytes): 48 bytes."""


def _table(**changes) -> list:
    """GOOD_TABLE with entry values replaced: changes like a_offset=8 or c_shape=[3]."""
    fields = {"name": 0, "dtype": 1, "shape": 2, "offset": 3}
    table = [list(entry) for entry in GOOD_TABLE]
    for key, value in changes.items():
        array, field = key.split("_", 1)
        table["abc".index(array)][fields[field]] = value
    return table


MALFORMED_TABLES = {
    "data one byte short": (GOOD_TABLE, bytes(GOOD_DATA)[:-1]),
    "data one byte long": (GOOD_TABLE, bytes(GOOD_DATA) + b"\0"),
    "data empty": (GOOD_TABLE, b""),
    "data padded to 56": (GOOD_TABLE, bytes(GOOD_DATA) + b"\0" * 8),
    "offset out of range": (_table(c_offset=4096), GOOD_DATA),
    "offset negative": (_table(a_offset=-8), GOOD_DATA),
    "first array not at 0": (_table(a_offset=8), GOOD_DATA),
    "overlapping arrays": (_table(b_offset=16), GOOD_DATA),
    "a gap between arrays": (_table(b_offset=32), GOOD_DATA),
    "unaligned offset": (_table(c_offset=27), GOOD_DATA),
    "offsets out of order": (_table(b_offset=32, c_offset=24), GOOD_DATA),
    "offset a float": (_table(b_offset=24.0), GOOD_DATA),
    "offset a bool": (_table(a_offset=False), GOOD_DATA),
    "more bytes than the next offset": (_table(a_shape=[2, 4]), GOOD_DATA),
    "fewer bytes than the next offset": (_table(a_shape=[2, 2]), GOOD_DATA),
    "last array short of the data": (_table(c_shape=[1]), GOOD_DATA),
    "last array past the data": (_table(c_shape=[3]), GOOD_DATA),
    "huge dims": (_table(c_shape=[2**63, 2**63]), GOOD_DATA),
    "huge dim, zero elements": (_table(c_shape=[0, 2**64 - 1]), bytes(GOOD_DATA)[:32]),
    "negative dim": (_table(b_shape=[-3]), GOOD_DATA),
    "bool dim": (_table(b_shape=[True, 3]), GOOD_DATA),
    "float dim": (_table(b_shape=[3.0]), GOOD_DATA),
    "9 dims": (_table(b_shape=[1] * 8 + [3]), GOOD_DATA),
    "shape an int": (_table(b_shape=3), GOOD_DATA),
    "shape a map": (_table(b_shape={"0": 3}), GOOD_DATA),
    "dtype complex": (_table(c_dtype="<c8"), GOOD_DATA),
    "dtype big-endian": (_table(a_dtype=">i4"), GOOD_DATA),
    "dtype f8 (must be <f8)": (_table(c_dtype="f8"), GOOD_DATA),
    "dtype <b1 (must be |b1)": (_table(b_dtype="<b1"), GOOD_DATA),
    "dtype uint64": (_table(c_dtype="<u8"), GOOD_DATA),
    "dtype object": (_table(c_dtype="|O"), GOOD_DATA),
    "dtype an int": (_table(a_dtype=4), GOOD_DATA),
    "dtype bin": (_table(a_dtype=b"<i4"), GOOD_DATA),
    "dtype a list": (_table(a_dtype=["<i4"]), GOOD_DATA),
    "name an int": (_table(b_name=7), GOOD_DATA),
    "name bin": (_table(b_name=b"b"), GOOD_DATA),
    "name twice": (_table(c_name="a"), GOOD_DATA),
    "entry of 3 values": ([*_table()[:2], _table()[2][:3]], GOOD_DATA),
    "entry of 5 values": ([*_table()[:2], [*_table()[2], 0]], GOOD_DATA),
    "entry a map": ([*_table()[:2], {"name": "c"}], GOOD_DATA),
    "entry a str": ([*_table()[:2], "cdef"], GOOD_DATA),
    "entry nil": ([*_table()[:2], None], GOOD_DATA),
    "257 entries": ([[f"e{i}", "|u1", [0], 0] for i in range(wire.MAX_PACKED_ARRAYS + 1)], b""),
}


@pytest.mark.parametrize("name", list(MALFORMED_TABLES))
def test_malformed_packed_arrays_raise_wire_error_and_bad_encoding(name):
    table, data = MALFORMED_TABLES[name]
    table, data = wire.decode(wire.encode({"arrays": table, "data": bytes(data)})).values()  # off the wire
    with pytest.raises(wire.WireError):
        wire.unpack_arrays(table, data)
    with pytest.raises(ProtocolError) as e:
        protocol.unpack_episodes({"task": ["t"], "arrays": table, "data": data})
    assert e.value.code == "bad_encoding", e.value
    with pytest.raises(ProtocolError) as e:  # what the learner does with such a TRAJ
        validate(
            via_wire(protocol.message(protocol.TRAJ, episodes={"task": ["t"], "arrays": table, "data": data}))
        )
    assert e.value.code == "bad_encoding", e.value


def test_the_malformed_tables_are_near_misses_of_a_valid_one():
    got = wire.unpack_arrays(GOOD_TABLE, bytes(GOOD_DATA))
    assert [(k, v.shape) for k, v in got.items()] == [("a", (2, 3)), ("b", (3,)), ("c", (2,))]
    assert wire.unpack_arrays([], b"") == {}
    zero = wire.unpack_arrays(
        [["z", "<f4", [0, 5], 0], ["s", "<i2", [], 0]], b"\x07\x00"
    )  # 0-d after an empty one
    assert zero["z"].shape == (0, 5) and zero["s"].shape == () and zero["s"] == 7


@pytest.mark.parametrize(
    ("table", "data"),
    [(GOOD_TABLE, "x" * len(GOOD_DATA)), (GOOD_TABLE, list(GOOD_DATA)), ({"a": GOOD_TABLE[0]}, GOOD_DATA)],
    ids=["data a str", "data a list", "table a map"],
)
def test_a_table_that_is_not_an_array_or_data_that_is_not_bin_is_refused(table, data):
    with pytest.raises(wire.WireError):
        wire.unpack_arrays(table, data)
    with pytest.raises(ProtocolError) as e:  # a field of the wrong type (PROTOCOL.md 7)
        protocol.unpack_episodes({"task": ["t"], "arrays": table, "data": data})
    assert e.value.code == "bad_field"


table_values = st.one_of(
    st.text(max_size=6),
    st.sampled_from([*sorted(wire.ALLOWED_DTYPES), "<c8", ">i4", "f4"]),
    st.integers(-(2**63), 2**64 - 1),
    st.lists(st.integers(-2, 2**64 - 1), max_size=10),
    st.lists(st.integers(0, 9), max_size=4),
    st.none(),
    st.booleans(),
    st.floats(),
    st.binary(max_size=4),
)
table_entries = st.one_of(
    st.tuples(
        st.text(max_size=3),
        st.sampled_from(sorted(wire.ALLOWED_DTYPES)),
        st.lists(st.integers(0, 4), max_size=3),
        st.integers(0, 80),
    ).map(list),
    st.lists(table_values, max_size=5),
    table_values,
)


@FUZZ
@given(st.lists(table_entries, max_size=6), st.binary(max_size=96))
def test_random_packed_tables_raise_only_wire_error(table, data):
    try:
        arrays = wire.unpack_arrays(table, data)
    except wire.WireError:
        return
    end = 0  # a table that happens to be valid: consistent views of `data`, laid out as 3.5 says
    for (_, dtype, shape, offset), arr in zip(table, arrays.values(), strict=True):
        assert arr.dtype.str == dtype and list(arr.shape) == shape and offset == -(-end // 8) * 8
        assert arr.tobytes() == data[offset : offset + arr.nbytes]
        end = offset + arr.nbytes
    assert end == len(data)


def test_long_bins_go_first_and_come_back_without_a_copy():
    rng = np.random.default_rng(21)
    eps = [make_episode(rng, MAX_STEPS) for _ in range(40)]
    msg = traj(*eps)
    assert msg["episodes"]["data"].nbytes >= wire.BY_REFERENCE_BYTES
    encoded = wire.encode(msg)
    # episodes first in the message, data first in episodes: a map of 5, "episodes", a map of 3, "data", bin 32
    assert encoded.startswith(b"\x85\xa8episodes\x83\xa4data\xc6")
    assert_same(msgpack.unpackb(encoded), msg)  # plain msgpack: the same message
    got = wire.decode(encoded)
    assert isinstance(got["episodes"]["data"], memoryview) and got["episodes"]["data"].readonly
    assert_same(got, msg)
    frame = np.frombuffer(encoded, np.uint8)
    for ep in validate(protocol.check_envelope(got)):
        assert all(np.shares_memory(a, frame) for a in (*ep.obs.values(), *ep.steps.values()))
    short = traj(*eps[:1])  # under 64 KiB: msgpack's own bytes, in the map's order
    assert wire.encode(short) == msgpack.packb(short, use_bin_type=True)


def _leading_bin_frame(*after: tuple[str, bytes]) -> bytes:
    """A map whose first entry is a long bin `data`, followed by raw msgpack entries `after`."""
    long = bytes(range(256)) * 300
    head = bytes([0x81 + len(after)]) + msgpack.packb("data") + b"\xc6" + struct.pack(">I", len(long))
    return head + long + b"".join(msgpack.packb(k) + v for k, v in after)


def test_decoding_a_leading_bin_without_a_copy_is_still_plain_msgpack():
    frame = _leading_bin_frame(("n", msgpack.packb(1)))
    got = wire.decode(frame)
    assert bytes(got["data"]) == msgpack.unpackb(frame)["data"] and got["n"] == 1
    assert isinstance(got["data"], memoryview) and got["data"].obj is frame
    assert isinstance(wire.decode(bytearray(frame))["data"], bytes)  # mutable input: copied
    duplicate = _leading_bin_frame(("data", msgpack.packb(b"short")))  # a later duplicate key wins, as ever
    assert wire.decode(duplicate) == msgpack.unpackb(duplicate) == {"data": b"short"}
    refused = {
        "timestamp after it": _leading_bin_frame(("t", msgpack.packb(msgpack.Timestamp(1, 0)))),
        "ext 127 after it": _leading_bin_frame(("e", msgpack.packb(msgpack.ExtType(127, bytes(16))))),
        "cut inside it": _leading_bin_frame()[:-1],
        "trailing bytes": _leading_bin_frame() + b"\x01",
    }
    for name, data in refused.items():
        with pytest.raises(wire.WireError):
            wire.decode(data)
        with pytest.raises(ProtocolError) as e:
            protocol.parse(data)
        assert e.value.code == "bad_encoding", name


LONG_TRAJ = wire.encode(traj(*[make_episode(np.random.default_rng(30), MAX_STEPS) for _ in range(40)]))


def _decoded_or_none(data) -> object:
    try:
        return wire.decode(data)
    except wire.WireError:
        return None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 47), st.integers(0, 255)), min_size=1, max_size=3), st.booleans())
def test_mutated_long_messages_decode_as_when_copied(flips, at_end):
    """Bytes flipped where the leading bin is found (the maps and keys before it, its header, its first
    bytes) or in the msgpack after it: decoding without a copy gives what decoding with one (a bytearray
    input) gives, or the same WireError."""
    data = bytearray(LONG_TRAJ)
    for pos, value in flips:
        data[len(data) - 1 - pos if at_end else pos] = value
    fast, slow = _decoded_or_none(bytes(data)), _decoded_or_none(data)
    if slow is None:
        assert fast is None
    else:
        assert_same(fast, slow)


# ---- packed episodes (PROTOCOL.md 6) ------------------------------------------------------------------
def test_packed_episodes_layout():
    rng = np.random.default_rng(22)
    eps = [make_episode(rng, 2), make_episode(rng, 1, truncated=True)]
    packed = protocol.pack_episodes(eps)
    assert set(packed) == {"task", "arrays", "data"} and packed["task"] == ["toggle", "toggle"]
    arrays = wire.unpack_arrays(packed["arrays"], packed["data"])
    assert arrays["length"].tolist() == [2, 1] and arrays["length"].dtype.str == "<i4"
    assert arrays["success"].tolist() == [True, False] and arrays["truncated"].tolist() == [False, True]
    for name, dtype in protocol.STEP_ARRAYS.items():  # episode 0's steps, then episode 1's
        assert_same(arrays[name], np.concatenate([eps[0][name], eps[1][name]]).astype(dtype), name)
    for key in SPEC:
        assert_same(arrays["obs/" + key], np.concatenate([eps[0]["obs"][key], eps[1]["obs"][key]]), key)
    assert not set(protocol.ESTIMATE_ARRAYS) & set(arrays)


def test_estimates_travel_only_with_every_episode():
    rng = np.random.default_rng(23)
    eps = [make_episode(rng, n) for n in (3, 1, 2)]
    with_estimates = [
        {
            **ep,
            "value": np.full(len(ep["reward"]), 0.5, np.float32),
            "entropy": np.ones(len(ep["reward"]), np.float32),
        }
        for ep in eps
    ]
    got = validate(via_wire(traj(*with_estimates)))
    for ep, want in zip(got, with_estimates, strict=True):
        assert_same(ep.estimates["value"], want["value"])
        assert_same(ep.estimates["entropy"], want["entropy"])
        assert_readonly_view(ep.estimates["value"])
    mixed = validate(via_wire(traj(with_estimates[0], eps[1])))  # one without: the batch carries none
    assert [ep.estimates for ep in mixed] == [{}, {}]


@pytest.mark.parametrize("count", [1, 2, protocol.MAX_EPISODES_PER_BATCH])
def test_multi_episode_round_trip_keeps_order_and_lengths(count):
    rng = np.random.default_rng(count)
    eps = [
        make_episode(rng, int(rng.integers(1, MAX_STEPS + 1)), truncated=bool(i % 3)) for i in range(count)
    ]
    eps = [{**ep, "task": f"task-{i}"} for i, ep in enumerate(eps)]
    got = validate(via_wire(traj(*eps)))
    assert [(ep.task, ep.length, ep.truncated, ep.success) for ep in got] == [
        (want["task"], len(want["reward"]), want["truncated"], want["success"]) for want in eps
    ]
    for ep, want in zip(got, eps, strict=True):
        assert type(ep.success) is bool and type(ep.truncated) is bool
        for key in SPEC:
            assert_same(ep.obs[key], want["obs"][key], key)
        for name in protocol.STEP_ARRAYS:
            assert_same(ep.steps[name], want[name], name)


# ---- episode specs: validation that knows no policy family ---------------------------------------------
TOY = protocol.EpisodeSpec(
    observations={"tokens": ((3,), "<i4"), "mask": ((3,), "|b1"), "score": ((2,), "<f4")},
    choices={"token": ("<i4", 5), "stop": ("|u1", 2)},
    id_ranges={"tokens": (-1, 10)},
)
"""A family that is not the pointer's: its own observations, two choices of their own dtypes, one id range."""


def toy_episode(rng: np.random.Generator, length: int) -> dict:
    obs = {
        "tokens": rng.integers(-1, 10, (length + 1, 3)).astype(np.int32),
        "mask": rng.random((length + 1, 3)) < 0.5,
        "score": rng.random((length + 1, 2)).astype(np.float32),
    }
    steps = {
        "token": rng.integers(0, 5, length),
        "stop": rng.integers(0, 2, length),
        "behavior_logp": -rng.random(length),
        "reward": rng.random(length),
        "policy_version": np.zeros(length),
    }
    return protocol.episode_fields("toy", True, False, obs, steps, spec=TOY)


def test_the_pointer_spec_is_todays_wire_format():
    """The pointer family's spec names today's per-step arrays in their wire order and dtypes, and an episode
    packs to the same bytes whether its choices come from its own keys or from the spec."""
    assert EPISODE_SPEC.step_arrays() == protocol.STEP_ARRAYS
    assert list(EPISODE_SPEC.step_arrays()) == list(protocol.STEP_ARRAYS)
    assert EPISODE_SPEC.observations == SPEC
    ep = make_episode(np.random.default_rng(40), 3)
    steps = {name: ep[name] for name in reversed(protocol.STEP_ARRAYS)}  # any order in, the spec's out
    with_spec = protocol.episode_fields("toggle", True, False, ep["obs"], steps, spec=EPISODE_SPEC)
    assert wire.encode(traj(with_spec)) == wire.encode(traj(ep))


def test_the_pointer_spec_bounds_every_choice_and_id():
    e, li, vocab = CFG.max_elements, CFG.max_instruction_tokens, CFG.vocab_size
    assert {name: bound for name, (_, bound) in EPISODE_SPEC.choices.items()} == {
        "action_type": 7, "element": e, "word": li, "direction": 4,
    }  # fmt: skip
    assert EPISODE_SPEC.id_ranges == {"instr_tokens": (0, vocab), "elem_tokens": (0, vocab)}
    text = ModelConfig(**{**CFG.to_dict(), "text_encoder": "minilm"})
    spec = featurize.episode_spec(text, text_vocab_size=30)
    assert set(spec.observations) == set(featurize.feature_spec(text))
    assert spec.id_ranges == {
        "instr_tokens": (0, vocab), "elem_tokens": (0, vocab), "instr_wp": (0, 30), "elem_wp": (0, 30),
        "instr_wp_word": (-1, li),
    }  # fmt: skip
    with pytest.raises(ValueError, match="vocabulary size"):
        featurize.episode_spec(text, text_vocab_size=0)


def test_another_familys_episodes_validate_against_its_spec():
    rng = np.random.default_rng(41)
    eps = [toy_episode(rng, n) for n in (2, 1, 3)]
    got = protocol.validate_episodes(via_wire(traj(*eps)), TOY, MAX_STEPS, 0)
    assert [ep.length for ep in got] == [2, 1, 3]
    for ep, want in zip(got, eps, strict=True):
        assert list(ep.steps) == ["token", "stop", *protocol.BASE_STEP_ARRAYS]
        assert ep.steps["stop"].dtype.str == "|u1"
        for name in ep.steps:
            assert_same(ep.steps[name], want[name], name)
        for key in TOY.observations:
            assert_same(ep.obs[key], want["obs"][key], key)
    parsed = protocol.Traj.from_msg(via_wire(traj(*eps)))
    assert [ep.length for ep in parsed.validate(TOY, MAX_STEPS, 0)] == [2, 1, 3]
    with pytest.raises(ProtocolError, match="TRAJ episodes need array 'action_type'") as e:
        validate(via_wire(traj(*eps)))  # a pointer learner refuses them
    assert e.value.code == "bad_field"


@pytest.mark.parametrize(
    ("where", "value", "code", "says"),
    [
        (("token", 1), 5, "bad_array", "token outside [0, 5)"),
        (("stop", 0), 2, "bad_array", "stop outside [0, 2)"),
        (("obs", "tokens", (2, 1)), 10, "bad_array", "tokens has ids outside [-1, 10)"),
        (("obs", "tokens", (0, 0)), -2, "bad_array", "tokens has ids outside [-1, 10)"),
        (("obs", "score", (1, 1)), np.nan, "non_finite", "obs score has NaN or infinity"),
        (("policy_version", 0), 1, "future_version", "policy_version is newer than 0"),
    ],
)
def test_another_familys_spec_bounds_its_choices_and_ids(where, value, code, says):
    ep = toy_episode(np.random.default_rng(42), 2)
    if where[0] == "obs":
        ep["obs"][where[1]][where[2]] = value
    else:
        ep[where[0]][where[1]] = value
    good = toy_episode(np.random.default_rng(43), 1)
    with pytest.raises(ProtocolError, match=re.escape(f"episode 1 {says}")) as e:  # the broken one
        protocol.validate_episodes(via_wire(traj(good, ep)), TOY, 4, 0)
    assert e.value.code == code


@pytest.mark.parametrize(
    "kwargs",
    [
        {"choices": {"reward": ("<i4", 3)}},
        {"choices": {"token": ("<f4", 3)}},
        {"choices": {"token": ("<i4", 0)}},
        {"id_ranges": {"score": (0, 3)}},
        {"id_ranges": {"missing": (0, 3)}},
        {"id_ranges": {"tokens": (3, 3)}},
    ],
    ids=["base name", "float choice", "no options", "float range", "no such array", "empty range"],
)
def test_a_spec_that_could_not_check_anything_is_refused(kwargs):
    with pytest.raises(ValueError):
        protocol.EpisodeSpec(**{"observations": TOY.observations, "choices": TOY.choices, **kwargs})


def test_packing_takes_the_step_arrays_every_episode_has():
    rng = np.random.default_rng(44)
    a, b = toy_episode(rng, 1), toy_episode(rng, 2)
    del b["stop"]
    with pytest.raises(ValueError, match=re.escape("episode 1 lacks the per-step arrays ['stop']")):
        protocol.pack_episodes([a, b])


# ---- malformed input ----------------------------------------------------------------------------------
GOOD_PAYLOAD = wire.pack_array(np.arange(6, dtype="<i4").reshape(2, 3))
HEADER_LEN = 1 + 3 + 1 + 16


def ext(payload: bytes, code: int = wire.ARRAY_EXT_CODE) -> bytes:
    return msgpack.packb({"a": msgpack.ExtType(code, payload)})


def header(dtype: bytes, dims: tuple[int, ...]) -> bytes:
    return bytes([len(dtype)]) + dtype + bytes([len(dims)]) + struct.pack(f"<{len(dims)}Q", *dims)


MALFORMED = {
    **{f"truncated header at {k}": ext(GOOD_PAYLOAD[:k]) for k in range(HEADER_LEN)},
    "one data byte short": ext(GOOD_PAYLOAD[:-1]),
    "one data byte extra": ext(GOOD_PAYLOAD + b"\0"),
    "no data": ext(GOOD_PAYLOAD[:HEADER_LEN]),
    "ext code 0": ext(GOOD_PAYLOAD, 0),
    "ext code 2": ext(GOOD_PAYLOAD, 2),
    "ext code 127": ext(GOOD_PAYLOAD, 127),
    "ext code -5": b"\x81\xa1a\xc7" + bytes([len(GOOD_PAYLOAD)]) + struct.pack("b", -5) + GOOD_PAYLOAD,
    "bad timestamp ext -1": b"\x81\xa1a\xd4\xff\x01",
    "dtype complex": ext(header(b"<c8", (1,)) + b"\0" * 8),
    "dtype object": ext(header(b"|O", (1,)) + b"\0" * 8),
    "dtype unicode": ext(header(b"<U1", (1,)) + b"\0" * 4),
    "dtype big-endian": ext(header(b">i4", (1,)) + b"\0" * 4),
    "dtype uint64": ext(header(b"<u8", (1,)) + b"\0" * 8),
    "dtype <i1 (must be |i1)": ext(header(b"<i1", (1,)) + b"\0"),
    "dtype =f4": ext(header(b"=f4", (1,)) + b"\0" * 4),
    "dtype f4": ext(header(b"f4", (1,)) + b"\0" * 4),
    "dtype garbage": ext(header(b"xyz", (1,)) + b"\0" * 4),
    "dtype empty": ext(header(b"", (1,)) + b"\0" * 4),
    "dtype not ascii": ext(header(b"\xff\xfe\xfd", (1,)) + b"\0" * 4),
    "dtype length past end": ext(bytes([200]) + b"<i4"),
    "9 dims": ext(header(b"<i4", (1,) * 9) + b"\0" * 4),
    "255 dims": ext(header(b"<i4", (1,) * 255) + b"\0" * 4),
    "huge dims": ext(header(b"<i4", (2**63, 2**63))),
    "huge dim, zero elements": ext(header(b"<i4", (0, 2**64 - 1))),
    "empty input": b"",
    "reserved byte": b"\xc1",
    "truncated map": msgpack.packb({"a": 1, "b": [1, 2, 3]})[:-2],
    "trailing data": msgpack.packb({"a": 1}) + b"\x01",
    "int map key": msgpack.packb({1: 2}),
    "map key array": b"\x81" + ext(GOOD_PAYLOAD)[3:] + b"\x01",
    "deep nesting": b"\x91" * 5000 + b"\x01",
    "claims 4G elements": b"\xdd\xff\xff\xff\xff",
    "claims 4G map": b"\xdf\xff\xff\xff\xff",
    "string over 1 MiB": msgpack.packb({"s": "x" * ((1 << 20) + 1)}),
    "array over 2**20 elements": msgpack.packb({"a": [0] * ((1 << 20) + 1)}),
    "str not utf-8": b"\x81\xa1a\xa2\xff\xfe",
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_payloads_raise_wire_error(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)
    with pytest.raises(ProtocolError) as e:
        protocol.parse(data)
    assert e.value.code == "bad_encoding"


def test_good_payload_decodes():
    """The malformed cases above are near misses of this valid one."""
    np.testing.assert_array_equal(wire.decode(ext(GOOD_PAYLOAD))["a"], np.arange(6).reshape(2, 3))


def test_limits_are_inclusive():
    got = wire.decode(msgpack.packb({"s": "x" * (1 << 20), "a": [0] * (1 << 20)}))
    assert len(got["s"]) == 1 << 20 and len(got["a"]) == 1 << 20


def test_timestamp_ext_is_refused():
    with pytest.raises(wire.WireError):
        wire.decode(msgpack.packb({"v": 3, "kind": "HEARTBEAT", "t": msgpack.Timestamp(1, 0)}))


def test_size_limit():
    data = wire.encode({"a": np.zeros(100, np.uint8)})
    assert wire.decode(data, max_bytes=len(data))["a"].shape == (100,)
    with pytest.raises(wire.WireError):
        wire.decode(data, max_bytes=len(data) - 1)
    with pytest.raises(wire.WireError):  # the default limit, checked before any parsing
        wire.decode(b"\x80" + b"\0" * wire.MAX_MESSAGE_BYTES)
    with pytest.raises(ProtocolError) as e:
        protocol.parse(b"\x80" + b"\0" * wire.MAX_MESSAGE_BYTES)
    assert e.value.code == "bad_encoding"


def _decode_or_wire_error(data: bytes):
    try:
        return wire.decode(data)
    except wire.WireError:
        return None


VALID_MESSAGE = wire.encode(
    {"v": 3, "kind": "TRAJ", "x": [np.arange(4, dtype=np.float32), np.ones((2, 2), bool)], "s": "hi"}
)


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes_raise_only_wire_error(data):
    _decode_or_wire_error(data)


@FUZZ
@given(st.binary(max_size=64))
def test_random_array_payloads_raise_only_wire_error(payload):
    out = _decode_or_wire_error(ext(payload))
    if out is not None:  # a payload that happens to be valid is a consistent array
        arr = out["a"]
        assert arr.dtype.str in wire.ALLOWED_DTYPES and arr.nbytes <= len(payload)


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, len(VALID_MESSAGE) - 1), st.integers(0, 255)), max_size=4),
    st.integers(0, len(VALID_MESSAGE)),
)
def test_mutated_messages_raise_only_wire_error(flips, cut):
    data = bytearray(VALID_MESSAGE)
    for pos, value in flips:
        data[pos] = value
    out = _decode_or_wire_error(bytes(data[:cut]))
    if cut < len(VALID_MESSAGE):  # msgpack cannot end early in this message: a cut is always refused
        assert out is None


# ---- envelope -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("obj", "code"),
    [
        ([1, 2], "bad_envelope"),
        (5, "bad_envelope"),
        ("HELLO", "bad_envelope"),
        (None, "bad_envelope"),
        ({"kind": "HELLO"}, "bad_version"),
        ({"v": 1, "kind": "HELLO"}, "bad_version"),
        ({"v": 0, "kind": "HELLO"}, "bad_version"),
        ({"v": 2, "kind": "HELLO"}, "bad_version"),  # a version 2 peer
        ({"v": 3, "kind": "HELLO"}, "bad_version"),  # a version 3 peer
        ({"v": "4", "kind": "HELLO"}, "bad_version"),
        ({"v": 5, "kind": "HELLO"}, "bad_version"),
        ({"v": 4}, "unknown_kind"),
        ({"v": 4, "kind": "NOPE"}, "unknown_kind"),
        ({"v": 4, "kind": "hello"}, "unknown_kind"),
        ({"v": 4, "kind": 3}, "unknown_kind"),
        ({"v": 4, "kind": None}, "unknown_kind"),
    ],
)
def test_parse_refuses_bad_envelopes(obj, code):
    with pytest.raises(ProtocolError) as e:
        protocol.parse(msgpack.packb(obj))
    assert e.value.code == code


@pytest.mark.parametrize("kind", sorted(protocol.KINDS))
def test_parse_accepts_every_kind(kind):
    assert protocol.parse(msgpack.packb({"v": 4, "kind": kind}))["kind"] == kind


@pytest.mark.parametrize("kind", [[1], {"a": 1}, b"HELLO", 1.5], ids=["list", "map", "bin", "float"])
def test_parse_kind_of_another_type_is_unknown(kind):
    """(At commit 48dd261 an unhashable kind raised TypeError out of parse, and out of IngestServer.poll.)"""
    with pytest.raises(ProtocolError) as e:
        protocol.parse(msgpack.packb({"v": 4, "kind": kind}))
    assert e.value.code == "unknown_kind"


@pytest.mark.parametrize(
    "v",
    [True, 1.0, [1], 4.0, [4], 1, 2, 3],
    ids=["bool", "float", "list", "4.0", "[4]", "1", "2 (older)", "3 (older)"],
)
def test_parse_version_must_be_the_integer_four(v):
    """PROTOCOL.md 3.1/3.2: v is the int 4 and true/false are never integers (48dd261 let True and 1.0 in)."""
    with pytest.raises(ProtocolError) as e:
        protocol.parse(msgpack.packb({"v": v, "kind": "HELLO"}))
    assert e.value.code == "bad_version"


# ---- episode validation -------------------------------------------------------------------------------
def test_validate_accepts_boundary_values():
    rng = np.random.default_rng(4)
    ep = make_episode(rng, MAX_STEPS)
    ep["action_type"][:2] = [0, 6]
    ep["element"][:2] = [0, CFG.max_elements - 1]
    ep["word"][:2] = [0, CFG.max_instruction_tokens - 1]
    ep["direction"][:2] = [0, 3]
    ep["policy_version"][:2] = [0, NEWEST]
    ep["behavior_logp"][:2] = [0.0, -80.0]
    ep["obs"]["instr_tokens"][0, :2] = [0, CFG.vocab_size - 1]
    (got,) = validate(via_wire(traj(ep)))
    assert got.length == MAX_STEPS
    many = validate(via_wire(traj(*[make_episode(rng, 1)] * protocol.MAX_EPISODES_PER_BATCH)))
    assert len(many) == protocol.MAX_EPISODES_PER_BATCH


def packed_columns(*episodes: dict) -> tuple[list, dict[str, np.ndarray]]:
    """The task names and the packed arrays of a TRAJ of these episodes, as writable copies to break."""
    packed = protocol.pack_episodes(list(episodes))
    arrays = wire.unpack_arrays(packed["arrays"], packed["data"])
    return list(packed["task"]), {name: arr.copy() for name, arr in arrays.items()}


def traj_of(task: list, arrays: dict[str, np.ndarray]) -> dict:
    """A TRAJ whose packed episodes are `task` and `arrays`, whatever they hold (packed as they are)."""
    table, data = wire.pack_arrays(arrays)
    return protocol.message(
        protocol.TRAJ, actor_id=3, seq=11, episodes={"task": task, "arrays": table, "data": data}
    )


def spans(lengths: list[int], i: int) -> tuple[slice, slice]:
    """Episode i's rows in the per-step arrays and in the observation arrays of a packed batch."""
    first = sum(lengths[:i])
    return slice(first, first + lengths[i]), slice(first + i, first + i + lengths[i] + 1)


BROKEN = make_episode(np.random.default_rng(5), 3)
"""The episode each case of BAD breaks (3 steps, 4 observation rows)."""


def _bad_batches() -> dict[str, tuple[object, str]]:
    """name -> (change, code): `change` is an episode to send in place of BROKEN, or an edit of the packed
    task names and arrays given the broken episode's rows (steps, observations)."""
    n = 3
    e, li, vocab = CFG.max_elements, CFG.max_instruction_tokens, CFG.vocab_size

    def retype(name, dtype):
        return lambda task, a, steps, rows: a.__setitem__(name, a[name].astype(dtype))

    def replace(name, fn):  # fn(the whole array) -> its replacement (None: removed)
        def edit(task, a, steps, rows):
            new = fn(a.pop(name))
            if new is not None:
                a[name] = new

        return edit

    def setval(name, index, value):  # one value in the broken episode's rows
        def edit(task, a, steps, rows):
            a[name][rows if name.startswith("obs/") else steps][index] = value

        return edit

    def set_length(value):  # the broken episode's `length` entry (its index: rows.start - steps.start)
        return lambda task, a, steps, rows: a["length"].__setitem__(rows.start - steps.start, value)

    return {
        "reward f8": (retype("reward", "<f8"), "bad_array"),
        "action_type i8": (retype("action_type", "<i8"), "bad_array"),
        "element u4": (retype("element", "<u4"), "bad_array"),
        "obs instr_tokens i8": (retype("obs/instr_tokens", "<i8"), "bad_array"),
        "obs elem_mask u1": (retype("obs/elem_mask", "|u1"), "bad_array"),
        "obs elem_feats f2": (retype("obs/elem_feats", "<f2"), "bad_array"),
        "success i8": (retype("success", "<i8"), "bad_array"),
        "truncated u1": (retype("truncated", "|u1"), "bad_array"),
        "length i8": (retype("length", "<i8"), "bad_array"),
        "reward 2-d": (replace("reward", lambda r: r[:, None]), "bad_array"),
        "reward 0-d": (replace("reward", lambda r: r[0]), "bad_array"),
        "word one step short": (replace("word", lambda w: w[:-1]), "bad_array"),
        "direction one step long": (replace("direction", lambda d: np.append(d, d[:1])), "bad_array"),
        "length one entry short": (replace("length", lambda x: x[:-1]), "bad_array"),
        "success one entry long": (replace("success", lambda x: np.append(x, x[:1])), "bad_array"),
        "obs one row short": (replace("obs/elem_feats", lambda f: f[:-1]), "bad_array"),
        "obs wrong width": (
            replace("obs/elem_tokens", lambda t: np.zeros((len(t), 4, 2), np.int32)),
            "bad_array",
        ),
        "length one step more than sent": (set_length(n + 1), "bad_array"),
        "length 0": (set_length(0), "bad_array"),
        "length -1": (set_length(-1), "bad_array"),
        "length over max_steps": (set_length(MAX_STEPS + 1), "bad_array"),
        "reward NaN": (setval("reward", 1, np.nan), "non_finite"),
        "reward inf": (setval("reward", 0, np.inf), "non_finite"),
        "behavior_logp -inf": (setval("behavior_logp", 2, -np.inf), "non_finite"),
        "behavior_logp NaN": (setval("behavior_logp", 2, np.nan), "non_finite"),
        "obs elem_feats NaN": (setval("obs/elem_feats", (1, 2, 3), np.nan), "non_finite"),
        "obs instr_feats inf": (setval("obs/instr_feats", (0, 0, 0), np.inf), "non_finite"),
        "policy_version future": (setval("policy_version", 0, NEWEST + 1), "future_version"),
        "policy_version negative": (setval("policy_version", 0, -1), "bad_array"),
        "action_type 7": (setval("action_type", 0, 7), "bad_array"),
        "action_type -1": (setval("action_type", 2, -1), "bad_array"),
        "element = max_elements": (setval("element", 1, e), "bad_array"),
        "element -1": (setval("element", 1, -1), "bad_array"),
        "word = max_instruction_tokens": (setval("word", 1, li), "bad_array"),
        "direction 4": (setval("direction", 1, 4), "bad_array"),
        "behavior_logp positive": (setval("behavior_logp", 0, 0.5), "bad_array"),
        "negative instr token": (setval("obs/instr_tokens", (0, 0), -1), "bad_array"),
        "negative elem token": (setval("obs/elem_tokens", (n, 1, 2), -5), "bad_array"),
        "instr token = vocab_size": (setval("obs/instr_tokens", (0, 1), vocab), "bad_array"),
        "elem token = vocab_size": (setval("obs/elem_tokens", (1, 0, 0), vocab), "bad_array"),
        "too many steps": (make_episode(np.random.default_rng(10), MAX_STEPS + 1), "bad_array"),
        "zero steps": (
            {
                **BROKEN,
                **{k: BROKEN[k][:0] for k in protocol.STEP_ARRAYS},
                "obs": {k: v[:1] for k, v in BROKEN["obs"].items()},
            },
            "bad_array",
        ),
        "task not str": (lambda task, a, steps, rows: task.__setitem__(-1, 5), "bad_field"),
        "task list one long": (
            lambda task, a, steps, rows: task.append("t"),
            "bad_array",
        ),  # [n] arrays disagree
        "missing success": (replace("success", lambda x: None), "bad_field"),
        "missing truncated": (replace("truncated", lambda x: None), "bad_field"),
        "missing length": (replace("length", lambda x: None), "bad_field"),
        "missing reward": (replace("reward", lambda x: None), "bad_field"),
        "obs missing key": (replace("obs/elem_feats", lambda x: None), "bad_field"),
        "obs key without its prefix": (
            lambda task, a, steps, rows: a.__setitem__("elem_feats", a.pop("obs/elem_feats")),
            "bad_field",
        ),
        "obs extra key": (
            lambda task, a, steps, rows: a.__setitem__(
                "obs/screenshot", np.zeros((len(a["obs/elem_mask"]), 2), np.uint8)
            ),
            "bad_field",
        ),
        "value without entropy": (
            lambda task, a, steps, rows: a.__setitem__("value", a["reward"].copy()),
            "bad_field",
        ),
        "estimates one step short": (
            lambda task, a, steps, rows: a.update(
                value=a["reward"][:-1].copy(), entropy=a["reward"][:-1] * 0
            ),
            "bad_array",
        ),
        "value NaN": (
            lambda task, a, steps, rows: a.update(
                value=np.where(np.arange(len(a["reward"])) == steps.start, np.float32(np.nan), a["reward"]),
                entropy=a["reward"] * 0,
            ),
            "non_finite",
        ),
        "entropy negative": (
            lambda task, a, steps, rows: a.update(
                value=a["reward"].copy(),
                entropy=np.where(
                    np.arange(len(a["reward"])) == steps.stop - 1, np.float32(-1), a["reward"] * 0
                ),
            ),
            "bad_array",
        ),
    }


BAD = _bad_batches()
NAMES_THE_EPISODE = {
    *(name for name, (_, code) in BAD.items() if code in ("non_finite", "future_version")),
    *("action_type 7", "action_type -1", "element = max_elements", "element -1", "direction 4"),
    *("word = max_instruction_tokens", "behavior_logp positive", "policy_version negative"),
    *("negative instr token", "negative elem token", "instr token = vocab_size", "elem token = vocab_size"),
    *("too many steps", "zero steps", "length 0", "length -1", "length over max_steps", "entropy negative"),
}
"""Range faults: their reason names the episode they are in."""


@pytest.mark.parametrize("name", list(BAD))
def test_validate_refuses(name):
    change, code = BAD[name]
    rng = np.random.default_rng(6)
    good = [make_episode(rng, 2), make_episode(rng, 4)]
    for position, others in ((0, []), (1, good[:1]), (1, good)):  # the fault is found in any position
        broken = change if isinstance(change, dict) else BROKEN
        episodes = [*others[:position], broken, *others[position:]]
        if isinstance(change, dict):
            msg = traj(*episodes)
        else:
            task, arrays = packed_columns(*episodes)
            change(task, arrays, *spans([len(ep["reward"]) for ep in episodes], position))
            msg = traj_of(task, arrays)
        with pytest.raises(ProtocolError) as e:
            validate(via_wire(msg))
        assert e.value.code == code, (position, e.value)
        if name in NAMES_THE_EPISODE:
            assert f"episode {position} " in e.value.reason, (position, e.value)


def test_the_unchanged_batches_of_test_validate_refuses_are_valid():
    """The near misses above break only what each case says."""
    rng = np.random.default_rng(6)
    good = [make_episode(rng, 2), make_episode(rng, 4)]
    for position, others in ((0, []), (1, good[:1]), (1, good)):
        episodes = [*others[:position], BROKEN, *others[position:]]
        assert len(validate(via_wire(traj_of(*packed_columns(*episodes))))) == len(episodes)


def test_unknown_arrays_outside_obs_are_ignored():
    task, arrays = packed_columns(make_episode(np.random.default_rng(11), 2))
    arrays["screenshot"] = np.zeros((2, 3), np.uint8)  # a field this side does not know (§3.1)
    (ep,) = validate(via_wire(traj_of(task, arrays)))
    assert set(ep.obs) == set(SPEC) and set(ep.steps) == set(protocol.STEP_ARRAYS)


def test_validate_cuts_the_task_name():
    ep = {**make_episode(np.random.default_rng(9), 2), "task": "t" * 1000}
    (got,) = validate(via_wire(traj(ep)))
    assert got.task == "t" * protocol.MAX_TEXT


def test_validate_refuses_zero_step_episode():
    ep = make_episode(np.random.default_rng(7), 1)
    empty = {**ep, **{k: ep[k][:0] for k in protocol.STEP_ARRAYS}}
    empty["obs"] = {k: v[:1] for k, v in ep["obs"].items()}
    with pytest.raises(ProtocolError) as e:
        validate(via_wire(traj(empty)))
    assert e.value.code == "bad_array"


def _malformed_episode_maps() -> dict[str, object]:
    rng = np.random.default_rng(8)
    good = protocol.pack_episodes([make_episode(rng, 1)])
    return {
        "missing": None,
        "str": "x",
        "empty list": [],
        "list of ints": [1],
        "a version 2 list of episode maps": [make_episode(rng, 1)],
        "empty map": {},
        "task not a list": {**good, "task": "toggle"},
        "no task": {**good, "task": []},
        "too many tasks": {**good, "task": ["t"] * (protocol.MAX_EPISODES_PER_BATCH + 1)},
        "task of another type": {**good, "task": [b"toggle"]},
        "task missing": {k: v for k, v in good.items() if k != "task"},
        "arrays missing": {k: v for k, v in good.items() if k != "arrays"},
        "arrays a map": {**good, "arrays": {"reward": good["arrays"][0]}},
        "data missing": {k: v for k, v in good.items() if k != "data"},
        "data a str": {**good, "data": "\0" * len(good["data"])},
        "data a list": {**good, "data": list(bytes(good["data"]))},
    }


MALFORMED_EPISODES = _malformed_episode_maps()


@pytest.mark.parametrize("name", list(MALFORMED_EPISODES))
def test_validate_refuses_malformed_episode_maps(name):
    msg = protocol.message(protocol.TRAJ, actor_id=1, seq=1)
    if MALFORMED_EPISODES[name] is not None:
        msg["episodes"] = MALFORMED_EPISODES[name]
    with pytest.raises(ProtocolError) as e:
        validate(via_wire(msg))
    assert e.value.code == "bad_field", e.value


def test_a_version_2_traj_is_refused_as_a_version():
    """An older actor's TRAJ (episodes a list of maps of array ext values, v 2) never reaches validation."""
    old = {
        "v": 2,
        "kind": "TRAJ",
        "actor_id": 3,
        "seq": 1,
        "episodes": [make_episode(np.random.default_rng(9), 2)],
    }
    with pytest.raises(ProtocolError) as e:
        protocol.parse(wire.encode(old))
    assert e.value.code == "bad_version"
    assert "speaks 4" in e.value.reason


def test_require_never_takes_bool_for_int():
    msg = {"kind": "ACK", "seq": True, "n": 3}
    assert protocol.require(msg, "n", int) == 3
    with pytest.raises(ProtocolError) as e:
        protocol.require(msg, "seq", int)
    assert e.value.code == "bad_field"
