"""The ADB device pool against the fake adb server and fake emulator processes: attach, launch, boot,
health, recovery with backoff, snapshots through the emulator console, and stopping only what it started."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import adbutils
import pytest

from actors.envs.adb import pool as pool_module
from actors.envs.adb.config import AdbConfig
from actors.envs.adb.console import EmulatorConsole
from actors.envs.adb.pool import DevicePool, DevicePoolError, _port_free
from actors.envs.faults import DeviceCommandFailed, DeviceCrash, DeviceDisconnected, DeviceHang
from tests.conftest import ROOT
from tests.fake_adb import FakeAdbServer, blank_phone

pytestmark = pytest.mark.timeout(60)

FAKE_EMULATOR = ROOT / "tests" / "fake_emulator.py"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No real adb server, a private HOME (console token), and every fake emulator killed at the end."""
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in [k for k in os.environ if k.startswith("FAKE_EMULATOR_")]:
        monkeypatch.delenv(name)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FAKE_EMULATOR_PID_DIR", str(pids))
    yield pids
    for pid in launched_pids(pids):  # a safety net: pools stop their emulators before this runs
        with contextlib.suppress(OSError):
            if alive(pid) and b"fake_emulator.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def launched_pids(pid_dir: Path) -> list[int]:
    """The fake emulators' pids (not their children's: child-PORT.PID, see FAKE_EMULATOR_CHILD)."""
    return sorted(int(f.suffix[1:]) for f in pid_dir.iterdir() if not f.name.startswith("child-"))


def alive(pid: int) -> bool:
    """Running or an unreaped zombie (both mean the pool did not clean up)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def running(pid: int) -> bool:
    """Running, not a zombie: an orphan (its parent gone) is dead once it is a zombie, whenever init reaps it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def group_members(pgid: int) -> list[int]:
    """The running processes of a process group (Linux: from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_bytes().rpartition(b")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                members.append(int(entry.name))
    return members


port_free = _port_free


@pytest.fixture
def base_port() -> int:
    """An even port P with P..P+3 free: room for two emulators (console and adb ports). Below Linux's
    ephemeral range (32768-60999), where the suite's other connections take their source ports: a port
    free here was taken by one of them before the test bound it ("Address already in use")."""
    for _ in range(200):
        port = random.randrange(20000, 32760, 2)
        if all(port_free(p) for p in range(port, port + 4)):
            return port
    raise RuntimeError("no free ports")


@pytest.fixture
def server(base_port):
    with FakeAdbServer(emulator_ports=[base_port, base_port + 2]) as s:
        yield s


@pytest.fixture
def emulator_binary(tmp_path) -> str:
    """A wrapper standing in for $ANDROID_HOME/emulator/emulator."""
    path = tmp_path / "emulator"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_EMULATOR}" "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def make_pool(server, base_port, emulator_binary, tmp_path):
    """Factory: a pool on the fake adb server (fast timeouts), closed at teardown; logs in `.logs`."""
    pools: list[DevicePool] = []

    def make(sleep=time.sleep, clock=time.monotonic, **overrides) -> DevicePool:
        settings = dict(
            port=server.port,
            emulator_binary=emulator_binary,
            emulator_port=base_port,
            boot_timeout=10.0,
            command_timeout=2.0,
            reset_timeout=5.0,
            restart_backoff=0.01,
        )
        logs: list[str] = []
        pool = DevicePool(
            AdbConfig(**{**settings, **overrides}),
            logs.append,
            sleep=sleep,
            clock=clock,
            log_dir=tmp_path / "logs",
        )
        pool.poll_interval, pool.stop_grace = 0.05, 2.0
        pool.logs = logs
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# ---- the fake adb server with several devices ----


def test_fake_server_lists_phones_and_emulators(server, base_port):
    server.add(blank_phone("R58M1"))
    server.add(blank_phone("XYZ9"))
    server.phone.state = "unauthorized"
    client = adbutils.AdbClient(host="127.0.0.1", port=server.port, socket_timeout=5)
    infos = client.list(extended=True)
    assert [(i.serial, i.state) for i in infos] == [("R58M1", "unauthorized"), ("XYZ9", "device")]
    assert len({i.transport_id for i in infos}) == 2
    assert client.device(serial="XYZ9").shell("echo hi", timeout=5) == "hi"
    with pytest.raises(adbutils.AdbError, match="unauthorized"):
        client.device(serial="R58M1").shell("echo hi", timeout=5)
    proc = subprocess.Popen([sys.executable, str(FAKE_EMULATOR), "-avd", "A", "-port", str(base_port)])
    try:
        wait_until(lambda: server.emulator(base_port) is not None)
        assert f"emulator-{base_port}" in [i.serial for i in client.list()]
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: server.emulator(base_port) is None)


# ---- attaching ----


def test_attach_to_running_devices(server, make_pool):
    server.add(blank_phone("R58M1"))
    server.add(blank_phone("emulator-5554"))
    pool = make_pool(serials=("R58M1", "emulator-5554"))
    assert pool.start() == ["R58M1", "emulator-5554"]
    assert pool.healthy("R58M1") and pool.healthy("emulator-5554")
    assert pool.device("R58M1") is pool.device("R58M1")
    assert pool.device("R58M1").check("echo hi") == "hi"
    assert pool.pid("R58M1") is None
    with pytest.raises(ValueError, match="not in this device pool"):
        pool.device("other")


def test_attach_names_every_problem(server, make_pool):
    server.add(blank_phone("good"))
    server.add(blank_phone("off"))
    server.add(blank_phone("locked"))
    server.add(blank_phone("unused"))
    phones = {d.phone.serial: d.phone for d in server.devices()}
    phones["off"].state, phones["locked"].state = "offline", "unauthorized"
    with pytest.raises(DevicePoolError) as e:
        make_pool(serials=("good", "off", "locked", "gone")).start()
    message = str(e.value)
    assert "off is offline" in message
    assert "locked is unauthorized: accept the USB debugging prompt on the phone" in message
    assert "gone is missing" in message
    assert "good is" not in message
    assert "lists good (device), off (offline), locked (unauthorized), unused (device)" in message


def test_configuration_errors(make_pool, server, base_port):
    with pytest.raises(DevicePoolError, match="not both"):
        make_pool(serials=("a",), avds=("b",)).start()
    with pytest.raises(DevicePoolError, match=r"--adb\.serials .* or --adb\.avds"):
        make_pool().start()
    with pytest.raises(DevicePoolError, match="distinct"):
        make_pool(serials=("a", "a")).start()
    with pytest.raises(ValueError, match=r"--adb\.restart-backoff must be >= 0"):  # AdbConfig checks it
        make_pool(serials=("a",), restart_backoff=-1.0).start()
    with pytest.raises(DevicePoolError, match="must be even"):
        make_pool(avds=("a",), emulator_port=base_port + 1).start()
    with pytest.raises(DevicePoolError, match="cannot run the emulator"):
        make_pool(avds=("a",), emulator_binary="/nonexistent/emulator").start()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base_port + 1))
        busy.listen()
        with pytest.raises(DevicePoolError, match=f"port {base_port + 1} on 127.0.0.1 is in use"):
            make_pool(avds=("a",)).start()
    server.close()
    with pytest.raises(DevicePoolError, match=r"no adb server at 127.0.0.1"):
        make_pool(serials=("a",)).start()


# ---- launching ----


def test_launch_two_emulators_and_close(make_pool, base_port, isolated, tmp_path):
    pool = make_pool(avds=("Pixel", "Tablet"))
    serials = [f"emulator-{base_port}", f"emulator-{base_port + 2}"]
    assert pool.start() == serials
    assert all(pool.healthy(s) for s in serials)
    assert pool.stats["launched"] == 2 and pool.stats["boot_seconds"] > 0
    assert any("launched AVD Tablet" in line for line in pool.logs)
    pids = [pool.pid(s) for s in serials]
    assert sorted(pids) == launched_pids(isolated)
    log = tmp_path / "logs" / f"emulator-{base_port}.log"
    assert f"-avd Pixel -port {base_port} -no-window -no-audio" in log.read_text()

    pool.close()
    assert not any(alive(pid) for pid in pids)
    assert all(port_free(p) for p in range(base_port, base_port + 4))
    assert "INFO: console kill" in log.read_text()
    assert pool.stats["stopped"] == 2 and pool.stats["sigkills"] == 0
    assert not pool.healthy(serials[0])
    pool.close()
    assert pool.stats["stopped"] == 2


def test_boot_timeout_is_clear_and_cleans_up(make_pool, monkeypatch, isolated):
    monkeypatch.setenv("FAKE_EMULATOR_NEVER_BOOT", "1")
    now = [0.0]

    def sleep(s: float) -> None:  # fake time runs 25x faster than real time
        now[0] += s
        time.sleep(s / 25)

    pool = make_pool(avds=("Pixel",), boot_timeout=25.0, sleep=sleep, clock=lambda: now[0])
    pool.poll_interval = 0.5
    # last seen: booting, or still missing on a machine so loaded that the fake has not started yet
    with pytest.raises(
        DevicePoolError, match=r"not ready after 25 s of booting \(last seen: (booting|adb lists)"
    ):
        pool.start()
    assert any("booting, 10 s of 25 s" in line for line in pool.logs)
    (pid,) = launched_pids(isolated)
    assert not alive(pid)
    assert pool.serials == []


def test_emulator_exiting_during_boot_shows_its_log(make_pool, monkeypatch, isolated):
    monkeypatch.setenv("FAKE_EMULATOR_AVDS", "Pixel")
    with pytest.raises(DevicePoolError) as e:
        make_pool(avds=("Pixel", "Nexus")).start()
    assert "exited with status 1 while booting" in str(e.value)
    assert "PANIC: Unknown AVD name [Nexus]" in str(e.value)
    assert not any(alive(pid) for pid in launched_pids(isolated))  # the good one was stopped too


# ---- health and recovery ----


def test_killed_emulator_is_relaunched(make_pool, base_port):
    pool = make_pool(avds=("Pixel",))
    (serial,) = pool.start()
    old = pool.pid(serial)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: not pool.healthy(serial))
    pool.recover(serial)
    assert pool.healthy(serial) and pool.pid(serial) != old and not alive(old)
    assert pool.device(serial).check("echo hi") == "hi"
    assert pool.stats["restarts"] == 1 and pool.stats["recoveries"] == 1 and pool.stats["launched"] == 2
    pool.recover(serial)  # healthy: nothing to do
    assert pool.stats["already_healthy"] == 1 and pool.stats["launched"] == 2


def test_hung_emulator_is_killed_even_when_it_ignores_sigterm(make_pool, monkeypatch):
    monkeypatch.setenv("FAKE_EMULATOR_IGNORE_TERM", "1")
    pool = make_pool(avds=("Pixel",), command_timeout=1.0)
    pool.stop_grace = 0.3
    (serial,) = pool.start()
    old = pool.pid(serial)
    os.kill(old, signal.SIGSTOP)  # alive, listed, never answers
    assert not pool.healthy(serial)
    pool.recover(serial)
    assert not alive(old) and pool.stats["sigkills"] == 1
    assert pool.healthy(serial)


def test_repeated_failures_back_off_then_give_up(make_pool, monkeypatch, isolated):
    naps: list[float] = []

    def sleep(s: float) -> None:
        naps.append(s)
        if s < 1:  # polling: really wait; backoff: skip
            time.sleep(s)

    pool = make_pool(avds=("Pixel",), sleep=sleep, restart_backoff=8.0, max_restarts=5)
    (serial,) = pool.start()
    monkeypatch.setenv("FAKE_EMULATOR_AVDS", "Other")  # from now on every launch exits at once
    os.kill(pool.pid(serial), signal.SIGKILL)
    with pytest.raises(DeviceCrash, match="given up after 5 failed recoveries in a row") as e:
        pool.recover(serial)
    assert str(e.value).endswith("\nPANIC: Unknown AVD name [Pixel], use -list-avds to see valid choices.")
    assert str(e.value).count("PANIC") == 1  # the tail shows the latest launch only
    assert [s for s in naps if s >= 1] == [8, 16, 32, 60, 60]
    assert pool.stats["failed_recoveries"] == 5 and pool.stats["given_up"] == 1
    assert pool.stats["restarts"] == 5 and pool.stats["launched"] == 6
    assert not any(alive(pid) for pid in launched_pids(isolated))
    naps.clear()
    with pytest.raises(DeviceCrash, match="given up"):
        pool.recover(serial)
    assert naps == [] and not pool.healthy(serial)


def test_success_resets_the_failure_count(make_pool, monkeypatch):
    backoffs: list[float] = []

    def sleep(s: float) -> None:
        if s < 1:
            return time.sleep(s)
        backoffs.append(s)
        if len(backoffs) == 3:  # the third attempt finds the emulator fixed
            monkeypatch.delenv("FAKE_EMULATOR_AVDS")

    pool = make_pool(avds=("Pixel",), sleep=sleep, restart_backoff=1.0, max_restarts=4)
    (serial,) = pool.start()
    monkeypatch.setenv("FAKE_EMULATOR_AVDS", "Other")
    os.kill(pool.pid(serial), signal.SIGKILL)
    pool.recover(serial)
    assert backoffs == [1, 2, 4] and pool.healthy(serial)
    assert pool.stats["failed_recoveries"] == 2 and pool.stats["recoveries"] == 1
    os.kill(pool.pid(serial), signal.SIGKILL)
    pool.recover(serial)
    assert backoffs == [1, 2, 4, 1]


@pytest.fixture
def no_kills(monkeypatch):
    """Fails the test if anything sends a signal."""
    sent: list[tuple] = []
    monkeypatch.setattr(os, "killpg", lambda *a: sent.append(("killpg", *a)))
    monkeypatch.setattr(os, "kill", lambda *a: sent.append(("kill", *a)))
    yield sent
    assert sent == []


def test_attached_device_that_vanishes_is_awaited_not_killed(server, make_pool, no_kills):
    server.add(blank_phone("R58M1"))
    pool = make_pool(serials=("R58M1",))
    pool.start()
    server.phone.faults.gone = True
    assert not pool.healthy("R58M1")
    threading.Timer(0.3, lambda: setattr(server.phone.faults, "gone", False)).start()
    pool.recover("R58M1")
    assert pool.healthy("R58M1")
    assert pool.stats["recoveries"] == 1 and pool.stats["restarts"] == 0 and pool.stats["launched"] == 0
    pool.close()


def test_attached_device_that_stays_away_is_given_up(server, make_pool, no_kills):
    server.add(blank_phone("R58M1"))
    now, naps = [0.0], []

    def sleep(s: float) -> None:
        naps.append(s)
        now[0] += s

    pool = make_pool(
        serials=("R58M1",), sleep=sleep, clock=lambda: now[0], restart_backoff=1.0, max_restarts=3
    )
    pool.poll_interval = 0.5
    pool.start()
    server.phone.state = "offline"
    with pytest.raises(DeviceCrash, match=r"R58M1 is given up after 3 failed .*adb lists it as offline"):
        pool.recover("R58M1")
    assert [s for s in naps if s >= 1] == [1, 2, 4]


def test_no_restarts_allowed_gives_up_at_once(server, make_pool, no_kills):
    server.add(blank_phone("R58M1"))
    pool = make_pool(serials=("R58M1",), max_restarts=0)
    pool.start()
    server.phone.faults.gone = True
    with pytest.raises(DeviceCrash, match="max-restarts is 0"):
        pool.recover("R58M1")
    assert pool.stats["given_up"] == 1 and pool.stats["failed_recoveries"] == 0


# ---- stopping ----


def test_close_signals_only_what_it_launched(make_pool, monkeypatch):
    bystander = subprocess.Popen(["sleep", "60"])
    own_group = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        pool = make_pool(avds=("Pixel",))
        (serial,) = pool.start()
        pid = pool.pid(serial)
        groups: list[int] = []
        real_killpg = os.killpg
        monkeypatch.setattr(os, "killpg", lambda pgid, sig: (groups.append(pgid), real_killpg(pgid, sig)))
        pool.close()
        assert set(groups) == {pid} and not alive(pid)
        assert bystander.poll() is None and own_group.poll() is None
    finally:
        for p in (bystander, own_group):
            p.kill()
            p.wait()


def test_close_stops_the_emulators_children_and_guards(make_pool, monkeypatch, tmp_path, base_port):
    monkeypatch.setenv("FAKE_EMULATOR_CHILD", "1")
    pool = make_pool(avds=("Pixel",))
    (serial,) = pool.start()
    pid = pool.pid(serial)
    assert len(group_members(pid)) == 3  # the emulator, its child (as qemu), the guard's watcher
    pool.close()
    wait_until(lambda: not group_members(pid), timeout=5.0)  # SIGKILLed: gone in a moment
    log = (tmp_path / "logs" / f"emulator-{base_port}.log").read_text()
    assert "INFO: console kill" in log and "guard:" not in log  # stopped by the pool, not by the guard


def test_emulators_die_with_the_process_that_launched_them(make_pool, monkeypatch, tmp_path, base_port):
    """When the actor dies, however it dies, the kernel closes its end of the guards' pipe: done here."""
    monkeypatch.setenv("FAKE_EMULATOR_CHILD", "1")
    pool = make_pool(avds=("Pixel", "Tablet"))
    pids = [pool.pid(s) for s in pool.start()]
    assert all(len(group_members(pid)) == 3 for pid in pids)
    read_end, write_end = pool._alive
    pool._alive = None
    os.close(write_end)
    os.close(read_end)
    wait_until(lambda: not any(group_members(pid) for pid in pids), timeout=10.0)
    assert all(port_free(p) for p in range(base_port, base_port + 4))
    log = (tmp_path / "logs" / f"emulator-{base_port}.log").read_text()
    assert f"guard: the actor is gone; stopping process group {pids[0]}" in log
    assert "console kill" not in log
    pool.close()  # finds them stopped
    assert pool.stats["stopped"] == 2 and pool.stats["sigkills"] == 0


def test_the_guard_kills_an_emulator_that_ignores_sigterm(make_pool, monkeypatch):
    monkeypatch.setenv("FAKE_EMULATOR_IGNORE_TERM", "1")
    monkeypatch.setenv("FAKE_EMULATOR_CHILD", "1")
    pool = make_pool(avds=("Pixel",))
    pool.stop_grace = 0.5  # the guard's too: it is passed at launch
    (serial,) = pool.start()
    pid = pool.pid(serial)
    os.kill(pid, signal.SIGSTOP)  # and hung, too
    read_end, write_end = pool._alive
    pool._alive = None
    os.close(write_end)
    os.close(read_end)
    time.sleep(0.2)
    assert alive(pid)  # SIGTERM did not stop it; SIGKILL after the grace does
    wait_until(lambda: not group_members(pid), timeout=10.0)


def test_without_the_guard_a_warning_and_a_plain_launch(make_pool, monkeypatch):
    monkeypatch.setattr(pool_module, "GUARDED", False)
    pool = make_pool(avds=("Pixel", "Tablet"))
    pids = [pool.pid(s) for s in pool.start()]
    warnings = [line for line in pool.logs if "not stopped if the actor is killed" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: on this platform")
    assert [group_members(pid) for pid in pids] == [[pid] for pid in pids]  # no watcher
    pool.close()
    assert not any(alive(pid) for pid in pids) and pool.stats["stopped"] == 2


# ---- snapshots and the console ----


@pytest.fixture
def token(tmp_path, monkeypatch) -> Path:
    """The console auth token, where the emulator and (through HOME) the pool find it."""
    path = tmp_path / ".emulator_console_auth_token"
    path.write_text("s3cret\n")
    monkeypatch.setenv("FAKE_EMULATOR_TOKEN_FILE", str(path))
    monkeypatch.setenv("FAKE_EMULATOR_SNAPSHOTS", "clean,other")
    return path


def test_load_snapshot_through_the_console(make_pool, server, base_port, token):
    pool = make_pool(avds=("Pixel",))
    (serial,) = pool.start()
    before = server.emulator(base_port)
    pool.load_snapshot(serial, "clean")
    assert server.emulator(base_port) is not before  # the fake resets the phone's state on a load
    assert pool.stats["snapshot_loads"] == 1 and pool.healthy(serial)
    with pytest.raises(
        DeviceCommandFailed, match="avd snapshot load nope` failed: KO: no snapshot named 'nope'"
    ):
        pool.load_snapshot(serial, "nope")
    with pytest.raises(ValueError, match="one printable word"):
        pool.load_snapshot(serial, "clean\r\nkill")
    token.write_text("wrong\n")
    with pytest.raises(
        DeviceCommandFailed, match="auth failed: KO: authentication token does not match"
    ) as e:
        pool.load_snapshot(serial, "clean")
    assert "wrong" not in str(e.value)
    assert pool.healthy(serial)


def test_snapshots_are_for_emulators_only(server, make_pool):
    server.add(blank_phone("R58M1"))
    pool = make_pool(serials=("R58M1",))
    pool.start()
    with pytest.raises(ValueError, match="R58M1 is not an emulator"):
        pool.load_snapshot("R58M1", "clean")


@pytest.fixture
def emulator(base_port, token):
    """A fake emulator started by hand (not through a pool); its console port."""
    proc = subprocess.Popen([sys.executable, str(FAKE_EMULATOR), "-avd", "A", "-port", str(base_port)])
    try:
        wait_until(lambda: not port_free(base_port + 1))
        yield base_port
    finally:
        proc.kill()
        proc.wait()


def test_console_commands_and_errors(emulator, token, tmp_path):
    with EmulatorConsole(emulator, timeout=2, token_path=token) as console:
        assert console.command("help") == ["avd snapshot load, kill, auth, quit"]
        with pytest.raises(DeviceCommandFailed, match="unknown command"):
            console.command("rotate")
        with pytest.raises(ValueError, match="one line"):
            console.command("help\nkill")
        console.load_snapshot("other")
    with pytest.raises(DeviceCommandFailed, match=r"token file .* is unreadable"):
        EmulatorConsole(emulator, timeout=2, token_path=tmp_path / "none").connect()
    with EmulatorConsole(emulator, timeout=2, token_path=token) as console:
        console.kill()
    wait_until(lambda: port_free(emulator))
    with pytest.raises(DeviceDisconnected, match="cannot connect"):
        EmulatorConsole(emulator, timeout=2).connect()


def test_console_silence_is_a_hang(base_port):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", base_port))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(DeviceHang, match="no answer to the banner"):
            EmulatorConsole(base_port, timeout=0.3).connect()
        assert time.monotonic() - started < 2


def test_console_closed_mid_answer_is_a_disconnect(base_port):
    with socket.socket() as server:
        server.bind(("127.0.0.1", base_port))
        server.listen()

        def answer_then_close() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"Android Console: type 'help' for a list of commands\r\nOK\r\n")
                conn.recv(100)
                conn.sendall(b"partial")

        threading.Thread(target=answer_then_close, daemon=True).start()
        with (
            EmulatorConsole(base_port, timeout=2) as console,
            pytest.raises(DeviceDisconnected, match="closed"),
        ):
            console.command("avd snapshot load x")


def test_console_refuses_bad_ports():
    with pytest.raises(ValueError, match=r"1..65535"):
        EmulatorConsole(70000)
