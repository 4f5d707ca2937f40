"""The ADB backend through the REAL adb server: Debian's `adb` (or the binary $REAL_ADB names) runs as a
private server (its own port, HOME and RSA key; no emulator scan), and fake devices (tests/fake_adbd.py,
the adbd side of the transport protocol) are attached to it with `adb connect 127.0.0.1:PORT`.

What the fake adb server (tests/fake_adb.py) cannot show is checked here: the transport protocol and
its handshake (RSA auth included), how the real server lists, names and reconnects devices, how its
errors surface in adbutils and in our DeviceFaults, and that doctor, whole episodes, the device pool and
a short training run all work through it.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import threading
import time

import adbutils
import pytest
from adbutils.errors import AdbError

from actors.envs.adb.config import AdbConfig
from actors.envs.adb.device import AdbDevice
from actors.envs.adb.env import make_adb_envs
from actors.envs.adb.pool import DevicePool, DevicePoolError
from actors.envs.faults import DeviceBadOutput, DeviceDisconnected, DeviceFault, DeviceHang
from actors.tools.doctor import DoctorConfig, run_doctor
from common.types import Action, ActionType
from tests.conftest import ACTOR_ENV, ROOT, START_S
from tests.fake_adbd import A_VERSION_MIN, FEATURES, FakeAdbd, RealAdbServer, find_adb
from tests.fake_screens import DUMP_PATH
from tests.test_adb_env import TASKS, make_world_phone, tap
from tests.test_fake_adb import make_phone

ADB = find_adb()
if ADB is None:
    pytest.skip(
        "Debian's adb is not installed: apt-get install adb; .ci/run installs it", allow_module_level=True
    )

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def adb_server():
    """One real adb server for the module; stopped at the end with its whole process group."""
    with RealAdbServer(ADB) as server:
        pgid = server.proc.pid
        yield server
    with pytest.raises(ProcessLookupError):  # nothing of it is left
        os.killpg(pgid, 0)


@pytest.fixture(autouse=True)
def no_adbutils_server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # adbutils never starts a server of its own


@pytest.fixture
def devices(adb_server):
    """Factory: a fake device, attached to the real server (`adb connect`) and awaited in `state`;
    every one is disconnected and closed at teardown."""
    made: list[FakeAdbd] = []

    def make(phone=None, state: str | None = "device", **options) -> FakeAdbd:
        dev = FakeAdbd(phone or make_world_phone(), **options).__enter__()
        made.append(dev)
        if state is not None:
            adb_server.connect(dev, state)
        return dev

    yield make
    for dev in made:
        adb_server.disconnect(dev.serial)
        dev.close()
    listed = adb_server.devices()
    assert not [d.serial for d in made if d.serial in listed], listed


def listing(server: RealAdbServer, serial: str) -> adbutils.AdbDeviceInfo:
    client = adbutils.AdbClient(port=server.port, socket_timeout=5)
    (info,) = [i for i in client.list(extended=True) if i.serial == serial]
    return info


def make_env(server: RealAdbServer, serial: str, tmp_path, **overrides):
    tasks = tmp_path / "world.json"
    tasks.write_text(json.dumps(TASKS))
    settings = {"settle_interval": 0.0, "settle_max": 0.5, "command_timeout": 2.0, "reset_timeout": 5.0}
    cfg = AdbConfig(port=server.port, serials=(serial,), **{**settings, **overrides})
    (env,) = make_adb_envs(cfg, str(tasks), "train", 0, log=lambda *_: None)
    return env


# ---- the protocol ----


def test_adbutils_and_the_adb_cli_reach_a_fake_device_through_the_real_server(adb_server, devices, tmp_path):
    dev = devices(make_phone(), features=(*FEATURES, "made_up"))
    phone = dev.phone
    assert dev.serial == f"127.0.0.1:{dev.port}"  # what `adb connect` names a TCP device
    info = listing(adb_server, dev.serial)
    assert info.state == "device" and info.transport_id and info.transport_id > 0
    assert (info.tags["product"], info.tags["model"], info.tags["device"]) == (
        "sdk_phone64",
        "FakePhone",
        "fake",
    )
    assert dev.host_banner.startswith("host::") and "shell_v2" in dev.host_banner

    d = adbutils.AdbClient(port=adb_server.port, socket_timeout=5).device(serial=dev.serial)
    v2 = d.shell2("echo out; no-such-cmd", timeout=5, v2=True)  # shell protocol: streams and exit code
    assert (v2.returncode, v2.stdout, v2.stderr) == (
        127,
        "out\n",
        "/system/bin/sh: no-such-cmd: inaccessible or not found\n",
    )
    v1 = d.shell2("echo out; no-such-cmd", timeout=5)  # raw `shell:` and adbutils' `echo X4EXIT:$?`
    assert v1.returncode == 127 and v1.output.startswith("out\n/system/bin/sh: no-such-cmd")
    assert set(d.get_features().split(",")) == {*FEATURES, "made_up"}  # the device's banner, unfiltered
    d.shell("input tap 200 1100", timeout=5)
    assert phone.current == "settings"

    d.shell(["uiautomator", "dump", DUMP_PATH], timeout=5)  # sync: STAT, LIST, RECV, SEND
    assert d.sync.read_bytes(DUMP_PATH) == phone.screen.xml
    assert d.sync.stat(DUMP_PATH).size == len(phone.screen.xml)
    assert [f.path for f in d.sync.list("/sdcard")] == ["window_dump.xml"]
    d.sync.push(b"pushed", "/sdcard/new.txt")
    assert phone.files["/sdcard/new.txt"] == b"pushed"

    # The adb CLI: stdin through shell protocol packets (close-stdin ends it), and `exec:` binary-safe.
    done = adb_server.cli("-s", dev.serial, "shell", "cat", input=b"typed\x00bytes\n")
    assert (done.returncode, done.stdout) == (0, b"typed\x00bytes\n"), done.stderr
    done = adb_server.cli("-s", dev.serial, "exec-out", "screencap -p", input=b"")
    assert done.stdout == phone.screen.png
    done = adb_server.cli("-s", dev.serial, "pull", DUMP_PATH, str(tmp_path / "dump.xml"))  # STA2 + RECV
    assert done.returncode == 0 and (tmp_path / "dump.xml").read_bytes() == phone.screen.xml, done.stderr
    assert dev.sync_requests["STA2"] == 1 and dev.sync_requests["RECV"] == 2  # stat_v2: the CLI's STA2
    done = adb_server.cli("-s", dev.serial, "shell", "no-such-cmd")
    assert done.returncode == 127 and "not found" in done.stderr
    assert "exec:screencap -p" in dev.services and any(s.startswith("shell,v2,") for s in dev.services)
    assert dev.received["OPEN"] == len(dev.services)

    ours = AdbDevice(dev.serial, port=adb_server.port, timeout=5)  # by transport id, one connection
    assert ours.shell("getprop sys.boot_completed").text == "1"
    assert ours._transport_id == info.transport_id
    assert dev.errors == []


def test_a_legacy_device_gets_checksums_and_4k_messages(adb_server, devices):
    """Protocol version 0x01000000 (Android < 9): the server must checksum every message it sends (the
    fake checks each and would drop the connection) and keep payloads to 4 KiB; flow control then
    moves a 300 KB answer in 75 acknowledged WRTEs each way of the pipe."""
    dev = devices(make_phone(), version=A_VERSION_MIN)
    big = bytes(range(256)) * 1200
    dev.phone.files["/sdcard/big"] = big
    ours = AdbDevice(dev.serial, port=adb_server.port, timeout=10)
    assert ours.shell("cat /sdcard/big").stdout == big
    assert dev.sent["WRTE"] >= len(big) // 4096  # each sent after the server's OKAY for the one before
    d = adbutils.AdbClient(port=adb_server.port, socket_timeout=10).device(serial=dev.serial)
    assert d.sync.read_bytes("/sdcard/big") == big
    received = dev.received["WRTE"]
    d.sync.push(big, "/sdcard/up")  # host -> device: 4 KiB WRTEs, each acknowledged by the device
    assert dev.phone.files["/sdcard/up"] == big
    assert dev.received["WRTE"] - received >= len(big) // 4096
    assert dev.errors == []  # every checksum right, no payload over 4 KiB


def test_rsa_auth_is_verified_and_remembered(adb_server, devices):
    """The server signs the device's token with its key (HOME/.android/adbkey); the device does not know
    the key yet, so the server sends its public key and the device trusts it ("Allow"). When the
    connection drops, the server reconnects on its own, and this time the signature verifies."""
    dev = devices(auth="verify")
    assert (dev.keys_presented, dev.signatures_accepted) == (1, 0) and dev.signatures >= 1
    transport = listing(adb_server, dev.serial).transport_id
    dev.drop_connections()
    deadline = time.monotonic() + 30
    while dev.handshakes < 2 and time.monotonic() < deadline:  # the server reconnects by itself
        time.sleep(0.05)
    adb_server.wait_state(dev.serial, "device", timeout=10)
    assert (dev.connections, dev.handshakes) == (2, 2)
    assert (dev.keys_presented, dev.signatures_accepted) == (1, 1)
    assert listing(adb_server, dev.serial).transport_id == transport  # a reconnect keeps the transport id
    assert AdbDevice(dev.serial, port=adb_server.port).shell("echo ok").text == "ok"

    # A device that already trusts the server's key (adb_keys on the phone) never sees it presented.
    key = (adb_server.home / ".android" / "adbkey.pub").read_text()
    known = devices(auth="verify", allow_new_keys=False, trusted_keys=(key,))
    assert (known.keys_presented, known.signatures_accepted) == (0, 1)


def test_unauthorized_until_the_prompt_is_accepted(adb_server, devices):
    dev = devices(auth="verify", allow_new_keys=False, state="unauthorized")
    info = listing(adb_server, dev.serial)
    assert info.state == "unauthorized" and "model" not in info.tags  # no banner yet: no product tags
    d = adbutils.AdbClient(port=adb_server.port, socket_timeout=5).device(serial=dev.serial)
    with pytest.raises(AdbError, match="device unauthorized"):
        d.shell("echo hi", timeout=5)
    with pytest.raises(DeviceDisconnected, match=f"{re.escape(dev.serial)} is unauthorized"):
        AdbDevice(dev.serial, port=adb_server.port, timeout=5).shell("echo hi")
    assert dev.phone.commands == []
    dev.authorize()  # the user taps "Allow": the waiting connection goes online, no reconnect
    adb_server.wait_state(dev.serial, "device", timeout=10)
    assert AdbDevice(dev.serial, port=adb_server.port, timeout=5).shell("echo hi").text == "hi"
    assert dev.connections == 1


# ---- doctor ----


def test_doctor_through_the_real_server(adb_server, devices):
    first, second = make_phone(), make_world_phone()
    for phone in (first, second):
        phone.props["ro.build.version.release"] = "14"
    a, b = devices(first), devices(second)
    cmd = [sys.executable, "-m", "actors", "doctor", "--adb-port", str(adb_server.port), "--json"]
    cmd += ["--timeout", "10", "--serials", a.serial, b.serial]
    env = {**ACTOR_ENV, "ADBUTILS_ADB_PATH": "/bin/false"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["adb_server"] == 41 and doc["host"] == f"127.0.0.1:{adb_server.port}"
    for report, phone, elements in zip(doc["devices"], (first, second), (1, 1), strict=True):
        assert report["ok"] and report["state"] == "device" and report["errors"] == []
        assert (report["serial"], report["android"], report["screen"]) == (phone.serial, "14", "1080x2400")
        assert report["ui_elements"] == elements and report["screenshot_bytes"] == len(phone.screen.png)
        assert 0 <= report["screenshot_ms"] < 10_000 and 0 <= report["dump_ms"] < 10_000

    # An unauthorized and an offline device: each gets its line of what to do; exit status 1.
    locked = devices(auth="verify", allow_new_keys=False, state="unauthorized")
    b.go_offline()
    adb_server.wait_state(b.serial, "offline")
    out = io.StringIO()
    rc = run_doctor(
        DoctorConfig(adb_port=adb_server.port, serials=(a.serial, b.serial, locked.serial), timeout=5),
        out=out,
    )
    text = out.getvalue()
    assert rc == 1 and "1 of 3 device(s) ready" in text, text
    assert f"{b.serial}: the device does not answer adb" in text
    assert f"{locked.serial}: accept the 'Allow USB debugging' prompt" in text


# ---- whole episodes ----


def test_a_whole_episode_through_the_real_server(adb_server, devices, tmp_path):
    dev = devices()
    phone = dev.phone
    phone.settings["global/airplane_mode_on"] = "1"  # the task's setup must turn it off first
    env = make_env(adb_server, dev.serial, tmp_path)
    try:
        obs, info = env.reset(seed=0)
        assert info == {"task": "airplane_on", "suite": "world"}
        assert phone.settings["global/airplane_mode_on"] == "0" and phone.keys == ["3", "3"]
        assert [e.label for e in obs.elements] == ["Settings"] and obs.screen_size == (1080, 2400)
        obs, reward, terminated, truncated, info = env.step(tap(obs, "Settings"))
        assert [e.label for e in obs.elements] == ["Network & internet", "Airplane mode"]
        assert (reward, terminated, truncated) == (0.0, False, False)
        obs, reward, terminated, truncated, info = env.step(tap(obs, "Airplane mode"))
        assert (reward, terminated, truncated, info["reason"]) == (1.0, True, False, "task completed")
        assert obs.elements[1].checked
        assert [c for c in phone.commands if c.startswith("input tap")] == [
            "input tap 200 1100",
            "input tap 540 600",
        ]
        env.reset()
        for i in range(4):  # the step limit
            _, reward, terminated, truncated, info = env.step(Action(ActionType.PRESS_BACK))
            assert reward == 0.0 and not terminated and truncated == (i == 3)
    finally:
        env.close()
    assert all(s.startswith("shell,v2:") for s in dev.services)  # the backend speaks shell v2 only


def test_real_device_quirks_through_the_real_server(adb_server, devices, tmp_path):
    """A phone left off and locked, and dumps that fail while the screen animates (stderr, exit 0, no
    file, as uiautomator does): woken, unlocked and retried through the real server's shell v2."""
    dev = devices()
    phone = dev.phone
    phone.awake, phone.locked, phone.override_size = False, True, (540, 1200)
    env = make_env(adb_server, dev.serial, tmp_path)
    try:
        obs, _ = env.reset(seed=0)
        assert phone.awake and not phone.locked and obs.screen_size == (540, 1200)
        phone.faults.dump_errors = [b"ERROR: could not get idle state.\n"] * 2
        obs, *_ = env.step(tap(obs, "Settings"))
        assert [e.label for e in obs.elements] == ["Network & internet", "Airplane mode"]
        assert env.stats["screen_woken"] == env.stats["keyguard_dismissed"] == 1
        assert env.stats["dump_retries"] == env.stats["dump_not_idle"] == 2
    finally:
        env.close()


def test_screenshots_through_the_real_server(adb_server, devices, tmp_path):
    dev = devices()
    env = make_env(adb_server, dev.serial, tmp_path, screenshot=(27, 60))
    try:
        obs, _ = env.reset(seed=0)
        assert obs.screenshot.shape == (60, 27, 3) and tuple(obs.screenshot[30, 13]) == (30, 60, 90)
        obs, *_ = env.step(tap(obs, "Settings"))
        assert obs.screenshot.shape == (60, 27, 3)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"hang": True}, DeviceHang),  # the command is accepted and never answered
        ({"delay_s": 3.0}, DeviceHang),  # slower than --adb.command-timeout
        ({"drop_mid_answer": True}, DeviceDisconnected),  # half an answer, then the connection drops
        ({"hang_up": True}, DeviceDisconnected),  # dropped as the command arrives: the server says "closed"
        ({"dump_xml": b"<hierarchy><node"}, DeviceBadOutput),
    ],
)
def test_device_faults_through_the_real_server(adb_server, devices, tmp_path, fault, error):
    dev = devices()
    env = make_env(adb_server, dev.serial, tmp_path, restart_backoff=0.1)
    try:
        obs, _ = env.reset(seed=0)
        for name, value in fault.items():
            setattr(dev if name == "drop_mid_answer" else dev.phone.faults, name, value)
        t0 = time.monotonic()
        with pytest.raises(error) as caught:
            env.step(tap(obs, "Settings"))
        assert isinstance(caught.value, DeviceFault) and time.monotonic() - t0 < 8.0  # within the deadline
        dev.phone.faults.__init__()  # the device is fine again
        dev.drop_mid_answer = False
        obs, _ = env.reset()  # the pool checks the device first (the server may be reconnecting it)
        assert [e.label for e in obs.elements] == ["Settings"] and env.stats["recoveries"] == 1
    finally:
        env.close()


# ---- the device pool ----


def pool_for(server: RealAdbServer, *serials: str, **overrides) -> DevicePool:
    settings = {"command_timeout": 2.0, "reset_timeout": 30.0, "restart_backoff": 0.1}
    return DevicePool(
        AdbConfig(port=server.port, serials=serials, **{**settings, **overrides}), log=lambda *_: None
    )


def test_pool_attach_problems_name_each_device(adb_server, devices):
    good = devices()
    locked = devices(auth="verify", allow_new_keys=False, state="unauthorized")
    away = devices()
    away.go_offline()
    adb_server.wait_state(away.serial, "offline")
    pool = pool_for(adb_server, good.serial, locked.serial, away.serial, "127.0.0.1:1")
    with pytest.raises(DevicePoolError) as caught:
        pool.start()
    message = str(caught.value)
    assert f"{locked.serial} is unauthorized: accept the USB debugging prompt" in message
    assert f"{away.serial} is offline: reconnect it" in message
    assert "127.0.0.1:1 is missing" in message and good.serial not in message.split("lists")[0]

    locked.authorize()  # the prompt accepted: the same pool configuration now attaches
    away.come_back()
    adb_server.wait_state(locked.serial, "device")
    adb_server.wait_state(away.serial, "device", timeout=30)  # the server's own reconnect brings it back
    with pool_for(adb_server, good.serial, locked.serial, away.serial) as pool:
        assert pool.start() == [good.serial, locked.serial, away.serial]
        assert all(pool.healthy(s) for s in pool.serials)


def test_pool_waits_for_a_device_that_left_and_came_back(adb_server, devices):
    """The device's adbd goes away (connection closed, connections refused): the real server keeps it
    listed as offline, not missing, and reconnects on its own once the device listens again; the pool's
    recovery only waits for that, and the cached transport id stays valid."""
    dev, other = devices(), devices()
    with pool_for(adb_server, dev.serial, other.serial) as pool:
        pool.start()
        transport = listing(adb_server, dev.serial).transport_id
        assert pool.device(dev.serial).shell("echo a").text == "a"
        dev.go_offline()
        adb_server.wait_state(dev.serial, "offline")  # not "missing": the server keeps trying to reconnect
        assert not pool.healthy(dev.serial) and pool.healthy(other.serial)
        assert pool.device(dev.serial).state() == "offline"
        with pytest.raises(DeviceDisconnected, match="offline"):
            pool.device(dev.serial).shell("echo a")
        threading.Timer(1.0, dev.come_back).start()
        t0 = time.monotonic()
        pool.recover(dev.serial)
        waited = time.monotonic() - t0
        assert pool.healthy(dev.serial) and pool.stats["recoveries"] == 1 and pool.stats["restarts"] == 0
        assert 1.0 <= waited < 30.0
        assert listing(adb_server, dev.serial).transport_id == transport
        assert pool.device(dev.serial).shell("echo b").text == "b"


# ---- a short training run ----


@pytest.mark.long
@pytest.mark.timeout(900)
def test_training_on_two_fake_devices_through_the_real_server(adb_server, devices, learner_process, tmp_path):
    """A real learner, and `python -m actors --backend adb` on two fake devices behind the real adb server,
    until the actor's episodes are acknowledged."""
    first, second = devices(), devices()
    learner = learner_process("--log-every", "0.5")
    tasks = tmp_path / "world.json"
    tasks.write_text(json.dumps(TASKS))
    cmd = [
        sys.executable, "-m", "actors", "--host", "127.0.0.1",
        "--ingest-port", learner.ingest.rsplit(":", 1)[1], "--params-port", learner.params.rsplit(":", 1)[1],
        "--backend", "adb", "--tasks", str(tasks), "--adb.port", str(adb_server.port),
        "--adb.serials", first.serial, second.serial, "--adb.settle-interval", "0", "--adb.settle-max", "0.5",
        "--adb.command-timeout", "5", "--adb.reset-timeout", "10", "--max-episodes", "8",
        "--learner-timeout", "60", "--ack-timeout", "60", "--status-every", "1000",
    ]  # fmt: skip
    log_path = tmp_path / "actor.log"
    with log_path.open("wb") as log:
        actor = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**ACTOR_ENV, "ADBUTILS_ADB_PATH": "/bin/false"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        rc = actor.wait(timeout=START_S)
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait()
    out = log_path.read_text(errors="replace")
    assert rc == 0, out[-4000:]
    assert f"2 device(s) ready: {first.serial}, {second.serial}" in out
    found = re.findall(r"^actor: stopped \(([^)]*)\); (\{.*\})\s*$", out, re.MULTILINE)
    assert len(found) == 1, out[-4000:]
    reason, stats = found[0][0], ast.literal_eval(found[0][1])
    assert reason == "episode limit", stats
    assert stats["episodes_finished"] >= 8 and stats["episodes_acked"] == stats["episodes_finished"], stats
    assert len(first.phone.commands) > 10 and len(second.phone.commands) > 10  # both devices were driven
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = learner.metrics()
        if metrics and metrics[-1].get("episodes", 0) >= stats["episodes_acked"]:
            break
        time.sleep(0.5)
    assert learner.metrics()[-1]["episodes"] >= stats["episodes_acked"], learner.metrics()[-1:]
    assert learner.stop() == 0, learner.log()[-4000:]
