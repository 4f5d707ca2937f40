"""Run an emulator that dies with its actor: `python -I -S guard.py ALIVE_FD ERROR_FD GRACE -- EMULATOR ARGS...`.

The device pool starts this script as the leader of a process group of its own (`start_new_session`).
It forks a watcher (twice, so the watcher is nobody's child but init's and the emulator never sees it),
then execs the emulator in its own place: the emulator keeps the pid, and with it the group id, that the
pool knows. ERROR_FD is closed by that exec; if the exec fails, the reason is written there instead.

The watcher blocks reading ALIVE_FD, the read end of a pipe whose only write end is held by the actor.
When the actor exits, however it exits (SIGKILL and crashes included), the kernel closes that end, the
read returns EOF, and the watcher stops the whole group: SIGTERM (and SIGCONT), up to GRACE seconds for
the emulator to exit, then SIGKILL to everything left in the group, the emulator's own children (qemu)
and the watcher included. While the actor lives the watcher only waits; it ignores SIGTERM, and the
pool's own stop (SIGTERM, then SIGKILL to the group) ends it with the rest.

The watcher is a member of the group, so the group id cannot be taken by an unrelated process while it
lives: it never signals a stranger. Stdlib only, started with -I -S: nothing of the actor's is imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: guard.py ALIVE_FD ERROR_FD GRACE -- EMULATOR [ARGS...]", file=sys.stderr)
        return 2
    alive_fd, error_fd, grace, cmd = int(argv[0]), int(argv[1]), float(argv[2]), argv[4:]
    os.set_inheritable(alive_fd, False)  # the emulator gets neither pipe
    os.set_inheritable(error_fd, False)
    middle = os.fork()
    if middle == 0:
        status = 1
        try:
            os.close(error_fd)  # the pool reads it until EOF: only the emulator's exec may close it
            if os.fork() == 0:
                _watch(alive_fd, grace)
            status = 0
        finally:
            os._exit(status)
    if os.waitpid(middle, 0)[1] != 0:
        os.write(error_fd, b"could not start the watcher that stops the emulator when the actor dies")
        return 127
    os.close(alive_fd)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        os.write(error_fd, f"[Errno {e.errno}] {e.strerror}: {cmd[0]!r}".encode())
    return 127


def _watch(alive_fd: int, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.chdir("/")
    os.closerange(3, alive_fd)
    os.closerange(alive_fd + 1, 1 << 16)
    while True:
        try:
            if not os.read(alive_fd, 4096):
                break
        except OSError:
            break
    group = os.getpgrp()  # == the emulator's pid
    try:
        with contextlib.suppress(Exception):  # the log may be gone: stop the group all the same
            print(f"guard: the actor is gone; stopping process group {group}", flush=True)
        _signal_group(group, signal.SIGTERM)
        _signal_group(group, signal.SIGCONT)  # a stopped emulator handles SIGTERM only once resumed
        deadline = time.monotonic() + grace
        while _running(group) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        _signal_group(group, signal.SIGKILL)  # whatever is left, this watcher included
        os._exit(0)


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(OSError):
        os.killpg(group, sig)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan is reaped by init, which may take its time)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] not in ([b"Z"], [b"X"], [])
    except FileNotFoundError:
        if os.path.exists("/proc/self/stat"):
            return False
    except OSError:
        pass
    try:  # no /proc: a zombie counts as running, so the grace runs out before SIGKILL
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
