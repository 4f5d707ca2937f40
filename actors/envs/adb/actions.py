"""Actions as `input` shell lines: what a policy's Action becomes on a real device.

Swipe convention (SimPhone's): the direction is the way the finger moves, so SWIPE UP moves the finger
from the lower to the upper part of the screen and the content scrolls up, showing what lies below (and
opens the app drawer on the home screen). LEFT moves the finger right to left, showing what lies right.
"""

from __future__ import annotations

import math
import shlex

from common.types import Action, ActionType, SwipeDirection

SWIPE_MS = 300
"""Swipe duration: slow enough to scroll rather than fling far."""
SWIPE_SPAN = 0.2, 0.8
"""A swipe runs between these fractions of the screen, clear of the status and navigation bars."""
MAX_TEXT = 500
"""Longest text typed in one action; longer is a policy bug, and `input text` is slow per character."""
KEYCODES = {ActionType.PRESS_BACK: 4, ActionType.PRESS_HOME: 3, ActionType.PRESS_ENTER: 66}


class UntypeableText(ValueError):
    """Text `input text` cannot type faithfully (non-ASCII, control characters, "%s", too long, empty)."""


def escape_text(text: str) -> str:
    """One shell word that makes `input text` type exactly `text`.

    `input text` turns "%s" into a space and has no escape for a literal "%s", so that pair is refused;
    it can only type printable ASCII. The word is single-quoted for the device's POSIX /system/bin/sh.
    """
    if not text:
        raise UntypeableText("empty text")
    if len(text) > MAX_TEXT:
        raise UntypeableText(f"text of {len(text)} characters, over the {MAX_TEXT} limit")
    for i, ch in enumerate(text):
        if not " " <= ch <= "~":
            raise UntypeableText(f"character {ch!r} at {i}: `input text` types printable ASCII only")
    if "%s" in text:
        raise UntypeableText(f'"%s" at {text.index("%s")}: `input text` would type it as a space')
    return shlex.quote(text.replace(" ", "%s"))


def _pixel(v: float, size: int, name: str) -> int:
    if math.isnan(v):
        raise ValueError(f"{name} is NaN")
    return min(size - 1, max(0, round(min(1.0, max(0.0, v)) * size)))


def _swipe(direction: SwipeDirection, w: int, h: int) -> str:
    lo, hi = SWIPE_SPAN
    cx, cy = w // 2, h // 2
    top, bottom, left, right = round(h * lo), round(h * hi), round(w * lo), round(w * hi)
    x1, y1, x2, y2 = {
        SwipeDirection.UP: (cx, bottom, cx, top),
        SwipeDirection.DOWN: (cx, top, cx, bottom),
        SwipeDirection.LEFT: (right, cy, left, cy),
        SwipeDirection.RIGHT: (left, cy, right, cy),
    }[SwipeDirection(direction)]
    return f"input swipe {x1} {y1} {x2} {y2} {SWIPE_MS}"


def action_command(action: Action, screen_size: tuple[int, int]) -> str | None:
    """The shell line for `action` on a screen of (width, height) pixels; None for STATUS_COMPLETE and NOOP.

    Raises ValueError for a NaN coordinate and UntypeableText for text `input text` cannot type.
    """
    w, h = screen_size
    match action.type:
        case ActionType.TAP:
            return f"input tap {_pixel(action.x, w, 'x')} {_pixel(action.y, h, 'y')}"
        case ActionType.SWIPE:
            return _swipe(action.direction, w, h)
        case ActionType.TYPE:
            return f"input text {escape_text(action.text)}"
        case ActionType.STATUS_COMPLETE | ActionType.NOOP:
            return None
        case kind if kind in KEYCODES:
            return f"input keyevent {KEYCODES[kind]}"
    raise ValueError(f"unknown action type {action.type!r}")
