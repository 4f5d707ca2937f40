"""Real-device states a reset must clear before an episode: a screen that is off, a keyguard that shows,
and how a failed `uiautomator dump` reads.

A phone left alone turns its screen off and locks; `uiautomator dump` then fails ("null root node")
and taps land on the lock screen. `ready_screen` wakes the screen and dismisses a swipe keyguard, and
stops with a clear fault when a PIN/pattern/password lock remains (it cannot be dismissed over adb).
`dump_failure` tells a transient dump failure (an animated screen that never idles, no window yet),
worth a retry, from one that is not. `keyboard_frame` finds the on-screen keyboard: the UI dump shows
only the app's window, so elements under the keyboard look tappable while a tap there hits a key.
"""

from __future__ import annotations

import re

from actors.envs.adb.device import AdbDevice
from actors.envs.faults import DeviceCommandFailed

STATE_LINE = "dumpsys power; dumpsys window policy"
"""One shell call for both: the power manager's wakefulness and the window policy's keyguard flags."""
AWAKE = re.compile(r"mWakefulness=(\w+)")
LOCKED = re.compile(r"(mShowingLockscreen|mDreamingLockscreen|isStatusBarKeyguard|showing)=true")
"""Keyguard flags across Android versions (the first two to Android 9, later `isStatusBarKeyguard` and
the KeyguardController's `showing`)."""

KEYBOARD_LINE = "dumpsys input_method; dumpsys window InputMethod"
"""Whether the input method shows its keyboard, and the frame of its window."""
KEYBOARD_SHOWN = re.compile(r"\b(mInputShown|mIsInputViewShown|isInputViewShown)=true")
FRAME = re.compile(r"\b(?:mFrame|frame)=\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
EDITABLE = ("EditText", "AutoCompleteTextView")


def keyboard_may_show(elements) -> bool:
    """A focused text field on screen: the only time the keyboard can be up, so the only time a tap
    pays for `keyboard_frame`."""
    return any(e.focused and any(h in e.cls for h in EDITABLE) for e in elements)


def keyboard_frame(device: AdbDevice, timeout: float) -> tuple[int, int, int, int] | None:
    """(left, top, right, bottom) of the shown keyboard's window, or None when none shows."""
    out = device.check(KEYBOARD_LINE, timeout)
    if not KEYBOARD_SHOWN.search(out):
        return None
    frame = FRAME.search(out)
    if frame is None:
        return None
    left, top, right, bottom = (int(v) for v in frame.groups())
    return (left, top, right, bottom) if right > left and bottom > top else None


TRANSIENT_DUMP_ERRORS = {
    "could not get idle state": "dump_not_idle",
    "null root node": "dump_null_root",
}
"""uiautomator's messages for a dump that may work a moment later -> the detail it is counted under."""


def screen_state(device: AdbDevice, timeout: float) -> tuple[bool, bool]:
    """(awake, locked) from `dumpsys`. A device that prints neither flag counts as awake and unlocked."""
    out = device.check(STATE_LINE, timeout)
    wake = AWAKE.search(out)
    return (wake is None or wake.group(1) == "Awake"), LOCKED.search(out) is not None


def ready_screen(device: AdbDevice, timeout: float, count) -> None:
    """Wake the screen and dismiss the keyguard when needed (counted as `screen_woken` and
    `keyguard_dismissed`); DeviceCommandFailed when a secure lock stays."""
    awake, locked = screen_state(device, timeout)
    if awake and not locked:
        return
    if not awake:
        device.check("input keyevent KEYCODE_WAKEUP", timeout)
        count("screen_woken")
    if locked:
        device.check("wm dismiss-keyguard", timeout)
        count("keyguard_dismissed")
    awake, locked = screen_state(device, timeout)
    if locked:
        raise DeviceCommandFailed(
            0.0,
            f"{device.serial}: the screen stays locked after `wm dismiss-keyguard`: it has a PIN, pattern "
            "or password lock, which adb cannot dismiss; remove it for training (Settings > Security)",
        )
    if not awake:
        raise DeviceCommandFailed(0.0, f"{device.serial}: the screen stays off after KEYCODE_WAKEUP")


def dump_failure(message: str) -> str:
    """The detail a failed dump is counted under: a transient one of TRANSIENT_DUMP_ERRORS, else
    "dump_failed"."""
    lowered = message.lower()
    for text, detail in TRANSIENT_DUMP_ERRORS.items():
        if text in lowered:
            return detail
    return "dump_failed"
