"""A fake Android device (the adbd side of adb) over TCP, so the REAL adb server can be tested offline.

`FakeAdbd(phone)` listens on a free port of 127.0.0.1, as a phone in `adb tcpip` mode (or an emulator's
adb port) does; `adb connect 127.0.0.1:PORT` attaches it to a real adb server, which then lists it as
`127.0.0.1:PORT`. What the device answers comes from the scripted phone of tests/fake_screens.py, the
same model tests/fake_adb.py (the fake adb *server*) serves, so a test scripts a phone once.

The transport protocol (AOSP adb's protocol.txt), written from its description:

- messages: a 24-byte little-endian header (command, arg0, arg1, data length, data checksum, magic =
  command ^ 0xffffffff) and the payload. The checksum is the byte sum of the payload; from version
  0x01000001 on nobody computes or checks it, so a `version=A_VERSION_MIN` device (Android < 9) checks
  every checksum the host sends and closes the connection on a wrong one; payloads are at most 4 KiB
  there, and 1 MiB (or less, as the host offers) otherwise.
- CNXN(version, maxdata, "host::features=...") from the host; the device answers CNXN with its banner
  `device::ro.product.name=...;ro.product.model=...;ro.product.device=...;features=shell_v2,cmd,stat_v2`,
  or, with `auth`, first AUTH(TOKEN, 0, 20 random bytes). The host signs the token with each of its keys
  (AUTH SIGNATURE, RSA PKCS#1 v1.5 over the token as a SHA-1 digest); a rejected signature gets a fresh
  token; out of keys, the host sends AUTH RSAPUBLICKEY (its adbkey.pub) and the device "shows the
  prompt". `auth="any"` accepts any signature; `auth="verify"` checks signatures against the keys it
  trusts and, when `allow_new_keys`, trusts a presented public key as a user tapping "Allow" would.
  Otherwise the device stays silent and the server lists it `unauthorized` until `authorize()`.
- streams: OPEN(host id, 0, "service\\0") -> OKAY(device id, host id), or CLSE(0, host id) for a
  service it does not know; WRTE carries data, and each WRTE is answered with OKAY before the other
  side sends its next one (the device waits for the host's OKAY too); CLSE ends a stream.
- services: `shell,v2[,opts]:CMD` (shell protocol packets: [id u8][length u32][data], ids stdin 0,
  stdout 1, stderr 2, exit 3, close-stdin 4, window-size 5; a `cat` reads stdin until close-stdin),
  `shell[,raw]:CMD` and `exec:CMD` (raw stdout and stderr, no exit code), and `sync:` (STAT, STA2, LST2,
  LIST, RECV, SEND, QUIT; DATA/DONE/OKAY/FAIL answers) on the phone's files.

Fault switches: the phone's (`phone.faults`: `gone` closes the connection and refuses new ones while
set, the real server then lists the device offline; `hang_up` closes the connection when a command
arrives; `hang` accepts commands and never answers; `delay_s` answers late; `failing`, `truncate_png`,
`dump_xml` act in the phone), plus `drop_mid_answer` (half the answer, then the connection closes) and
the `auth` modes above.

`RealAdbServer` runs the real `adb` binary as a private server (its own port, HOME and keys) for these
devices; `find_adb()` says where that binary is.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import itertools
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tests.fake_screens import FakePhone

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453
A_VERSION_MIN = 0x01000000
"""The first protocol version: checksums required, payloads up to MAX_PAYLOAD_V1."""
A_VERSION = 0x01000001
"""Checksums skipped (Android 9+)."""
MAX_PAYLOAD_V1 = 4 * 1024
MAX_PAYLOAD = 1024 * 1024
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
TOKEN_SIZE = 20
FEATURES = ("shell_v2", "cmd", "stat_v2")
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN, SHELL_WINDOW = range(6)
SYNC_DATA_MAX = 64 * 1024
"""Largest DATA chunk of the sync protocol."""
SHA1_DIGEST_INFO = bytes.fromhex("3021300906052b0e03021a05000414")
"""DER prefix of a SHA-1 DigestInfo: what PKCS#1 v1.5 signs before the 20-byte digest (here: the token)."""
NAMES = {A_SYNC: "SYNC", A_CNXN: "CNXN", A_AUTH: "AUTH", A_OPEN: "OPEN", A_OKAY: "OKAY"}
NAMES.update({A_CLSE: "CLSE", A_WRTE: "WRTE", A_STLS: "STLS"})

AuthMode = Literal["none", "any", "verify"]


def checksum(data: bytes) -> int:
    """adb's data "crc32": the unsigned sum of the payload's bytes."""
    return sum(data) & 0xFFFFFFFF


def message(command: int, arg0: int, arg1: int, data: bytes = b"", with_checksum: bool = True) -> bytes:
    """One adb message: the 24-byte header and the payload."""
    check = checksum(data) if with_checksum else 0
    head = struct.pack("<6I", command, arg0, arg1, len(data), check, command ^ 0xFFFFFFFF)
    return head + data


@dataclass(frozen=True)
class PublicKey:
    """An RSA public key in Android's adbkey.pub format: base64 of (u32 words, u32 n0inv, modulus
    little-endian, R^2 little-endian, u32 exponent), then a space and the key's name."""

    modulus: int
    exponent: int
    size: int
    """Modulus length in bytes."""
    name: str

    @classmethod
    def parse(cls, text: bytes | str) -> PublicKey:
        raw = text.encode() if isinstance(text, str) else text
        b64, _, name = raw.rstrip(b"\0\n").partition(b" ")
        blob = base64.b64decode(b64, validate=True)
        words = struct.unpack_from("<I", blob)[0]
        size = 4 * words
        if len(blob) != 12 + 2 * size:
            raise ValueError(f"an adb public key of {len(blob)} bytes for {words} words")
        modulus = int.from_bytes(blob[8 : 8 + size], "little")
        exponent = struct.unpack_from("<I", blob, 8 + 2 * size)[0]
        return cls(modulus, exponent, size, name.decode("utf-8", "replace"))

    def verifies(self, token: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's PKCS#1 v1.5 signature of `token` taken as a SHA-1 digest."""
        if len(signature) != self.size or len(token) != TOKEN_SIZE:
            return False
        em = pow(int.from_bytes(signature, "big"), self.exponent, self.modulus).to_bytes(self.size, "big")
        tail = b"\0" + SHA1_DIGEST_INFO + token
        return em == b"\0\1" + b"\xff" * (self.size - 2 - len(tail)) + tail


class _Closed(Exception):
    """The stream or its connection ended."""


class _Stream:
    """One adb stream on a connection: the device's end of a service."""

    def __init__(self, conn: _Connection, local: int, remote: int, service: str) -> None:
        self.conn, self.local, self.remote, self.service = conn, local, remote, service
        self._cond = threading.Condition()
        self._inbox = bytearray()
        self._may_send = True
        """The host acknowledged our last WRTE (or we sent none yet)."""
        self._closed = False
        self._sent_close = False

    # ---- from the connection's reader ----

    def on_write(self, data: bytes) -> None:
        with self._cond:
            self._inbox += data
            self._cond.notify_all()
        self.conn.send(A_OKAY, self.local, self.remote)  # ready for the next one

    def on_okay(self) -> None:
        with self._cond:
            self._may_send = True
            self._cond.notify_all()

    def on_close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---- from the service's thread ----

    @property
    def closed(self) -> bool:
        return self._closed or not self.conn.alive

    def write(self, data: bytes) -> None:
        """Send `data` in WRTE messages of at most the negotiated payload, each after the host's OKAY."""
        step = self.conn.max_payload
        for i in range(0, len(data), step):
            with self._cond:
                while not self._may_send and not self.closed:
                    self._cond.wait(0.1)
                if self.closed:
                    raise _Closed
                self._may_send = False
            self.conn.send(A_WRTE, self.local, self.remote, data[i : i + step])

    def read_exact(self, n: int) -> bytes:
        with self._cond:
            while len(self._inbox) < n:
                if self.closed:
                    raise _Closed
                self._cond.wait(0.1)
            data = bytes(self._inbox[:n])
            del self._inbox[:n]
            return data

    def wait_closed(self, stop: threading.Event) -> None:
        """Block until the host closes the stream or the connection ends (a hung command)."""
        with self._cond:
            while not self.closed and not stop.is_set():
                self._cond.wait(0.1)

    def close(self) -> None:
        """CLSE, once (the host may already have closed it)."""
        with self._cond:
            if self._sent_close:
                return
            self._sent_close = True
            closed_by_host = self._closed
        if not closed_by_host:
            self.conn.send(A_CLSE, self.local, self.remote)
        self.conn.forget(self)


class _Connection:
    """One TCP connection from an adb server: handshake, then streams."""

    def __init__(self, device: FakeAdbd, sock: socket.socket) -> None:
        self.device, self.sock = device, sock
        self.alive = True
        self.online = False
        self.version = device.version
        self.max_payload = MAX_PAYLOAD_V1 if device.version < A_VERSION else device.max_payload
        self._wlock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._token = b""
        self.pending_key: bytes | None = None
        """A public key the host presented that the device has not accepted (the prompt is showing)."""

    # ---- I/O ----

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        legacy = self.version < A_VERSION or not self.online
        try:
            with self._wlock:
                self.sock.sendall(message(command, arg0, arg1, data, with_checksum=legacy))
                self.device.sent[NAMES.get(command, hex(command))] += 1
        except OSError:
            self.kill()
            raise _Closed from None

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise _Closed
            buf += chunk
        return bytes(buf)

    def kill(self) -> None:
        """Drop the TCP connection (a cable pulled); every stream on it ends."""
        if self.alive:
            self.alive = False
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        for stream in list(self._streams.values()):
            stream.on_close()

    def forget(self, stream: _Stream) -> None:
        self._streams.pop(stream.local, None)

    # ---- the reader ----

    def serve(self) -> None:
        try:
            while self.alive:
                command, arg0, arg1, length, check, magic = struct.unpack("<6I", self._recv_exact(24))
                name = NAMES.get(command, hex(command))
                if magic != command ^ 0xFFFFFFFF:
                    self.device.errors.append(f"bad magic on {name}")
                    return
                if length > (self.max_payload if self.online else MAX_PAYLOAD):
                    self.device.errors.append(f"{name} of {length} bytes, over maxdata {self.max_payload}")
                    return
                data = self._recv_exact(length)
                if self.device.version < A_VERSION and checksum(data) != check:
                    self.device.errors.append(f"bad checksum on {name}")
                    return
                self.device.received[name] += 1
                self._handle(command, arg0, arg1, data)
        except (_Closed, OSError):
            pass
        finally:
            self.kill()
            with contextlib.suppress(OSError):
                self.sock.close()

    def _handle(self, command: int, arg0: int, arg1: int, data: bytes) -> None:
        device = self.device
        if command == A_CNXN:
            device.host_banner = data.rstrip(b"\0").decode("utf-8", "replace")
            self.version = min(arg0, device.version)
            limit = MAX_PAYLOAD_V1 if self.version < A_VERSION else device.max_payload
            self.max_payload = min(arg1, limit)
            self.online = False
            if device.auth == "none":
                return self._connect()
            return self._new_token()
        if command == A_AUTH:
            return self._auth(arg0, data)
        if not self.online:
            device.errors.append(f"{NAMES.get(command, hex(command))} before the handshake")
            raise _Closed
        if command == A_OPEN:
            return self._open(arg0, data.rstrip(b"\0").decode("utf-8", "replace"))
        stream = self._streams.get(arg1)
        if stream is None:
            return  # a late message for a stream already closed
        if command == A_WRTE:
            stream.on_write(data)
        elif command == A_OKAY:
            stream.on_okay()
        elif command == A_CLSE:
            stream.on_close()
            self.forget(stream)

    # ---- handshake ----

    def _connect(self) -> None:
        device = self.device
        device.handshakes += 1
        self.pending_key = None
        self.send(A_CNXN, self.version, self.max_payload, device.banner().encode())
        self.online = True

    def _new_token(self) -> None:
        self._token = os.urandom(TOKEN_SIZE)
        self.send(A_AUTH, AUTH_TOKEN, 0, self._token)

    def _auth(self, kind: int, data: bytes) -> None:
        device = self.device
        if self.online or device.auth == "none":
            return
        if kind == AUTH_SIGNATURE:
            device.signatures += 1
            if device.auth == "any" or any(k.verifies(self._token, data) for k in device.trusted):
                device.signatures_accepted += 1
                return self._connect()
            return self._new_token()  # rejected: the host tries its next key, then sends its public key
        if kind == AUTH_RSAPUBLICKEY:
            device.keys_presented += 1
            if device.auth == "any":
                return self._connect()
            self.pending_key = data
            if device.allow_new_keys:
                device.trust(data)
                return self._connect()
            # The prompt shows on the phone; the host waits (`unauthorized`) until authorize().

    def accept_pending(self) -> None:
        if self.alive and not self.online and self.pending_key is not None:
            self.device.trust(self.pending_key)
            self._connect()

    # ---- streams ----

    def _open(self, remote: int, service: str) -> None:
        device = self.device
        device.services.append(service)
        faults = device.phone.faults
        if faults.hang_up:
            self.kill()
            return
        run = device.service_for(service)
        if run is None:
            self.send(A_CLSE, 0, remote)  # refused: the host reports the service as closed
            return
        stream = _Stream(self, next(self._ids), remote, service)
        self._streams[stream.local] = stream
        self.send(A_OKAY, stream.local, remote)
        threading.Thread(
            target=device.run_service, args=(run, stream), name=f"fake-adbd-{service[:20]}", daemon=True
        ).start()


class FakeAdbd:
    """A fake device on 127.0.0.1:`port` (0: a free one); use as a context manager. Its adb serial is
    `serial` ("127.0.0.1:PORT"), which it also sets as `phone.serial`."""

    def __init__(
        self,
        phone: FakePhone,
        *,
        auth: AuthMode = "none",
        allow_new_keys: bool = True,
        trusted_keys: tuple[bytes | str, ...] = (),
        version: int = A_VERSION,
        max_payload: int = MAX_PAYLOAD,
        features: tuple[str, ...] = FEATURES,
        product: str = "sdk_phone64",
        model: str = "FakePhone",
        device: str = "fake",
        port: int = 0,
    ) -> None:
        self.phone = phone
        self.auth, self.allow_new_keys = auth, allow_new_keys
        self.trusted: list[PublicKey] = [PublicKey.parse(k) for k in trusted_keys]
        self.version, self.max_payload, self.features = version, max_payload, features
        self.product, self.model, self.device = product, model, device
        self.drop_mid_answer = False
        """Send half of the next answers, then close the connection (a cable pulled mid-transfer)."""
        self.services: list[str] = []
        """Every service the host opened, in order."""
        self.host_banner = ""
        """The host's CNXN payload ("host::features=...")."""
        self.connections = 0
        self.handshakes = 0
        self.signatures = 0
        """AUTH SIGNATUREs received (the host signed a token with one of its keys)..."""
        self.signatures_accepted = 0
        """... and those accepted (`auth="verify"`: made with a key the device trusts)."""
        self.keys_presented = 0
        """AUTH RSAPUBLICKEYs received: the host ran out of keys the device accepts."""
        self.errors: list[str] = []
        """Protocol violations seen (bad magic or checksum, a payload over maxdata, a message before the
        handshake): the connection is closed on the first one, as adbd does."""
        self.received: collections.Counter = collections.Counter()
        """Messages received, by command name ("CNXN", "WRTE", ...)."""
        self.sent: collections.Counter = collections.Counter()
        self.sync_requests: collections.Counter = collections.Counter()
        """Sync requests received, by verb ("STAT", "STA2", "RECV", ...)."""
        self._phone_lock = threading.Lock()
        self._lock = threading.Lock()
        self._conns: set[_Connection] = set()
        self._stop = threading.Event()
        self._listener: socket.socket | None = self._listen(port)
        self.port: int = self._listener.getsockname()[1]
        self.phone.serial = self.serial
        self._thread = threading.Thread(target=self._accept_loop, name=f"fake-adbd-{self.port}", daemon=True)

    @property
    def serial(self) -> str:
        """What `adb connect` makes of it: HOST:PORT."""
        return f"127.0.0.1:{self.port}"

    def banner(self) -> str:
        props = (
            f"ro.product.name={self.product};ro.product.model={self.model};ro.product.device={self.device};"
        )
        return f"device::{props}features={','.join(self.features)}"

    # ---- life cycle ----

    def __enter__(self) -> FakeAdbd:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._close_listener()
        self.drop_connections()

    @staticmethod
    def _listen(port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(16)
        except OSError:
            s.close()
            raise
        s.settimeout(0.05)
        return s

    def _close_listener(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def _accept_loop(self) -> None:
        """Accept connections; while `phone.faults.gone` is set, no listener (connections are refused)."""
        while not self._stop.is_set():
            if self.phone.faults.gone:
                if self._listener is not None:
                    self._close_listener()
                    self.drop_connections()
                self._stop.wait(0.02)
                continue
            if self._listener is None:
                try:
                    listener = self._listen(self.port)
                except OSError:  # the port is briefly unavailable: try again
                    self._stop.wait(0.05)
                    continue
                with self._lock:
                    self._listener = listener
            try:
                sock, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, sock)
            with self._lock:
                self._conns.add(conn)
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), name="fake-adbd-conn", daemon=True).start()

    def _serve(self, conn: _Connection) -> None:
        try:
            conn.serve()
        finally:
            with self._lock:
                self._conns.discard(conn)

    # ---- switches ----

    def drop_connections(self) -> None:
        """Close every connection (the device keeps listening: a server that reconnects gets it back)."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.kill()

    def go_offline(self) -> None:
        """Close the connection and refuse new ones (the device left, or adbd died)."""
        self.phone.faults.gone = True
        deadline = time.monotonic() + 5
        while self._listener is not None and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.drop_connections()  # also one accepted just before the listener closed

    def come_back(self) -> None:
        """Listen again on the same port."""
        self.phone.faults.gone = False

    def trust(self, key: bytes | str) -> None:
        parsed = PublicKey.parse(key)
        if parsed not in self.trusted:
            self.trusted.append(parsed)

    def authorize(self) -> None:
        """The user taps "Allow" on the USB debugging prompt: new keys are trusted from now on, and a host
        waiting with its public key gets the device at once."""
        self.allow_new_keys = True
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.accept_pending()

    @property
    def online_connections(self) -> int:
        with self._lock:
            return sum(c.online and c.alive for c in self._conns)

    # ---- services ----

    def service_for(self, service: str):
        """The function serving an OPENed service, or None when the device does not know it."""
        name, sep, arg = service.partition(":")
        if not sep:
            return None
        kind, *opts = name.split(",")
        if kind == "shell" and arg:
            return (self._shell_v2 if "v2" in opts else self._raw), arg
        if kind == "exec" and arg and not opts:
            return self._raw, arg
        if service == "sync:":
            return self._sync, ""
        return None

    def run_service(self, run, stream: _Stream) -> None:
        func, arg = run
        try:
            if self.phone.faults.hang:
                stream.wait_closed(self._stop)
                return
            func(stream, arg)
        except (_Closed, OSError):
            return
        with contextlib.suppress(_Closed):
            stream.close()

    def _slow(self) -> None:
        delay = self.phone.faults.delay_s
        if delay and self._stop.wait(delay):
            raise _Closed

    def _answer(self, stream: _Stream, data: bytes) -> None:
        """Write an answer, or half of it and then drop the connection (`drop_mid_answer`)."""
        if self.drop_mid_answer:
            stream.write(data[: len(data) // 2])
            stream.conn.kill()
            raise _Closed
        stream.write(data)

    def _run(self, line: str, stdin: bytes = b"") -> tuple[bytes, bytes, int]:
        with self._phone_lock:
            return self.phone.run(line, stdin)

    def _raw(self, stream: _Stream, line: str) -> None:
        """`shell:CMD`, `exec:CMD`: stdout and stderr on one stream as they come, no exit code."""
        self._slow()
        with self._phone_lock:
            data, _ = self.phone.run_merged(line)
        self._answer(stream, data)

    def _shell_v2(self, stream: _Stream, line: str) -> None:
        stdin = b""
        if FakePhone.reads_stdin(line):  # read stdin packets until close-stdin
            while True:
                kind, size = struct.unpack("<BI", stream.read_exact(5))
                data = stream.read_exact(size)
                if kind == SHELL_STDIN:
                    stdin += data
                elif kind == SHELL_CLOSE_STDIN:
                    break
        self._slow()
        out, err, code = self._run(line, stdin)
        step = stream.conn.max_payload - 5
        packets = [
            _shell_packet(kind, data[i : i + step])
            for kind, data in ((SHELL_STDOUT, out), (SHELL_STDERR, err))
            for i in range(0, len(data), step)
        ]
        packets.append(_shell_packet(SHELL_EXIT, bytes([code & 0xFF])))
        if self.drop_mid_answer:
            return self._answer(stream, b"".join(packets))
        for packet in packets:  # one packet per WRTE, as adbd sends them
            stream.write(packet)

    def _sync(self, stream: _Stream, _: str) -> None:
        files = self.phone.files
        while True:
            verb, size = struct.unpack("<4sI", stream.read_exact(8))
            self.sync_requests[verb.decode("ascii", "replace")] += 1
            if verb == b"QUIT":
                return
            if size > 1024:
                return stream.write(_sync_fail("path too long"))
            path = stream.read_exact(size).decode("utf-8", "replace")
            if verb == b"STAT":
                data = files.get(path)
                mode, length = (0o100644, len(data)) if data is not None else (0, 0)
                mtime = 1_700_000_000 if data is not None else 0
                stream.write(b"STAT" + struct.pack("<III", mode, length, mtime))
            elif verb in (b"STA2", b"LST2"):
                data = files.get(path)
                if data is None:
                    stat = struct.pack("<IQQIIIIQqqq", 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # ENOENT
                else:
                    t = 1_700_000_000
                    stat = struct.pack("<IQQIIIIQqqq", 0, 1, 1, 0o100644, 1, 2000, 2000, len(data), t, t, t)
                stream.write(verb + stat)
            elif verb == b"LIST":
                prefix = path.rstrip("/") + "/"
                reply = b""
                for name, data in sorted(files.items()):
                    rest = name[len(prefix) :]
                    if name.startswith(prefix) and rest and "/" not in rest:
                        entry = rest.encode()
                        reply += b"DENT" + struct.pack(
                            "<IIII", 0o100644, len(data), 1_700_000_000, len(entry)
                        )
                        reply += entry
                stream.write(reply + b"DONE" + bytes(16))
            elif verb == b"RECV":
                self._slow()
                if path not in files:
                    return stream.write(_sync_fail("No such file or directory"))
                data, reply = files[path], b""
                for i in range(0, len(data), SYNC_DATA_MAX):
                    part = data[i : i + SYNC_DATA_MAX]
                    reply += b"DATA" + struct.pack("<I", len(part)) + part
                self._answer(stream, reply + b"DONE" + struct.pack("<I", 0))
            elif verb == b"SEND":
                body = b""
                while True:
                    head, n = struct.unpack("<4sI", stream.read_exact(8))
                    if head == b"DONE":
                        break
                    if head != b"DATA" or n > SYNC_DATA_MAX:
                        return stream.write(_sync_fail("bad SEND stream"))
                    body += stream.read_exact(n)
                files[path.rsplit(",", 1)[0]] = body
                stream.write(b"OKAY" + struct.pack("<I", 0))
            else:
                return stream.write(_sync_fail(f"unsupported sync request {verb!r}"))


def _shell_packet(kind: int, data: bytes) -> bytes:
    return struct.pack("<BI", kind, len(data)) + data


def _sync_fail(text: str) -> bytes:
    data = text.encode()
    return b"FAIL" + struct.pack("<I", len(data)) + data


# ---- the real adb server ----

ADB_ENV = "REAL_ADB"
"""Names an adb binary to test with instead of the `adb` on PATH (e.g. a newer platform-tools one)."""
RESERVED_PORTS = {5037, *range(5554, 5586)}
"""The default adb server port and the emulator ports a real adb server scans: never ours."""


def find_adb() -> str | None:
    """The real adb binary: $REAL_ADB, else `adb` on PATH; None when there is none."""
    named = os.environ.get(ADB_ENV)
    return named if named else shutil.which("adb")


def free_port() -> int:
    """A free port on 127.0.0.1 outside RESERVED_PORTS."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


@dataclass
class RealAdbServer:
    """`adb -P PORT nodaemon server` in a process group of its own, with a private HOME (its own RSA key
    in HOME/.android, never the user's) and no emulator scan; use as a context manager.

    `env` is the environment for adb clients of this server (ANDROID_ADB_SERVER_PORT is its port)."""

    adb: str
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="real-adb-home-")))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID_", "ADB_", "ADBUTILS_"))}
        self.env = {
            **base,
            "HOME": str(self.home),
            "TMPDIR": str(self.home),
            "ANDROID_ADB_SERVER_PORT": str(self.port),
            "ADB_LOCAL_TRANSPORT_MAX_PORT": "5553",  # below 5555: no emulator port is scanned
            "ADB_MDNS": "0",  # no mDNS discovery
            "ADB_USB": "0",  # no USB: never claim a phone the user's own adb server has
            "ADBUTILS_ADB_PATH": "/bin/false",  # adbutils never starts a server of its own
        }

    @property
    def log_path(self) -> Path:
        return self.home / "adb-server.log"

    def __enter__(self) -> RealAdbServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 20.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.adb, "-P", str(self.port), "nodaemon", "server"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"adb server exited {self.proc.returncode}: {self.log()}")
            try:
                if self.request("host:version").startswith(b"OKAY"):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"adb server did not answer on port {self.port}: {self.log()}")
            time.sleep(0.05)

    def request(self, service: str, timeout: float = 5.0) -> bytes:
        """One host request on a fresh connection; everything the server answered until it closed."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(f"{len(service):04x}{service}".encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def cli(
        self, *args: str, timeout: float = 20.0, input: bytes | None = None
    ) -> subprocess.CompletedProcess:
        """The adb command-line client against this server; stdout and stderr as bytes when `input` is
        given (binary in, binary out), else as text."""
        return subprocess.run(
            [self.adb, "-P", str(self.port), *args],
            env=self.env,
            capture_output=True,
            text=input is None,
            timeout=timeout,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
        )

    def devices(self) -> dict[str, str]:
        """serial -> state, from `host:devices`."""
        answer = self.request("host:devices")
        if not answer.startswith(b"OKAY"):
            raise RuntimeError(f"host:devices: {answer!r}")
        rows = answer[8:].decode().splitlines()
        return dict(row.split("\t", 1) for row in rows if "\t" in row)

    def wait_state(self, serial: str, states: str | tuple[str, ...], timeout: float = 15.0) -> str:
        """Poll `host:devices` until `serial` is in one of `states` ("missing": not listed)."""
        wanted = (states,) if isinstance(states, str) else states
        deadline = time.monotonic() + timeout
        while True:
            state = self.devices().get(serial, "missing")
            if state in wanted:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"{serial} is {state}, not {'/'.join(wanted)}, after {timeout} s")
            time.sleep(0.05)

    def connect(
        self, device: FakeAdbd, state: str | tuple[str, ...] = "device", timeout: float = 15.0
    ) -> str:
        """`adb connect` the device and wait until it is listed in `state`; its serial."""
        done = self.cli("connect", device.serial)
        # adb 29 says "failed to authenticate to ..." (exit status 0) as soon as the device asks for the
        # host's public key, even when the device then accepts it: the state tells.
        if "connected to" not in done.stdout and "failed to authenticate" not in done.stdout:
            raise RuntimeError(f"adb connect {device.serial}: {done.stdout}{done.stderr}")
        self.wait_state(device.serial, state, timeout)
        return device.serial

    def disconnect(self, serial: str) -> None:
        self.cli("disconnect", serial)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL) and remove its HOME."""
        proc, self.proc = self.proc, None
        if proc is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything it left in its group
        shutil.rmtree(self.home, ignore_errors=True)
