"""AdbPhoneEnv: a real phone or emulator as a gymnasium.Env with SimPhone's Observation and Action.

One step: the action as an `input` command, then observations until the screen settles (two UI dumps
in a row agree, or `settle_max` has passed), then the task's success check. One observation is a single
shell call (`uiautomator dump` + `cat`, and `screencap -p` when a screenshot is wanted), so a step costs
two or three adb round trips rather than the five or six of dumping, pulling and capturing separately.

Everything the device says is untrusted: an undecodable image, XML that does not parse, bounds outside
the screen, a command that hangs. Each raises a `DeviceFault` (actors/envs/faults.py) that the actor
turns into a truncated, counted episode; the next `reset()` first has the pool check and, if needed,
recover the device.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import gymnasium as gym

from actors.envs.adb.actions import UntypeableText, action_command
from actors.envs.adb.capture import decode_png, observe_line, split_capture
from actors.envs.adb.config import AdbConfig
from actors.envs.adb.device import AdbDevice
from actors.envs.adb.errors import DeviceOutputError
from actors.envs.adb.evaluator import Evaluator, make_evaluator
from actors.envs.adb.pool import DevicePool
from actors.envs.adb.screen_state import (
    TRANSIENT_DUMP_ERRORS,
    dump_failure,
    keyboard_frame,
    keyboard_may_show,
    ready_screen,
)
from actors.envs.adb.tasks import DeviceTask, bind, load_device_templates, run_setup
from actors.envs.adb.uixml import parse_dump
from actors.envs.faults import DeviceBadOutput, DeviceCommandFailed, DeviceFault, DeviceHang
from actors.envs.simphone.spaces import ActionSpace, ObservationSpace
from actors.envs.simphone.tasks import sample
from common.types import Action, ActionType, Observation, UIElement


class AdbPhoneEnv(gym.Env):
    """One device of a `DevicePool`. `info` carries the task, success, the judge's or check's reason."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(
        self,
        pool: DevicePool,
        serial: str,
        cfg: AdbConfig,
        templates: list,
        split: str = "train",
        max_steps: int = 0,
        evaluator: Evaluator | None = None,
        sleep=time.sleep,
    ):
        self.pool, self.serial, self.cfg = pool, serial, cfg
        self.device: AdbDevice = pool.device(serial)
        self.templates, self.split, self.max_steps = templates, split, max_steps
        self.evaluator = evaluator or make_evaluator(cfg.evaluator, cfg.judge, cfg.command_timeout)
        self.observation_space = ObservationSpace()
        self.action_space = ActionSpace()
        self.sleep = sleep
        self.task: DeviceTask | None = None
        self.screen_size = (0, 0)
        self._elements: tuple[UIElement, ...] = ()
        """The last observation's elements (to know when the keyboard may cover a tap)."""
        self.stats: dict[str, float] = {}
        self._steps = 0
        self._suspect = False
        """A fault happened since the last reset: ask the pool to check (and recover) the device first."""
        judged = getattr(self.evaluator, "needs_screenshot", False)
        self._success_on = cfg.success_on if cfg.success_on != "auto" else "end" if judged else "any_step"
        self._want_png = cfg.screenshot is not None or getattr(self.evaluator, "needs_screenshot", False)

    def _count(self, key: str, by: float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + by

    @property
    def device_counts(self) -> dict[str, float]:
        """What this device needed over the env's life (recoveries, retries, woken screens, ...): the
        actor adds them to its final stats as adb_<key>."""
        return self.stats

    # ---- gymnasium ----

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        try:
            return self._reset(options or {})
        except DeviceFault:
            self._suspect = True
            raise

    def _reset(self, options: dict):
        cfg = self.cfg
        deadline = time.monotonic() + cfg.reset_timeout
        if self._suspect:
            self._count("recoveries")
            self.pool.recover(self.serial)
            self._suspect = False
        if cfg.snapshot:
            self.pool.load_snapshot(self.serial, cfg.snapshot)
        else:
            ready_screen(self.device, self._left(deadline), self._count)
            self.device.check("input keyevent 3", self._left(deadline))
        task = options.get("task") or sample(self.templates, self.split, self.np_random, bind)
        run_setup(
            task, self.device, timeout=self._left(deadline),
            load_snapshot=lambda name: self.pool.load_snapshot(self.serial, name),
        )  # fmt: skip
        self.screen_size = self.device.screen_size(self._left(deadline))
        self.task, self._steps = task, 0
        obs, _ = self._observe(deadline, with_png=self._want_png)
        return obs, {"task": task.template.id, "suite": task.template.suite}

    def step(self, action: Action):
        assert self.task is not None, "call reset() first"
        try:
            return self._step(action)
        except DeviceFault:
            self._suspect = True
            raise

    def _step(self, action: Action):
        task = self.task
        self._steps += 1
        info: dict[str, Any] = {"task": task.template.id, "suite": task.template.suite}
        flag = self._act(action)
        if flag:
            info["invalid_action"] = flag
        obs, png = self._settle()
        completed = self.action_space.contains(action) and action.type == ActionType.STATUS_COMPLETE
        last = self._steps >= (self.max_steps or task.max_steps)
        holds = False
        if completed or self._success_on == "any_step" or (last and self._success_on == "end"):
            verdict = self.evaluator.evaluate(self.device, task, obs, png)
            holds, info["check"] = verdict.success, verdict.reason
        terminated = completed or holds
        success = holds and terminated
        truncated = not terminated and last
        info["success"] = success
        info["reason"] = (
            "task completed" if success else "completed before the task held" if completed
            else "step limit" if truncated else "running"
        )  # fmt: skip
        return obs, float(success), terminated, truncated, info

    def _act(self, action: Action) -> str:
        """Send the action; the invalid-action flag ("" when it went through)."""
        if not self.action_space.contains(action):
            return "unknown_action"
        try:
            line = action_command(action, self.screen_size)
        except UntypeableText:
            self._count("untypeable_text")
            return "untypeable_text"
        except ValueError:
            return "bad_coordinates"
        if line is None:
            return ""
        if line.startswith("input tap ") and keyboard_may_show(self._elements):
            self._clear_keyboard(line)
        result = self.device.shell(line, self.cfg.command_timeout)
        if result.code != 0:
            err = (result.stderr or result.stdout)[:200].decode("utf-8", "replace").strip()
            raise DeviceCommandFailed(0.0, f"{self.serial}: `{line[:60]}` exited {result.code}: {err}")
        return ""

    def _clear_keyboard(self, tap_line: str) -> None:
        """Hide the on-screen keyboard (BACK, which the keyboard takes for itself) when the tap would land
        on it: the element the policy chose lies under the keyboard, which the UI dump does not show."""
        x, y = (int(v) for v in tap_line.split()[2:4])
        frame = keyboard_frame(self.device, self.cfg.command_timeout)
        if frame is not None and frame[0] <= x < frame[2] and frame[1] <= y < frame[3]:
            self.device.check("input keyevent 4", self.cfg.command_timeout)
            self._count("keyboard_hidden")

    def _settle(self) -> tuple[Observation, bytes | None]:
        """Observe until two UI dumps in a row agree or `settle_max` has passed; the last observation.

        The polls dump the UI only; the screenshot (when one is wanted) is taken once, of the settled
        screen, so a step costs one `screencap` however long the screen takes to settle."""
        cfg = self.cfg
        start = time.monotonic()
        if cfg.settle_max <= 0:  # no settling: one observation, with the screen if wanted
            self._count("settle_polls")
            return self._observe(start + cfg.command_timeout, with_png=self._want_png)
        obs, _ = self._observe(start + cfg.command_timeout, with_png=False)
        polls, settled = 1, False
        while not settled and time.monotonic() - start < cfg.settle_max:
            self.sleep(cfg.settle_interval)
            previous = obs.elements
            obs, _ = self._observe(time.monotonic() + cfg.command_timeout, with_png=False)
            polls += 1
            settled = obs.elements == previous
        if not settled:
            self._count("settle_capped")
        self._count("settle_polls", polls)
        if not self._want_png:
            return obs, None
        png = self.device.check_bytes("screencap -p", cfg.command_timeout)
        shot = decode_png(png, cfg.screenshot) if cfg.screenshot else None
        return Observation(obs.instruction, obs.elements, obs.screen_size, shot), png

    def _observe(self, deadline: float, with_png: bool) -> tuple[Observation, bytes | None]:
        """One shell call: the UI dump, and the screen too when `with_png`. A dump that fails for a
        moment (an animation that never idles, no window yet) is tried again, up to --adb.dump-retries
        times (`dump_retries`, and `dump_not_idle` / `dump_null_root` by cause)."""
        for attempt in range(self.cfg.dump_retries + 1):
            result = self.device.shell(observe_line(with_png), self._left(deadline))
            if result.code == 0:
                break
            err = (result.stderr or result.stdout)[:300].decode("utf-8", "replace").strip()
            detail = dump_failure(err)
            if detail not in TRANSIENT_DUMP_ERRORS.values() or attempt == self.cfg.dump_retries:
                raise DeviceBadOutput(detail, f"{self.serial}: UI dump failed ({result.code}): {err}")
            self._count("dump_retries")
            self._count(detail)
            self.sleep(self.cfg.settle_interval)
        xml, png = split_capture(result.stdout, with_png)
        try:
            elements: list[UIElement] = parse_dump(xml, self.screen_size)
        except DeviceOutputError as e:
            raise DeviceBadOutput(e.kind, f"{self.serial}: {e}") from None
        shot = decode_png(png, self.cfg.screenshot) if png is not None and self.cfg.screenshot else None
        self._elements = tuple(elements)
        return Observation(self.task.instruction, self._elements, self.screen_size, shot), png

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeviceHang(0.0, "ran past its deadline (--adb.reset-timeout or --adb.command-timeout)")
        return left

    def close(self) -> None:
        self.pool.release(self.serial)


class _SharedPool:
    """Closes the pool (stopping the emulators it launched) when the last env using it is closed."""

    def __init__(self, pool: DevicePool, serials: list[str]):
        self.pool, self._open, self._lock = pool, set(serials), threading.Lock()

    def __getattr__(self, name: str):
        return getattr(self.pool, name)

    def release(self, serial: str) -> None:
        with self._lock:
            self._open.discard(serial)
            last = not self._open
        if last:
            self.pool.close()


def make_adb_envs(cfg: AdbConfig, tasks: str, split: str, max_steps: int, log=print) -> list[AdbPhoneEnv]:
    """Start the pool (attach or launch the devices) and make one environment per device."""
    templates = load_device_templates("stock" if tasks == "general" else tasks)
    evaluator = make_evaluator(
        cfg.evaluator, cfg.judge, cfg.command_timeout
    )  # bad flags fail before any boot
    pool = DevicePool(cfg, log)
    try:
        serials = pool.start()
    except BaseException:
        pool.close()
        raise
    shared = _SharedPool(pool, serials)
    log(f"actor: {len(serials)} device(s) ready: {', '.join(serials)}")
    return [AdbPhoneEnv(shared, s, cfg, templates, split, max_steps, evaluator) for s in serials]
