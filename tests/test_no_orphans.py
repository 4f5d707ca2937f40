"""No orphans: the emulators a real `python -m actors --adb.avds ...` launched die with it, however it dies.

The actor launches two fake emulators (tests/fake_emulator.py), each with a child standing in for qemu,
through the fake adb server, and waits for a learner that never answers. Killed with SIGKILL it cannot
stop them itself: the guard each emulator was started through (actors/envs/adb/guard.py) does. Stopped
with SIGTERM, it stops them itself, through the emulator console, as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.actor_command import actor_command
from tests.conftest import ACTOR_ENV, ROOT, START_S
from tests.fake_adb import FakeAdbServer
from tests.test_adb_pool import FAKE_EMULATOR, group_members, port_free, running

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="reads /proc; the guard is tested on Linux"
    ),
]

GONE_S = 10.0
"""How soon after the actor's death its emulators must be gone (the guard takes well under a second)."""


def free_even_port(width: int) -> int:
    for port in range(20000 + 2 * (os.getpid() % 5000), 60000, 2):
        if all(port_free(p) for p in range(port, port + width)):
            return port
    raise RuntimeError("no free ports")


class ActorWithEmulators:
    """`python -m actors --backend adb --adb.avds Pixel Tablet` on a fake adb server, its output collected."""

    def __init__(self, tmp_path: Path) -> None:
        self.pid_dir = tmp_path / "pids"
        self.pid_dir.mkdir()
        self.tmp = tmp_path
        base = free_even_port(6)
        self.emulator_ports = (base, base + 2)
        learner_ports = (base + 4, base + 5)  # nothing listens there: the actor keeps trying to join
        emulator = tmp_path / "emulator"
        emulator.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_EMULATOR}" "$@"\n')
        emulator.chmod(0o755)
        self.server = FakeAdbServer(emulator_ports=self.emulator_ports).__enter__()
        self.proc: subprocess.Popen | None = None
        env = {k: v for k, v in ACTOR_ENV.items() if not k.startswith("FAKE_EMULATOR_")}
        env.update(
            ADBUTILS_ADB_PATH="/bin/false",  # adbutils never starts a real adb server
            HOME=str(tmp_path),
            TMPDIR=str(tmp_path),  # the emulators' logs go to a temporary folder
            FAKE_EMULATOR_PID_DIR=str(self.pid_dir),
            FAKE_EMULATOR_CHILD="1",
        )
        cmd = actor_command(
            host="127.0.0.1", ingest_port=learner_ports[0], params_port=learner_ports[1], env="adb",
            extra=(
                "--adb.port", str(self.server.port), "--adb.avds", "Pixel", "Tablet",
                "--adb.emulator-binary", str(emulator), "--adb.emulator-port", str(base),
                "--adb.command-timeout", "2", "--status-every", "1000",
            ),
        )  # fmt: skip
        self.cmd, self.env = cmd, env
        self.lines: list[str] = []

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while "2 device(s) ready" not in self.output:
            assert self.proc.poll() is None, f"the actor exited early:\n{self.output}"
            assert time.monotonic() < deadline, f"the emulators did not boot:\n{self.output}"
            time.sleep(0.05)

    def pids(self) -> tuple[list[int], list[int]]:
        """The fake emulators' pids and their children's."""
        names = [f.name for f in self.pid_dir.iterdir()]
        emulators = sorted(int(n.split(".")[1]) for n in names if not n.startswith("child-"))
        children = sorted(int(n.split(".")[1]) for n in names if n.startswith("child-"))
        return emulators, children

    def emulator_logs(self) -> list[str]:
        return [path.read_text() for path in sorted(self.tmp.glob("adb-emulators-*/emulator-*.log"))]

    def close(self) -> None:
        """Stop everything this test started, whatever state the test left it in."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self._reader.join(timeout=5)
            self.proc.stdout.close()
        emulators, children = self.pids()
        for pid in emulators:  # its group: the emulator, its child and the guard's watcher, if still there
            for member in group_members(pid):
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{member}/cmdline").read_bytes()
                    if any(name in cmdline for name in (b"fake_emulator.py", b"guard.py", b"sleep")):
                        os.kill(member, signal.SIGKILL)
        for pid in children:  # a child left behind outside the group
            with contextlib.suppress(OSError):
                if running(pid) and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                    os.kill(pid, signal.SIGKILL)
        self.server.close()


@pytest.fixture
def actor(tmp_path):
    a = ActorWithEmulators(tmp_path)
    try:
        a.start()
        yield a
    finally:
        a.close()


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still running after `timeout` seconds (a zombie waiting for init to reap it is gone)."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def wait_ports_free(ports: list[int], timeout: float) -> list[int]:
    """The ports still bound after `timeout` seconds: a dying process's threads close its sockets after
    /proc already shows its leader as a zombie, so the ports are polled, not checked once."""
    deadline = time.monotonic() + timeout
    while (bound := [p for p in ports if not port_free(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return bound


def test_emulators_die_when_the_actor_is_killed(actor):
    actor.wait_ready()
    emulators, children = actor.pids()
    assert len(emulators) == 2 and len(children) == 2
    watched = [member for pid in emulators for member in group_members(pid)]
    assert len(watched) == 6  # per emulator: itself, its child (as qemu), the guard's watcher
    assert {*emulators, *children} < set(watched)
    actor.proc.kill()  # SIGKILL: no handler, no finally, no atexit
    actor.proc.wait()
    left = wait_gone(watched, GONE_S)
    assert not left, f"still running {GONE_S:.0f} s after the actor was killed: {left}\n{actor.output}"
    bound = wait_ports_free([p for port in actor.emulator_ports for p in (port, port + 1)], GONE_S)
    assert not bound, f"ports still bound {GONE_S:.0f} s after the emulators died: {bound}"
    logs = actor.emulator_logs()
    assert len(logs) == 2
    assert all("guard: the actor is gone" in log and "console kill" not in log for log in logs), logs


def test_emulators_are_stopped_cleanly_when_the_actor_stops(actor):
    actor.wait_ready()
    emulators, children = actor.pids()
    watched = [member for pid in emulators for member in group_members(pid)]
    assert len(watched) == 6 and {*emulators, *children} < set(watched)
    actor.proc.send_signal(signal.SIGTERM)
    assert actor.proc.wait(timeout=START_S) == 0, actor.output
    assert not wait_gone(watched, GONE_S)
    assert "actor: stopped (SIGTERM)" in actor.output
    logs = actor.emulator_logs()
    assert len(logs) == 2
    # the actor stopped them itself, through the console, before the guard could notice anything
    assert all("INFO: console kill" in log and "guard:" not in log for log in logs), logs
