"""Per-step overhead of the ADB backend, against the stock adbutils calls, on the fake adb server.

The fake device answers at once, so what is left is the client's own cost: connections, round trips,
adbutils' 10 ms linger on every close, parsing and decoding. Rows (ms per call, best of several runs):

- `command`: one shell command. Reference: adbutils `shell2(v2=True)` (a `host:version` connection, then
  the transport; 10 ms linger on each close). Ours: `AdbDevice.shell` (transport id, one connection).
- `observation`: the UI dump and a 1080x2400 screenshot. Reference: the stock way, `uiautomator dump`,
  a sync pull of the file, `screencap -p` (three calls). Ours: one shell line (`capture.observe_line`).
- `env step`: a whole `AdbPhoneEnv.step` (tap, two UI dumps to see the screen settle, the success
  check), with and without a screenshot, with settle_interval 0 so only overhead is measured.

The same rows `... via adb` drive the same calls through the REAL adb server (Debian's `adb`, or
$REAL_ADB; a private server on its own port and HOME) and a fake device speaking the transport protocol
(tests/fake_adbd.py), beside the fake-server rows: `fake_server_ms` is our figure on the fake server,
`overhead_ms` and `overhead_x` what the real server and the device transport add (the fake device's
own Python time included). Without adb on PATH those rows are skipped with a note.
"""

from __future__ import annotations

import io
import os
import tempfile
from types import SimpleNamespace

import numpy as np

from benchmarks.report import best_seconds


def _screen_png(width: int = 1080, height: int = 2400) -> bytes:
    """A screenshot-like PNG (flat panels with some texture), ~1 MB like a real phone's."""
    from PIL import Image

    rng = np.random.default_rng(0)
    img = np.zeros((height, width, 3), np.uint8)
    img[:] = (245, 245, 245)
    for top in range(0, height, 240):
        img[top : top + 200, 40:-40] = rng.integers(0, 255, 3)
    noisy = rng.random((height, width)) < 0.05
    img[noisy] = rng.integers(0, 255, (int(noisy.sum()), 3))
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="PNG")
    return out.getvalue()


def run(quick: bool) -> list[dict]:
    os.environ.setdefault("ADBUTILS_ADB_PATH", "/bin/false")  # never start an adb server through adbutils
    from tests.fake_adb import FakeAdbServer
    from tests.fake_adbd import FakeAdbd, RealAdbServer, find_adb
    from tests.test_adb_env import make_world_phone

    repeats, inner = (3, 10) if quick else (5, 30)
    png = _screen_png()
    with FakeAdbServer(make_world_phone(png=png)) as server:
        rows = _measure(server.port, server.phone, repeats, inner)
    adb = find_adb()
    if adb is None:
        print(
            "adb_step: the `... via adb` rows are skipped: Debian's adb is not installed (apt-get install adb)"
        )
        return rows
    with RealAdbServer(adb) as real, FakeAdbd(make_world_phone(png=png)) as device:
        real.connect(device)
        via = _measure(real.port, device.phone, repeats, inner)
    for fake, row in zip(rows, via, strict=True):
        row["row"] += " via adb"
        row["fake_server_ms"] = fake["ours_ms"]
        row["overhead_ms"] = round(row["ours_ms"] - fake["ours_ms"], 3)
        row["overhead_x"] = round(row["ours_ms"] / fake["ours_ms"], 2)
    return rows + via


def _measure(port: int, phone, repeats: int, inner: int) -> list[dict]:
    """The rows for one adb server on 127.0.0.1:`port` that lists `phone` (by its serial)."""
    import adbutils

    from actors.envs.adb.capture import observe_line, split_capture
    from actors.envs.adb.device import AdbDevice
    from tests.fake_adb import DUMP_PATH
    from tests.test_adb_env import make_env_on

    rows = []
    stock = adbutils.AdbClient("127.0.0.1", port, socket_timeout=10).device(serial=phone.serial)
    ours = AdbDevice(phone.serial, port=port)
    ref = best_seconds(lambda: stock.shell2("echo ok", v2=True), repeats, inner)
    new = best_seconds(lambda: ours.shell("echo ok"), repeats, inner)
    rows.append(_row("command", "echo ok", ref, new, 2, 1))

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "dump.xml")

        def stock_observation():
            stock.shell(["uiautomator", "dump", DUMP_PATH])
            stock.sync.pull(DUMP_PATH, local)
            return stock.shell("screencap -p", encoding=None)

        def our_observation():
            return split_capture(ours.shell(observe_line(True)).stdout, True)

        ref = best_seconds(stock_observation, repeats, max(1, inner // 3))
        new = best_seconds(our_observation, repeats, max(1, inner // 3))
    rows.append(_row("observation", "dump + screenshot", ref, new, 6, 1))

    for shot in (None, (108, 240)):
        env = make_env_on(SimpleNamespace(port=port, phone=phone), screenshot=shot, settle_interval=0.0)
        try:
            env.reset(seed=0)
            ms = 1000 * best_seconds(lambda env=env: _tap_step(env), repeats, max(1, inner // 3))
        finally:
            env.close()
        rows.append(
            {
                "row": "env step",
                "what": f"tap + settle + check, screenshot {shot}",
                "ours_ms": round(ms, 3),
            }
        )
    return rows


def _tap_step(env) -> None:
    from common.types import Action

    _, _, terminated, truncated, _ = env.step(Action.tap(0.5, 0.1))
    if terminated or truncated:
        env.reset()


def _row(name: str, what: str, ref_s: float, ours_s: float, ref_conns: int, our_conns: int) -> dict:
    return {
        "row": name,
        "what": what,
        "stock_ms": round(1000 * ref_s, 3),
        "ours_ms": round(1000 * ours_s, 3),
        "speedup": round(ref_s / ours_s, 2),
        "connections_stock": ref_conns,
        "connections_ours": our_conns,
    }
