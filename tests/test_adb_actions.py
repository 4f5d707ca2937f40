"""Actions as `input` lines: pixels, swipe directions, keys, and text that survives the device shell intact."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.envs.adb.actions import MAX_TEXT, UntypeableText, action_command, escape_text
from actors.envs.adb.device import AdbDevice
from common.types import Action, ActionType, SwipeDirection, UIElement
from tests.fake_adb import FakeAdbServer, FakePhone, Screen, make_png

pytestmark = pytest.mark.timeout(60)

SIZE = (1080, 2400)


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    phone = FakePhone(screens={"home": Screen(b"<hierarchy/>", make_png(2, 2, (0, 0, 0)))}, current="home")
    with FakeAdbServer(phone) as s:
        yield s


@pytest.fixture
def device(server):
    return AdbDevice(server.phone.serial, port=server.port, timeout=2)


def android_input_text(arg: str) -> str:
    """What Android's `input text` types for its argument (InputShellCommand.sendText): "%s" -> " "."""
    out, escape = [], False
    for ch in arg:
        if escape:
            escape = False
            if ch == "s":
                out[-1] = " "  # the "%" becomes the space, the "s" is dropped
                continue
        out.append(ch)
        escape = ch == "%"
    return "".join(out)


# ---- pixels, swipes, keys ----


@pytest.mark.parametrize(
    ("x", "y", "want"),
    [
        (0.5, 0.5, "input tap 540 1200"),
        (0.0, 0.0, "input tap 0 0"),
        (1.0, 1.0, "input tap 1079 2399"),
        (-3.0, 7.0, "input tap 0 2399"),
        (float("inf"), float("-inf"), "input tap 1079 0"),
    ],
)
def test_tap_pixels_are_clamped(x, y, want):
    assert action_command(Action.tap(x, y), SIZE) == want


@pytest.mark.parametrize(("x", "y"), [(float("nan"), 0.5), (0.5, float("nan"))])
def test_tap_nan_is_refused(x, y):
    with pytest.raises(ValueError, match="NaN"):
        action_command(Action.tap(x, y), SIZE)


def test_tap_element_hits_its_centre():
    e = UIElement("android.widget.Button", bounds=(101, 333, 260, 481))
    assert action_command(Action.tap_element(e, SIZE), SIZE) == f"input tap {e.center[0]} {e.center[1]}"


def swipe_points(direction: SwipeDirection) -> list[int]:
    line = action_command(Action(ActionType.SWIPE, direction=direction), SIZE)
    words = line.split()
    assert words[:2] == ["input", "swipe"] and words[-1] == "300"
    points = [int(w) for w in words[2:6]]
    assert all(0 <= p < SIZE[i % 2] for i, p in enumerate(points))
    return points


def test_swipe_direction_is_the_finger_movement():
    x1, y1, x2, y2 = swipe_points(SwipeDirection.UP)
    assert x1 == x2 == 540 and y1 > y2 and y1 - y2 > SIZE[1] // 3  # lower to upper: content scrolls up
    x1, y1, x2, y2 = swipe_points(SwipeDirection.DOWN)
    assert x1 == x2 and y1 < y2
    x1, y1, x2, y2 = swipe_points(SwipeDirection.LEFT)
    assert y1 == y2 == 1200 and x1 > x2
    x1, y1, x2, y2 = swipe_points(SwipeDirection.RIGHT)
    assert y1 == y2 and x1 < x2


def test_keys_and_complete(device, server):
    for kind in (ActionType.PRESS_BACK, ActionType.PRESS_HOME, ActionType.PRESS_ENTER):
        device.check(action_command(Action(kind), SIZE))
    assert server.phone.keys == ["4", "3", "66"]
    assert action_command(Action(ActionType.STATUS_COMPLETE), SIZE) is None


def test_tap_and_swipe_run_on_the_fake(device, server):
    device.check(action_command(Action.tap(0.25, 0.75), SIZE))
    device.check(action_command(Action(ActionType.SWIPE, direction=SwipeDirection.UP), SIZE))
    assert server.phone.commands == ["input tap 270 1800", "input swipe 540 1920 540 480 300"]


# ---- text ----

HOSTILE = [
    "hello world",
    "a'; rm -rf / #",
    "$(reboot)",
    "`reboot`",
    "\"quoted\" and 'single'",
    "a && b || c; d | e > f < g",
    "back\\slash \\n",
    "100% sure",
    "%d %% %",
    "  leading and trailing  ",
    "~!@#$^&*()_+{}[]:;<>?,./=-",
    "x" * MAX_TEXT,
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_typed_verbatim_as_one_command(device, server, text):
    line = action_command(Action(ActionType.TYPE, text=text), SIZE)
    device.check(line)
    assert server.phone.typed == [text]
    assert len(server.phone.commands) == 1 and server.phone.commands[0].startswith("input text ")
    assert android_input_text(shlex.split(line)[2]) == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("line\nbreak", "printable ASCII"),
        ("tab\there", "printable ASCII"),
        ("nul\x00", "printable ASCII"),
        ("café", "printable ASCII"),
        ("日本", "printable ASCII"),
        ("emoji 🙂", "printable ASCII"),
        ("100%sure", "as a space"),
        ("a%%sb", "as a space"),
        ("", "empty"),
        ("x" * (MAX_TEXT + 1), "limit"),
    ],
)
def test_untypeable_text_is_refused(text, why):
    with pytest.raises(UntypeableText, match=why):
        action_command(Action(ActionType.TYPE, text=text), SIZE)


def test_untypeable_names_the_character():
    with pytest.raises(UntypeableText, match=r"'é' at 3"):
        escape_text("caf\u00e9")
    assert issubclass(UntypeableText, ValueError)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=40))
def test_any_printable_text_round_trips(text):
    """The device shell's word, run through Android's %s rule, is the text, or the text is refused."""
    try:
        word = escape_text(text)
    except UntypeableText:
        assert "%s" in text
        return
    (arg,) = shlex.split(word)
    assert " " not in arg and android_input_text(arg) == text
