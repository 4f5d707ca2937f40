"""EnvSlots: threaded environments step at their own pace, faults come back as outcomes, and a slot whose
reset fails is retried with a doubling backoff while the others keep working."""

from __future__ import annotations

import threading
import time
from collections import Counter

import gymnasium as gym
import pytest

from actors.envs.faults import DeviceDisconnected, DeviceHang
from actors.slots import EnvSlots

pytestmark = pytest.mark.timeout(30)


class CountingEnv(gym.Env):
    """Observations are (name, step count); `gate` (if set) must be open for a step to return."""

    def __init__(
        self, name: str, gate: threading.Event | None = None, reset_faults: int = 0, step_fault=None
    ):
        self.name, self.gate, self.reset_faults, self.step_fault = name, gate, reset_faults, step_fault
        self.steps = self.resets = 0
        self.seeds: list = []
        self.closed = False

    def reset(self, *, seed=None, options=None):
        self.seeds.append(seed)
        if self.reset_faults:
            self.reset_faults -= 1
            raise DeviceDisconnected(0.0, f"{self.name} is gone")
        self.resets += 1
        return (self.name, 0), {}

    def step(self, action):
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.step_fault is not None:
            raise self.step_fault
        self.steps += 1
        return (self.name, self.steps), 0.0, False, False, {"action": action}

    def close(self):
        self.closed = True


def drive(slots: EnvSlots, until, limit_s: float = 20.0) -> list:
    """Act on every ready slot and collect, until `until()` or the limit; every outcome seen."""
    seen = []
    deadline = time.monotonic() + limit_s
    while not until() and time.monotonic() < deadline:
        for i in slots.ready():
            slots.step(i, f"act{i}", tag=i)
        seen += slots.collect(timeout=0.01)
    return seen


def test_a_blocked_device_does_not_hold_up_the_others():
    gate = threading.Event()
    slow, fast = CountingEnv("slow", gate=gate), CountingEnv("fast")
    slots = EnvSlots([slow, fast], [1, 2], threaded=True, stats=Counter())
    slots.reset(0)
    slots.reset(1)
    try:
        drive(slots, lambda: fast.steps >= 50)
        assert fast.steps >= 50 and slow.steps == 0  # the slow one is stuck in its first step
        assert slots.ready() == [1] and slots[0].busy is not None
        gate.set()
        drive(slots, lambda: slow.steps >= 3)
        assert slow.steps >= 3
    finally:
        gate.set()
        slots.close()
    assert slow.closed and fast.closed
    assert slow.seeds == [1] and fast.seeds == [2]  # the first reset is seeded


@pytest.mark.parametrize("threaded", [False, True])
def test_step_outcomes_carry_the_tag_and_faults(threaded):
    ok, bad = CountingEnv("ok"), CountingEnv("bad", step_fault=DeviceHang(2.5))
    slots = EnvSlots([ok, bad], [0, 0], threaded=threaded, stats=Counter())
    slots.reset(0)
    slots.reset(1)
    resets = []
    while len(resets) < 2:
        resets += slots.collect(timeout=0.05)
    assert sorted(o.slot for o in resets) == [0, 1] and all(o.kind == "reset" for o in resets)
    slots.step(0, "a", tag="t0")
    slots.step(1, "b", tag="t1")
    assert slots.ready() == []
    outs = []
    while len(outs) < 2:
        outs += slots.collect(timeout=0.05)
    by_slot = {o.slot: o for o in outs}
    assert by_slot[0].fault is None and by_slot[0].tag == "t0" and by_slot[0].result[4] == {"action": "a"}
    assert isinstance(by_slot[1].fault, DeviceHang) and by_slot[1].tag == "t1" and by_slot[1].result is None
    assert slots.ready() == [0]  # a faulted step leaves no observation: the caller must reset
    slots.close()


def test_failed_resets_back_off_and_recover_while_others_work():
    stats, lines = Counter(), []
    flaky, fine = CountingEnv("flaky", reset_faults=3), CountingEnv("fine")
    slots = EnvSlots([flaky, fine], [0, 0], threaded=True, stats=stats, log=lines.append, reset_backoff=0.05)
    slots.reset(0)
    slots.reset(1)
    try:
        drive(slots, lambda: flaky.resets == 1 and 0 in slots.ready())
    finally:
        slots.close()
    assert stats["reset_disconnect"] == 3 and stats["reset_retries"] == 3 and flaky.resets == 1
    assert fine.steps > 0  # the healthy slot stepped while the other was down
    waits = [float(line.rsplit("retrying in ", 1)[1].rstrip("s")) for line in lines]
    assert waits == [0.05, 0.1, 0.2]  # the backoff doubles per failure in a row
    assert "flaky is gone" in lines[0]


def test_actor_heartbeats_while_its_policy_compiles():
    """A first compile can outlast the learner's actor timeout on a busy CPU: the actor keeps
    heartbeating meanwhile, and compiles exactly the batch shape it will use."""
    from actors.actor import Actor
    from actors.config import ActorConfig
    from actors.connection import LearnerConnection
    from actors.policy_runner import PolicyRunner
    from common.config import ModelConfig
    from common.policies import PointerPolicy
    from common.policies.pointer.featurize import feature_spec

    class Connection:  # records what the actor sends; nothing arrives
        actor_id = 3
        last_beat = 0.0
        heartbeat_if_due = LearnerConnection.heartbeat_if_due  # the real cadence, over this send()

        def __init__(self):
            self.sent = []

        def send(self, msg):
            self.sent.append(msg["kind"])
            return True

        def wait(self, timeout_ms):
            time.sleep(timeout_ms / 1000)

        def receive(self):
            return [], None

    conn = Connection()

    class SlowRunner:
        cfg = ModelConfig()
        policy = PointerPolicy(cfg)
        shapes = None
        example_features = PolicyRunner.example_features  # the real one: reads only `policy`

        def compile(self, features):
            # Done only once the actor has heartbeaten three times meanwhile (or after 20 s: a slow
            # machine delays the beats, it does not stop them).
            deadline = time.monotonic() + 20
            while conn.sent.count("HEARTBEAT") < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.shapes = {k: v.shape for k, v in features.items()}

    actor = Actor(ActorConfig(heartbeat_every=0.2), log=lambda *_: None)
    runner = SlowRunner()
    actor.inference.prepare(conn, runner, 5, lambda: actor._take_in(conn, runner))
    assert conn.sent.count("HEARTBEAT") >= 3
    assert runner.shapes == {k: (5, *shape) for k, (shape, _) in feature_spec(ModelConfig()).items()}
