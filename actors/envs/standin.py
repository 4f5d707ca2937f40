"""A small stand-in phone with tasks of 2 to 4 steps, until the full SimPhone exists.

It speaks the real Observation / Action types: a launcher with eight app icons in random order, a
Settings app with three switches, Notes with a text field, a Browser with a search box, and a few
distractor apps. Tapping works by coordinates (the element under the point is hit), `type` writes into
the focused field, back and home behave as on Android. Reward is 1 on the step that completes the task
(checked after every action, as DigiRL's evaluator does), and the episode then ends; `status_complete`
ends it without reward; the step limit truncates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from common.types import Action, ActionType, Observation, UIElement

SCREEN = (1080, 2400)
APPS = ("Settings", "Clock", "Messages", "Browser", "Notes", "Camera", "Maps", "Music")
SWITCHES = ("Wi-Fi", "Bluetooth", "Airplane mode")
WORDS = ("hello", "milk", "meeting", "pizza", "tokyo", "weather", "groceries", "football", "jazz", "coffee")
TASK_FAMILIES = ("open_app", "toggle", "write_note", "search")
_BUTTON = "android.widget.Button"
_TEXT = "android.widget.TextView"


@dataclass
class _PhoneState:
    screen: str = "home"
    switches: dict[str, bool] = field(default_factory=dict)
    field_text: dict[str, str] = field(default_factory=dict)
    focused: str | None = None
    searched: str | None = None


@dataclass(frozen=True)
class Task:
    family: str
    instruction: str
    target: str
    """App to open, switch to flip, or word to write/search."""
    want_on: bool = True


class StandInPhoneEnv(gym.Env):
    """gymnasium.Env over Observation / Action objects."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self, max_steps: int = 6, families: tuple[str, ...] = TASK_FAMILIES):
        unknown = set(families) - set(TASK_FAMILIES)
        if unknown:
            raise ValueError(f"unknown task families {sorted(unknown)}; choose from {TASK_FAMILIES}")
        self.max_steps = max_steps
        self.families = families
        self._rng = np.random.default_rng()
        self._state = _PhoneState()
        self._icon_order: list[str] = list(APPS)
        self._switch_order: list[str] = list(SWITCHES)
        self.task = Task("open_app", "Open Clock", "Clock")
        self._steps = 0

    # ---- gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        rng = self._rng
        self._icon_order = list(rng.permutation(APPS))
        self._switch_order = list(rng.permutation(SWITCHES))
        switches = {s: bool(rng.integers(2)) for s in SWITCHES}
        self._state = _PhoneState(switches=switches, field_text={"Notes": "", "Browser": ""})
        self.task = self._sample_task(rng.choice(self.families))
        if self.task.family == "toggle":
            self._state.switches[self.task.target] = not self.task.want_on
        self._steps = 0
        return self._observe(), {"task": self.task.family}

    def step(self, action: Action):
        self._steps += 1
        if action.type == ActionType.STATUS_COMPLETE:
            return self._observe(), 0.0, True, False, self._info(False)
        self._apply(action)
        success = self._succeeded()
        truncated = not success and self._steps >= self.max_steps
        return self._observe(), float(success), success, truncated, self._info(success)

    # ---- tasks ---------------------------------------------------------------------------------
    def _sample_task(self, family: str) -> Task:
        rng = self._rng
        if family == "open_app":
            app = str(rng.choice(APPS))
            others = [a for a in APPS if a != app]
            self._state.screen = "home" if rng.random() < 0.5 else str(rng.choice(others))
            return Task(family, f"Open the {app} app", app)
        if family == "toggle":
            switch = str(rng.choice(SWITCHES))
            on = bool(rng.integers(2))
            return Task(family, f"Turn {'on' if on else 'off'} {switch}", switch, on)
        word = str(rng.choice(WORDS))
        if family == "write_note":
            return Task(family, f"Write {word} in Notes", word)
        return Task(family, f"Search for {word} in the Browser", word)

    def _succeeded(self) -> bool:
        s, t = self._state, self.task
        match t.family:
            case "open_app":
                return s.screen == t.target
            case "toggle":
                return s.switches[t.target] == t.want_on
            case "write_note":
                return t.target in s.field_text["Notes"].split()
            case _:
                return s.searched == t.target

    def _info(self, success: bool) -> dict:
        return {"task": self.task.family, "success": success, "steps": self._steps}

    # ---- phone mechanics -----------------------------------------------------------------------
    def _apply(self, action: Action) -> None:
        s = self._state
        match action.type:
            case ActionType.PRESS_HOME | ActionType.PRESS_BACK:
                s.screen, s.focused = "home", None
            case ActionType.TAP:
                hit = self._element_at(action.x * SCREEN[0], action.y * SCREEN[1])
                if hit is not None:
                    self._tap(hit)
            case ActionType.TYPE:
                if s.focused is not None:
                    s.field_text[s.focused] = (s.field_text[s.focused] + " " + action.text).strip()
            case ActionType.PRESS_ENTER:
                if s.focused == "Browser" and s.field_text["Browser"]:
                    s.searched = s.field_text["Browser"]
            case ActionType.SWIPE:
                pass

    def _tap(self, el: UIElement) -> None:
        s = self._state
        if s.screen == "home" and el.content_desc in APPS:
            s.screen, s.focused = el.content_desc, None
        elif el.cls == "android.widget.Switch":
            s.switches[el.text] = not s.switches[el.text]
        elif "EditText" in el.cls:
            s.focused = s.screen

    def _element_at(self, x: float, y: float) -> UIElement | None:
        for el in reversed(self._elements()):
            left, top, right, bottom = el.bounds
            if el.clickable and left <= x < right and top <= y < bottom:
                return el
        return None

    def _elements(self) -> list[UIElement]:
        s = self._state
        els = [
            UIElement(
                _TEXT, text="12:00", resource_id="com.android.systemui:id/clock", bounds=(0, 0, 1080, 80)
            )
        ]
        if s.screen == "home":
            for i, app in enumerate(self._icon_order):
                col, row = i % 4, i // 4
                box = (col * 270, 1600 + row * 300, col * 270 + 270, 1600 + row * 300 + 300)
                els.append(UIElement(_TEXT, content_desc=app, bounds=box, clickable=True))
            return els
        els.append(UIElement(_TEXT, text=s.screen, resource_id="android:id/title", bounds=(0, 80, 1080, 240)))
        if s.screen == "Settings":
            for i, name in enumerate(self._switch_order):
                box = (0, 300 + i * 200, 1080, 500 + i * 200)
                els.append(
                    UIElement(
                        "android.widget.Switch",
                        text=name,
                        bounds=box,
                        clickable=True,
                        checked=s.switches[name],
                    )
                )
        elif s.screen in ("Notes", "Browser"):
            hint = "Write a note" if s.screen == "Notes" else "Search or type URL"
            els.append(
                UIElement(
                    "android.widget.EditText",
                    text=s.field_text[s.screen] or hint,
                    bounds=(40, 300, 1040, 440),
                    clickable=True,
                    focused=s.focused == s.screen,
                )
            )
            if s.screen == "Browser" and s.searched:
                els.append(UIElement(_TEXT, text=f"Results for {s.searched}", bounds=(40, 500, 1040, 640)))
        else:
            for i, label in enumerate(("Menu", "Share", "More options")):
                els.append(
                    UIElement(
                        _BUTTON, text=label, bounds=(i * 360, 2200, i * 360 + 360, 2400), clickable=True
                    )
                )
        return els

    def _observe(self) -> Observation:
        return Observation(self.task.instruction, tuple(self._elements()), SCREEN)
