"""The Ray launcher's supervisor (learner/launch/supervisor.py), event by event and without Ray: what it
says, whom it places and restarts, and when the launch is over with which status. The same rules run
on a real cluster in tests/test_cluster_ray.py."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from learner.launch.config import LaunchConfig
from learner.launch.process_host import ProcessHost
from learner.launch.supervisor import RUNNING, STARTING, Actions, Event, Proc, Supervisor
from tests.conftest import ROOT

RUN_DIR = Path("/runs/ray")


class World:
    """The supervisor's actions, recorded; a clock the test moves."""

    def __init__(self, actors: int = 2, relays: int = 0):
        self.now = 100.0
        self.said: list[str] = []
        self.shown: list[tuple[str, list[str]]] = []
        self.restarted: list[str] = []
        self.placed_with: list[tuple[str, dict]] = []
        self.names = [f"relay-{j}" for j in range(relays)] + [f"actor-{i}" for i in range(actors)]

    def place(self, host: str, endpoints: dict) -> list[Proc]:
        self.placed_with.append((host, endpoints))
        return [Proc(name, handle=None) for name in self.names]

    def actions(self) -> Actions:
        return Actions(
            place=self.place,
            restart=lambda p: self.restarted.append(p.name),
            say=self.said.append,
            show=lambda name, lines: self.shown.append((name, lines)),
            clock=lambda: self.now,
        )


def info(pid: int, restarted: bool = False, ip: str = "127.0.0.1") -> dict:
    return {"pid": pid, "node_ip": ip, "node_id": "abcdef0123456789", "restarted": restarted}


def started(world: World, **cfg) -> Supervisor:
    """A supervisor whose learner is placed and ready, its actors placed (each with a pid)."""
    sup = Supervisor(
        LaunchConfig(**{"actors": len(world.names), **cfg}), RUN_DIR, Proc("learner", None), world.actions()
    )
    assert sup.handle(Event("placed", sup.learner, info(10))) is None
    assert sup.reading() == "endpoints"
    world.now += 3.5
    assert sup.handle(Event("endpoints", sup.learner, {"ingest_port": 5555, "params_port": 5556})) is None
    for k, p in enumerate(sup.procs[1:]):
        sup.handle(Event("placed", p, info(20 + k)))
    return sup


def test_startup_places_the_actors_at_the_learner_ports_and_says_when():
    world = World()
    sup = started(world)
    assert sup.phase == RUNNING and [p.name for p in sup.actors] == ["actor-0", "actor-1"]
    assert world.placed_with == [("127.0.0.1", {"ingest_port": 5555, "params_port": 5556})]
    assert world.said[0] == f"learner: pid 10 on 127.0.0.1 (node abcdef01), run dir {RUN_DIR}"
    assert "learner ready after 3.5 s: ingest 127.0.0.1:5555, params 127.0.0.1:5556" in world.said
    assert "actor-1: pid 21 on 127.0.0.1 (node abcdef01)" in world.said
    assert sup.reading() == "metrics"


def test_first_episodes_come_from_the_metrics_records_once():
    world = World()
    sup = started(world)
    world.now += 4.0
    sup.handle(Event("metrics", sup.learner, [{"episodes": 0, "update": 3}]))
    assert not any("first episodes" in s for s in world.said)
    sup.handle(Event("metrics", sup.learner, [{"episodes": 0}, {"episodes": 12}]))
    sup.handle(Event("metrics", sup.learner, [{"episodes": 40}]))
    assert [s for s in world.said if "first episodes" in s] == [
        "first episodes acknowledged 7.5 s after launch"
    ]
    assert sup.reading() is None  # nothing more to read from the learner's files


def test_output_lines_are_shown_under_the_process_name():
    world = World()
    sup = started(world)
    sup.handle(Event("lines", sup.actors[0], ["actor x: policy v1"]))
    assert world.shown == [("actor-0", ["actor x: policy v1"])]


def test_a_dead_actor_is_restarted_up_to_max_restarts_then_left_down():
    world = World(actors=2)
    sup = started(world, max_restarts=1)
    a = sup.actors[0]
    assert sup.handle(Event("exited", a, -9)) is None
    assert world.restarted == ["actor-0"] and a.waiting_info and a.restarts == 1
    assert "actor-0: exited with status -9; Ray restarts it (restart 1 of 1)" in world.said
    sup.handle(Event("placed", a, info(30, restarted=True)))  # asked for: counted once, not twice
    assert a.restarts == 1 and "actor-0: pid 30 on 127.0.0.1 (node abcdef01) (restart 1 of 1)" in world.said
    assert sup.handle(Event("exited", a, 1)) is None  # actor-1 still runs
    assert a.done and world.restarted == ["actor-0"]
    assert "actor-0: exited with status 1; all 1 restarts used, leaving it down" in world.said


def test_bad_actor_arguments_are_not_restarted_and_no_actor_left_stops_the_launch():
    world = World(actors=1)
    sup = started(world)
    assert sup.handle(Event("exited", sup.actors[0], 2)) == 1
    assert world.restarted == []
    assert world.said[-2:] == [
        "actor-0: exited with status 2 (bad --actor-args? its output is above); not restarting it",
        "no actor is left running; stopping the learner",
    ]


def test_a_restart_ray_made_on_its_own_is_counted():
    world = World()
    sup = started(world, max_restarts=3)
    a = sup.actors[1]
    assert sup.handle(Event("unavailable", a, "RayActorError")) is None and a.waiting_info
    sup.handle(Event("placed", a, info(44, restarted=True)))
    assert a.restarts == 1 and a.pid == 44 and a.down_since is None


def test_an_actor_host_that_stays_away_is_left_down():
    world = World(actors=2)
    sup = started(world, start_timeout=60.0)
    a = sup.actors[0]
    sup.handle(Event("unavailable", a, "RayActorError"))
    world.now += 61
    sup.handle(Event("unavailable", a, "RayActorError"))
    assert a.done and "actor-0: its Ray actor has not come back in 60 s; leaving it down" in world.said


@pytest.mark.parametrize(
    ("rc", "status", "says"),
    [
        (0, 0, "the learner finished (status 0); stopping the actors"),
        (-9, 1, "the learner died with status -9 on its node; stopping the actors"),
    ],
)
def test_the_learner_exiting_ends_the_launch(rc, status, says):
    world = World()
    sup = started(world)
    assert sup.handle(Event("exited", sup.learner, rc)) == status
    assert world.said[-1] == says and sup.learner.done


def test_the_learner_exiting_before_its_ports_ends_the_launch():
    world = World()
    sup = Supervisor(LaunchConfig(), RUN_DIR, Proc("learner", None), world.actions())
    sup.handle(Event("placed", sup.learner, info(10)))
    assert sup.handle(Event("exited", sup.learner, 1)) == 1
    assert world.said[-1] == "the learner exited with status 1 before binding its ports (its output is above)"
    assert world.placed_with == []


def test_the_start_timeout_counts_from_the_learner_placement():
    world = World()
    sup = Supervisor(LaunchConfig(start_timeout=30.0), RUN_DIR, Proc("learner", None), world.actions())
    world.now += 1000  # Ray took long to place it: that does not count
    assert sup.handle(Event("tick")) is None and sup.reading() is None
    sup.handle(Event("placed", sup.learner, info(10)))
    world.now += 29
    assert sup.handle(Event("tick")) is None
    world.now += 2
    assert sup.handle(Event("tick")) == 1 and sup.phase == STARTING
    assert (
        world.said[-1]
        == f"the learner did not write {RUN_DIR / 'endpoints.json'} within --start-timeout 30 s"
    )


def test_a_dead_learner_host_ends_the_launch_and_a_signal_stops_it():
    world = World()
    sup = started(world)
    assert sup.handle(Event("signal", data=signal.SIGTERM)) == 0
    assert world.said[-1] == "SIGTERM: stopping the actors, then the learner"
    assert sup.handle(Event("unavailable", sup.learner, "ActorDiedError")) == 1
    assert (
        world.said[-1]
        == "the learner's Ray actor died (ActorDiedError: its node or worker is gone); stopping"
    )


def test_a_learner_off_loopback_without_keys_is_warned_about():
    world = World()
    sup = Supervisor(LaunchConfig(), RUN_DIR, Proc("learner", None), world.actions())
    sup.handle(Event("placed", sup.learner, info(10, ip="10.0.0.5")))
    assert "without --secure or --insecure it refuses to bind" in world.said[-1]


def test_an_unknown_event_kind_is_refused_by_name_and_every_kind_the_launcher_makes_has_a_handler():
    world = World()
    sup = Supervisor(LaunchConfig(), RUN_DIR, Proc("learner", None), world.actions())
    with pytest.raises(ValueError, match="no handler for event kind 'placd'"):
        sup.handle(Event("placd", sup.learner, info(10)))
    assert world.said == []
    made = set(re.findall(r'Event\("([a-z]+)"', (ROOT / "learner/launch/cluster.py").read_text()))
    assert made and made <= set(sup.handlers)


def test_the_process_host_reads_only_the_lines_this_run_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"episodes": 99}) + "\n")  # the last run's record in a reused run dir
    host = object.__new__(ProcessHost)  # its file methods only: no Ray, no process
    host.offsets = {str(path): path.stat().st_size}
    assert host.new_lines(str(path)) == []
    with path.open("a") as f:
        f.write('{"episodes": 1}\n{"episodes": 2')  # the second line is still being written
    assert host.new_lines(str(path)) == ['{"episodes": 1}']
    with path.open("a") as f:
        f.write("}\n")
    assert host.new_lines(str(path)) == ['{"episodes": 2}']
    assert host.new_lines(str(tmp_path / "missing.jsonl")) == []
