"""`python -m actors doctor`: check an adb setup before training on it.

Per device: whether it answers, Android version, screen size, the time of one screenshot and of one UI
dump, and how many UI elements the policy would see. A missing adb server, an unauthorized phone or an
offline emulator gets a line that says what to do. Exit status 0 when every device checked is usable.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import asdict, dataclass, field

from actors.envs.adb.capture import decode_png, observe_line, split_capture
from actors.envs.adb.device import AdbDevice
from actors.envs.adb.errors import DeviceOutputError
from actors.envs.adb.uixml import parse_dump
from actors.envs.faults import DeviceFault
from common.net.ports import adb_clash

HINTS = {
    "unauthorized": "accept the 'Allow USB debugging' prompt on the phone (then run doctor again)",
    "offline": "the device does not answer adb: restart it (or its emulator), or run `adb reconnect offline`",
    "missing": "not listed by the adb server: check the serial with `adb devices`, the cable, or start the emulator",
    "no permissions": "the adb server may not open the USB device: fix the udev rules (Linux) and replug",
}


@dataclass
class DoctorConfig:
    """Check that the adb server and its devices are ready for `python -m actors --backend adb`."""

    adb_host: str = "127.0.0.1"
    """Address of the adb server."""
    adb_port: int = 5037
    """Port of the adb server."""
    serials: tuple[str, ...] = ()
    """Devices to check (default: every device the adb server lists)."""
    timeout: float = 15.0
    """Seconds for each adb command."""
    json: bool = False
    """Print one JSON object instead of the table."""

    def __post_init__(self) -> None:
        if not 1 <= self.adb_port <= 65535:
            raise ValueError(f"--adb-port must be in [1, 65535], got {self.adb_port}")
        if not 0 < self.timeout < float("inf"):
            raise ValueError(f"--timeout must be positive, got {self.timeout}")


@dataclass
class DeviceReport:
    serial: str
    state: str
    ok: bool = False
    android: str = ""
    screen: str = ""
    screenshot_ms: float | None = None
    screenshot_bytes: int = 0
    dump_ms: float | None = None
    ui_elements: int | None = None
    errors: list[str] = field(default_factory=list)


def check_device(device: AdbDevice, state: str, timeout: float) -> DeviceReport:
    """Everything doctor measures on one device; problems go to `errors`, never raise."""
    report = DeviceReport(device.serial, state)
    if state != "device":
        report.errors.append(HINTS.get(state, f"adb reports the state {state!r}"))
        if state == "offline" and (port := _emulator_adb_port(device.serial)):
            report.errors.append(
                f"if no emulator runs as {device.serial}, another program listens on 127.0.0.1:{port}, which "
                f"the adb server probes for emulators ({adb_clash(port)}); a learner or relay there "
                f"(old defaults 5555/5556/5566) looks like this: move it to a port outside 5037 and 5554-5682"
            )
        return report
    try:
        report.android = device.check("getprop ro.build.version.release", timeout)
        if device.check("getprop sys.boot_completed", timeout) != "1":
            report.errors.append("still booting (sys.boot_completed is not 1): wait, then run doctor again")
        size = device.screen_size(timeout)
        report.screen = f"{size[0]}x{size[1]}"
        t0 = time.perf_counter()
        png = device.check_bytes("screencap -p", timeout)
        report.screenshot_ms = round(1000 * (time.perf_counter() - t0), 1)
        report.screenshot_bytes = len(png)
        decode_png(png, (64, 64))
        t0 = time.perf_counter()
        result = device.shell(observe_line(screenshot=False), timeout)
        report.dump_ms = round(1000 * (time.perf_counter() - t0), 1)
        if result.code != 0:
            err = result.stderr.decode("utf-8", "replace").strip()[:200]
            report.errors.append(f"`uiautomator dump` failed ({result.code}): {err}")
        else:
            xml, _ = split_capture(result.stdout, screenshot=False)
            report.ui_elements = len(parse_dump(xml, size))
    except (DeviceFault, DeviceOutputError) as e:
        report.errors.append(f"{type(e).__name__}: {e}")
    report.ok = not report.errors
    return report


def _emulator_adb_port(serial: str) -> int | None:
    """The loopback port adb reached `emulator-N` on (N + 1), when it is one of those adb probes."""
    prefix, _, number = serial.partition("-")
    if prefix != "emulator" or not number.isdigit():
        return None
    port = int(number) + 1
    return port if adb_clash(port) else None


def server_reachable(host: str, port: int, timeout: float = 3.0) -> str:
    """ "" when something accepts connections at host:port, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return ""
    except OSError as e:
        return str(e)


def run_doctor(cfg: DoctorConfig, out=sys.stdout) -> int:
    problem = server_reachable(cfg.adb_host, cfg.adb_port)
    if problem:
        message = (
            f"no adb server at {cfg.adb_host}:{cfg.adb_port} ({problem}). Start one with `adb start-server` "
            "(Android platform-tools), or point --adb-host/--adb-port at a running one."
        )
        _emit(cfg, out, {"adb_server": None, "error": message, "devices": []}, message)
        return 2
    probe = AdbDevice("", cfg.adb_host, cfg.adb_port, cfg.timeout)
    try:
        version = probe.client.server_version()
        listed = {info.serial: info.state for info in probe.client.list(extended=True)}
    except Exception as e:  # a port that is open but does not speak adb
        message = f"{cfg.adb_host}:{cfg.adb_port} does not answer like an adb server: {e}"
        _emit(cfg, out, {"adb_server": None, "error": message, "devices": []}, message)
        return 2
    serials = list(cfg.serials) or sorted(listed)
    if not serials:
        message = (
            f"adb server {version} at {cfg.adb_host}:{cfg.adb_port} lists no devices: start an emulator "
            "(`emulator -avd NAME`) or plug in a phone with USB debugging on."
        )
        _emit(cfg, out, {"adb_server": version, "error": message, "devices": []}, message)
        return 1
    reports = []
    for serial in serials:
        device = AdbDevice(serial, cfg.adb_host, cfg.adb_port, cfg.timeout)
        reports.append(check_device(device, listed.get(serial, "missing"), cfg.timeout))
    doc = {
        "adb_server": version,
        "host": f"{cfg.adb_host}:{cfg.adb_port}",
        "devices": [asdict(r) for r in reports],
    }
    _emit(cfg, out, doc, _table(version, cfg, reports))
    return 0 if all(r.ok for r in reports) else 1


def _table(version: int, cfg: DoctorConfig, reports: list[DeviceReport]) -> str:
    rows = [("device", "state", "android", "screen", "screenshot", "UI dump", "elements", "ok")]
    for r in reports:
        shot = f"{r.screenshot_ms:.1f} ms" if r.screenshot_ms is not None else "-"
        dump = f"{r.dump_ms:.1f} ms" if r.dump_ms is not None else "-"
        elements = str(r.ui_elements) if r.ui_elements is not None else "-"
        rows.append(
            (
                r.serial,
                r.state,
                r.android or "-",
                r.screen or "-",
                shot,
                dump,
                elements,
                "yes" if r.ok else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"adb server {version} at {cfg.adb_host}:{cfg.adb_port}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for r in reports:
        lines += [f"{r.serial}: {e}" for e in r.errors]
    usable = sum(r.ok for r in reports)
    lines.append(f"{usable} of {len(reports)} device(s) ready for `python -m actors --backend adb`")
    return "\n".join(lines)


def _emit(cfg: DoctorConfig, out, doc: dict, text: str) -> None:
    print(json.dumps(doc, indent=2) if cfg.json else text, file=out, flush=True)
