"""Configuration of the ADB backend (`python -m actors --backend adb --adb.serials ...`).

Both configs check their own values (`__post_init__`, ValueError naming the `--adb.*` flag); which
devices to use (serials or AVDs, distinct, a free emulator port range) is the device pool's to check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class JudgeConfig:
    """An optional VLM judge of success: an OpenAI-compatible chat endpoint that sees the last screenshot."""

    url: str = ""
    """Chat-completions URL, e.g. "http://127.0.0.1:8000/v1/chat/completions" (empty: no judge)."""
    model: str = ""
    """Model name sent in the request."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the bearer token (unset: no Authorization header)."""
    timeout: float = 60.0
    """Seconds to wait for the judge's answer; a timeout counts as failure, with the reason."""

    def __post_init__(self) -> None:
        _check("judge.timeout", self.timeout, positive=True)


@dataclass(frozen=True)
class AdbConfig:
    """Real phones or emulators through an adb server."""

    host: str = "127.0.0.1"
    """Address of the adb server (`adb start-server` listens on 127.0.0.1:5037)."""
    port: int = 5037
    """Port of the adb server."""
    serials: tuple[str, ...] = ()
    """Attach to these running devices (`adb devices` lists them). One environment per device."""
    avds: tuple[str, ...] = ()
    """Or launch these AVDs (one emulator each); they stop when the actor stops, even when it is killed."""
    emulator_binary: str = "emulator"
    """The Android emulator executable (from $ANDROID_HOME/emulator), for --adb.avds."""
    emulator_port: int = 5554
    """Console port of the first launched emulator; the next ones use +2, +4, ... (adb's numbering)."""
    emulator_args: tuple[str, ...] = ("-no-window", "-no-audio", "-no-snapshot-save", "-read-only")
    """Extra emulator flags, after `-avd NAME -port P`."""
    boot_timeout: float = 300.0
    """Seconds a launched emulator has to reach sys.boot_completed=1."""
    snapshot: str = ""
    """Load this emulator snapshot at every reset (emulators only; empty: go home and run the task's setup)."""
    max_restarts: int = 5
    """Give up on a device after this many failed recoveries in a row (its environment stays down)."""
    restart_backoff: float = 2.0
    """Seconds before the first recovery attempt; doubles per failure, up to 60 s."""
    command_timeout: float = 10.0
    """Seconds for one adb command (observation, action, check) before the device counts as hung."""
    reset_timeout: float = 60.0
    """Seconds for a whole reset (snapshot load, task setup, first observation)."""
    settle_interval: float = 0.2
    """After an action, seconds between observations while waiting for the screen to stop changing."""
    settle_max: float = 3.0
    """Longest wait for the screen to settle after an action; the last observation is used after that."""
    dump_retries: int = 3
    """Times to try a UI dump again that failed for a moment ("could not get idle state" on an animated
    screen, "null root node" before a window shows), settle-interval apart, before it is a fault."""
    screenshot: tuple[int, int] | None = None
    """(width, height) of the downscaled RGB screenshot in observations; None: no screenshot (faster)."""
    success_on: Literal["auto", "any_step", "end", "complete"] = "auto"
    """When to ask the evaluator: "any_step" after every action (the episode ends with reward once the
    task holds); "end" at STATUS_COMPLETE and at the step limit (as DigiRL judges the final screen);
    "complete" only at STATUS_COMPLETE. "auto": any_step with the task checks, end with the judge."""
    evaluator: Literal["checks", "judge"] = "checks"
    """"checks": the task's programmatic success checks over adb; "judge": ask the VLM judge (--adb.judge.url)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The VLM judge, used only with --adb.evaluator judge."""

    def __post_init__(self) -> None:
        for name in ("port", "emulator_port"):
            port = getattr(self, name)
            if not 1 <= port <= 65535:
                raise ValueError(f"{_flag(name)} must be in [1, 65535], got {port}")
        for name in ("boot_timeout", "command_timeout", "reset_timeout"):
            _check(name, getattr(self, name), positive=True)
        for name in ("max_restarts", "restart_backoff", "settle_interval", "settle_max", "dump_retries"):
            _check(name, getattr(self, name), positive=False)
        if self.screenshot is not None and not (len(self.screenshot) == 2 and min(self.screenshot) > 0):
            raise ValueError(f"--adb.screenshot must be a positive WIDTH HEIGHT, got {self.screenshot}")


def _flag(name: str) -> str:
    return "--adb." + name.replace("_", "-")


def _check(name: str, value: float, positive: bool) -> None:
    """A finite number > 0 (`positive`) or >= 0, or a ValueError naming its flag."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{_flag(name)} must be {'positive' if positive else '>= 0'}, got {value}")
