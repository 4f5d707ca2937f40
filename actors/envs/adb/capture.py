"""One observation in one shell call: the UI dump and, when wanted, the screen, split and decoded safely."""

from __future__ import annotations

import io

import numpy as np

from actors.envs.faults import DeviceBadOutput

DUMP_PATH = "/sdcard/window_dump.xml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_SCREEN_PIXELS = 16384 * 16384
DUMP_END = b"</hierarchy>"


def observe_line(screenshot: bool) -> str:
    """The one shell line that dumps the UI (and captures the screen): the old dump is removed first so
    a failed `uiautomator dump` cannot hand back the previous screen."""
    line = f"rm -f {DUMP_PATH}; uiautomator dump {DUMP_PATH} >/dev/null && cat {DUMP_PATH}"
    return line + (" && screencap -p" if screenshot else "")


def split_capture(data: bytes, screenshot: bool) -> tuple[bytes, bytes | None]:
    """(xml, png) from the output of `observe_line`."""
    if not screenshot:
        return data, None
    end = data.rfind(DUMP_END)
    start = data.find(PNG_MAGIC, end + len(DUMP_END) if end >= 0 else 0)
    if start < 0:
        raise DeviceBadOutput("bad_png", "no PNG after the UI dump")
    return data[:start], data[start:]


def decode_png(png: bytes, size: tuple[int, int]) -> np.ndarray:
    """RGB uint8 [H, W, 3] downscaled to `size` (width, height); DeviceBadOutput for anything unusable."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(png)) as img:
            if img.format != "PNG":
                raise DeviceBadOutput("bad_png", f"image is {img.format}, not PNG")
            if img.width * img.height > MAX_SCREEN_PIXELS:
                raise DeviceBadOutput("bad_png", f"image of {img.width}x{img.height} pixels")
            rgb = img.convert("RGB").resize(size, Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except DeviceBadOutput:
        raise
    except Exception as e:  # Pillow raises many types for broken data (OSError, SyntaxError, ValueError...)
        raise DeviceBadOutput("bad_png", f"{type(e).__name__}: {e}") from None
