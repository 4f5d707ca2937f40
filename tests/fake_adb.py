"""A fake adb server speaking the adb host protocol, so the unmodified adbutils client can be tested offline.

It serves scripted phones: screens (uiautomator XML + PNG) linked by tap targets, a tiny file system
for `uiautomator dump` and `sync:` pulls, a settings table, and fault switches for what real devices do
wrong (vanish, hang, truncate, answer garbage, fail commands).

It also discovers emulators the way the real adb server does, by probing their adb port (console port
+ 1): tests/fake_emulator.py answers there with one status line, and while it does, `emulator-P` is
listed with a FakePhone of its own (fresh per emulator process and per snapshot load).
"""

from __future__ import annotations

import contextlib
import itertools
import shlex
import socket
import socketserver
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

DUMP_PATH = "/sdcard/window_dump.xml"
V1_EXIT_MAGIC = "; echo X4EXIT:$?"
"""adbutils' shell2() without v2 appends this and parses `X4EXIT:<code>` from the output."""
TRANSPORT_ID = 1
"""The first phone's transport id in `host:devices-l`, answered by `host:transport-id:` and
`host-transport-id:`; later phones and every emulator process get the next ids."""
ADB_VERSION = 41
"""41+ makes adbutils use `host:tport:serial:` (OKAY + 8-byte transport id) rather than `host:transport:`."""


def make_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid solid-colour RGB PNG, built with zlib and struct only."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    row = b"\x00" + bytes(rgb) * width
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


@dataclass
class Screen:
    xml: bytes
    png: bytes
    links: dict[tuple[int, int, int, int], str] = field(default_factory=dict)
    """Tap target bounds -> name of the screen a tap inside them opens."""


@dataclass
class Faults:
    """Switches flipped by tests while the server runs."""

    gone: bool = False
    """The device left: dropped from host:devices, transports fail with `device not found`."""
    hang_up: bool = False
    """Transport connections are closed without an answer (a cable pulled mid-command)."""
    delay_s: float = 0.0
    """A slow device: sleep after accepting a shell or sync request, before any output."""
    truncate_png: bool = False
    dump_xml: bytes | None = None
    """Replaces the current screen's XML in `uiautomator dump` (malformed, empty, hostile...)."""
    failing: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Shell command prefix -> (exit code, stderr)."""


Handler = Callable[["FakePhone", list[str]], tuple[bytes, bytes, int]]


@dataclass
class FakePhone:
    screens: dict[str, Screen]
    current: str
    serial: str = "emulator-5554"
    state: str = "device"
    """What `adb devices` lists: "device", or "offline", "unauthorized", ... (then commands fail)."""
    size: tuple[int, int] = (1080, 2400)
    settings: dict[str, str] = field(default_factory=lambda: {"global/airplane_mode_on": "0"})
    files: dict[str, bytes] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    props: dict[str, str] = field(default_factory=lambda: {"sys.boot_completed": "1"})
    """`getprop` values."""
    handlers: dict[str, Handler] = field(default_factory=dict)
    """Extra commands by argv[0] (e.g. "content", "dumpsys"), so a test can script what it checks."""
    commands: list[str] = field(default_factory=list)
    """Every simple shell command run, for assertions (a `a; b` line counts as two)."""
    typed: list[str] = field(default_factory=list)
    """Text received by `input text`, unescaped as the device shell would."""
    keys: list[str] = field(default_factory=list)
    """Key codes received by `input keyevent`."""

    def run(self, line: str) -> tuple[bytes, bytes, int]:
        """Run a shell line: simple commands joined by `;` or `&&`, with `>/dev/null` and `2>&1`
        redirections; (stdout, stderr, exit code of the last command run)."""
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:
            return b"", b"/system/bin/sh: syntax error\n", 2
        out = err = b""
        code, argv, joiner = 0, [], ";"
        for token in [*tokens, ";"]:
            if token not in (";", "&&"):
                argv.append(token)
                continue
            if argv and (joiner == ";" or code == 0):
                o, e, code = self._simple(argv)
                out, err = out + o, err + e
            argv, joiner = [], token
        return out, err, code

    def _simple(self, argv: list[str]) -> tuple[bytes, bytes, int]:
        quiet_out = quiet_err = False
        while len(argv) >= 2 and argv[-2] in (">", "2>") and argv[-1] == "/dev/null":
            quiet_out, quiet_err = quiet_out or argv[-2] == ">", quiet_err or argv[-2] == "2>"
            argv = argv[:-2]
        if len(argv) >= 3 and argv[-3:] == ["2", ">", "&1"]:
            argv = argv[:-3]
        out, err, code = self._command(argv)
        return (b"" if quiet_out else out), (b"" if quiet_err else err), code

    def _command(self, argv: list[str]) -> tuple[bytes, bytes, int]:
        cmd = shlex.join(argv)
        self.commands.append(cmd)
        for prefix, (code, err) in self.faults.failing.items():
            if cmd.startswith(prefix):
                return b"", err, code
        if argv and argv[0] in self.handlers:
            return self.handlers[argv[0]](self, argv)
        match argv:
            case ["input", "tap", x, y]:
                return self._tap(int(float(x)), int(float(y)))
            case ["input", "swipe", *_]:
                return b"", b"", 0
            case ["input", "text", text]:
                self.typed.append(text.replace("%s", " "))
                return b"", b"", 0
            case ["input", "keyevent", key]:
                self.keys.append(key)
                return b"", b"", 0
            case ["getprop", name]:
                return (self.props.get(name, "") + "\n").encode(), b"", 0
            case ["uiautomator", "dump", *rest]:
                path = rest[0] if rest else DUMP_PATH
                xml = self.faults.dump_xml if self.faults.dump_xml is not None else self.screen.xml
                self.files[path] = xml
                return f"UI hierchary dumped to: {path}\n".encode(), b"", 0
            case ["screencap", "-p"]:
                png = self.screen.png
                return (png[: len(png) // 2] if self.faults.truncate_png else png), b"", 0
            case ["settings", "get", ns, key]:
                return (self.settings.get(f"{ns}/{key}", "null") + "\n").encode(), b"", 0
            case ["settings", "put", ns, key, value]:
                self.settings[f"{ns}/{key}"] = value
                return b"", b"", 0
            case ["wm", "size"]:
                return f"Physical size: {self.size[0]}x{self.size[1]}\n".encode(), b"", 0
            case ["cat", path]:
                if path not in self.files:
                    return b"", f"cat: {path}: No such file or directory\n".encode(), 1
                return self.files[path], b"", 0
            case ["echo", *words]:
                return (" ".join(words) + "\n").encode(), b"", 0
        name = argv[0] if argv else ""
        return b"", f"/system/bin/sh: {name}: inaccessible or not found\n".encode(), 127

    @property
    def screen(self) -> Screen:
        return self.screens[self.current]

    def _tap(self, x: int, y: int) -> tuple[bytes, bytes, int]:
        for (left, top, right, bottom), target in self.screen.links.items():
            if left <= x < right and top <= y < bottom:
                self.current = target
                break
        return b"", b"", 0


EMULATOR_PROBE_TIMEOUT = 0.3
"""Seconds a probed emulator has to send its status line. A refused probe is an emulator that is gone; a
connection that stays silent is a hung one (still listed, its commands never answer)."""
UNAUTHORIZED = (
    "device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is not set\n"
    "Try 'adb kill-server' if that seems wrong.\nOtherwise check for a confirmation dialog on your device."
)


def blank_phone(serial: str) -> FakePhone:
    """The phone of an emulator nobody scripted: one empty home screen."""
    xml = b"<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\"></hierarchy>"
    return FakePhone(screens={"home": Screen(xml, make_png(4, 8, (0, 0, 0)))}, current="home", serial=serial)


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
            if device.hung:
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
