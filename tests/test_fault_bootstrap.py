"""A device fault mid-step drops that step (its outcome is unknown) and ends the episode truncated at the
step before, bootstrapping from the last real observation; a fault on the first step leaves no episode.

Keeping the faulted step with its own starting observation as the bootstrap would give the learner
delta = r + gamma V(s) - V(s) = -(1 - gamma) V(s) for it: a systematic negative advantage on devices."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from actors.actor import Actor
from actors.config import ActorConfig
from actors.envs.faults import DeviceCrash
from actors.policy_runner import PolicyRunner
from actors.rounds import Rounds
from actors.slots import EnvSlots
from actors.world import World
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies.pointer import network as model
from common.types import Observation, UIElement

pytestmark = pytest.mark.timeout(120)

CFG = ModelConfig(vocab_size=512, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)


class FaultingPhone(gym.Env):
    """A phone whose screen changes every step (so observations can be told apart), that never ends an
    episode by itself, and that crashes on step `fault_at` (0-based) of its first episode."""

    def __init__(self, fault_at: int):
        self.fault_at = fault_at
        self.episodes = 0
        self.seen: list[Observation] = []
        """The first episode's observations: after the reset, then after each step that succeeded."""
        self.actions: list = []
        """The first episode's actions that succeeded."""

    @staticmethod
    def _screen(n: int) -> Observation:
        button = UIElement("android.widget.Button", text=f"item {n}", bounds=(10 * n, 0, 10 * n + 50, 40))
        return Observation("open the settings", (button,), (1080 + n, 2400))

    def reset(self, *, seed=None, options=None):
        self.episodes += 1
        obs = self._screen(0)
        if self.episodes == 1:
            self.seen, self.actions = [obs], []
        return obs, {}

    def step(self, action):
        n = len(self.seen)
        if self.episodes == 1 and n - 1 == self.fault_at:
            raise DeviceCrash(0.1)
        obs = self._screen(n)
        if self.episodes == 1:
            self.seen.append(obs)
            self.actions.append(action)
        return obs, 0.5, False, False, {"success": False}


def run_until_fault(fault_at: int) -> tuple[Actor, FaultingPhone, PolicyRunner]:
    """One actor with one inline phone, stepped through its first episode until the fault has been
    handled and the slot has started its next episode."""
    actor = Actor(ActorConfig(num_envs=1), log=lambda *_: None)
    runner = PolicyRunner(CFG, seed=0)
    runner.load(0, params_to_flat(model.create(CFG, 0)[1]))
    phone = FaultingPhone(fault_at)
    slots = EnvSlots([phone], [0], False, actor.stats, log=lambda *_: None)
    slots.reset(0)
    world = World(CFG, 50, runner, slots, [None], runner.policy.episode_spec(), Rounds(slots))
    for _ in range(fault_at + 3):  # the reset, the steps, the fault; the next reset comes with the fault
        actor._step(world)
        if actor.stats["device_crash"]:
            break
    assert actor.stats["device_crash"] == 1 and phone.episodes == 2, "the fault never came"
    return actor, phone, runner


def test_a_faulted_step_is_dropped_and_the_episode_bootstraps_from_the_last_real_observation():
    k = 3
    actor, phone, runner = run_until_fault(fault_at=k)
    assert len(actor.outbox.pending) == 1, "the interrupted episode was not sent"
    episode = actor.outbox.pending[0]
    assert len(episode["reward"]) == k, "the faulted step must not be kept"
    assert episode["truncated"] and not episode["success"]
    assert all(len(rows) == k + 1 for rows in episode["obs"].values())  # k steps and the final observation
    # The final observation is the one after step k-1, featurized with the k actions that led to it.
    assert len(phone.seen) == k + 1 and len(phone.actions) == k
    expected = runner.featurize(phone.seen[k], phone.actions)
    for name, rows in episode["obs"].items():
        np.testing.assert_array_equal(rows[-1], expected[name], err_msg=name)
    before = runner.featurize(phone.seen[k - 1], phone.actions[:-1])  # the check can tell screens apart
    assert any(not np.array_equal(rows[-1], before[name]) for name, rows in episode["obs"].items())
    assert actor.stats["episodes_finished"] == 1 and actor.stats["episodes_dropped_fault"] == 0
    assert actor.stats["env_steps"] == k


def test_a_fault_on_the_first_step_drops_the_episode_and_counts_it():
    actor, _, _ = run_until_fault(fault_at=0)
    assert not actor.outbox.pending and actor.stats["episodes_finished"] == 0
    assert actor.stats["episodes_dropped_fault"] == 1
    assert actor.stats["device_crash"] == 1  # the fault itself is counted as before
    assert actor.stats["env_steps"] == 0
