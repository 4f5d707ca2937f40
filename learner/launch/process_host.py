"""`ProcessHost`: one `python -m ...` subprocess on the node Ray placed it on (learner/launch/cluster.py).

`launch` makes it a Ray actor (`ray.remote(ProcessHost)`), so Ray places it by resources and restarts it
(a new subprocess, from the same constructor arguments) when the launcher asks or its worker dies. The
launcher pulls the subprocess's output lines with `drain`, reads files it writes on its node
(`read_text`, and `new_lines` for the lines a run appends to RUN_DIR/metrics.jsonl) and stops it with
`stop`.

Files the process needs on its node (CURVE keys) come as constructor arguments and are written to
FILES_ROOT/<launch id>/<name>/ (folders 0700, files 0600), which `{files}` in argv names. A restart
writes them again over the same folder; `stop` deletes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

FILES_ROOT = Path(tempfile.gettempdir())
"""Where each launch's per-process files go on a node: FILES_ROOT/distrl-launch-<id>/<name>/."""


def files_dir(launch_id: str, name: str) -> Path:
    return FILES_ROOT / f"distrl-launch-{launch_id}" / name


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the ProcessHost that started it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def write_private(directory: Path, files: dict[str, bytes]) -> None:
    """`files` (relative path -> content) under `directory`, replacing what was there; only this user
    can read them (folders 0700, files 0600, set before any byte is written)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o700)
    directory.mkdir(mode=0o700)
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(content)


class ProcessHost:
    """One subprocess and its queued output lines; a Ray actor in `launch`."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        remove_first: list[str],
        files: dict[str, bytes] | None = None,
        launch_id: str = "",
        follow: list[str] | None = None,
    ):
        import ray

        self.name = name
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        for path in remove_first:  # a reused run dir: wait for this run's file, not the last one's
            Path(path).unlink(missing_ok=True)
        # Files `new_lines` reads: only what this run appends (a reused run dir keeps the last one's lines).
        self.offsets = {path: _size(path) for path in follow or []}
        self.files: Path | None = None
        if files:
            self.files = files_dir(launch_id, name)
            write_private(self.files, files)
        subs = {"{node_ip}": self.node_ip, "{pid}": str(os.getpid()), "{files}": str(self.files)}
        for key, value in subs.items():
            argv = [a.replace(key, value) for a in argv]
        self.argv = argv
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.eof = False
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_die_with_parent,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self.cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def info(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid,
            "node_ip": self.node_ip,
            "node_id": self.node_id,
            "restarted": self.restarted,
        }

    def drain(self, wait: float) -> tuple[list[str], int | None]:
        """Output lines since the last call (waiting up to `wait` s for one), and the exit status once the
        process has exited and all its output is in those lines (else None)."""
        with self.cond:
            if not self.lines and not self.eof:
                self.cond.wait(wait)
            lines, self.lines = self.lines, []
            eof = self.eof
        return lines, (self.proc.wait() if eof else None)

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def new_lines(self, path: str) -> list[str]:
        """The complete lines appended to `path` (one of `follow`) since the last call, or since this
        host started the process."""
        start = self.offsets.get(path, 0)
        if _size(path) < start:  # replaced or truncated: read it from the start
            start = 0
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for the next call
        self.offsets[path] = start + len(complete)
        return complete.decode(errors="replace").splitlines()

    def stop(self, grace: float) -> tuple[list[str], int]:
        """SIGTERM, SIGKILL after `grace` s; the remaining output and the exit status. Deletes the files."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if self.files is not None:
            shutil.rmtree(self.files, ignore_errors=True)
            with contextlib.suppress(OSError):  # the launch's folder, once its last process has stopped
                self.files.parent.rmdir()
        with self.cond:
            self.cond.wait_for(lambda: self.eof, timeout=5)
            lines, self.lines = self.lines, []
        return lines, rc
