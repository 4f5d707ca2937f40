"""Per-step overhead of the ADB backend, against the stock adbutils calls, on the fake adb server.

The fake device answers at once, so what is left is the client's own cost: connections, round trips,
adbutils' 10 ms linger on every close, parsing and decoding. Rows (ms per call, best of several runs):

- `command`: one shell command. Reference: adbutils `shell2(v2=True)` (a `host:version` connection, then
  the transport; 10 ms linger on each close). Ours: `AdbDevice.shell` (transport id, one connection).
- `observation`: the UI dump and a 1080x2400 screenshot. Reference: the stock way, `uiautomator dump`,
  a sync pull of the file, `screencap -p` (three calls). Ours: one shell line (`capture.observe_line`).
- `env step`: a whole `AdbPhoneEnv.step` (tap, two UI dumps to see the screen settle, the success
  check), with and without a screenshot, with settle_interval 0 so only overhead is measured.
"""

from __future__ import annotations

import io
import os
import tempfile

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
    os.environ.setdefault("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    import adbutils

    from actors.envs.adb.capture import observe_line, split_capture
    from actors.envs.adb.device import AdbDevice
    from tests.fake_adb import DUMP_PATH, FakeAdbServer
    from tests.test_adb_env import make_env_on, make_world_phone

    repeats, inner = (3, 10) if quick else (5, 30)
    phone = make_world_phone(png=_screen_png())
    rows = []
    with FakeAdbServer(phone) as server:
        stock = adbutils.AdbClient("127.0.0.1", server.port, socket_timeout=10).device(serial=phone.serial)
        ours = AdbDevice(phone.serial, port=server.port)
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
            env = make_env_on(server, screenshot=shot, settle_interval=0.0)
            env.reset(seed=0)
            ms = 1000 * best_seconds(lambda env=env: _tap_step(env), repeats, max(1, inner // 3))
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
