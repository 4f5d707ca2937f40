"""The unmodified adbutils client against the fake adb server: protocol, scripted phone, and faults."""

from __future__ import annotations

import threading
import time

import adbutils
import pytest
from adbutils.errors import AdbError, AdbTimeout

from actors.envs.adb.errors import DeviceOutputError
from actors.envs.adb.uixml import parse_dump
from tests.fake_adb import DUMP_PATH, FakeAdbServer, FakePhone, Screen, make_png

pytestmark = pytest.mark.timeout(60)

HOME = b"""<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation="0">
<node index="0" text="Settings" resource-id="com.android.launcher3:id/icon" class="android.widget.TextView"
 package="com.android.launcher3" content-desc="" clickable="true" bounds="[100,1000][300,1200]" /></hierarchy>"""
SETTINGS = b"""<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation="0">
<node index="0" text="Airplane mode" resource-id="" class="android.widget.Switch"
 package="com.android.settings" checkable="true" checked="false" clickable="true" bounds="[0,500][1080,700]" />
</hierarchy>"""


def make_phone() -> FakePhone:
    return FakePhone(
        screens={
            "home": Screen(HOME, make_png(4, 8, (0, 0, 255)), links={(100, 1000, 300, 1200): "settings"}),
            "settings": Screen(SETTINGS, make_png(4, 8, (255, 255, 255))),
        },
        current="home",
    )


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    with FakeAdbServer(make_phone()) as s:
        yield s


@pytest.fixture
def client(server):
    return adbutils.AdbClient(host="127.0.0.1", port=server.port, socket_timeout=5)


@pytest.fixture
def device(client, server):
    return client.device(serial=server.phone.serial)


def test_version_and_devices(client, server):
    assert client.server_version() == 41
    assert [d.serial for d in client.device_list()] == [server.phone.serial]
    (info,) = client.list(extended=True)
    assert info.state == "device" and info.tags["model"] == "FakePhone"
    assert client.device().serial == server.phone.serial


def test_shell_output_and_exit_codes(device):
    assert device.shell("echo hello world", timeout=5) == "hello world"
    assert device.shell("settings get global airplane_mode_on", timeout=5) == "0"
    v1 = device.shell2("no-such-cmd", timeout=5)
    assert v1.returncode == 127 and "not found" in v1.output
    v2 = device.shell2("no-such-cmd", timeout=5, v2=True)
    assert v2.returncode == 127 and "not found" in v2.stderr and v2.stdout == ""
    ok = device.shell2(["echo", "a b"], timeout=5, v2=True)
    assert ok.returncode == 0 and ok.stdout == "a b\n"
    assert device.get_state() == "device"


def test_settings_put_then_get(device):
    device.shell("settings put global airplane_mode_on 1", timeout=5)
    assert device.shell("settings get global airplane_mode_on", timeout=5) == "1"


def test_dump_pull_screencap_tap(device, server, tmp_path):
    out = device.shell(["uiautomator", "dump", DUMP_PATH], timeout=5)
    assert DUMP_PATH in out
    assert device.sync.exists(DUMP_PATH)
    assert device.sync.read_bytes(DUMP_PATH) == HOME
    assert device.sync.pull(DUMP_PATH, tmp_path / "d.xml") == len(HOME)
    (icon,) = parse_dump(device.sync.read_bytes(DUMP_PATH), server.phone.size)
    assert icon.text == "Settings" and icon.clickable

    png = device.shell("screencap -p", timeout=5, encoding=None)
    assert png == server.phone.screens["home"].png
    assert device.screenshot(error_ok=False).size == (4, 8)

    x, y = icon.center
    device.shell(f"input tap {x} {y}", timeout=5)
    device.shell("uiautomator dump", timeout=5)
    (switch,) = parse_dump(device.sync.read_bytes(DUMP_PATH), server.phone.size)
    assert switch.text == "Airplane mode" and not switch.checked
    assert device.shell("screencap -p", timeout=5, encoding=None) == server.phone.screens["settings"].png


def test_tap_outside_targets_stays(device, server):
    device.shell("input tap 5 5", timeout=5)
    assert server.phone.current == "home"


def test_sync_missing_file_and_push(device):
    assert not device.sync.exists("/sdcard/nothing")
    with pytest.raises(AdbError, match="No such file"):
        device.sync.read_bytes("/sdcard/nothing")
    device.sync.push(b"payload", "/sdcard/x.txt")
    assert device.sync.read_bytes("/sdcard/x.txt") == b"payload"


def test_device_gone(client, device, server):
    server.phone.faults.gone = True
    assert client.device_list() == []
    with pytest.raises(AdbError, match="not found"):
        device.shell("echo hi", timeout=5)
    with pytest.raises(AdbError, match="not found"):
        device.sync.read_bytes(DUMP_PATH)


def test_hang_up_is_an_error_not_a_hang(device, server):
    server.phone.faults.hang_up = True
    with pytest.raises(AdbError):
        device.shell("echo hi", timeout=5)
    with pytest.raises((AdbError, EOFError)):
        device.shell2("echo hi", timeout=5, v2=True)


def test_drop_connections_mid_command(device, server):
    server.phone.faults.delay_s = 30
    started = time.monotonic()
    threading.Timer(0.3, server.drop_connections).start()
    with pytest.raises(AdbError):
        device.shell2("echo hi", timeout=10)  # v1 with exit marker: the marker never arrives
    assert time.monotonic() - started < 5


def test_slow_answer_times_out(device, server):
    server.phone.faults.delay_s = 5
    started = time.monotonic()
    with pytest.raises(AdbTimeout):
        device.shell("echo hi", timeout=0.5)
    assert time.monotonic() - started < 3


def test_truncated_png(device, server):
    server.phone.faults.truncate_png = True
    png = device.shell("screencap -p", timeout=5, encoding=None)
    assert len(png) < len(server.phone.screens["home"].png)
    with pytest.raises(Exception):  # noqa: B017 - PIL raises OSError on load
        device.screenshot(error_ok=False).load()


@pytest.mark.parametrize(("xml", "kind"), [(b"", "empty"), (b"<hierarchy><node", "bad_xml")])
def test_bad_dump_surfaces_as_device_output_error(device, server, xml, kind):
    server.phone.faults.dump_xml = xml
    device.shell("uiautomator dump", timeout=5)
    with pytest.raises(DeviceOutputError) as e:
        parse_dump(device.sync.read_bytes(DUMP_PATH), server.phone.size)
    assert e.value.kind == kind


def test_failing_command(device, server):
    server.phone.faults.failing["uiautomator dump"] = (
        1,
        b"ERROR: null root node returned by UiTestAutomationBridge.\n",
    )
    result = device.shell2("uiautomator dump", timeout=5, v2=True)
    assert result.returncode == 1 and "null root node" in result.stderr
    assert "null root node" in device.shell("uiautomator dump", timeout=5)


def test_close_releases_port(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    with FakeAdbServer(make_phone()) as s:
        port = s.port
    client = adbutils.AdbClient(host="127.0.0.1", port=port, socket_timeout=2)
    with pytest.raises(AdbError):
        client.server_version()
