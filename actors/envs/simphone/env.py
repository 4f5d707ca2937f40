"""SimPhoneEnv: the built-in phone as a gymnasium.Env, with tasks, an evaluator and optional screenshots.

Reward: 1 when the task's success predicate holds at `status_complete` (or, with
`success_on="any_step"`, as soon as it holds after any action), else 0, minus an optional per-step
penalty. `status_complete` always ends the episode; the step limit truncates it. `info` carries the
task, the outcome and its reason, and a flag for an action the phone could not perform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from actors.envs.simphone import compose
from actors.envs.simphone import tasks as task_lib
from actors.envs.simphone.apps import default_apps
from actors.envs.simphone.phone import HEIGHT, WIDTH, SimPhone
from actors.envs.simphone.render import render_screenshot
from actors.envs.simphone.spaces import ActionSpace, ObservationSpace
from common.types import Action, ActionType, Observation


@dataclass(frozen=True)
class SimPhoneConfig:
    """The built-in phone: which tasks, how episodes end, what observations hold."""

    tasks: str = "general"
    """A shipped suite ("general", "webshop"), a task .json file, or a folder of them."""
    split: str = "train"
    """Templates and parameter values to draw from: train, test (adds held-out templates and test values),
    dev (train without the validation templates), validation or heldout (the held-out templates alone;
    tasks.py SPLITS)."""
    success_on: str = "any_step"
    """"complete": reward only at status_complete; "any_step": end with reward once the task holds."""
    step_penalty: float = 0.0
    """Subtracted from the reward of every step."""
    dialog_probability: float = 0.1
    """Chance that opening an app shows a notification-permission dialog first."""
    screenshot: tuple[int, int] | None = None
    """(width, height) of the rendered RGB screenshot, or None for no screenshot."""
    max_steps: int = 0
    """Override every template's step limit (0 keeps the template's)."""
    compose_rate: float = 0.0
    """Chance that an episode's task is a composition of two training tasks ("A and B", compose.py); only
    with the train and dev splits. 0 = never."""


class SimPhoneEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}  # noqa: RUF012

    def __init__(self, cfg: SimPhoneConfig = SimPhoneConfig(), templates: list | None = None):
        if cfg.success_on not in ("complete", "any_step"):
            raise ValueError(f"success_on must be 'complete' or 'any_step', got {cfg.success_on!r}")
        if not 0.0 <= cfg.compose_rate <= 1.0:
            raise ValueError(f"compose rate must be in [0, 1], got {cfg.compose_rate}")
        if cfg.compose_rate and cfg.split not in compose.SPLITS:
            raise ValueError(
                f"only the {' and '.join(compose.SPLITS)} splits compose tasks, not {cfg.split!r}"
            )
        self.cfg = cfg
        self.templates = templates if templates is not None else task_lib.load_templates(cfg.tasks)
        self.observation_space = ObservationSpace()
        self.action_space = ActionSpace()
        self.phone = SimPhone(default_apps(), np.random.default_rng(), cfg.dialog_probability)
        self.task: task_lib.Task | None = None
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.phone.rng = self.np_random
        self.phone.reset()
        task = (options or {}).get("task") or self._draw()
        task_lib.apply_setup(self.phone.state, task.setup)
        self.task = task
        self._steps = 0
        return self._observe(), {"task": task.template.id, "suite": task.template.suite}

    def _draw(self) -> task_lib.Task:
        """The next task of the split: a composition with probability compose_rate (no draw at 0, so the
        task stream of a run without compositions is unchanged)."""
        rng = self.np_random
        if self.cfg.compose_rate and rng.random() < self.cfg.compose_rate:
            return compose.sample_composed(self.templates, self.cfg.split, rng)
        return task_lib.sample(self.templates, self.cfg.split, rng)

    def step(self, action: Action):
        assert self.task is not None, "call reset() first"
        self._steps += 1
        info: dict[str, Any] = {"task": self.task.template.id, "suite": self.task.template.suite}
        flag = self.phone.act(action) if self.action_space.contains(action) else "unknown_action"
        if flag:
            info["invalid_action"] = flag
        holds = self.task.predicate.evaluate(self.phone.state)
        completed = isinstance(action, Action) and action.type == ActionType.STATUS_COMPLETE
        terminated = completed or (holds and self.cfg.success_on == "any_step")
        success = holds and terminated
        truncated = not terminated and self._steps >= (self.cfg.max_steps or self.task.max_steps)
        info["success"] = success
        info["reason"] = (
            "task completed" if success else "completed before the task held" if completed
            else "step limit" if truncated else "running"
        )  # fmt: skip
        reward = float(success) - self.cfg.step_penalty
        return self._observe(), reward, terminated, truncated, info

    def render(self) -> np.ndarray:
        screen = self.phone.screen()
        return render_screenshot(
            screen.elements, (WIDTH, HEIGHT), self.cfg.screenshot or (108, 240), screen.keyboard
        )

    def _observe(self) -> Observation:
        screen = self.phone.screen()
        shot = None
        if self.cfg.screenshot is not None:
            shot = render_screenshot(screen.elements, (WIDTH, HEIGHT), self.cfg.screenshot, screen.keyboard)
        return Observation(self.task.instruction, tuple(screen.elements), (WIDTH, HEIGHT), shot)
