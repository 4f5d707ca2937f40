"""The Ray launcher's supervisor (learner/launch/cluster.py) as a small state machine: one handler per event.

learner/launch/cluster.py turns what the placed processes' ProcessHosts answer into events (a process was placed
or restarted, printed lines, exited, became unreachable; the learner's RUN_DIR/endpoints.json appeared;
new RUN_DIR/metrics.jsonl records; a stop signal; a clock tick) and hands each to `Supervisor.handle`,
which updates the state and returns an exit status when the launch is over. The supervisor never calls
Ray itself (placing and restarting go through `Actions`), so its rules are tested without a cluster.

Phases: STARTING (the learner is placed and binds its ports; it has --start-timeout to write
endpoints.json) -> RUNNING (relays and actors placed; dead actors restarted up to --max-restarts) ->
over (the learner exited, no actor is left, or a stop signal): the launcher then stops everything.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from common.net.curve import is_loopback
from learner.launch.config import LaunchConfig

STARTING, RUNNING = "starting", "running"

EPISODES_KEY = "episodes"
"""The running count of episodes the learner stored, in each RUN_DIR/metrics.jsonl record
(learner/session.py `Session.record`)."""


@dataclass
class Proc:
    """The launcher's view of one placed process (its ProcessHost is `handle`)."""

    name: str
    handle: Any
    waiting_info: bool = True
    """Its next call asks where it runs (it was just placed or restarted), not for its output."""
    pid: int | None = None
    restarts: int = 0
    """Restarts used, of --max-restarts."""
    done: bool = False
    """Exited for good (or left down): no more calls, not restarted."""
    down_since: float | None = None
    """When its host became unreachable (restarting, or its node gone)."""
    kill_counted: bool = False
    """Its current restart was asked for (and counted) by the launcher, not done by Ray on its own."""


class Event(NamedTuple):
    """One thing that happened: `kind` picks the handler in `Supervisor.handlers` (`placed`, `lines`,
    `exited`, `unavailable`, `endpoints`, `metrics`, `signal`, `tick`), `proc` the process it happened to
    (None: the launch)."""

    kind: str
    proc: Proc | None = None
    data: Any = None


@dataclass(frozen=True)
class Actions:
    """What the supervisor may do to the world."""

    place: Callable[[str, dict[str, Any]], list[Proc]]
    """Place the relays and actors, given the learner node's IP and its endpoints.json."""
    restart: Callable[[Proc], None]
    """Have Ray restart this process's host (a fresh process)."""
    say: Callable[[str], None]
    """One `launch:` line on the console."""
    show: Callable[[str, list[str]], None]
    """A process's output lines, prefixed with its name."""
    clock: Callable[[], float] = time.monotonic


class Supervisor:
    """The launch's state (phase, processes, restarts, first episodes) and its event handlers."""

    def __init__(self, cfg: LaunchConfig, run_dir: Path, learner: Proc, actions: Actions):
        self.cfg, self.run_dir, self.learner, self.act = cfg, run_dir, learner, actions
        self.started = actions.clock()
        self.phase = STARTING
        self.procs: list[Proc] = [learner]
        self.actors: list[Proc] = []
        self.learner_ip: str | None = None
        self.deadline = float("inf")
        self.first_episodes: float | None = None
        self.handlers: dict[str, Callable[[Any, Any], int | None]] = {
            "placed": self._on_placed,
            "lines": self._on_lines,
            "exited": self._on_exited,
            "unavailable": self._on_unavailable,
            "endpoints": self._on_endpoints,
            "metrics": self._on_metrics,
            "signal": self._on_signal,
            "tick": self._on_tick,
        }
        """Each event kind's handler, called with the event's process and data: the whole vocabulary of
        events, in one place (an unknown kind is the launcher's bug, not a new rule)."""

    def handle(self, event: Event) -> int | None:
        """Apply one event; the launch's exit status when it is over, else None."""
        handler = self.handlers.get(event.kind)
        if handler is None:
            raise ValueError(
                f"no handler for event kind {event.kind!r}; the kinds are {sorted(self.handlers)}"
            )
        return handler(event.proc, event.data)

    def reading(self) -> str | None:
        """Which learner file to read now: "endpoints" until it appears, then "metrics" until the first
        episodes are in, then none."""
        if self.learner_ip is None:
            return None
        if self.phase == STARTING:
            return "endpoints"
        return "metrics" if self.first_episodes is None else None

    def _on_placed(self, p: Proc, info: dict[str, Any]) -> None:
        p.waiting_info, p.down_since = False, None
        if info["pid"] == p.pid:
            return
        if p is self.learner:
            return self._learner_placed(info)
        unasked = p.pid is not None and info["restarted"] and not p.kill_counted
        if unasked and p.restarts < self.cfg.max_restarts:
            p.restarts += 1  # Ray restarted it without our asking (its worker or node died)
        p.kill_counted = False
        again = f" (restart {p.restarts} of {self.cfg.max_restarts})" if p.restarts else ""
        p.pid = info["pid"]
        self.act.say(f"{p.name}: pid {p.pid} on {info['node_ip']} (node {info['node_id'][:8]}){again}")

    def _learner_placed(self, info: dict[str, Any]) -> None:
        self.learner.pid, self.learner_ip = info["pid"], info["node_ip"]
        self.act.say(
            f"learner: pid {info['pid']} on {info['node_ip']} (node {info['node_id'][:8]}), run dir {self.run_dir}"
        )
        if not is_loopback(info["node_ip"]) and not (self.cfg.insecure or self.cfg.secure):
            self.act.say(
                "the learner's node is not on loopback: without --secure or --insecure it refuses to bind"
            )
        self.deadline = self.act.clock() + self.cfg.start_timeout

    def _on_endpoints(self, _p: Proc | None, endpoints: dict[str, Any]) -> None:
        if self.phase != STARTING or self.learner_ip is None:
            return
        host = self.learner_ip
        self.act.say(
            f"learner ready after {self.act.clock() - self.started:.1f} s: ingest {host}:{endpoints['ingest_port']}, "
            f"params {host}:{endpoints['params_port']}"
        )
        placed = self.act.place(host, endpoints)
        self.procs += placed
        self.actors = [p for p in placed if p.name.startswith("actor-")]
        self.phase = RUNNING

    def _on_metrics(self, _p: Proc | None, records: list[dict[str, Any]]) -> None:
        if self.first_episodes is None and any(r.get(EPISODES_KEY, 0) > 0 for r in records):
            self.first_episodes = self.act.clock() - self.started
            self.act.say(f"first episodes acknowledged {self.first_episodes:.1f} s after launch")

    def _on_lines(self, p: Proc, lines: list[str]) -> None:
        self.act.show(p.name, lines)

    def _on_exited(self, p: Proc, rc: int) -> int | None:
        if p is self.learner:
            self.learner.done = True
            if self.phase == STARTING:
                self.act.say(
                    f"the learner exited with status {rc} before binding its ports (its output is above)"
                )
                return 1
            if rc == 0:
                self.act.say("the learner finished (status 0); stopping the actors")
                return 0
            self.act.say(f"the learner died with status {rc} on its node; stopping the actors")
            return 1
        return self._actor_exited(p, rc)

    def _actor_exited(self, p: Proc, rc: int) -> int | None:
        """Have Ray restart its host, unless it was bad arguments or it is out of restarts."""
        if rc == 2:
            self.act.say(
                f"{p.name}: exited with status 2 (bad --actor-args? its output is above); not restarting it"
            )
            p.done = True
        elif p.restarts >= self.cfg.max_restarts:
            self.act.say(
                f"{p.name}: exited with status {rc}; all {self.cfg.max_restarts} restarts used, leaving it down"
            )
            p.done = True
        else:
            p.restarts += 1
            self.act.say(
                f"{p.name}: exited with status {rc}; Ray restarts it (restart {p.restarts} of {self.cfg.max_restarts})"
            )
            self.act.restart(p)
            p.waiting_info, p.down_since, p.kill_counted = True, self.act.clock(), True
        return self._none_left()

    def _on_unavailable(self, p: Proc, error: str) -> int | None:
        """A call to a host failed: the learner's is fatal; an actor's is restarting (ask again) or gone."""
        if p is self.learner:
            self.act.say(f"the learner's Ray actor died ({error}: its node or worker is gone); stopping")
            return 1
        now = self.act.clock()
        p.down_since = now if p.down_since is None else p.down_since
        p.waiting_info = True
        if now - p.down_since > self.cfg.start_timeout:
            self.act.say(
                f"{p.name}: its Ray actor has not come back in {self.cfg.start_timeout:g} s; leaving it down"
            )
            p.done = True
        return self._none_left()

    def _none_left(self) -> int | None:
        if self.actors and all(p.done for p in self.actors):
            self.act.say("no actor is left running; stopping the learner")
            return 1
        return None

    def _on_signal(self, _p: Proc | None, signum: int) -> int:
        self.act.say(f"{signal.Signals(signum).name}: stopping the actors, then the learner")
        return 0

    def _on_tick(self, _p: Proc | None, _data: Any) -> int | None:
        if self.phase == STARTING and self.act.clock() > self.deadline:
            self.act.say(
                f"the learner did not write {self.run_dir / 'endpoints.json'} within --start-timeout {self.cfg.start_timeout:g} s"
            )
            return 1
        return None
