"""Observation, Action and the pointer policy's typed choice: the data every backend and both sides share.

An Observation looks like what `uiautomator dump` plus `screencap` give on a real phone, so the
built-in phone and the ADB backend are interchangeable. An Action follows Android-in-the-Wild /
AndroidWorld: taps, swipes, typed text and key presses, with coordinates normalized to [0, 1].
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class UIElement:
    """One node of the UI tree, as `uiautomator dump` reports it."""

    cls: str
    """Android widget class, e.g. `android.widget.TextView`."""
    text: str = ""
    """Visible text."""
    content_desc: str = ""
    """Accessibility description (icons often have only this)."""
    hint: str = ""
    """Placeholder of an empty text field (uiautomator's `hint`): it says what to type, but is not typed."""
    resource_id: str = ""
    """View id, e.g. `com.android.settings:id/switch_widget`."""
    bounds: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(left, top, right, bottom) in screen pixels."""
    clickable: bool = False
    checked: bool = False
    focused: bool = False
    scrollable: bool = False

    @property
    def center(self) -> tuple[int, int]:
        left, top, right, bottom = self.bounds
        return (left + right) // 2, (top + bottom) // 2

    @property
    def label(self) -> str:
        """The text a person would read on or for this element."""
        return self.text or self.content_desc or self.hint


@dataclass(frozen=True)
class Observation:
    """What the policy sees at one step."""

    instruction: str
    """The task in natural language, e.g. "Turn on Wi-Fi"."""
    elements: tuple[UIElement, ...]
    """The UI elements on screen, in tree order."""
    screen_size: tuple[int, int] = (1080, 2400)
    """(width, height) of the screen in pixels."""
    screenshot: np.ndarray | None = None
    """Optional uint8 RGB screenshot [H, W, 3], downscaled."""


class ActionType(enum.IntEnum):
    """Action kinds; the integer values are part of the wire protocol."""

    TAP = 0
    SWIPE = 1
    TYPE = 2
    PRESS_BACK = 3
    PRESS_HOME = 4
    PRESS_ENTER = 5
    STATUS_COMPLETE = 6
    NOOP = 7
    """Nothing happens: what an action that did not parse becomes (the `lm` family with constraints off).
    No policy chooses it as such, so it is not among NUM_ACTION_TYPES."""


class SwipeDirection(enum.IntEnum):
    UP = 0
    DOWN = 1
    LEFT = 2
    RIGHT = 3


NUM_ACTION_TYPES = 7
"""The action types a policy chooses among (the pointer policy's action_type head): all but NOOP."""
NOOP_PENALTY = 0.1
"""Subtracted by the actor from the reward of a NOOP step (an action that did not parse), which it counts."""
NUM_SWIPE_DIRECTIONS = len(SwipeDirection)


@dataclass(frozen=True)
class Action:
    """One action. `tap` targets a point (normalized to [0, 1]); `type` writes `text` into the focused field."""

    type: ActionType
    x: float = 0.0
    y: float = 0.0
    direction: SwipeDirection = SwipeDirection.UP
    text: str = ""
    note: str = field(default="", compare=False)
    """How the policy that chose it wrote it (the `lm` family's action text, e.g. `tap(3)`), so that a
    family can show an episode's earlier actions in its own words; not part of what the action does."""

    @staticmethod
    def tap(x: float, y: float) -> Action:
        return Action(ActionType.TAP, x=x, y=y)

    @staticmethod
    def tap_element(element: UIElement, screen_size: tuple[int, int]) -> Action:
        cx, cy = element.center
        return Action(ActionType.TAP, x=cx / screen_size[0], y=cy / screen_size[1])

    def to_aitw(self) -> str:
        """The Android-in-the-Wild style action string, for logs and text-generating policies."""
        match self.type:
            case ActionType.TAP:
                return f"DUAL_POINT({self.x:.3f}, {self.y:.3f})"
            case ActionType.SWIPE:
                return f"SCROLL({self.direction.name})"
            case ActionType.TYPE:
                return f'TYPE("{self.text}")'
            case _:
                return self.type.name


@dataclass(frozen=True)
class PolicyChoice:
    """The indices the factorized policy head picked; what the learner needs to recompute log-probs."""

    action_type: int
    element: int = 0
    """Index into the observation's element list (tap and type targets)."""
    word: int = 0
    """Index into the instruction's words (the text to type)."""
    direction: int = 0

    def as_dict(self) -> dict[str, int]:
        """The choice as the pointer family's choice arrays take it (common/policies/pointer/family.py)."""
        return {
            "action_type": self.action_type,
            "element": self.element,
            "word": self.word,
            "direction": self.direction,
        }
