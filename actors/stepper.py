"""One step of the actor loop: a batched policy call for every ready environment, then the outcomes that
came back recorded in their episodes (a device fault ends its episode at the last real step)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from actors.envs.factory import task_name
from actors.envs.faults import DeviceFault
from actors.policy_runner import ChosenRows, stack
from actors.slots import Outcome
from actors.world import World
from common.episode import EpisodeBuilder
from common.types import NOOP_PENALTY, Action, ActionType


class StepTag(NamedTuple):
    """What the actor attaches to a step it hands to the slots (actors/slots.py) and reads back with the
    step's outcome: everything the episode records of the action besides what the environment says."""

    features: dict[str, np.ndarray]
    """The features of the observation the action was chosen on."""
    choice: dict[str, int]
    action: Action
    logp: float
    value: float
    entropy: float
    version: int
    """The policy version that chose it."""


Act = Callable[[Any, dict[str, np.ndarray]], ChosenRows | None]
"""The policy call: (runner, batched features) -> its choices, or None when the step is to be tried again
(actors/local_inference.py, actors/remote_inference.py)."""


class Stepper:
    """Steps a World's environments with its policy and records their outcomes; counts into `stats`."""

    def __init__(self, stats: Counter, act: Act):
        self.stats = stats
        self.act = act

    def step(self, world: World) -> list[dict]:
        """One batched policy call for every ready environment, then whatever steps and resets have
        finished (all of them when stepping inline); the wire fields of the episodes that ended."""
        ready = world.slots.ready()
        if ready and not self._act_on(world, ready):
            return []
        finished = []
        for out in world.slots.collect(timeout=0.0 if ready else 0.05):
            if out.kind == "reset":
                if out.fault is None:
                    world.episodes[out.slot] = EpisodeBuilder(task_name(world.slots[out.slot].env))
                    world.rounds.began(out.slot, world.runner.version)
            else:
                finished += self._settle(world, out)
        return finished

    def _act_on(self, world: World, ready: list[int]) -> bool:
        """Choose and start the actions of the `ready` slots; False when the policy gave no answer."""
        runner, slots = world.runner, world.slots
        features = [runner.featurize(slots[i].obs, _history(world.episodes[i])) for i in ready]
        # Threaded slots act on any subset: pad to one batch shape so the policy compiles once.
        batch = features + features[:1] * (len(slots) - len(ready)) if slots.threaded else features
        t0 = time.perf_counter()
        acted = self.act(runner, stack(batch))
        if acted is None:
            return False
        self.stats["act_us"] += int((time.perf_counter() - t0) * 1e6)
        self.stats["act_calls"] += 1
        for stage, seconds in runner.stage_seconds.items():
            self.stats[f"act_{stage}_us"] += int(seconds * 1e6)
        for k, i in enumerate(ready):
            obs, choice = slots[i].obs, acted.choices[k]
            action = runner.to_action(obs, choice)
            logp, value, entropy = float(acted.logp[k]), float(acted.value[k]), float(acted.entropy[k])
            slots.step(i, action, StepTag(features[k], choice, action, logp, value, entropy, runner.version))
        return True

    def _settle(self, world: World, out: Outcome) -> list[dict]:
        """Record one step's outcome in its episode; the finished episode's wire fields when it ended."""
        tag: StepTag = out.tag
        if out.fault is not None:
            return self._faulted(world, out.slot, out.fault, tag.features)
        obs, reward, terminated, truncated, info = out.result
        episode = world.episodes[out.slot]
        # min(): a step in flight while the actor joined a restarted learner gets its version capped too.
        version = min(tag.version, world.runner.version)
        if tag.action.type == ActionType.NOOP:  # an action that did not parse: a step lost, penalised
            reward = float(reward) - NOOP_PENALTY
            self.stats["invalid_actions"] += 1
        episode.add(
            tag.features, tag.choice, tag.logp, float(reward), version, tag.action, tag.value, tag.entropy
        )
        self.stats["env_steps"] += 1
        if not (terminated or truncated):
            return []
        success = bool(info.get("success", False))
        self.stats["successes"] += success
        final = world.runner.featurize(obs, episode.actions)
        return [self._finish(world, out.slot, final, success, bool(truncated and not terminated))]

    def _faulted(self, world: World, i: int, fault: DeviceFault, chosen_on: dict) -> list[dict]:
        """The device failed mid-step: the step's outcome is unknown, so it is dropped, and the episode
        ends truncated (it would have gone on) at the step before, bootstrapping from the observation
        the dropped action was chosen on: the last real one (`chosen_on`, its features). Keeping the
        step with that observation as its own bootstrap would teach -(1 - gamma) V(s) for it. A fault on
        the first step leaves nothing to send: counted as episodes_dropped_fault, and the slot starts
        again at once (in --mode sync too: this round still needs its episode)."""
        self._count_fault(fault)
        if world.episodes[i].length:
            return [self._finish(world, i, chosen_on, False, True)]
        self.stats["episodes_dropped_fault"] += 1
        world.episodes[i] = None
        world.rounds.begin(i)  # its reset restarts or reconnects the device
        return []

    def _finish(self, world: World, i: int, final: dict, success: bool, truncated: bool) -> dict:
        """Close slot i's episode with its final observation's features, then park the slot (--mode
        sync) or start its next episode."""
        episode = world.episodes[i].finish(final, success, truncated, world.spec)
        world.episodes[i] = None
        world.rounds.ended(i)
        return episode

    def _count_fault(self, fault: DeviceFault) -> None:
        self.stats[f"device_{fault.kind}"] += 1
        detail = getattr(fault, "detail", "")
        if detail:
            self.stats[f"device_{fault.kind}_{detail}"] += 1


def _history(episode: EpisodeBuilder | None) -> list:
    """The actions of the episode in progress (none when its reset is still being collected)."""
    return [] if episode is None else episode.actions
