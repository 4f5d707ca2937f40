"""A minimal client of the Android emulator console (what `adb emu` talks to), for snapshots and stopping.

The console is a line protocol on 127.0.0.1:PORT (the emulator's even port; adb is PORT+1): a banner
ending in "OK", `auth TOKEN` when the banner asks for it (the token is in ~/.emulator_console_auth_token),
then one command per line, each answered by zero or more lines and a final "OK" or "KO: reason".

It only ever connects to 127.0.0.1: the console listens on the emulator's machine alone, and a console
can stop the emulator, so nothing here takes a host. Every read has a deadline; failures are device
faults by cause: refused or closed -> DeviceDisconnected, silence -> DeviceHang, KO -> DeviceCommandFailed.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

from actors.envs.faults import DeviceBadOutput, DeviceCommandFailed, DeviceDisconnected, DeviceHang

CONSOLE_HOST = "127.0.0.1"
MAX_ANSWER_BYTES = 64 * 1024
"""Longest banner or answer accepted (real ones are a few hundred bytes)."""


def default_token_path() -> Path:
    """Where the emulator writes the console's auth token (it creates the file on first start)."""
    return Path.home() / ".emulator_console_auth_token"


class EmulatorConsole:
    """One console connection; use as a context manager. `timeout` bounds each command (and the banner)."""

    def __init__(self, port: int, *, timeout: float = 10.0, token_path: str | Path | None = None) -> None:
        if not 0 < port < 65536:
            raise ValueError(f"console port must be in 1..65535, not {port}")
        self.port = port
        self.timeout = timeout
        self.token_path = Path(token_path) if token_path is not None else default_token_path()
        self._sock: socket.socket | None = None
        self._buf = b""

    def __repr__(self) -> str:
        return f"EmulatorConsole({CONSOLE_HOST}:{self.port})"

    def __enter__(self) -> EmulatorConsole:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Connect, read the banner, and authenticate if the banner asks for it."""
        t0 = time.monotonic()
        try:
            self._sock = socket.create_connection((CONSOLE_HOST, self.port), timeout=self.timeout)
        except TimeoutError as e:
            raise DeviceHang(time.monotonic() - t0, f"{self}: connect timed out") from e
        except OSError as e:
            raise DeviceDisconnected(
                time.monotonic() - t0, f"{self}: cannot connect ({e}); is the emulator running?"
            ) from e
        try:
            banner = self._answer("the banner", time.monotonic() + self.timeout)
            if any("Authentication required" in line for line in banner):
                self.command(f"auth {self._token()}", what="auth")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def command(self, line: str, *, timeout: float | None = None, what: str | None = None) -> list[str]:
        """Send one command line; the lines before its "OK". `what` names it in errors (hides secrets)."""
        if "\n" in line or "\r" in line:
            raise ValueError(f"a console command is one line, not {line!r}")
        if self._sock is None:
            raise DeviceDisconnected(0.0, f"{self}: not connected")
        what = what or f"`{line}`"
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            self._sock.sendall(line.encode() + b"\r\n")
        except OSError as e:
            raise DeviceDisconnected(0.0, f"{self}: sending {what}: {e}") from e
        return self._answer(what, deadline)

    def load_snapshot(self, name: str, timeout: float | None = None) -> None:
        """`avd snapshot load NAME`; DeviceCommandFailed when the emulator refuses (e.g. no such snapshot)."""
        if not name or not name.isprintable() or any(c.isspace() for c in name):
            raise ValueError(f"a snapshot name is one printable word, not {name!r}")
        self.command(f"avd snapshot load {name}", timeout=timeout)

    def kill(self) -> None:
        """Ask the emulator to exit; it answers "OK: killing emulator, bye bye" and closes the connection."""
        with contextlib.suppress(DeviceDisconnected):  # closed before answering: it is going away anyway
            self.command("kill")

    # ---- reading ----

    def _token(self) -> str:
        try:
            token = self.token_path.read_text().strip()
        except OSError as e:
            raise DeviceCommandFailed(
                0.0, f"{self} asks for authentication but the token file {self.token_path} is unreadable: {e}"
            ) from e
        if not token or "\n" in token:
            raise DeviceCommandFailed(0.0, f"{self}: the token file {self.token_path} holds no single token")
        return token

    def _answer(self, what: str, deadline: float) -> list[str]:
        """Lines up to a final "OK" (returned without it) or "KO: reason" (DeviceCommandFailed)."""
        lines: list[str] = []
        total = 0
        while True:
            line = self._line(what, deadline)
            total += len(line)
            if total > MAX_ANSWER_BYTES:
                raise DeviceBadOutput(
                    "console_too_long", f"{self}: answer to {what} over {MAX_ANSWER_BYTES} bytes"
                )
            if line == "OK" or line.startswith("OK:"):
                return lines
            if line == "KO" or line.startswith("KO:"):
                reason = line.removeprefix("KO").lstrip(": ")
                raise DeviceCommandFailed(0.0, f"{self}: {what} failed: KO: {reason}")
            lines.append(line)

    def _line(self, what: str, deadline: float) -> str:
        assert self._sock is not None
        t0 = time.monotonic()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeviceHang(time.monotonic() - t0, f"{self}: no answer to {what} in time")
            if len(self._buf) > MAX_ANSWER_BYTES:
                raise DeviceBadOutput(
                    "console_too_long", f"{self}: a line of the answer to {what} is too long"
                )
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(4096)
            except TimeoutError as e:
                raise DeviceHang(time.monotonic() - t0, f"{self}: no answer to {what} in time") from e
            except OSError as e:
                raise DeviceDisconnected(
                    time.monotonic() - t0, f"{self}: reading the answer to {what}: {e}"
                ) from e
            if not chunk:
                raise DeviceDisconnected(time.monotonic() - t0, f"{self}: connection closed during {what}")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\n")
        return raw.decode("utf-8", "replace").strip()
