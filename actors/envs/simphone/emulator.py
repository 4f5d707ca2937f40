"""An emulator model: make a simulated phone step, reset and fail like a real Android emulator.

Why
---
A real emulator driven over adb takes about one action per second, with a wide, right-skewed spread
(screenshots and `uiautomator dump` of a heavy screen, app start-up, garbage collection), now and then a
stall of several seconds, slow resets, and faults: a command that never returns (a hang), an emulator
process that dies (a crash, which needs a cold restart) and an adb connection that drops (a disconnect,
which needs a reconnect). The whole point of an asynchronous, distributed learner is to keep learning
while such slow and unreliable devices step at their own pace, so the framework has to show its
asynchrony and its fault tolerance without owning an emulator. This module does that over any env with
the Observation / Action API (the stand-in phone, the SimPhone): `EmulatedPhone` waits the sampled
delays and raises the sampled faults; `EmulatorModel` only samples, so the same model can drive
simulations, benchmarks and tests with a fake clock.

How actors handle faults
------------------------
`EmulatedPhone.step` raises a `DeviceFault` (`DeviceHang`, `DeviceCrash` or `DeviceDisconnected`)
after it has waited as long as the real device would have made the actor wait. An actor is expected to:

1. end the interrupted episode and send it as *truncated* (`truncated = True`, the last
   observation it has as `final_features`, so the learner bootstraps from the value instead of
   treating the fault as a terminal state; an episode with no steps yet is dropped);
2. call `reset()` on the env, which pays for the recovery (restart after a crash, reconnect after a
   disconnect) plus the usual reset delay;
3. count the fault by kind (`DeviceFault.kind`) in its metrics; `EmulatedPhone.stats` counts them too.

After a crash, every `step` raises `DeviceCrash` at once until `reset()` is called. After a disconnect
or a hang the env may be stepped again (a step after a disconnect first pays the reconnect), but the
episode is still to be sent as truncated: a real actor cannot know what the interrupted action did.

Defaults and why
----------------
The model is off by default (`enabled=False`); `maybe_wrap` then returns the env itself.

- Step latency: lognormal with mean 1.0 s and sigma 0.6 (median 0.84 s, 95th percentile 2.2 s),
  about one action per second with the long right tail seen on emulators.
- Stalls: with probability 0.01 per step a step takes an extra exponential stall of mean 5 s.
- Reset: lognormal with mean 4 s, sigma 0.5 (home, force-stop apps, clear their state).
- Faults per step: hang 0.001, crash 0.0005, disconnect 0.001; at one step per second that is a hang
  every ~17 minutes, a crash every ~33 minutes and a drop every ~17 minutes per device: rare, but a
  fleet of devices meets several an hour.
- Recovery: restart after a crash 60 s (snapshot boot), reconnect after a drop 3 s.
- Step timeout: 30 s; a hang is reported after exactly that long, and so is any step whose sampled
  latency plus stall would reach it (the caller's timeout fires first).
- `time_scale` (1.0) multiplies every duration above, the step timeout included, so tests and benchmarks
  can run the same model ten or a thousand times faster. These numbers are plausible estimates for
  a loaded desktop emulator, not measurements.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from actors.envs.faults import DeviceCrash, DeviceDisconnected, DeviceFault, DeviceHang
from common.config import EmulatorModelConfig

FAULT_KINDS = ("hang", "crash", "disconnect")
"""The faults this model raises (actors/envs/faults.py has every kind a backend may raise)."""


# ---- faults ---------------------------------------------------------------------------------------------
_FAULTS: dict[str, type[DeviceFault]] = {
    "hang": DeviceHang,
    "crash": DeviceCrash,
    "disconnect": DeviceDisconnected,
}


# ---- sampling -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepOutcome:
    """What one step does on the device: how long it takes (wall-clock, scaled) and how it fails."""

    delay_s: float
    """Seconds the caller waits before the step returns or raises (a hang: the step timeout)."""
    fault: str | None = None
    """None, "hang", "crash" or "disconnect"."""
    stall_s: float = 0.0
    """The part of `delay_s` that was a stall (successful steps only)."""


def _lognormal(mean: float, sigma: float, z: float) -> float:
    """The lognormal with the given mean and log-sigma at standard-normal quantile z."""
    if mean <= 0.0:
        return 0.0
    return math.exp(math.log(mean) - 0.5 * sigma * sigma + sigma * z)


class EmulatorModel:
    """Samples step outcomes and reset delays; pure (no sleeping), deterministic given the Generator.

    Each `step_outcome` draws exactly three uniforms and one standard normal, and each `reset_delay` one
    standard normal, whatever the config, so two models fed the same Generator stay in step.
    """

    def __init__(self, cfg: EmulatorModelConfig):
        self.cfg = cfg
        self.scale = cfg.time_scale
        self._hang_at = cfg.hang_prob
        self._crash_at = cfg.hang_prob + cfg.crash_prob
        self._disconnect_at = self._crash_at + cfg.disconnect_prob

    @property
    def step_timeout_s(self) -> float:
        """The step timeout in wall-clock seconds (after `time_scale`)."""
        return self.cfg.step_timeout * self.scale

    @property
    def restart_s(self) -> float:
        return self.cfg.restart_seconds * self.scale

    @property
    def reconnect_s(self) -> float:
        return self.cfg.reconnect_seconds * self.scale

    def step_outcome(self, rng: np.random.Generator) -> StepOutcome:
        cfg = self.cfg
        u_fault, u_stall, u_len = rng.random(3).tolist()
        latency = _lognormal(cfg.step_latency_mean, cfg.step_latency_sigma, float(rng.standard_normal()))
        if u_fault < self._hang_at:
            return StepOutcome(self.step_timeout_s, "hang")
        if u_fault < self._crash_at:
            # The device dies while executing the action; adb reports it when the command would have returned.
            return StepOutcome(min(latency, cfg.step_timeout) * self.scale, "crash")
        if u_fault < self._disconnect_at:
            return StepOutcome(0.0, "disconnect")
        stall = -cfg.stall_mean * math.log1p(-u_len) if u_stall < cfg.stall_prob else 0.0
        if latency + stall >= cfg.step_timeout:
            return StepOutcome(self.step_timeout_s, "hang")
        return StepOutcome((latency + stall) * self.scale, None, stall * self.scale)

    def reset_delay(self, rng: np.random.Generator) -> float:
        cfg = self.cfg
        z = float(rng.standard_normal())
        return _lognormal(cfg.reset_latency_mean, cfg.reset_latency_sigma, z) * self.scale


# ---- the wrapper ----------------------------------------------------------------------------------------
class EmulatedPhone(gym.Wrapper):
    """Wraps an Observation/Action env so that it steps, resets and fails like a real emulator.

    `sleep` is called with every delay (inject a fake clock in tests); `stats` counts steps, faults by
    kind (`fault_hang`, ...), steps refused by a crashed device (`dead_steps`), resets, restarts,
    reconnects, and seconds waited by cause (`wait_s_step`, `wait_s_stall`, `wait_s_hang`,
    `wait_s_crash`, `wait_s_reset`, `wait_s_restart`, `wait_s_reconnect`). With a disabled config the
    wrapper only forwards `step` and `reset`.
    """

    def __init__(
        self,
        env: gym.Env,
        cfg: EmulatorModelConfig,
        *,
        index: int = 0,
        rng: np.random.Generator | None = None,
        sleep: Callable[[float], Any] = time.sleep,
        model: EmulatorModel | None = None,
    ):
        super().__init__(env)
        self.cfg = cfg
        self.model = model if model is not None else EmulatorModel(cfg)
        # The draws of this device: by default stream `index` of `cfg.seed`, so that every env differs.
        self.rng = rng if rng is not None else np.random.default_rng([cfg.seed, index])
        self.sleep = sleep
        self.stats: Counter = Counter()
        # What the device needs before it works again: None, "restart" (crashed) or "reconnect".
        self.needs: str | None = None
        self._enabled = cfg.enabled

    def _wait(self, seconds: float, cause: str) -> None:
        if seconds > 0.0:
            self.stats[f"wait_s_{cause}"] += seconds
            self.sleep(seconds)

    def step(self, action):
        if not self._enabled:
            return self.env.step(action)
        stats = self.stats
        stats["steps"] += 1
        if self.needs == "restart":
            stats["dead_steps"] += 1
            raise DeviceCrash(0.0, "emulated device is down after a crash; call reset() to restart it")
        if self.needs == "reconnect":
            stats["reconnects"] += 1
            self._wait(self.model.reconnect_s, "reconnect")
            self.needs = None
        out = self.model.step_outcome(self.rng)
        if out.fault is not None:
            stats[f"fault_{out.fault}"] += 1
            self._wait(out.delay_s, out.fault)
            if out.fault == "crash":
                self.needs = "restart"
            elif out.fault == "disconnect":
                self.needs = "reconnect"
            raise _FAULTS[out.fault](out.delay_s)
        if out.delay_s > 0.0:
            stats["wait_s_step"] += out.delay_s - out.stall_s
            stats["wait_s_stall"] += out.stall_s
            self.sleep(out.delay_s)
        obs, reward, terminated, truncated, info = self.env.step(action)
        stats["steps_ok"] += 1
        info = {**info, "emulator": {"delay_s": out.delay_s, "stall_s": out.stall_s}}
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if not self._enabled:
            return self.env.reset(seed=seed, options=options)
        stats = self.stats
        stats["resets"] += 1
        recovered, extra = self.needs, 0.0
        if recovered == "restart":
            stats["restarts"] += 1
            extra = self.model.restart_s
        elif recovered == "reconnect":
            stats["reconnects"] += 1
            extra = self.model.reconnect_s
        if recovered is not None:
            self._wait(extra, recovered)
        delay = self.model.reset_delay(self.rng)
        self._wait(delay, "reset")
        self.needs = None
        obs, info = self.env.reset(seed=seed, options=options)
        info = {**info, "emulator": {"delay_s": extra + delay, "recovered": recovered}}
        return obs, info


def maybe_wrap(
    env: gym.Env,
    cfg: EmulatorModelConfig,
    *,
    index: int = 0,
    sleep: Callable[[float], Any] = time.sleep,
) -> gym.Env:
    """`EmulatedPhone(env, cfg, ...)` when the model is enabled, else `env` itself (zero overhead)."""
    if not cfg.enabled:
        return env
    return EmulatedPhone(env, cfg, index=index, sleep=sleep)
