"""--max-episode-rate: a token bucket (tested on a fake clock) decides when a slot whose episode ended
may start its next one; the other slots keep stepping meanwhile."""

from __future__ import annotations

import gymnasium as gym
import pytest

from actors.actor import Actor
from actors.config import ActorConfig
from actors.pacing import TokenBucket
from actors.policy_runner import PolicyRunner
from actors.rounds import Rounds
from actors.slots import EnvSlots
from actors.world import World
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies.pointer import network as model
from common.types import Observation, UIElement

pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_allows_the_rate_and_one_at_a_time():
    clock = Clock()
    bucket = TokenBucket(2.0, clock=clock)
    assert bucket.take() and not bucket.take()  # starts full, with a burst of one
    assert bucket.wait_s() == pytest.approx(0.5)
    clock.now += 0.4
    assert not bucket.take() and bucket.wait_s() == pytest.approx(0.1)
    clock.now += 0.1
    assert bucket.take() and not bucket.take()
    clock.now += 60.0  # a long idle spell does not save up a burst
    assert bucket.take() and not bucket.take()
    taken = 0
    for _ in range(1000):  # 10 s in 10 ms ticks: 2 per second
        clock.now += 0.01
        taken += bucket.take()
    assert taken == 20


def test_a_larger_burst_and_bad_settings():
    clock = Clock()
    bucket = TokenBucket(1.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    with pytest.raises(ValueError, match="rate must be positive"):
        TokenBucket(0.0)
    with pytest.raises(ValueError, match="burst must be at least 1"):
        TokenBucket(1.0, burst=0.5)


@pytest.mark.parametrize("rate", [-1.0, float("nan"), float("inf")])
def test_the_flag_refuses_bad_rates(rate):
    with pytest.raises(ValueError, match="--max-episode-rate must be >= 0"):
        ActorConfig(max_episode_rate=rate)


class OneStepPhone(gym.Env):
    """Every episode ends after one step; counts its resets."""

    def __init__(self):
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        return Observation("go", (UIElement("android.widget.Button", text="ok", bounds=(0, 0, 50, 40)),)), {}

    def step(self, action):
        obs, _ = self.reset()
        self.resets -= 1
        return obs, 1.0, True, False, {"success": True}


def test_slots_wait_for_the_bucket_and_the_others_keep_stepping():
    cfg = ModelConfig(vocab_size=512, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)
    clock = Clock()
    actor = Actor(ActorConfig(num_envs=3, max_episode_rate=1.0), log=lambda *_: None)
    pacer = TokenBucket(1.0, clock=clock)  # the real one, on a clock the test moves
    runner = PolicyRunner(cfg, seed=0)
    runner.load(0, params_to_flat(model.create(cfg, 0)[1]))
    phones = [OneStepPhone() for _ in range(3)]
    slots = EnvSlots(phones, [0, 1, 2], False, actor.stats, log=lambda *_: None)
    for i in range(3):
        slots.reset(i)  # every slot's first episode starts at once
    world = World(cfg, 5, runner, slots, [None] * 3, runner.policy.episode_spec(), Rounds(slots, pacer))
    rounds = world.rounds
    actor._step(world)  # the first resets are collected
    actor._step(world)  # one step each: three episodes end, and their slots wait for a token
    assert actor.stats["episodes_finished"] == 3 and list(rounds.waiting) == [0, 1, 2]
    assert rounds.release()  # the bucket starts with one token: slot 0 starts again
    assert [p.resets for p in phones] == [2, 1, 1] and list(rounds.waiting) == [1, 2]
    assert rounds.release() and list(rounds.waiting) == [1, 2]  # no token: the others still wait
    actor._step(world)  # slot 0's new episode (reset collected) ...
    actor._step(world)  # ... steps and ends: it queues behind the others
    assert actor.stats["episodes_finished"] == 4 and list(rounds.waiting) == [1, 2, 0]
    assert not rounds.release()  # every slot waits: nothing to step
    clock.now += 1.0
    assert rounds.release()  # one token: the slot that waited longest starts
    assert [p.resets for p in phones] == [2, 2, 1] and list(rounds.waiting) == [2, 0]
