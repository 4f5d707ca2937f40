"""The wire format (common.wire) and the protocol envelope and validators (common.protocol)."""

from __future__ import annotations

import struct
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import featurize, protocol, wire
from common.config import ModelConfig
from common.protocol import ProtocolError

CFG = ModelConfig(vocab_size=64, max_instruction_tokens=5, max_elements=4, max_element_tokens=3)
SPEC = featurize.feature_spec(CFG)
MAX_STEPS = 6
NEWEST = 7

SHAPES = [(), (0,), (3, 0, 2), (5,), (2, 3), (1, 2, 1, 2, 1, 2, 1, 2)]


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
    """A valid TRAJ episode (wire form) for CFG with `length` steps."""
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
    return protocol.message(protocol.TRAJ, actor_id=3, seq=11, episodes=list(episodes))


def via_wire(msg: dict) -> dict:
    return protocol.parse(wire.encode(msg))


def validate(msg: dict) -> list[protocol.Episode]:
    return protocol.validate_episodes(msg, SPEC, MAX_STEPS, NEWEST, vocab_size=CFG.vocab_size)


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
    assert got == {"v": 2, "kind": "ERROR", "code": "future_version", "reason": "too new"}
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
        "v": 2,
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
        "86 a176 02 a46b696e64 a548454c4c4f a56163746f72 a26131 a86e756d5f656e7673 10"
        " a8696e7374616e6365 a26931 ad66697273745f756e61636b6564 01"
    )
    assert len(hello) == 61
    fields = {"actor": "a1", "num_envs": 16, "instance": "i1", "first_unacked": 1}
    assert wire.encode(protocol.message(protocol.HELLO, **fields)) == hello
    assert protocol.parse(hello) == {"v": 2, "kind": "HELLO", **fields}
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
        wire.decode(msgpack.packb({"v": 2, "kind": "HEARTBEAT", "t": msgpack.Timestamp(1, 0)}))


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


FUZZ = settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
VALID_MESSAGE = wire.encode(
    {"v": 2, "kind": "TRAJ", "x": [np.arange(4, dtype=np.float32), np.ones((2, 2), bool)], "s": "hi"}
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
        ({"v": "2", "kind": "HELLO"}, "bad_version"),
        ({"v": 2}, "unknown_kind"),
        ({"v": 2, "kind": "NOPE"}, "unknown_kind"),
        ({"v": 2, "kind": "hello"}, "unknown_kind"),
        ({"v": 2, "kind": 3}, "unknown_kind"),
        ({"v": 2, "kind": None}, "unknown_kind"),
    ],
)
def test_parse_refuses_bad_envelopes(obj, code):
    with pytest.raises(ProtocolError) as e:
        protocol.parse(msgpack.packb(obj))
    assert e.value.code == code


@pytest.mark.parametrize("kind", sorted(protocol.KINDS))
def test_parse_accepts_every_kind(kind):
    assert protocol.parse(msgpack.packb({"v": 2, "kind": kind}))["kind"] == kind


@pytest.mark.parametrize("kind", [[1], {"a": 1}, b"HELLO", 1.5], ids=["list", "map", "bin", "float"])
def test_parse_kind_of_another_type_is_unknown(kind):
    """(At commit 48dd261 an unhashable kind raised TypeError out of parse, and out of IngestServer.poll.)"""
    with pytest.raises(ProtocolError) as e:
        protocol.parse(msgpack.packb({"v": 2, "kind": kind}))
    assert e.value.code == "unknown_kind"


@pytest.mark.parametrize("v", [True, 1.0, [1], 2.0, [2], 1], ids=["bool", "float", "list", "2.0", "[2]", "1"])
def test_parse_version_must_be_the_integer_two(v):
    """PROTOCOL.md 3.1/3.2: v is the int 2 and true/false are never integers (48dd261 let True and 1.0 in)."""
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


def _set(ep: dict, key: str, value) -> dict:
    """A copy of the episode with one (possibly obs/<name>) field replaced; None deletes it."""
    ep = {**ep, "obs": dict(ep["obs"])}
    container, name = (ep["obs"], key[4:]) if key.startswith("obs/") else (ep, key)
    if value is None:
        del container[name]
    else:
        container[name] = value
    return ep


def _bad_episodes() -> dict[str, tuple[dict, str | tuple[str, ...]]]:
    rng = np.random.default_rng(5)
    n = 3
    ep = make_episode(rng, n)

    def edit(key, fn):
        arr = (ep["obs"][key[4:]] if key.startswith("obs/") else ep[key]).copy()
        fn(arr)
        return _set(ep, key, arr)

    def setval(key, index, value):
        return edit(key, lambda a: a.__setitem__(index, value))

    return {
        "reward f8": (_set(ep, "reward", ep["reward"].astype("<f8")), "bad_array"),
        "action_type i8": (_set(ep, "action_type", ep["action_type"].astype("<i8")), "bad_array"),
        "element u4": (_set(ep, "element", ep["element"].astype("<u4")), "bad_array"),
        "obs instr_tokens i8": (
            _set(ep, "obs/instr_tokens", ep["obs"]["instr_tokens"].astype("<i8")),
            "bad_array",
        ),
        "obs elem_mask u1": (_set(ep, "obs/elem_mask", ep["obs"]["elem_mask"].astype("|u1")), "bad_array"),
        "obs elem_feats f2": (_set(ep, "obs/elem_feats", ep["obs"]["elem_feats"].astype("<f2")), "bad_array"),
        "reward 2-d": (_set(ep, "reward", ep["reward"][:, None]), "bad_array"),
        "reward 0-d": (_set(ep, "reward", ep["reward"][0]), "bad_field"),  # a scalar is not an array
        "word one step short": (_set(ep, "word", ep["word"][:-1]), "bad_array"),
        "direction one step long": (_set(ep, "direction", np.zeros(n + 1, np.int32)), "bad_array"),
        "obs one row short": (_set(ep, "obs/elem_feats", ep["obs"]["elem_feats"][:-1]), "bad_array"),
        "obs wrong width": (_set(ep, "obs/elem_tokens", np.zeros((n + 1, 4, 2), np.int32)), "bad_array"),
        "reward NaN": (setval("reward", 1, np.nan), "non_finite"),
        "reward inf": (setval("reward", 0, np.inf), "non_finite"),
        "behavior_logp -inf": (setval("behavior_logp", 2, -np.inf), "non_finite"),
        "behavior_logp NaN": (setval("behavior_logp", 2, np.nan), "non_finite"),
        "obs elem_feats NaN": (
            edit("obs/elem_feats", lambda a: a.__setitem__((1, 2, 3), np.nan)),
            "non_finite",
        ),
        "obs instr_feats inf": (
            edit("obs/instr_feats", lambda a: a.__setitem__((0, 0, 0), np.inf)),
            "non_finite",
        ),
        "policy_version future": (setval("policy_version", 0, NEWEST + 1), "future_version"),
        "policy_version negative": (setval("policy_version", 0, -1), "bad_array"),
        "action_type 7": (setval("action_type", 0, 7), "bad_array"),
        "action_type -1": (setval("action_type", 2, -1), "bad_array"),
        "element = max_elements": (setval("element", 1, CFG.max_elements), "bad_array"),
        "element -1": (setval("element", 1, -1), "bad_array"),
        "word = max_instruction_tokens": (setval("word", 1, CFG.max_instruction_tokens), "bad_array"),
        "direction 4": (setval("direction", 1, 4), "bad_array"),
        "behavior_logp positive": (setval("behavior_logp", 0, 0.5), "bad_array"),
        "negative instr token": (edit("obs/instr_tokens", lambda a: a.__setitem__((0, 0), -1)), "bad_array"),
        "negative elem token": (edit("obs/elem_tokens", lambda a: a.__setitem__((n, 1, 2), -5)), "bad_array"),
        "instr token = vocab_size": (
            edit("obs/instr_tokens", lambda a: a.__setitem__((0, 1), CFG.vocab_size)),
            "bad_array",
        ),
        "elem token = vocab_size": (
            edit("obs/elem_tokens", lambda a: a.__setitem__((1, 0, 0), CFG.vocab_size)),
            "bad_array",
        ),
        "too many steps": (make_episode(rng, MAX_STEPS + 1), "bad_array"),
        "missing task": (_set(ep, "task", None), "bad_field"),
        "task not str": (_set(ep, "task", 5), "bad_field"),
        "success int": (_set(ep, "success", 1), "bad_field"),
        "truncated missing": (_set(ep, "truncated", None), "bad_field"),
        "missing reward": (_set(ep, "reward", None), "bad_field"),
        "reward as list": (_set(ep, "reward", [0.0] * n), "bad_field"),
        "obs not a map": (_set(ep, "obs", [1]), "bad_field"),
        "obs missing key": (_set(ep, "obs/elem_feats", None), "bad_field"),
        "obs extra key": (_set(ep, "obs/screenshot", np.zeros((n + 1, 2), np.uint8)), "bad_field"),
    }


BAD = _bad_episodes()


@pytest.mark.parametrize("name", list(BAD))
def test_validate_refuses(name):
    ep, code = BAD[name]
    good = make_episode(np.random.default_rng(6), 2)
    for episodes in ([ep], [good, ep]):  # the fault is found in any position
        with pytest.raises(ProtocolError) as e:
            validate(via_wire(traj(*episodes)))
        assert e.value.code in ((code,) if isinstance(code, str) else code), e.value


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


@pytest.mark.parametrize(
    "episodes",
    [None, "x", [], [1], [make_episode(np.random.default_rng(8), 1)] * (protocol.MAX_EPISODES_PER_BATCH + 1)],
    ids=["missing", "str", "empty", "not a map", "too many"],
)
def test_validate_refuses_bad_episode_lists(episodes):
    msg = protocol.message(protocol.TRAJ, actor_id=1, seq=1)
    if episodes is not None:
        msg["episodes"] = episodes
    with pytest.raises(ProtocolError) as e:
        validate(via_wire(msg))
    assert e.value.code == "bad_field"


def test_require_never_takes_bool_for_int():
    msg = {"kind": "ACK", "seq": True, "n": 3}
    assert protocol.require(msg, "n", int) == 3
    with pytest.raises(ProtocolError) as e:
        protocol.require(msg, "seq", int)
    assert e.value.code == "bad_field"
