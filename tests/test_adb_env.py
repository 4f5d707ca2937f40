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
