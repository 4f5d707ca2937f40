"""`python -m actors doctor` against the fake adb server: per-device report, faults, and what-to-do errors."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from actors.envs.adb.device import AdbDevice
from actors.tools.doctor import DoctorConfig, check_device, run_doctor
from tests.fake_adb import FakeAdbServer
from tests.test_fake_adb import make_phone

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    phone = make_phone()
    phone.props["ro.build.version.release"] = "14"
    with FakeAdbServer(phone) as s:
        yield s


def doctor(server, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = run_doctor(DoctorConfig(adb_port=server.port, **{"timeout": 2.0, **kw}), out=out)
    return rc, out.getvalue()


def test_healthy_device_table(server):
    rc, text = doctor(server)
    assert rc == 0
    row = next(line for line in text.splitlines() if line.startswith("emulator-5554"))
    assert row.split()[:4] == ["emulator-5554", "device", "14", "1080x2400"]
    assert row.split()[-2:] == ["1", "yes"]  # one UI element on the fake home screen
    assert "1 of 1 device(s) ready" in text


def test_json_report_and_missing_serial(server):
    rc, text = doctor(server, serials=("emulator-5554", "R58M123"), json=True)
    doc = json.loads(text)
    assert rc == 1 and doc["adb_server"] == 41
    good, missing = doc["devices"]
    assert good["ok"] and good["screen"] == "1080x2400" and good["ui_elements"] == 1
    assert good["screenshot_bytes"] == len(server.phone.screen.png) and good["dump_ms"] >= 0
    assert not missing["ok"] and missing["state"] == "missing" and "adb devices" in missing["errors"][0]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ({"truncate_png": True}, "bad_png"),
        ({"dump_xml": b"<hierarchy><node"}, "bad_xml"),
        ({"delay_s": 5.0}, "DeviceHang"),
        ({"failing": {"screencap": (1, b"screencap: permission denied")}}, "permission denied"),
    ],
)
def test_device_faults_become_errors_not_crashes(server, fault, expected):
    for name, value in fault.items():
        setattr(server.phone.faults, name, value)
    rc, text = doctor(server, timeout=1.0) if "delay_s" in fault else doctor(server)
    assert rc == 1 and "NO" in text
    assert any(expected in line for line in text.splitlines() if line.startswith("emulator-5554:"))


@pytest.mark.parametrize("state", ["unauthorized", "offline"])
def test_states_that_need_a_person_say_what_to_do(server, state):
    device = AdbDevice("emulator-5554", port=server.port, timeout=2)
    report = check_device(device, state, 2.0)
    assert not report.ok and report.screen == ""
    assert ("USB debugging" if state == "unauthorized" else "restart") in report.errors[0]


def test_no_devices_and_no_server(server):
    server.phone.faults.gone = True
    rc, text = doctor(server)
    assert rc == 1 and "lists no devices" in text
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    out = io.StringIO()
    assert run_doctor(DoctorConfig(adb_port=closed_port), out=out) == 2
    assert "adb start-server" in out.getvalue()


def test_command_line(server):
    env = {**os.environ, "ADBUTILS_ADB_PATH": "/bin/false"}
    cmd = [sys.executable, "-m", "actors", "doctor", "--adb-port", str(server.port), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["devices"][0]["serial"] == "emulator-5554"
