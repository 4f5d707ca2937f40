"""One Android device behind an adb server, every call bounded in time and size.

adbutils speaks the adb host protocol; this wrapper adds what a training loop needs on top:

- a deadline on every command (adbutils' own default is 600 s per socket read), so a hung device costs
  one step timeout, not ten minutes;
- one connection per command: the device is addressed by its transport id (`host:transport-id:N`), which
  skips the `host:version` round trip adbutils makes before every `host:tport:serial:`, and the
  connection is closed without adbutils' 10 ms linger;
- exit codes from `shell,v2:` (with the `; echo X4EXIT:$?` fallback for devices without shell_v2);
- every failure mapped to a `DeviceFault` by cause: `DeviceHang` (timeout), `DeviceDisconnected`
  (device or adb server gone), `DeviceBadOutput` (oversized or garbled answer), `DeviceCommandFailed`
  (`check` of a command that exited non-zero).
"""

from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import adbutils
from adbutils.errors import AdbError, AdbTimeout

from actors.envs.faults import DeviceBadOutput, DeviceCommandFailed, DeviceDisconnected, DeviceHang

MAX_OUTPUT_BYTES = 32 * 1024 * 1024
"""Largest answer accepted from one command (a 1440x3200 PNG is ~2-6 MB; a UI dump ~100 KB)."""
DEFAULT_TIMEOUT = 10.0
_V1_MAGIC = b"X4EXIT:"


@dataclass(frozen=True)
class ShellResult:
    """What one shell command returned. stdout and stderr are raw bytes: the device's encoding is unknown."""

    stdout: bytes
    stderr: bytes
    code: int

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced) and stripped."""
        return self.stdout.decode("utf-8", errors="replace").strip()


def command_line(cmd: str | Sequence[str]) -> str:
    """A shell line: a string is sent as is (the caller quoted it); a sequence is quoted word by word."""
    return cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)


class AdbDevice:
    """A device by serial on the adb server at host:port. Thread-safe: every call opens its own connection."""

    def __init__(
        self, serial: str, host: str = "127.0.0.1", port: int = 5037, timeout: float = DEFAULT_TIMEOUT
    ):
        self.serial = serial
        self.timeout = timeout
        self.client = adbutils.AdbClient(host=host, port=port, socket_timeout=timeout)
        self._transport_id: int | None = None
        self._v2: bool | None = None

    def __repr__(self) -> str:
        return f"AdbDevice({self.serial!r} at {self.client.host}:{self.client.port})"

    # ---- state ----

    def state(self) -> str:
        """ "device", "offline", "unauthorized", ... as adb lists it, or "missing"; never raises a fault
        except when the adb server itself cannot be reached (DeviceDisconnected)."""
        for info in self._list():
            if info.serial == self.serial:
                return info.state
        return "missing"

    def _list(self) -> list:
        try:
            return self.client.list(extended=True)
        except (AdbError, OSError, EOFError) as e:
            raise DeviceDisconnected(0.0, f"adb server at {self.client.host}:{self.client.port}: {e}") from e

    def _resolve(self) -> int | None:
        """The device's transport id (None when the server does not report one: fall back to the serial)."""
        for info in self._list():
            if info.serial == self.serial:
                if info.state != "device":
                    raise DeviceDisconnected(0.0, f"{self.serial} is {info.state}")
                return info.transport_id
        raise DeviceDisconnected(0.0, f"{self.serial} is not attached to the adb server")

    def _handle(self) -> adbutils.AdbDevice:
        if self._transport_id is None:
            self._transport_id = self._resolve()
        if self._transport_id is not None:
            return adbutils.AdbDevice(self.client, transport_id=self._transport_id)
        return adbutils.AdbDevice(self.client, serial=self.serial)

    def _uses_v2(self, timeout: float) -> bool:
        if self._v2 is None:
            try:
                with self._handle().open_transport("features", timeout=timeout) as c:
                    self._v2 = "shell_v2" in c.read_string_block().split(",")
            except AdbTimeout as e:
                raise DeviceHang(
                    timeout, f"{self.serial}: no answer to features within {timeout:.1f} s"
                ) from e
            except (AdbError, OSError, EOFError) as e:
                self._forget()
                raise DeviceDisconnected(0.0, f"{self.serial}: {e}") from e
        return self._v2

    def _forget(self) -> None:
        """Look the transport up again next time (it changes when a device reconnects)."""
        self._transport_id = None

    # ---- commands ----

    def shell(self, cmd: str | Sequence[str], timeout: float | None = None) -> ShellResult:
        """Run one shell line; raises DeviceHang past `timeout` seconds in all (default: the device's)."""
        line = command_line(cmd)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        v2 = self._uses_v2(timeout)
        try:
            return self._run(line, v2, deadline)
        except DeviceDisconnected:
            self._forget()
            raise

    def check(self, cmd: str | Sequence[str], timeout: float | None = None) -> str:
        """stdout of a command that must succeed (decoded, stripped); DeviceCommandFailed otherwise."""
        return self.check_bytes(cmd, timeout).decode("utf-8", errors="replace").strip()

    def check_bytes(self, cmd: str | Sequence[str], timeout: float | None = None) -> bytes:
        """Raw stdout of a command that must succeed (a screenshot); DeviceCommandFailed otherwise."""
        result = self.shell(cmd, timeout)
        if result.code != 0:
            err = (result.stderr or result.stdout)[:200].decode("utf-8", "replace").strip()
            raise DeviceCommandFailed(
                0.0, f"{self.serial}: `{command_line(cmd)[:80]}` exited {result.code}: {err}"
            )
        return result.stdout

    def _run(self, line: str, v2: bool, deadline: float) -> ShellResult:
        t0 = time.monotonic()
        try:
            conn = self._handle().open_transport(timeout=max(0.01, deadline - t0))
        except AdbTimeout as e:
            raise DeviceHang(time.monotonic() - t0, f"{self.serial}: adb did not answer") from e
        except (AdbError, OSError, EOFError) as e:
            raise DeviceDisconnected(time.monotonic() - t0, f"{self.serial}: {e}") from e
        sock = conn.conn
        try:
            conn.send_command(f"shell,v2:{line}" if v2 else f"shell:{line}; echo {_V1_MAGIC.decode()}$?")
            conn.check_okay()
            return _read_v2(sock, deadline) if v2 else _read_v1(sock, deadline)
        except (TimeoutError, AdbTimeout) as e:
            raise DeviceHang(
                time.monotonic() - t0, f"{self.serial}: `{line[:80]}` did not finish in time"
            ) from e
        except (AdbError, OSError, EOFError) as e:
            raise DeviceDisconnected(time.monotonic() - t0, f"{self.serial}: `{line[:80]}`: {e}") from e
        finally:
            sock.close()  # not conn.close(): that lingers 10 ms per command

    def screen_size(self, timeout: float | None = None) -> tuple[int, int]:
        """(width, height) in pixels from `wm size` (an override size wins over the physical one)."""
        out = self.check("wm size", timeout)
        sizes = {}
        for row in out.splitlines():
            key, _, value = row.partition(":")
            w, _, h = value.strip().partition("x")
            if w.isdigit() and h.isdigit():
                sizes[key.strip().lower()] = (int(w), int(h))
        size = sizes.get("override size") or sizes.get("physical size")
        if size is None or not (0 < size[0] <= 16384 and 0 < size[1] <= 16384):
            raise DeviceBadOutput("bad_size", f"{self.serial}: `wm size` said {out[:80]!r}")
        return size


def _recv(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Up to n bytes (b"" at end of stream), waiting no later than `deadline`."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)
    return sock.recv(n)


def _exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = _recv(sock, n - len(buf), deadline)
        if not chunk:
            raise EOFError("connection closed mid-answer")
        buf += chunk
    return bytes(buf)


def _read_v2(sock: socket.socket, deadline: float) -> ShellResult:
    """shell v2 packets: [id u8][length u32 le][data]; 1 stdout, 2 stderr, 3 exit code."""
    out, err = bytearray(), bytearray()
    while True:
        head = _exact(sock, 5, deadline)
        kind, size = head[0], int.from_bytes(head[1:], "little")
        if len(out) + len(err) + size > MAX_OUTPUT_BYTES:
            raise DeviceBadOutput("too_large", f"answer over {MAX_OUTPUT_BYTES} bytes")
        data = _exact(sock, size, deadline)
        if kind == 1:
            out += data
        elif kind == 2:
            err += data
        elif kind == 3:
            return ShellResult(bytes(out), bytes(err), data[0] if data else 255)


def _read_v1(sock: socket.socket, deadline: float) -> ShellResult:
    data = bytearray()
    while chunk := _recv(sock, 65536, deadline):
        data += chunk
        if len(data) > MAX_OUTPUT_BYTES:
            raise DeviceBadOutput("too_large", f"answer over {MAX_OUTPUT_BYTES} bytes")
    at = data.rfind(_V1_MAGIC)
    code = data[at + len(_V1_MAGIC) :].strip() if at >= 0 else b""
    if not code.isdigit():
        raise DeviceBadOutput("no_exit_code", "shell output lacks the exit-code marker")
    return ShellResult(bytes(data[:at]), b"", int(code))
