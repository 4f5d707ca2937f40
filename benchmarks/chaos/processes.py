"""The soak's processes (benchmarks/chaos/soak.py): one `Role` per process the soak runs and restarts under
the same name, its output piped into its log file by the soak (a file size limit on a learner must not
break its own output), and the readings the soak takes of them (ports, metrics, sizes, memory)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Role:
    """One process of the soak, restarted under the same name: its command and its incarnations."""

    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables added to this process's (a learner's compilation cache)."""
    proc: subprocess.Popen | None = None
    incarnation: int = 0
    restarting: bool = False
    """A restart is scheduled (after a kill, or an exit of its own)."""
    started_at: list[float] = field(default_factory=list)
    rss_mb: list[tuple[float, int, float]] = field(default_factory=list)
    """(soak seconds, incarnation, resident MB) samples."""

    def start(self, clock: float, extra: list[str] | None = None) -> None:
        """A new incarnation: its command with `extra` arguments (a multi-process learner's coordinator)."""
        self.incarnation += 1
        self.restarting = False
        self.started_at.append(clock)
        self.proc = subprocess.Popen(
            [*self.cmd, *(extra or [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "JAX_PLATFORMS": "cpu", **self.env},
        )
        threading.Thread(target=_copy, args=(self.proc, self.log), daemon=True).start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _copy(proc: subprocess.Popen, path: Path) -> None:
    with path.open("ab") as out:
        for line in proc.stdout:
            out.write(line)
            out.flush()


def metrics_lines(run_dir: Path) -> list[dict]:
    """The learner's metrics.jsonl as records."""
    lines = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # cannot happen (lines are cut back whole), but a bad line must not hide the rest
    return lines


def dir_bytes(path: Path) -> int:
    """The bytes of the files in `path` (one deleted meanwhile, a pruned log segment, counts 0)."""
    total = 0
    for item in path.glob("*"):
        with contextlib.suppress(OSError):
            total += item.stat().st_size
    return total


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
