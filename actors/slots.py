"""The actor's environments as slots that step inline or each on its own thread.

A real device takes about a second per action, with a long tail, and now and then fails. Stepping N of
them one after another would make every action wait for all the others, and one hung device would stall
the whole actor. So with `threaded=True` every step and reset runs on a worker thread; the actor acts on
whichever slots are ready (one batched policy call for all of them) and collects outcomes as they come:
collection runs at the pace of each device, not of the slowest.

A reset that fails (a device that is down) puts its slot out of service; it is tried again after a
backoff that doubles per failure (1 s, 2 s, ... 60 s), while the other slots keep working. In-process
environments (SimPhone, the stand-in) step inline: threads would only add overhead there.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from actors.envs.faults import DeviceFault

MAX_RESET_BACKOFF = 60.0


@dataclass
class Outcome:
    """What a slot's step or reset gave back."""

    slot: int
    kind: str
    """"step" or "reset"."""
    result: Any = None
    """step: (obs, reward, terminated, truncated, info); reset: (obs, info)."""
    fault: DeviceFault | None = None
    tag: Any = None
    """What the caller attached to the step (the actor's StepTag, actors/stepper.py: features, choice, ...
    of the action taken), handed back untouched."""


@dataclass
class _Slot:
    env: gym.Env
    obs: Any = None
    """The newest observation, None while a reset is due or running."""
    busy: Future | None = None
    retry_at: float = 0.0
    """While down: when to try the reset again."""
    failures: int = 0
    """Failed resets in a row."""
    seed: int | None = None
    data: dict = field(default_factory=dict)
    """The caller's per-slot state (the episode in progress)."""


class EnvSlots:
    def __init__(
        self,
        envs: list[gym.Env],
        seeds: list[int],
        threaded: bool,
        stats: Counter,
        log=print,
        reset_backoff: float = 1.0,
    ):
        self.reset_backoff = reset_backoff
        """Seconds before retrying a failed reset; doubles per failure in a row, up to 60 s."""
        self.slots = [_Slot(env, seed=seed) for env, seed in zip(envs, seeds, strict=True)]
        self.threaded = threaded
        self.stats = stats
        self.log = log
        self._pool = ThreadPoolExecutor(len(envs), thread_name_prefix="env") if threaded else None
        self._done: list[Outcome] = []

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, i: int) -> _Slot:
        return self.slots[i]

    def ready(self) -> list[int]:
        """Slots with an observation and nothing running: the ones to act on now."""
        return [i for i, s in enumerate(self.slots) if s.obs is not None and s.busy is None]

    def down(self) -> int:
        return sum(s.obs is None and s.busy is None for s in self.slots)

    def step(self, i: int, action, tag: Any = None) -> None:
        slot = self.slots[i]
        slot.obs = None
        self._run(i, "step", lambda: slot.env.step(action), tag)

    def park(self, i: int) -> None:
        """Leave slot i idle (its episode is over) until `reset(i)`."""
        self.slots[i].obs = None

    def reset(self, i: int) -> None:
        """Start a new episode on slot i (the first reset of a slot uses its seed)."""
        slot = self.slots[i]
        slot.obs = None
        seed, slot.seed = slot.seed, None
        self._run(i, "reset", lambda: slot.env.reset(seed=seed))

    def _run(self, i: int, kind: str, fn, tag: Any = None) -> None:
        if self._pool is None:
            self._done.append(self._call(i, kind, fn, tag))
            return
        future = self._pool.submit(self._call, i, kind, fn, tag)
        self.slots[i].busy = future

    @staticmethod
    def _call(i: int, kind: str, fn, tag: Any) -> Outcome:
        try:
            return Outcome(i, kind, fn(), tag=tag)
        except DeviceFault as fault:
            return Outcome(i, kind, fault=fault, tag=tag)

    def collect(self, timeout: float = 0.0) -> list[Outcome]:
        """Outcomes finished since the last call, waiting up to `timeout` s for one if none is; also
        retries the resets of slots that are down and due."""
        now = time.monotonic()
        for i, slot in enumerate(self.slots):
            if slot.obs is None and slot.busy is None and slot.retry_at and now >= slot.retry_at:
                slot.retry_at = 0.0
                self.stats["reset_retries"] += 1
                self.reset(i)
        if self._pool is not None:
            busy = [s.busy for s in self.slots if s.busy is not None]
            if busy and not self._done:
                wait(busy, timeout=timeout, return_when=FIRST_COMPLETED)
            for slot in self.slots:
                if slot.busy is not None and slot.busy.done():
                    self._done.append(slot.busy.result())
                    slot.busy = None
        elif not self._done and timeout > 0:
            time.sleep(timeout)
        done, self._done = self._done, []
        for out in done:
            self._settle(out)
        return done

    def _settle(self, out: Outcome) -> None:
        slot = self.slots[out.slot]
        if out.kind == "reset":
            if out.fault is None:
                slot.obs, slot.failures = out.result[0], 0
                return
            slot.failures += 1
            backoff = min(MAX_RESET_BACKOFF, self.reset_backoff * 2.0 ** (slot.failures - 1))
            slot.retry_at = time.monotonic() + backoff
            self.stats[f"reset_{out.fault.kind}"] += 1
            self.log(f"actor: env {out.slot} could not reset ({out.fault}); retrying in {backoff:.3g}s")
        elif out.fault is None:
            slot.obs = out.result[0]

    def close(self, close_envs: bool = True) -> None:
        """Wait for running steps (each bounded by its device timeout), then close every env (or leave
        them open for another EnvSlots)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for slot in self.slots if close_envs else ():
            # A real device's handled quirks (screen woken, dump retried, ...) go into the actor's final
            # line as adb_<key>; its faults are counted as device_<kind> when they happen.
            for key, value in getattr(slot.env, "device_counts", {}).items():
                self.stats[f"adb_{key}"] += value
            try:
                slot.env.close()
            except Exception as e:  # closing is best effort: one bad env must not keep others open
                self.log(f"actor: closing an env failed: {e}")
