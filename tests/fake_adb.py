"""A fake adb server speaking the adb host protocol, so the unmodified adbutils client can be tested offline.

It serves scripted phones (tests/fake_screens.py, shared with the fake device of tests/fake_adbd.py):
screens (uiautomator XML + PNG) linked by tap targets, a tiny file system for `uiautomator dump` and
`sync:` pulls, a settings table, and fault switches for what real devices do wrong (vanish, hang,
truncate, answer garbage, fail commands).

It also discovers emulators the way the real adb server does, by probing their adb port (console port
+ 1): tests/fake_emulator.py answers there with one status line, and while it does, `emulator-P` is
listed with a FakePhone of its own (fresh per emulator process and per snapshot load).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tests.fake_screens import DUMP_PATH, FakePhone, Faults, Handler, Screen, blank_phone, make_png

__all__ = [
    "DUMP_PATH",
    "FakeAdbServer",
    "FakePhone",
    "Faults",
    "Handler",
    "Screen",
    "blank_phone",
    "make_png",
]

V1_EXIT_MAGIC = "; echo X4EXIT:$?"
"""adbutils' shell2() without v2 appends this and parses `X4EXIT:<code>` from the output."""
TRANSPORT_ID = 1
"""The first phone's transport id in `host:devices-l`, answered by `host:transport-id:` and
`host-transport-id:`; later phones and every emulator process get the next ids."""
ADB_VERSION = 41
"""41+ makes adbutils use `host:tport:serial:` (OKAY + 8-byte transport id) rather than `host:transport:`."""


EMULATOR_PROBE_TIMEOUT = 0.3
"""Seconds a probed emulator has to send its status line. A refused probe is an emulator that is gone; a
connection that stays silent is a hung one (still listed, its commands never answer)."""
UNAUTHORIZED = (
    "device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is not set\n"
    "Try 'adb kill-server' if that seems wrong.\nOtherwise check for a confirmation dialog on your device."
)


@dataclass
class _Emulator:
    """One fake emulator process as last probed."""

    instance: str
    generation: str
    phone: FakePhone
    transport_id: int
    hung: bool = False


@dataclass(frozen=True)
class _Device:
    phone: FakePhone
    transport_id: int
    hung: bool = False


class FakeAdbServer:
    """The server thread; use as a context manager. `port` is a free port on 127.0.0.1.

    `FakeAdbServer(phone, *more)` serves fixed phones (`phone` is the first; `add` and `remove` change
    them later). `emulator_ports` are console ports whose fake emulators are listed while they answer,
    each with a phone made by `emulator_phone(serial)`.
    """

    def __init__(
        self,
        *phones: FakePhone,
        emulator_ports: Iterable[int] = (),
        emulator_phone: Callable[[str], FakePhone] = blank_phone,
    ) -> None:
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count(TRANSPORT_ID)
        self._fixed: list[tuple[FakePhone, int]] = []
        for phone in phones:
            self.add(phone)
        self.emulator_ports = tuple(emulator_ports)
        self.emulator_phone = emulator_phone
        self._emulators: dict[int, _Emulator] = {}
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-adb", daemon=True
        )

    def __enter__(self) -> FakeAdbServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self.drop_connections()
        self._thread.join(timeout=5)

    def drop_connections(self) -> None:
        """Close every open client connection, as a vanishing device or server does."""
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    # ---- devices ----

    @property
    def phone(self) -> FakePhone:
        """The first fixed phone."""
        with self._lock:
            if not self._fixed:
                raise AttributeError("this FakeAdbServer serves no fixed phone")
            return self._fixed[0][0]

    def add(self, phone: FakePhone) -> None:
        """Plug in a fixed phone (it gets the next transport id)."""
        with self._lock:
            self._fixed.append((phone, next(self._ids)))

    def remove(self, serial: str) -> None:
        """Unplug a fixed phone for good (`faults.gone` hides one for a while instead)."""
        with self._lock:
            self._fixed = [(p, i) for p, i in self._fixed if p.serial != serial]

    def emulator(self, port: int) -> FakePhone | None:
        """The phone of the emulator on console port `port`, probed now; None while none answers."""
        emu = self._probe(port)
        return None if emu is None else emu.phone

    def devices(self) -> list[_Device]:
        """Every device present now: fixed phones not `gone`, then emulators that answer their probe."""
        with self._lock:
            found = [_Device(p, i) for p, i in self._fixed if not p.faults.gone]
        for port in self.emulator_ports:
            emu = self._probe(port)
            if emu is not None and not emu.phone.faults.gone:
                found.append(_Device(emu.phone, emu.transport_id, emu.hung))
        return found

    def _probe(self, port: int) -> _Emulator | None:
        """Ask the emulator on console port `port` for its status line on its adb port (port + 1)."""
        try:
            with socket.create_connection(("127.0.0.1", port + 1), timeout=EMULATOR_PROBE_TIMEOUT) as s:
                try:
                    words = s.makefile("rb").readline(256).decode("ascii", "replace").split()
                except TimeoutError:
                    words = None
        except OSError:
            words = []
        with self._lock:
            emu = self._emulators.get(port)
            if words is None:  # accepted but silent: hung
                if emu is not None:
                    emu.hung = True
                return emu
            if len(words) != 4 or words[0] != "fake-emulator":
                self._emulators.pop(port, None)
                return None
            _, instance, booted, generation = words
            if emu is None or emu.instance != instance:  # a new process: new transport, fresh phone
                phone = self.emulator_phone(f"emulator-{port}")
                emu = self._emulators[port] = _Emulator(instance, generation, phone, next(self._ids))
            elif emu.generation != generation:  # a snapshot was loaded: the phone's state is reset
                emu.phone, emu.generation = self.emulator_phone(f"emulator-{port}"), generation
            emu.hung = False
            emu.phone.props["sys.boot_completed"] = "1" if booted == "1" else ""
            return emu

    def _select(self, selector: str) -> _Device | str:
        """The device a transport request names (serial, "any" or "id:N"), or adb's error message."""
        devices = self.devices()
        if selector == "any":
            if len(devices) != 1:
                return "more than one device/emulator" if devices else "no devices/emulators found"
            return devices[0]
        for d in devices:
            if selector in (d.phone.serial, f"id:{d.transport_id}"):
                if d.phone.state == "unauthorized":
                    return UNAUTHORIZED
                return d if d.phone.state == "device" else f"device {d.phone.state}"
        return f"device '{selector}' not found"

    # ---- protocol ----

    def _serve(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.add(sock)
        sock.settimeout(10)
        try:
            self._session(sock)
        except (OSError, EOFError):
            pass
        finally:
            with self._lock:
                self._conns.discard(sock)
            sock.close()

    def _session(self, sock: socket.socket) -> None:
        device: _Device | None = None
        while True:
            cmd = _read_request(sock)
            if device is None:
                device = self._host(sock, cmd)
                if device is None:
                    return
                continue
            # A device service: the connection ends with it.
            phone = device.phone
            if phone.faults.gone:
                return _fail(sock, "device offline")
            if phone.faults.hang_up:
                return
            if device.hung or phone.faults.hang:
                return self._stall(sock)
            if cmd.startswith("shell,v2:"):
                return self._shell_v2(sock, phone, cmd.removeprefix("shell,v2:"))
            if cmd.startswith("shell:"):
                return self._shell_v1(sock, phone, cmd.removeprefix("shell:"))
            if cmd == "sync:":
                sock.sendall(b"OKAY")
                return self._sync(sock, phone)
            return _fail(sock, f"unknown service {cmd}")

    def _host(self, sock: socket.socket, cmd: str) -> _Device | None:
        """Answer a host request; the device the connection now talks to, or None to close."""
        if cmd == "host:version":
            sock.sendall(b"OKAY" + _block(f"{ADB_VERSION:04x}"))
            return None
        if cmd in ("host:devices", "host:devices-l"):
            lines = []
            for d in self.devices():
                line = f"{d.phone.serial}\t{d.phone.state}"
                if cmd.endswith("-l"):
                    if d.phone.state == "device":
                        line += " product:sdk_phone64 model:FakePhone device:fake"
                    line += f" transport_id:{d.transport_id}"
                lines.append(line + "\n")
            sock.sendall(b"OKAY" + _block("".join(lines)))
            return None
        selector = _serial_of(cmd)
        if selector is None:
            _fail(sock, f"unknown host service {cmd[:64]}")
            return None
        device = self._select(selector)
        if isinstance(device, str):
            _fail(sock, device)
            return None
        if cmd.startswith("host:tport:"):
            sock.sendall(b"OKAY" + struct.pack("<Q", device.transport_id))
            return device
        if cmd.startswith(("host:transport:", "host:transport-id:", "host:transport-any")):
            sock.sendall(b"OKAY")
            return device
        if device.hung:
            self._stall(sock)
            return None
        # host-serial:SERIAL:request or host-transport-id:ID:request
        request = cmd.rsplit(":", 1)[1]
        answers = {
            "features": "shell_v2,cmd,stat_v2",
            "get-state": "device",
            "get-serialno": device.phone.serial,
        }
        if request not in answers:
            _fail(sock, f"unknown request {request}")
        else:
            sock.sendall(b"OKAY" + _block(answers[request]))
        return None

    def _stall(self, sock: socket.socket) -> None:
        """A hung device: answer nothing until the client gives up or the server stops."""
        sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                if not sock.recv(4096):
                    return
            except TimeoutError:
                continue

    def _shell_v1(self, sock: socket.socket, phone: FakePhone, cmd: str) -> None:
        magic = cmd.endswith(V1_EXIT_MAGIC)
        sock.sendall(b"OKAY")
        if self._slow(phone):
            return
        out, err, code = phone.run(cmd.removesuffix(V1_EXIT_MAGIC))
        sock.sendall(out + err + (f"X4EXIT:{code}".encode() if magic else b""))

    def _shell_v2(self, sock: socket.socket, phone: FakePhone, cmd: str) -> None:
        sock.sendall(b"OKAY")
        if self._slow(phone):
            return
        out, err, code = phone.run(cmd)
        packets = b""
        if out:
            packets += _packet(1, out)
        if err:
            packets += _packet(2, err)
        sock.sendall(packets + _packet(3, bytes([code & 0xFF])))

    def _slow(self, phone: FakePhone) -> bool:
        """Apply the delay fault; True when the server closed meanwhile."""
        delay = phone.faults.delay_s
        return bool(delay) and self._stop.wait(delay)

    def _sync(self, sock: socket.socket, phone: FakePhone) -> None:
        files = phone.files
        while True:
            head = _read_exact(sock, 8)
            verb, size = head[:4], struct.unpack("<I", head[4:])[0]
            if verb == b"QUIT":
                return
            if size > 1024:
                return _sync_fail(sock, "path too long")
            path = _read_exact(sock, size).decode("utf-8", "replace")
            if verb == b"STAT":
                data = files.get(path)
                mode, length = (0o100644, len(data)) if data is not None else (0, 0)
                sock.sendall(b"STAT" + struct.pack("<III", mode, length, 1_700_000_000 if mode else 0))
            elif verb == b"RECV":
                if self._slow(phone):
                    return
                if path not in files:
                    return _sync_fail(sock, "No such file or directory")
                data = files[path]
                for i in range(0, len(data), 64 * 1024):
                    part = data[i : i + 64 * 1024]
                    sock.sendall(b"DATA" + struct.pack("<I", len(part)) + part)
                sock.sendall(b"DONE" + struct.pack("<I", 0))
            elif verb == b"SEND":
                files[path.rsplit(",", 1)[0]] = self._receive(sock)
                sock.sendall(b"OKAY" + struct.pack("<I", 0))
            else:
                return _sync_fail(sock, f"unsupported sync request {verb!r}")

    def _receive(self, sock: socket.socket) -> bytes:
        body = b""
        while True:
            head = _read_exact(sock, 8)
            verb, size = head[:4], struct.unpack("<I", head[4:])[0]
            if verb == b"DONE":
                return body
            if verb != b"DATA" or size > 64 * 1024:
                raise EOFError("bad SEND stream")
            body += _read_exact(sock, size)


def _serial_of(cmd: str) -> str | None:
    for prefix in ("host:tport:serial:", "host:transport:", "host-serial:"):
        if cmd.startswith(prefix):
            rest = cmd.removeprefix(prefix)
            return rest.split(":", 1)[0] if prefix == "host-serial:" else rest
    if cmd in ("host:tport:any", "host:transport-any"):
        return "any"
    for prefix in ("host:transport-id:", "host-transport-id:"):
        if cmd.startswith(prefix):
            return "id:" + cmd.removeprefix(prefix).split(":", 1)[0]
    return None


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("client closed")
        buf += chunk
    return buf


def _read_request(sock: socket.socket) -> str:
    size = int(_read_exact(sock, 4), 16)
    return _read_exact(sock, size).decode("utf-8", "replace")


def _block(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):04x}".encode() + data


def _fail(sock: socket.socket, message: str) -> None:
    sock.sendall(b"FAIL" + _block(message))


def _sync_fail(sock: socket.socket, message: str) -> None:
    data = message.encode()
    sock.sendall(b"FAIL" + struct.pack("<I", len(data)) + data)


def _packet(stream_id: int, data: bytes) -> bytes:
    return bytes([stream_id]) + struct.pack("<I", len(data)) + data
