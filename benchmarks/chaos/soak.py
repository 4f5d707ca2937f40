"""The processes of `python -m benchmarks chaos` and the faults done to them.

The production configuration: a learner (fixed loopback ports, its write-ahead log pruned at every
checkpoint as in any run, `--audit-log` so an audit can still see every batch it logged), a parameter
relay, and actors (each with `--ack-log`: its own record of what was acknowledged) whose ingest traffic
goes through the fault proxy (benchmarks/chaos/proxy.py): the first takes its parameters through the
relay, the second acts on the learner's inference service (`--inference remote`), the others act
locally. With `processes` 2 the learner is a two-process job (one jax.distributed job on the CPU, each
process with its own ports, proxy and actors: actor i serves process i mod 2; no actor on the inference
service, which a multi-process learner does not run), and a kill or an exit of either process takes the
other with it: the job restarts as one, on a fresh coordinator port, as a supervisor of a multi-process
job does (a process cannot rejoin a running job). At seeded random times one fault, chosen in turn from
FAULTS:
- `kill`: SIGKILL a random process, restarted after 0.5-3 s (a learner on the same run dir and ports);
- `stop`: SIGSTOP a random process for 0.5-4 s, then SIGCONT;
- `disk`: a learner process's file size limit (RLIMIT_FSIZE) set to its newest log segment's size for
  1-5 s, so the log cannot grow (nor any file already that large: metrics, checkpoints), then lifted.
A process that exits by itself (a learner that cannot write its files at start-up with the disk full,
say) is counted in `exits` and restarted after 1-3 s, as a supervisor would. Resident memory of every
process is sampled every 2 s.
"""

from __future__ import annotations

import heapq
import itertools
import json
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.chaos.processes import Role, dir_bytes, free_ports, metrics_lines, rss_mb
from benchmarks.chaos.proxy import FaultProxy, FaultRates

FAULTS = ("kill", "stop", "disk")
REMOTE_ACTOR = 1
"""The actor that acts on the learner's inference service (actor 0 goes through the relay)."""
START_S = 600.0
"""Longest wait for a learner to bind its ports (start-up and log recovery on a busy machine)."""


@dataclass
class SoakConfig:
    """What `python -m benchmarks chaos` runs."""

    out: Path
    minutes: float
    seed: int = 0
    actors: int = 3
    """Actors: the first takes its parameters from the relay, the second acts on the learner's inference
    service (with one learner process), the others take parameters from the learner directly and act
    locally. With several learner processes actor i serves process i mod `processes`."""
    processes: int = 1
    """Learner processes: 2 runs the learner as a two-process job, restarted as one (the module docstring)."""
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

    def __post_init__(self):
        if not 1 <= self.processes <= self.actors:
            raise ValueError(f"need 1 <= processes <= actors (an actor per process), got {self.processes}")


WAL_SEGMENT_MB = 8
"""The learner's log segment size here: the unit pruning deletes, small enough (about 200 of the soak's
batches) that a segment kept past its prune shows (benchmarks/chaos/log_pruning.py) and the log's size
follows what restores need rather than the 64 MB default's steps."""


class Soak:
    """Start everything, fault it until the deadline, calm, then stop it all in order (`run`)."""

    def __init__(self, cfg: SoakConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.out = cfg.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.out / "learner"
        n = cfg.processes
        ports = free_ports(3 * n + 1)
        self.ingest, self.params, self.inference = ports[:n], ports[n : 2 * n], ports[2 * n : 3 * n]
        self.relay_port = ports[-1]
        self.proxies = [
            FaultProxy(port, cfg.rates, cfg.seed + 1000 * r) for r, port in enumerate(self.ingest)
        ]
        self.learners = [self._learner(rank) for rank in range(n)]
        """The learner's processes (one job: started, killed and restarted together)."""
        self.roles = [*self.learners, self._relay(), *(self._actor(i) for i in range(cfg.actors))]
        self.faults: Counter[str] = Counter()
        self.exits: Counter[str] = Counter()
        """Exits a process made by itself (not killed), per role: each was restarted."""
        self._turn = 0
        self.log_bytes: list[tuple[float, int]] = []
        """(soak seconds, bytes of the learner's write-ahead logs, all processes) samples: bounded once
        checkpoints prune them."""
        self.events: list[dict] = []
        """Every fault and restart, with its soak time: the record the audit reads."""
        self._pending: list[tuple[float, int, str, Role, int]] = []  # (due, order, action, role, incarnation)
        self._order = itertools.count()
        self._t0 = time.monotonic()
        self.t0_unix = time.time()
        """The soak clock's zero in Unix seconds (the actors' ack logs carry Unix times)."""

    def clock(self) -> float:
        return time.monotonic() - self._t0

    def process_dir(self, rank: int) -> Path:
        """Where learner process `rank` writes its log, audit log and metrics (checkpoints: the run dir's)."""
        return self.run_dir if rank == 0 else self.run_dir / f"process-{rank}"

    @property
    def proxy_counts(self) -> Counter[str]:
        """What the fault proxies did, all processes' together."""
        return sum((Counter(p.counts) for p in self.proxies), Counter())

    # ---- the processes -------------------------------------------------------------------------------
    def _learner(self, rank: int) -> Role:
        inference = str(self.inference[rank]) if self.cfg.processes == 1 else "-1"
        cmd = [sys.executable, "-m", "learner", "--run-dir", str(self.run_dir), "--bind", "127.0.0.1",
               "--ingest-port", str(self.ingest[rank]), "--params-port", str(self.params[rank]), "--inference-port", inference,
               "--local-actors", "0", "--env", self.cfg.env, "--model.text-encoder", "none", "--max-steps", "8",
               "--batch-size", "8", "--checkpoint-every", "1000000", "--checkpoint-every-s",
               str(self.cfg.checkpoint_every_s), "--durability", "fsync", "--audit-log", "--warmup-demos", "0",
               "--wal-segment-mb", str(WAL_SEGMENT_MB),
               "--warmup-updates", "0", "--max-policy-lag", "0", "--actor-timeout", "10", "--log-every", "1",
               "--console", "lines", "--no-tensorboard"]  # fmt: skip
        name = "learner" if self.cfg.processes == 1 else f"learner{rank}"
        # JAX's persistent compilation cache: a restarted learner reads its compiled step from disk
        # instead of compiling again (68-71 s for a two-process job on 2 busy cores, longer than the time
        # between job kills: that job never trained between faults, BENCHMARKS.md "chaos").
        cache = {"JAX_COMPILATION_CACHE_DIR": str(self.out / "jax-cache"),
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # fmt: skip
        return Role(name, cmd, self.out / f"{name}.log", env=cache)

    def _relay(self) -> Role:
        cmd = [sys.executable, "-m", "actors", "relay", "--host", "127.0.0.1", "--params-port", str(self.params[0]),
               "--port", str(self.relay_port), "--status-every", "0", "--endpoint-file", str(self.out / "relay.json")]  # fmt: skip
        return Role("relay", cmd, self.out / "relay.log")

    def _actor(self, i: int) -> Role:
        rank = i % self.cfg.processes
        params = ["--params-endpoint", f"tcp://127.0.0.1:{self.relay_port}"] if i == 0 else []
        params += ["--inference", "remote"] if i == REMOTE_ACTOR and self.cfg.processes == 1 else []
        cmd = [sys.executable, "-m", "actors", "--host", "127.0.0.1", "--ingest-port", str(self.proxies[rank].port),
               "--params-port", str(self.params[rank]), *params, "--env", self.cfg.env, "--num-envs", "4",
               "--seed", str(self.cfg.seed * 100 + i), "--ack-log", str(self.out / f"acks-actor{i}.jsonl"),
               "--ack-timeout", "6", "--learner-timeout", "6", "--heartbeat-every", "0.5", "--flush-timeout", "60",
               "--status-every", "30"]  # fmt: skip
        return Role(f"actor{i}", cmd, self.out / f"actor{i}.log")

    @property
    def learner(self) -> Role:
        """The learner's process 0 (with one process, the learner)."""
        return self.learners[0]

    def _wait_for_learner(self) -> None:
        deadline = time.monotonic() + START_S
        for rank, role in enumerate(self.learners):
            while not (self.process_dir(rank) / "endpoints.json").exists():
                if not role.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the learner did not start: see {role.log}")
                time.sleep(0.1)

    def _start(self, role: Role, extra: list[str] | None = None) -> None:
        role.start(self.clock(), extra)
        self.events.append(
            {"t": self.clock(), "event": "start", "role": role.name, "incarnation": role.incarnation}
        )

    def _start_learners(self) -> None:
        """Every learner process, together, on a fresh coordinator port (a job starts as one)."""
        n = self.cfg.processes
        coordinator = f"127.0.0.1:{free_ports(1)[0]}" if n > 1 else ""
        for rank, role in enumerate(self.learners):
            (self.process_dir(rank) / "endpoints.json").unlink(missing_ok=True)
            job = ["--coordinator", coordinator, "--num-processes", str(n), "--process-id", str(rank)]
            self._start(role, job if coordinator else None)

    def _down(self, role: Role, delay: float) -> None:
        """`role` is down (killed, or exited by itself): its restart after `delay` seconds. A learner
        process takes the job's other processes with it (SIGKILL), and the job restarts as one."""
        group = self.learners if role in self.learners else [role]
        for member in group:
            if member.alive():
                member.proc.send_signal(signal.SIGKILL)
                member.proc.wait()
                self.events.append({"t": self.clock(), "event": "job_kill", "role": member.name,
                                    "incarnation": member.incarnation})  # fmt: skip
            member.restarting = True
        self._later(delay, "restart", group[0])

    # ---- the soak ------------------------------------------------------------------------------------
    def run(self) -> None:
        for proxy in self.proxies:
            proxy.start()
        self._start_learners()
        self._wait_for_learner()
        for role in self.roles[len(self.learners) :]:
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
                self._down(role, float(self.rng.uniform(1.0, 3.0)))

    def _later(self, delay: float, action: str, role: Role) -> None:
        heapq.heappush(
            self._pending, (self.clock() + delay, next(self._order), action, role, role.incarnation)
        )

    def _due(self, now: float) -> None:
        while self._pending and self._pending[0][0] <= now:
            _, _, action, role, incarnation = heapq.heappop(self._pending)
            if action == "restart":
                self._start_learners() if role in self.learners else self._start(role)
            elif role.incarnation == incarnation and role.alive():  # not killed meanwhile
                if action == "cont":
                    role.proc.send_signal(signal.SIGCONT)
                elif action == "disk_back":
                    resource.prlimit(role.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            self.events.append({"t": now, "event": action, "role": role.name, "incarnation": incarnation})

    def _fault(self, kind: str, now: float) -> None:
        live = [r for r in self.roles if r.alive()]
        if kind == "disk":
            ranks = [rank for rank, learner in enumerate(self.learners) if learner.alive()]
            if not ranks:
                return
            rank = ranks[int(self.rng.integers(len(ranks)))] if len(self.learners) > 1 else ranks[0]
            role = self.learners[rank]
            segments = sorted((self.process_dir(rank) / "wal").glob("*.wal"))
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
                self._down(role, float(self.rng.uniform(0.5, 3.0)))
            else:
                role.proc.send_signal(signal.SIGSTOP)
                self._later(float(self.rng.uniform(0.5, 4.0)), "cont", role)
        self.faults[kind] += 1
        self.events.append({"t": now, "event": kind, "role": role.name, "incarnation": role.incarnation})

    def _sample(self, now: float) -> None:
        wal = sum(dir_bytes(self.process_dir(rank) / "wal") for rank in range(len(self.learners)))
        self.log_bytes.append((now, wal))
        for role in self.roles:
            if role.alive() and (mb := rss_mb(role.proc.pid)) is not None:
                role.rss_mb.append((now, role.incarnation, mb))

    # ---- the end -------------------------------------------------------------------------------------
    def stop(self) -> dict[str, int]:
        """Actors first (SIGTERM: they deliver what they hold), then the relay, then the learner's processes
        together (SIGTERM: they agree on the stop and write a final checkpoint). Every process is
        continued and restarted first if a fault left it so. Returns each process's exit status."""
        while self._pending:  # restarts and continues still due
            self._due(self._pending[0][0] + 0.001)
        relay, *actors = self.roles[len(self.learners) :]
        codes = {}
        for group in [*([a] for a in actors), [relay], self.learners]:
            live = [role for role in group if role.alive()]
            for role in live:
                role.proc.send_signal(signal.SIGCONT)
                role.proc.send_signal(signal.SIGTERM)
            for role in live:
                try:
                    codes[role.name] = role.proc.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    role.proc.kill()
                    codes[role.name] = role.proc.wait()
        for proxy in self.proxies:
            proxy.stop()
        (self.out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events))
        samples = {role.name: role.rss_mb for role in self.roles}  # (soak seconds, incarnation, MB)
        (self.out / "memory.json").write_text(json.dumps(samples))
        (self.out / "log_size.json").write_text(json.dumps(self.log_bytes))  # (soak seconds, bytes)
        return codes

    def kill_all(self) -> None:
        """After an error: nothing may be left running."""
        for role in self.roles:
            if role.alive():
                role.proc.kill()
                role.proc.wait()
