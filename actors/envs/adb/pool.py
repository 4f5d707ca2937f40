"""The devices of one actor: attach to running phones or launch emulators, check health, recover, stop.

Attached devices (--adb.serials) are not ours: the pool never kills anything for them and only waits
for them to come back. Launched emulators (--adb.avds) run each in a process group of its own, so a
hung one is stopped with everything it started, and nothing else is ever signalled: a launched
process is not reaped until it is stopped, so its pid (the group id) cannot be reused meanwhile.

Launched emulators also die when the actor dies without stopping them (SIGKILL, a crash): each is
started through `guard.py`, which leaves a watcher in the emulator's group holding one end of a pipe
whose other end only this process holds; when that end closes, the watcher stops the whole group
(SIGTERM, then SIGKILL after `stop_grace`), the emulator's own children (qemu) included. Where the guard
cannot run (no fork: Windows) the pool says so once and launches emulators unguarded.

`stats` counts: launched (emulator processes started), boot_seconds, recover_calls, already_healthy,
recoveries (devices brought back), restarts (emulator relaunches), failed_recoveries (failed attempts),
given_up, snapshot_loads, stopped (emulators stopped), sigkills (emulators that ignored SIGTERM).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import adbutils
from adbutils.errors import AdbError

from actors.envs.adb.config import AdbConfig
from actors.envs.adb.console import EmulatorConsole
from actors.envs.adb.device import AdbDevice
from actors.envs.faults import DeviceCrash, DeviceDisconnected, DeviceFault, DeviceHang

MAX_BACKOFF_S = 60.0
PROGRESS_EVERY_S = 10.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
EMULATOR_SERIAL = re.compile(r"emulator-(\d+)")
GUARD = Path(__file__).with_name("guard.py")
"""Runs each launched emulator so that it dies with the actor."""
GUARDED = hasattr(os, "fork") and bool(sys.executable)
"""The guard can run here (it forks its watcher); elsewhere (Windows) emulators are launched unguarded."""
STATE_HINTS = {
    "missing": "plug it in (or `adb connect` it) and check `adb devices`",
    "unauthorized": "accept the USB debugging prompt on the phone",
    "offline": "reconnect it (or run `adb reconnect offline`); it may also be rebooting",
}


class DevicePoolError(RuntimeError):
    """The pool cannot provide a device it was asked for: bad configuration, device absent, failed boot."""


@dataclass
class _Emulator:
    avd: str
    port: int
    log_path: Path
    proc: subprocess.Popen | None = None


@dataclass
class _Slot:
    serial: str
    emulator: _Emulator | None
    """None: an attached device, not ours to stop."""
    failures: int = 0
    given_up: bool = False


class DevicePool:
    """The devices named by an AdbConfig. `sleep` and `clock` pace backoff and polling (tests fake them)."""

    poll_interval: float = 0.5
    """Seconds between checks while a device boots or comes back."""
    stop_grace: float = 10.0
    """Seconds a launched emulator has to exit after SIGTERM before its process group gets SIGKILL."""

    def __init__(
        self,
        cfg: AdbConfig,
        log: Callable[[str], object] = print,
        *,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        log_dir: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.stats: collections.Counter = collections.Counter()
        self._log, self._sleep, self._clock = log, sleep, clock
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._slots: dict[str, _Slot] = {}
        self._devices: dict[str, AdbDevice] = {}
        self._lock = threading.Lock()
        self._alive: tuple[int, int] | None = None
        """The pipe (read end, write end) every emulator's guard watches; only this process writes to it."""
        self._unguarded_warned = False

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def serials(self) -> list[str]:
        return list(self._slots)

    # ---- start ----

    def start(self) -> list[str]:
        """Attach to cfg.serials or launch cfg.avds and wait for them to boot; the usable serials."""
        cfg = self.cfg
        if self._slots:
            raise DevicePoolError("the device pool was already started")
        if cfg.serials and cfg.avds:
            raise DevicePoolError("pass --adb.serials (running devices) or --adb.avds (emulators), not both")
        if not cfg.serials and not cfg.avds:
            raise DevicePoolError(
                "no devices: pass --adb.serials SERIAL... (as `adb devices` lists them) "
                "or --adb.avds AVD... (as `emulator -list-avds` lists them)"
            )
        if cfg.max_restarts < 0 or cfg.restart_backoff < 0 or cfg.boot_timeout <= 0 or cfg.reset_timeout <= 0:
            raise DevicePoolError(
                "--adb.max-restarts and --adb.restart-backoff must be >= 0, "
                "--adb.boot-timeout and --adb.reset-timeout > 0"
            )
        try:
            self._attach() if cfg.serials else self._launch_all()
        except BaseException:
            self.close()
            self._slots.clear()
            self._devices.clear()
            raise
        return self.serials

    def _attach(self) -> None:
        cfg = self.cfg
        if len(set(cfg.serials)) != len(cfg.serials) or not all(cfg.serials):
            raise DevicePoolError(f"--adb.serials must name distinct devices, not {list(cfg.serials)}")
        listed = self._listing()
        problems = []
        for serial in cfg.serials:
            state = listed.get(serial, "missing")
            if state != "device":
                problems.append(f"{serial} is {state}: {STATE_HINTS.get(state, 'wait until it is ready')}")
        if problems:
            shown = ", ".join(f"{s} ({state})" for s, state in listed.items()) or "no device"
            raise DevicePoolError(
                f"cannot attach: {'; '.join(problems)}. The adb server at {cfg.host}:{cfg.port} lists {shown}."
            )
        self._slots = {s: _Slot(s, None) for s in cfg.serials}
        self._log(f"attached to {', '.join(cfg.serials)}")

    def _listing(self) -> dict[str, str]:
        """serial -> state, as `adb devices` shows them."""
        client = adbutils.AdbClient(
            host=self.cfg.host, port=self.cfg.port, socket_timeout=self.cfg.command_timeout
        )
        try:
            return {info.serial: info.state for info in client.list()}
        except (AdbError, OSError, EOFError) as e:
            raise DevicePoolError(
                f"no adb server at {self.cfg.host}:{self.cfg.port} ({e}); start one with `adb start-server`"
            ) from e

    def _launch_all(self) -> None:
        cfg = self.cfg
        first, last = cfg.emulator_port, cfg.emulator_port + 2 * len(cfg.avds) - 1
        if first % 2 or first < 1024 or last > 65535:
            raise DevicePoolError(
                f"--adb.emulator-port must be even and leave room for {len(cfg.avds)} emulators "
                f"(ports {first}..{last}), not {first}"
            )
        if first < 5554 or last > 5585:
            self._log(
                f"warning: adb looks for emulators on ports 5554..5585 by default; {first}..{last} is outside"
            )
        log_dir = self._log_dir or Path(tempfile.mkdtemp(prefix="adb-emulators-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        for i, avd in enumerate(cfg.avds):
            port = first + 2 * i
            self._slots[f"emulator-{port}"] = _Slot(
                f"emulator-{port}", _Emulator(avd, port, log_dir / f"emulator-{port}.log")
            )
        for slot in self._slots.values():
            self._launch(slot)
        for slot in self._slots.values():  # they boot in parallel
            self._count("boot_seconds", self._wait_ready(slot, cfg.boot_timeout, "booting"))
            self._log(f"{slot.serial} booted")

    def _launch(self, slot: _Slot) -> None:
        emu = slot.emulator
        assert emu is not None
        busy = [p for p in (emu.port, emu.port + 1) if not _port_free(p)]
        if busy:
            raise DevicePoolError(
                f"{slot.serial}: port {busy[0]} on 127.0.0.1 is in use (another emulator? see `adb devices`); "
                "stop it or pick another --adb.emulator-port"
            )
        cmd = [self.cfg.emulator_binary, "-avd", emu.avd, "-port", str(emu.port), *self.cfg.emulator_args]
        with emu.log_path.open("ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
            out.flush()
            emu.proc = self._spawn(cmd, out)
        self._count("launched")
        self._log(f"{slot.serial}: launched AVD {emu.avd} (pid {emu.proc.pid}), output in {emu.log_path}")

    def _spawn(self, cmd: list[str], out: BinaryIO) -> subprocess.Popen:
        """Start `cmd` as the leader of a new process group (and session), through the guard where it can
        run, so that it dies with this process. DevicePoolError if it cannot be run."""
        popen = functools.partial(
            subprocess.Popen,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        alive = self._alive_pipe()
        proc = None
        try:
            if alive is None:
                return popen(cmd)
            error_r, error_w = os.pipe()
            try:
                try:
                    args = [str(GUARD), str(alive), str(error_w), str(self.stop_grace), "--", *cmd]
                    proc = popen([sys.executable, "-I", "-S", *args], pass_fds=(alive, error_w))
                finally:
                    os.close(error_w)
                failure = _read_all(error_r).decode("utf-8", "replace")  # EOF: the emulator runs
            finally:
                os.close(error_r)
            if failure:
                raise DevicePoolError(self._cannot_run(failure))
            return proc
        except BaseException as e:
            if proc is not None:  # not reaped yet: the group id is still ours
                _signal_group(proc.pid, signal.SIGKILL)  # the launcher and the guard's watcher
                proc.wait()
            if isinstance(e, OSError):
                raise DevicePoolError(self._cannot_run(e)) from e
            raise

    def _cannot_run(self, reason: object) -> str:
        return (
            f"cannot run the emulator {self.cfg.emulator_binary!r} ({reason}); "
            "pass --adb.emulator-binary $ANDROID_HOME/emulator/emulator"
        )

    def _alive_pipe(self) -> int | None:
        """The read end of the pipe the guards watch (made on first use); None where no guard can run."""
        with self._lock:
            if self._alive is None:
                if not GUARDED:
                    if not self._unguarded_warned:
                        self._unguarded_warned = True
                        self._log(
                            "warning: on this platform emulators launched with --adb.avds are not stopped "
                            "if the actor is killed (SIGKILL); only a normal stop stops them"
                        )
                    return None
                self._alive = os.pipe()  # not inheritable: no other child of this process holds an end
            return self._alive[0]

    def _wait_ready(self, slot: _Slot, timeout: float, doing: str) -> float:
        """Poll until the device is listed as "device" and sys.boot_completed is 1; the seconds waited.
        DevicePoolError past `timeout`, or as soon as a launched emulator exits."""
        dev = self.device(slot.serial)
        t0 = self._clock()
        note = t0 + PROGRESS_EVERY_S
        while True:
            emu = slot.emulator
            if emu is not None and (code := _exit_status(emu.proc)) is not None:
                raise DevicePoolError(
                    f"{slot.serial}: the emulator (AVD {emu.avd}) exited with status {code} while {doing}"
                    f"{_tail(emu.log_path)}"
                )
            seen = _readiness(dev)
            now = self._clock()
            if seen == "ready":
                return now - t0
            if now - t0 >= timeout:
                raise DevicePoolError(
                    f"{slot.serial}: not ready after {timeout:.0f} s of {doing} (last seen: {seen})"
                    + (_tail(emu.log_path) if emu else "")
                )
            if now >= note:
                self._log(f"{slot.serial}: {doing}, {now - t0:.0f} s of {timeout:.0f} s: {seen}")
                note += PROGRESS_EVERY_S
            self._sleep(self.poll_interval)

    # ---- use ----

    def device(self, serial: str) -> AdbDevice:
        """The device's AdbDevice (one per serial, shared, so a refreshed transport serves everyone)."""
        self._slot(serial)
        with self._lock:
            if serial not in self._devices:
                cfg = self.cfg
                self._devices[serial] = AdbDevice(serial, cfg.host, cfg.port, cfg.command_timeout)
            return self._devices[serial]

    def pid(self, serial: str) -> int | None:
        """The launched emulator's pid (None for an attached device or a stopped emulator)."""
        emu = self._slot(serial).emulator
        return emu.proc.pid if emu is not None and emu.proc is not None else None

    def healthy(self, serial: str) -> bool:
        """Listed as "device", answers `echo ok` within the command timeout, and (if launched) running."""
        emu = self._slot(serial).emulator
        if emu is not None and (emu.proc is None or _exit_status(emu.proc) is not None):
            return False
        dev = self.device(serial)
        for attempt in range(2):  # a changed transport id fails once, then is looked up again
            try:
                return dev.state() == "device" and dev.check("echo ok") == "ok"
            except DeviceDisconnected:
                if attempt:
                    return False
            except DeviceFault:
                return False
        return False

    def recover(self, serial: str) -> None:
        """Bring an unhealthy device back, blocking: relaunch a launched emulator, wait for an attached device.
        Backoff before each attempt, doubling; DeviceCrash after cfg.max_restarts failed attempts in a row."""
        cfg, slot = self.cfg, self._slot(serial)
        self._count("recover_calls")
        if slot.given_up:
            raise DeviceCrash(0.0, f"{serial} was given up after {slot.failures} failed recoveries")
        if self.healthy(serial):
            self._count("already_healthy")
            return
        t0 = self._clock()
        error: Exception | None = None
        while slot.failures < cfg.max_restarts:
            delay = min(cfg.restart_backoff * 2 ** min(slot.failures, 16), MAX_BACKOFF_S)
            self._log(
                f"{serial}: unhealthy; recovery attempt {slot.failures + 1} of {cfg.max_restarts} in {delay:.0f} s"
            )
            self._sleep(delay)
            try:
                if slot.emulator is not None:
                    self._stop(slot, console=False)
                    self._count("restarts")
                    self._launch(slot)
                    self._count("boot_seconds", self._wait_ready(slot, cfg.boot_timeout, "booting"))
                else:
                    self._wait_ready(slot, cfg.reset_timeout, "waiting for it to come back")
            except (DevicePoolError, DeviceFault) as e:
                error = e
                slot.failures += 1
                self._count("failed_recoveries")
                self._log(f"{serial}: recovery attempt {slot.failures} failed: {e}")
                continue
            slot.failures = 0
            self._count("recoveries")
            self._log(f"{serial}: recovered in {self._clock() - t0:.0f} s")
            return
        slot.given_up = True
        self._count("given_up")
        self._stop(slot, console=False)
        reason = error or "--adb.max-restarts is 0"
        raise DeviceCrash(
            self._clock() - t0,
            f"{serial} is given up after {slot.failures} failed recoveries in a row: {reason}",
        ) from error

    def load_snapshot(self, serial: str, name: str) -> None:
        """Load an emulator snapshot through the emulator console, then wait until the device answers."""
        cfg = self.cfg
        self._slot(serial)
        match = EMULATOR_SERIAL.fullmatch(serial)
        if match is None:
            raise ValueError(f"{serial} is not an emulator (emulator-PORT): snapshots are for emulators only")
        if cfg.host not in LOCAL_HOSTS:
            raise ValueError(
                f"{serial}: snapshots need the emulator console on this machine, but adb is at {cfg.host}"
            )
        t0 = self._clock()
        with EmulatorConsole(int(match.group(1)), timeout=cfg.command_timeout) as console:
            console.load_snapshot(name, timeout=cfg.reset_timeout)
        self._count("snapshot_loads")
        while not self.healthy(serial):
            if self._clock() - t0 >= cfg.reset_timeout:
                raise DeviceHang(
                    self._clock() - t0, f"{serial} did not answer after loading snapshot {name!r}"
                )
            self._sleep(self.poll_interval)

    # ---- stop ----

    def close(self) -> None:
        """Stop every emulator this pool launched (console `kill`, then its process group). Idempotent."""
        for slot in list(self._slots.values()):
            self._stop(slot, console=True)
        with self._lock:
            alive, self._alive = self._alive, None
        if alive is not None:  # a guard still watching (none should be) now stops its group
            for fd in alive:
                os.close(fd)

    def _stop(self, slot: _Slot, *, console: bool) -> None:
        emu = slot.emulator
        proc = emu.proc if emu is not None else None
        if emu is None or proc is None:
            return
        emu.proc = None
        if console and _exit_status(proc) is None:
            try:
                with EmulatorConsole(emu.port, timeout=min(self.cfg.command_timeout, 5.0)) as c:
                    c.kill()
            except DeviceFault as e:
                self._log(f"{slot.serial}: console kill failed ({e}); signalling it")
        if proc.returncode is None:  # not reaped: the group id is still ours
            _signal_group(proc.pid, signal.SIGTERM)
            _signal_group(proc.pid, signal.SIGCONT)  # a stopped process handles SIGTERM only once resumed
            deadline = time.monotonic() + self.stop_grace
            while _exit_status(proc) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if _exit_status(proc) is None:
                self._count("sigkills")
                self._log(f"{slot.serial}: still running {self.stop_grace:.0f} s after SIGTERM; SIGKILL")
            _signal_group(proc.pid, signal.SIGKILL)  # also whatever it left behind in its group
            proc.wait()
        self._count("stopped")

    # ---- helpers ----

    def _slot(self, serial: str) -> _Slot:
        slot = self._slots.get(serial)
        if slot is None:
            raise ValueError(f"{serial!r} is not in this device pool ({', '.join(self._slots) or 'empty'})")
        return slot

    def _count(self, key: str, n: float = 1) -> None:
        with self._lock:
            self.stats[key] += n


def _readiness(dev: AdbDevice) -> str:
    """ "ready", or what is missing."""
    try:
        state = dev.state()
        if state != "device":
            return f"adb lists it as {state}"
        if dev.shell("getprop sys.boot_completed").text != "1":
            return "booting (sys.boot_completed is not 1)"
        return "ready"
    except DeviceFault as e:
        return f"no answer ({e})"


def _exit_status(proc: subprocess.Popen | None) -> int | None:
    """A launched process's exit status (negative: killed by that signal), None while it runs.
    Does not reap it, so its pid, and with it its process group id, stays ours until `_stop`."""
    if proc is None:
        return -1
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped by someone else: its group id may be reused, never signal it
        proc.returncode = -1
        return -1
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port (connections lingering in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tail(path: Path, lines: int = 15) -> str:
    """The last lines the latest launch wrote to an emulator's log, to put in an error message."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    text = text.rpartition("\n=== ")[2].partition("\n")[2]  # after the latest launch's header line
    return f"; last lines of {path}:\n" + "\n".join(text.splitlines()[-lines:])
