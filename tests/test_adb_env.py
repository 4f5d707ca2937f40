"""AdbPhoneEnv through the real ADB code path (adbutils, the pool, the task checks) on the fake adb server:
whole episodes, settling, screenshots, and every device fault turned into a named DeviceFault."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

from actors.envs.adb.config import AdbConfig
from actors.envs.adb.env import AdbPhoneEnv, make_adb_envs
from actors.envs.faults import (
    DeviceBadOutput,
    DeviceCommandFailed,
    DeviceDisconnected,
    DeviceFault,
    DeviceHang,
)
from common.types import Action, ActionType, Observation
from tests.fake_adb import FakeAdbServer, FakePhone, Screen, make_png

pytestmark = pytest.mark.timeout(60)

SWITCH = (0, 500, 1080, 700)
ICON = (100, 1000, 300, 1200)


def _xml(*nodes: str) -> bytes:
    body = "".join(nodes)
    return f"<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">{body}</hierarchy>".encode()


def _node(
    text: str, bounds: tuple[int, int, int, int], cls: str = "android.widget.TextView", **flags: str
) -> str:
    attrs = " ".join(f'{k}="{v}"' for k, v in {"clickable": "true", **flags}.items())
    b = f"[{bounds[0]},{bounds[1]}][{bounds[2]},{bounds[3]}]"
    return f'<node text="{text}" class="{cls}" package="p" content-desc="" bounds="{b}" {attrs} />'


def _settings(on: bool) -> bytes:
    return _xml(
        _node("Network &amp; internet", (0, 200, 1080, 400)),
        _node("Airplane mode", SWITCH, "android.widget.Switch", checked=str(on).lower()),
    )


def _input(phone: FakePhone, argv: list[str]) -> tuple[bytes, bytes, int]:
    """`input` on the world phone: the airplane switch toggles the setting; HOME goes home."""
    match argv:
        case ["input", "tap", x, y]:
            x, y = int(x), int(y)
            if phone.current.startswith("settings") and SWITCH[1] <= y < SWITCH[3]:
                on = phone.settings.get("global/airplane_mode_on") != "1"
                phone.settings["global/airplane_mode_on"] = "1" if on else "0"
                phone.current = "settings_on" if on else "settings_off"
                return b"", b"", 0
            return phone._tap(x, y)
        case ["input", "keyevent", key]:
            phone.keys.append(key)
            if key == "3":
                phone.current = "home"
            return b"", b"", 0
        case ["input", "text", text]:
            phone.typed.append(text.replace("%s", " "))
            return b"", b"", 0
        case ["input", "swipe", *_]:
            return b"", b"", 0
    return b"", b"usage: input ...\n", 1


def _rm(phone: FakePhone, argv: list[str]) -> tuple[bytes, bytes, int]:
    for path in argv[1:]:
        phone.files.pop(path, None)
    return b"", b"", 0


def make_world_phone(png: bytes | None = None) -> FakePhone:
    """Home -> Settings -> the airplane-mode switch, with a real setting behind it."""
    shot = png or make_png(54, 120, (30, 60, 90))
    return FakePhone(
        screens={
            "home": Screen(_xml(_node("Settings", ICON)), shot, links={ICON: "settings_off"}),
            "settings_off": Screen(_settings(False), shot),
            "settings_on": Screen(_settings(True), shot),
        },
        current="home",
        handlers={"input": _input, "rm": _rm},
    )


TASKS = {
    "suite": "world",
    "templates": [
        {
            "id": "airplane_on",
            "instruction": "Turn on airplane mode",
            "setup": [{"home": True}, {"setting": "global/airplane_mode_on", "value": "0"}],
            "success": {"setting": "global/airplane_mode_on", "equals": "1"},
            "max_steps": 4,
        }
    ],
}


def write_tasks(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tasks") / "world.json"
    path.write_text(json.dumps(TASKS))
    return str(path)


def make_env_on(server: FakeAdbServer, tasks: str | None = None, **overrides) -> AdbPhoneEnv:
    """The one env of a pool attached to the fake phone (no settling wait unless asked)."""
    import tempfile
    from pathlib import Path

    if tasks is None:
        tasks = str(Path(tempfile.mkdtemp()) / "world.json")
        Path(tasks).write_text(json.dumps(TASKS))
    settings = {"settle_interval": 0.0, "settle_max": 0.5, "command_timeout": 2.0, "reset_timeout": 5.0}
    cfg = AdbConfig(port=server.port, serials=(server.phone.serial,), **{**settings, **overrides})
    (env,) = make_adb_envs(cfg, tasks, "train", 0, log=lambda *_: None)
    return env


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    with FakeAdbServer(make_world_phone()) as s:
        yield s


@pytest.fixture
def env(server):
    env = make_env_on(server)
    yield env
    env.close()


def tap(obs: Observation, label: str) -> Action:
    (element,) = [e for e in obs.elements if e.label == label]
    return Action.tap_element(element, obs.screen_size)


def test_a_whole_episode_succeeds_through_adb(env, server):
    server.phone.settings["global/airplane_mode_on"] = "1"  # the task's setup must turn it off first
    obs, info = env.reset(seed=0)
    assert info == {"task": "airplane_on", "suite": "world"}
    assert server.phone.settings["global/airplane_mode_on"] == "0" and server.phone.keys == [
        "3",
        "3",
    ]  # env, then task
    assert obs.instruction == "Turn on airplane mode" and obs.screen_size == (1080, 2400)
    assert [e.label for e in obs.elements] == ["Settings"] and obs.screenshot is None
    obs, reward, terminated, truncated, info = env.step(tap(obs, "Settings"))
    assert [e.label for e in obs.elements] == ["Network & internet", "Airplane mode"]
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    switch = obs.elements[1]
    assert not switch.checked
    obs, reward, terminated, truncated, info = env.step(tap(obs, "Airplane mode"))
    assert (reward, terminated, truncated, info["success"], info["reason"]) == (
        1.0,
        True,
        False,
        True,
        "task completed",
    )
    assert obs.elements[1].checked
    taps = [c for c in server.phone.commands if c.startswith("input tap")]
    assert taps == ["input tap 200 1100", "input tap 540 600"]  # element centres, in device pixels


def test_step_limit_truncates_and_complete_ends(env, server):
    env.reset(seed=0)
    for i in range(4):
        _, reward, terminated, truncated, info = env.step(Action(ActionType.PRESS_BACK))
        assert reward == 0.0 and not terminated and truncated == (i == 3)
    assert info["reason"] == "step limit"
    env.reset()
    _, reward, terminated, truncated, info = env.step(Action(ActionType.STATUS_COMPLETE))
    assert (reward, terminated, truncated, info["reason"]) == (
        0.0,
        True,
        False,
        "completed before the task held",
    )


def test_typed_text_and_untypeable_text(env, server):
    env.reset(seed=0)
    env.step(Action(ActionType.TYPE, text="it's $HOME"))
    assert server.phone.typed == ["it's $HOME"]
    _, _, _, _, info = env.step(Action(ActionType.TYPE, text="café"))
    assert info["invalid_action"] == "untypeable_text" and server.phone.typed == ["it's $HOME"]
    assert env.stats["untypeable_text"] == 1


def test_screenshot_is_decoded_and_downscaled(server):
    env = make_env_on(server, screenshot=(27, 60))
    try:
        obs, _ = env.reset(seed=0)
        assert obs.screenshot.shape == (60, 27, 3) and obs.screenshot.dtype == np.uint8
        assert tuple(obs.screenshot[30, 13]) == (30, 60, 90)
        obs, *_ = env.step(tap(obs, "Settings"))
        assert obs.screenshot.shape == (60, 27, 3)
    finally:
        env.close()


def test_the_screen_is_polled_until_it_settles(server):
    """An app that animates: the first dumps after the tap differ, then two agree."""
    phone = server.phone
    frames = iter([_xml(_node(f"Loading {i}", (0, 0, 500, 100))) for i in range(3)])

    def uiautomator(phone: FakePhone, argv: list[str]) -> tuple[bytes, bytes, int]:
        xml = next(frames, phone.screen.xml) if phone.current == "settings_off" else phone.screen.xml
        phone.files[argv[2]] = xml
        return b"UI hierchary dumped to: x\n", b"", 0

    phone.handlers["uiautomator"] = uiautomator
    env = make_env_on(server, settle_max=5.0)
    try:
        obs, _ = env.reset(seed=0)
        before = env.stats.get("settle_polls", 0)
        obs, *_ = env.step(tap(obs, "Settings"))
        assert [e.label for e in obs.elements] == ["Network & internet", "Airplane mode"]
        assert env.stats["settle_polls"] - before == 5  # 3 loading frames, then the screen twice
        assert env.stats.get("settle_capped", 0) == 0
    finally:
        env.close()


def test_settling_gives_up_after_settle_max(server):
    counter = iter(range(10**6))

    def uiautomator(phone: FakePhone, argv: list[str]) -> tuple[bytes, bytes, int]:
        phone.files[argv[2]] = _xml(_node(f"Frame {next(counter)}", (0, 0, 500, 100)))
        return b"", b"", 0

    server.phone.handlers["uiautomator"] = uiautomator
    env = make_env_on(server, settle_max=0.3, settle_interval=0.05)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(Action(ActionType.PRESS_BACK))
        assert env.stats["settle_capped"] == 1 and obs.elements[0].text.startswith("Frame")
    finally:
        env.close()


@pytest.mark.parametrize(
    ("fault", "error", "detail"),
    [
        ({"dump_xml": b"<hierarchy><node text='x'"}, DeviceBadOutput, "bad_xml"),
        ({"dump_xml": b""}, DeviceBadOutput, "empty"),
        ({"dump_xml": b"<!DOCTYPE x [<!ENTITY a 'b'>]><hierarchy/>"}, DeviceBadOutput, "dtd"),
        (
            {"dump_xml": _xml(_node("x", (0, 0, 10, 10)).replace("[0,0][10,10]", "[0,0][oops]"))},
            DeviceBadOutput,
            "bad_bounds",
        ),
        ({"failing": {"input tap": (1, b"Error: device busy")}}, DeviceCommandFailed, None),
        ({"delay_s": 3.0}, DeviceHang, None),
        ({"gone": True}, DeviceDisconnected, None),
        ({"hang_up": True}, DeviceDisconnected, None),
    ],
)
def test_device_faults_are_named_and_the_next_reset_recovers(env, server, fault, error, detail):
    obs, _ = env.reset(seed=0)
    for name, value in fault.items():
        setattr(server.phone.faults, name, value)
    with pytest.raises(error) as caught:
        env.step(tap(obs, "Settings"))
    assert isinstance(caught.value, DeviceFault)
    if detail is not None:
        assert caught.value.detail == detail and detail in str(caught.value)
    server.phone.faults.__init__()  # the device is fine again
    obs, _ = env.reset()
    assert [e.label for e in obs.elements] == ["Settings"] and env.stats["recoveries"] == 1


def test_a_truncated_png_is_a_bad_output(server):
    env = make_env_on(server, screenshot=(27, 60))
    try:
        env.reset(seed=0)
        server.phone.faults.truncate_png = True
        with pytest.raises(DeviceBadOutput) as caught:
            env.step(Action(ActionType.PRESS_BACK))
        assert caught.value.detail == "bad_png"
    finally:
        env.close()


def test_observation_is_one_shell_call(env, server):
    env.reset(seed=0)
    server.phone.commands.clear()
    env.step(Action(ActionType.PRESS_BACK))
    # the action, then two dumps that agree (rm + dump + cat each), then the check
    lines = [shlex.split(c)[0] for c in server.phone.commands]
    assert lines == ["input", "rm", "uiautomator", "cat", "rm", "uiautomator", "cat", "settings"]


def test_the_judge_sees_the_final_screen_only(server, monkeypatch):
    """With the VLM judge (success_on auto = "end"): asked at the step limit and at STATUS_COMPLETE,
    never mid-episode, and shown the settled screen's PNG."""
    from actors.envs.adb.config import JudgeConfig
    from tests.test_adb_evaluator import Judge

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    judge = Judge()
    judge.thread.start()
    env = make_env_on(server, evaluator="judge", judge=JudgeConfig(url=judge.url, model="m", timeout=5))
    try:
        env.reset(seed=0)
        judge.mode = "no"
        for _ in range(3):
            _, _, terminated, truncated, info = env.step(Action(ActionType.PRESS_BACK))
            assert not terminated and not truncated and "check" not in info
        assert judge.requests == []
        _, reward, terminated, truncated, info = env.step(Action(ActionType.PRESS_BACK))
        assert (reward, terminated, truncated, info["reason"]) == (0.0, False, True, "step limit")
        assert len(judge.requests) == 1 and info["check"]  # the judge's "no", with its reason
        env.reset()
        judge.mode = "yes"
        _, reward, terminated, truncated, info = env.step(Action(ActionType.STATUS_COMPLETE))
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
        assert len(judge.requests) == 2
        image = judge.requests[1][1]["messages"][-1]["content"]
        assert any("image_url" in part for part in image)
    finally:
        env.close()
        judge.close()


# ---- real-device quirks (issue 19, item 3) ----------------------------------------------------------------
NOT_IDLE = b"ERROR: could not get idle state.\n"
NULL_ROOT = b"ERROR: null root node returned by UiTestAutomationBridge.\n"


def test_a_dump_that_cannot_idle_for_a_moment_is_tried_again(env, server):
    obs, _ = env.reset(seed=0)
    server.phone.faults.dump_errors = [NOT_IDLE, NULL_ROOT]  # an animation, then no window yet
    obs, *_ = env.step(tap(obs, "Settings"))
    assert [e.label for e in obs.elements] == ["Network & internet", "Airplane mode"]
    assert env.stats["dump_retries"] == 2
    assert env.stats["dump_not_idle"] == 1 and env.stats["dump_null_root"] == 1


def test_a_dump_that_never_idles_is_a_named_fault(server):
    env = make_env_on(server, dump_retries=2)
    try:
        obs, _ = env.reset(seed=0)
        server.phone.faults.dump_errors = [NOT_IDLE] * 3
        with pytest.raises(DeviceBadOutput) as caught:
            env.step(tap(obs, "Settings"))
        assert caught.value.detail == "dump_not_idle" and "could not get idle state" in str(caught.value)
        assert env.stats["dump_retries"] == 2 and not server.phone.faults.dump_errors
    finally:
        env.close()


def test_a_dump_that_fails_otherwise_is_not_retried(env, server):
    obs, _ = env.reset(seed=0)
    server.phone.faults.failing = {"uiautomator dump": (137, b"Killed\n")}
    with pytest.raises(DeviceBadOutput) as caught:
        env.step(tap(obs, "Settings"))
    assert caught.value.detail == "dump_failed" and "dump_retries" not in env.stats


def test_a_screen_that_is_off_and_locked_is_woken_and_unlocked_at_reset(env, server):
    phone = server.phone
    phone.awake, phone.locked = False, True
    obs, _ = env.reset(seed=0)
    assert phone.awake and not phone.locked
    assert phone.keys[0] == "KEYCODE_WAKEUP" and "wm dismiss-keyguard" in phone.commands
    assert env.stats["screen_woken"] == 1 and env.stats["keyguard_dismissed"] == 1
    assert [e.label for e in obs.elements] == ["Settings"]
    env.reset()  # awake and unlocked now: nothing to do
    assert env.stats["screen_woken"] == 1 and env.stats["keyguard_dismissed"] == 1
    assert env.device_counts is env.stats


def test_a_secure_lock_is_a_clear_fault(env, server):
    server.phone.locked = server.phone.secure_lock = True
    with pytest.raises(DeviceCommandFailed, match="PIN, pattern or password lock"):
        env.reset(seed=0)


def test_an_override_size_is_the_screen_size(server):
    server.phone.override_size = (540, 1200)
    env = make_env_on(server)
    try:
        obs, _ = env.reset(seed=0)
        assert env.screen_size == obs.screen_size == (540, 1200)
    finally:
        env.close()


def test_the_actor_reports_what_its_devices_needed():
    from collections import Counter

    from actors.slots import EnvSlots

    class Device:
        device_counts = {"screen_woken": 2, "dump_retries": 5}  # noqa: RUF012

        def close(self):
            pass

    stats: Counter = Counter()
    EnvSlots([Device(), Device()], [0, 1], threaded=False, stats=stats).close()
    assert stats == {"adb_screen_woken": 4, "adb_dump_retries": 10}


SEND = (800, 2000, 1000, 2100)
"""A button under where the keyboard shows."""


def make_compose_phone() -> FakePhone:
    """A message being typed (focused field) with Send at the bottom, under the on-screen keyboard."""
    shot = make_png(54, 120, (30, 60, 90))
    field_ = _node("", (0, 300, 1080, 450), "android.widget.EditText", focused="true")
    return FakePhone(
        screens={
            "compose": Screen(
                _xml(field_, _node("Send", SEND, "android.widget.Button")), shot, links={SEND: "sent"}
            ),
            "sent": Screen(_xml(_node("Sent", (0, 300, 1080, 450))), shot),
        },
        current="compose",
        keyboard=(0, 1500, 1080, 2400),
    )


@pytest.mark.parametrize("keyboard", [(0, 1500, 1080, 2400), (0, 2200, 1080, 2400)])
def test_a_tap_under_the_keyboard_hides_it_first(monkeypatch, keyboard):
    """Send lies under the keyboard at (0, 1500)-(1080, 2400): BACK first, then the tap reaches the app.
    A keyboard that does not cover Send (from y 2200) is left alone."""
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    phone = make_compose_phone()
    phone.keyboard = keyboard
    with FakeAdbServer(phone) as server:
        env = make_env_on(server)
        try:
            obs, _ = env.reset(seed=0)
            env.step(tap(obs, "Send"))
        finally:
            env.close()
    covered = keyboard[1] <= 2050
    assert phone.current == "sent" and not phone.keys_hit
    assert env.stats.get("keyboard_hidden", 0) == int(covered)
    assert ("4" in phone.keys) == covered and (phone.keyboard is None) == covered
