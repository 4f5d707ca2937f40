"""The processes of `python -m benchmarks chaos` and the faults done to them.

The production configuration: a learner (fixed loopback ports, its write-ahead log pruned at every
checkpoint as in any run, `--audit-log` so an audit can still see every batch it logged), a parameter
relay, and actors (each with `--ack-log`: its own record of what was acknowledged) whose ingest traffic
goes through the fault proxy (benchmarks/chaos/proxy.py): the first takes its parameters through the
relay, the second acts on the learner's inference service (`--inference remote`), the others act
locally. Every process's output is
piped into its log file by this process (a file size limit on the learner must not break its own
output). At seeded random times one fault, chosen in turn from FAULTS:
- `kill`: SIGKILL a random process, restarted after 0.5-3 s (the learner on the same run dir and ports);
- `stop`: SIGSTOP a random process for 0.5-4 s, then SIGCONT;
- `disk`: the learner's file size limit (RLIMIT_FSIZE) set to its newest log segment's size for 1-5 s, so
  the log cannot grow (nor any file already that large: metrics, checkpoints), then lifted.
A process that exits by itself (a learner that cannot write its files at start-up with the disk full,
say) is counted in `exits` and restarted after 1-3 s, as a supervisor would. Resident memory of every
process is sampled every 2 s.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.chaos.proxy import FaultProxy, FaultRates

FAULTS = ("kill", "stop", "disk")
REMOTE_ACTOR = 1
"""The actor that acts on the learner's inference service (actor 0 goes through the relay)."""
START_S = 600.0
"""Longest wait for a learner to bind its ports (start-up and log recovery on a busy machine)."""


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
    proc: subprocess.Popen | None = None
    incarnation: int = 0
    restarting: bool = False
    """A restart is scheduled (after a kill, or an exit of its own)."""
    started_at: list[float] = field(default_factory=list)
    rss_mb: list[tuple[float, int, float]] = field(default_factory=list)
    """(soak seconds, incarnation, resident MB) samples."""

    def start(self, clock: float) -> None:
        self.incarnation += 1
        self.restarting = False
        self.started_at.append(clock)
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
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


@dataclass
class SoakConfig:
    """What `python -m benchmarks chaos` runs."""

    out: Path
    minutes: float
    seed: int = 0
    actors: int = 3
    """Actors: the first takes its parameters from the relay, the second acts on the learner's inference
    service, the others take parameters from the learner directly and act locally."""
    fault_every_s: tuple[float, float] = (1.0, 4.0)
    """Seconds between faults, drawn uniformly."""
    calm_s: float = 120.0
    """Fault-free seconds at the end (the last restarted learner compiles and trains in them)."""
    calm_updates: int = 0
    """End the calm period early once the learner trained this many updates since the last fault (0: never
    early, the whole `calm_s`): a short soak need not wait out a calm sized for a slow compile."""
    checkpoint_every_s: float = 30.0
    env: str = "standin"
    rates: FaultRates = field(default_factory=FaultRates)


class Soak:
    """Start everything, fault it until the deadline, calm, then stop it all in order (`run`)."""

    def __init__(self, cfg: SoakConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.out = cfg.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.out / "learner"
        self.ingest, self.params, self.relay_port, self.inference = free_ports(4)
        self.proxy = FaultProxy(self.ingest, cfg.rates, cfg.seed)
        self.roles = [self._learner(), self._relay(), *(self._actor(i) for i in range(cfg.actors))]
        self.faults: Counter[str] = Counter()
        self.exits: Counter[str] = Counter()
        """Exits a process made by itself (not killed), per role: each was restarted."""
        self._turn = 0
        self.log_bytes: list[tuple[float, int]] = []
        """(soak seconds, bytes of the learner's write-ahead log) samples: bounded once checkpoints prune it."""
        self.events: list[dict] = []
        """Every fault and restart, with its soak time: the record the audit reads."""
        self._pending: list[tuple[float, int, str, Role, int]] = []  # (due, order, action, role, incarnation)
        self._order = itertools.count()
        self._t0 = time.monotonic()
        self.t0_unix = time.time()
        """The soak clock's zero in Unix seconds (the actors' ack logs carry Unix times)."""

    def clock(self) -> float:
        return time.monotonic() - self._t0

    # ---- the processes -------------------------------------------------------------------------------
    def _learner(self) -> Role:
        cmd = [sys.executable, "-m", "learner", "--run-dir", str(self.run_dir), "--bind", "127.0.0.1",
               "--ingest-port", str(self.ingest), "--params-port", str(self.params), "--inference-port", str(self.inference),
               "--local-actors", "0", "--env", self.cfg.env, "--model.text-encoder", "none", "--max-steps", "8",
               "--batch-size", "8", "--checkpoint-every", "1000000", "--checkpoint-every-s",
               str(self.cfg.checkpoint_every_s), "--durability", "fsync", "--audit-log", "--warmup-demos", "0",
               "--warmup-updates", "0", "--max-policy-lag", "0", "--actor-timeout", "10", "--log-every", "1",
               "--console", "lines", "--no-tensorboard"]  # fmt: skip
        return Role("learner", cmd, self.out / "learner.log")

    def _relay(self) -> Role:
        cmd = [sys.executable, "-m", "actors", "relay", "--host", "127.0.0.1", "--params-port", str(self.params),
               "--port", str(self.relay_port), "--status-every", "0", "--endpoint-file", str(self.out / "relay.json")]  # fmt: skip
        return Role("relay", cmd, self.out / "relay.log")

    def _actor(self, i: int) -> Role:
        params = ["--params-endpoint", f"tcp://127.0.0.1:{self.relay_port}"] if i == 0 else []
        params += ["--inference", "remote"] if i == REMOTE_ACTOR else []
        cmd = [sys.executable, "-m", "actors", "--host", "127.0.0.1", "--ingest-port", str(self.proxy.port),
               "--params-port", str(self.params), *params, "--env", self.cfg.env, "--num-envs", "4",
               "--seed", str(self.cfg.seed * 100 + i), "--ack-log", str(self.out / f"acks-actor{i}.jsonl"),
               "--ack-timeout", "6", "--learner-timeout", "6", "--heartbeat-every", "0.5", "--flush-timeout", "60",
               "--status-every", "30"]  # fmt: skip
        return Role(f"actor{i}", cmd, self.out / f"actor{i}.log")

    @property
    def learner(self) -> Role:
        return self.roles[0]

    def _wait_for_learner(self) -> None:
        endpoints = self.run_dir / "endpoints.json"
        deadline = time.monotonic() + START_S
        while not endpoints.exists():
            if not self.learner.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the learner did not start: see {self.learner.log}")
            time.sleep(0.1)

    def _start(self, role: Role) -> None:
        if role is self.learner:
            (self.run_dir / "endpoints.json").unlink(missing_ok=True)
        role.start(self.clock())
        self.events.append(
            {"t": self.clock(), "event": "start", "role": role.name, "incarnation": role.incarnation}
        )

    # ---- the soak ------------------------------------------------------------------------------------
    def run(self) -> None:
        self.proxy.start()
        self._start(self.learner)
        self._wait_for_learner()
        for role in self.roles[1:]:
            self._start(role)
        end_faults = self.cfg.minutes * 60 - self.cfg.calm_s
        next_fault = self.clock() + self._gap()
        next_sample = 0.0
        while self.clock() < self.cfg.minutes * 60:
            now = self.clock()
            self._due(now)
            self._restart_exited(now)
            if now >= next_sample:
                self._sample(now)
                next_sample = now + 2.0
                if now >= end_faults and self._calm_enough():
                    break
            if now >= next_fault and now < end_faults:
                self._fault(FAULTS[self._turn % len(FAULTS)], now)
                self._turn += 1
                next_fault = now + self._gap()
            time.sleep(0.05)
        self.events.append({"t": self.clock(), "event": "end"})

    def _calm_enough(self) -> bool:
        """The running learner trained `calm_updates` since the last fault (read from its metrics, once
        its newest line is its own: written after it started)."""
        path = self.run_dir / "metrics.jsonl"
        if not self.cfg.calm_updates or not self.learner.alive() or self._pending or not path.exists():
            return False
        if path.stat().st_mtime - self.t0_unix <= self.learner.started_at[-1]:
            return False
        lines = metrics_lines(self.run_dir)
        final_run = [m for m in lines if m["run_id"] == lines[-1]["run_id"]]
        return self.updates_since_last_fault(final_run) >= self.cfg.calm_updates

    def updates_since_last_fault(self, final_run: list[dict]) -> int:
        """What the newest learner (its metrics lines) trained since the last fault: from its update when
        the fault happened, or its first if it started after it. Its lines' `wall` counts from its own
        start, which the soak's clock puts at the role's last start."""
        last_fault = max((e["t"] for e in self.events if e["event"] in FAULTS), default=0.0)
        started = self.learner.started_at[-1]
        before = [m["update"] for m in final_run if started + m["wall"] <= last_fault]
        return final_run[-1]["update"] - max(before, default=final_run[0]["update"])

    def _gap(self) -> float:
        return float(self.rng.uniform(*self.cfg.fault_every_s))

    def _restart_exited(self, now: float) -> None:
        for role in self.roles:
            if role.proc is not None and not role.alive() and not role.restarting:
                self.exits[role.name] += 1
                time.sleep(0.2)  # its last lines through the pipe
                tail = [line for line in role.log.read_text(errors="replace").splitlines() if line.strip()]
                why = tail[-1][:300] if tail else ""
                self.events.append({"t": now, "event": "exited", "role": role.name, "code": role.proc.returncode,
                                    "why": why})  # fmt: skip
                role.restarting = True
                self._later(float(self.rng.uniform(1.0, 3.0)), "restart", role)

    def _later(self, delay: float, action: str, role: Role) -> None:
        heapq.heappush(
            self._pending, (self.clock() + delay, next(self._order), action, role, role.incarnation)
        )

    def _due(self, now: float) -> None:
        while self._pending and self._pending[0][0] <= now:
            _, _, action, role, incarnation = heapq.heappop(self._pending)
            if action == "restart":
                self._start(role)
            elif role.incarnation == incarnation and role.alive():  # not killed meanwhile
                if action == "cont":
                    role.proc.send_signal(signal.SIGCONT)
                elif action == "disk_back":
                    resource.prlimit(role.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            self.events.append({"t": now, "event": action, "role": role.name, "incarnation": incarnation})

    def _fault(self, kind: str, now: float) -> None:
        live = [r for r in self.roles if r.alive()]
        if kind == "disk":
            if not self.learner.alive():
                return
            role = self.learner
            segments = sorted((self.run_dir / "wal").glob("*.wal"))
            limit = segments[-1].stat().st_size if segments else 0
            resource.prlimit(role.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            self._later(float(self.rng.uniform(1.0, 5.0)), "disk_back", role)
        elif not live:
            return
        else:
            role = live[int(self.rng.integers(len(live)))]
            if kind == "kill":
                role.proc.send_signal(signal.SIGKILL)
                role.proc.wait()
                role.restarting = True
                self._later(float(self.rng.uniform(0.5, 3.0)), "restart", role)
            else:
                role.proc.send_signal(signal.SIGSTOP)
                self._later(float(self.rng.uniform(0.5, 4.0)), "cont", role)
        self.faults[kind] += 1
        self.events.append({"t": now, "event": kind, "role": role.name, "incarnation": role.incarnation})

    def _sample(self, now: float) -> None:
        self.log_bytes.append((now, dir_bytes(self.run_dir / "wal")))
        for role in self.roles:
            if role.alive() and (mb := rss_mb(role.proc.pid)) is not None:
                role.rss_mb.append((now, role.incarnation, mb))

    # ---- the end -------------------------------------------------------------------------------------
    def stop(self) -> dict[str, int]:
        """Actors first (SIGTERM: they deliver what they hold), then the relay, then the learner (SIGTERM:
        a final checkpoint). Every process is continued and restarted first if a fault left it so.
        Returns each process's exit status."""
        while self._pending:  # restarts and continues still due
            self._due(self._pending[0][0] + 0.001)
        codes = {}
        for role in [*self.roles[2:], self.roles[1], self.learner]:
            if role.alive():
                role.proc.send_signal(signal.SIGCONT)
                role.proc.send_signal(signal.SIGTERM)
                try:
                    codes[role.name] = role.proc.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    role.proc.kill()
                    codes[role.name] = role.proc.wait()
        self.proxy.stop()
        (self.out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events))
        samples = {role.name: role.rss_mb for role in self.roles}  # (soak seconds, incarnation, MB)
        (self.out / "memory.json").write_text(json.dumps(samples))
        return codes

    def kill_all(self) -> None:
        """After an error: nothing may be left running."""
        for role in self.roles:
            if role.alive():
                role.proc.kill()
                role.proc.wait()
