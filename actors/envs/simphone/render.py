"""SimPhone screenshots: UI elements drawn as coloured boxes with text, so a pixel-only policy has something to see.

Everything is drawn with numpy slice assignments on a small RGB array (108x240 by default, a tenth of the
1080x2400 screen): the environment has to reach 500 steps/s with the screenshot on one core, so a render
must stay well under a millisecond. What does not change between steps is cached: the background and
status bar, the soft keyboard layer (both per screen size and output size), and the bitmap of every label.
Text uses a built-in 3x5 pixel font (upper case, digits, common punctuation), scaled by a whole factor
when the output is larger, so nothing is downloaded and nothing depends on Pillow.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from common.types import UIElement

STATUS_BAR_PX = 80
"""Height of the status bar in screen pixels (the stand-in phone puts its clock there)."""
KEYBOARD_TOP = 0.65
"""The soft keyboard covers the screen below this fraction of its height."""
KEY_ROWS = ("QWERTYUIOP", "ASDFGHJKL", "^ZXCVBNM<")
"""Letter rows of the keyboard; `^` is shift and `<` backspace. A fourth row holds `?123 , space . >`."""

Color = tuple[int, int, int]
BACKGROUND: Color = (236, 239, 241)
STATUS_BAR: Color = (38, 50, 56)
FOCUS: Color = (255, 87, 34)
ACCENT: Color = (0, 150, 136)
DARK_TEXT: Color = (33, 33, 33)
LIGHT_TEXT: Color = (250, 250, 250)
KIND_FILL: dict[str, Color | None] = {
    "button": (25, 118, 210),
    "text": (255, 255, 255),
    "edit": (255, 248, 225),
    "toggle": (232, 245, 233),
    "image": (144, 164, 174),
    "icon": (255, 167, 38),
    "scroll": (227, 242, 253),
    "view": None,  # layouts are invisible; clickable ones get a border
    "system": None,  # status-bar views: light text straight on the bar
}
"""Fill colour per element kind; see `element_kind`. Borders are the fill at 60% brightness."""

# fmt: off
_FONT: dict[str, str] = {
    'A': '.#./#.#/###/#.#/#.#', 'B': '##./#.#/##./#.#/##.', 'C': '.##/#../#../#../.##', 'D': '##./#.#/#.#/#.#/##.',
    'E': '###/#../##./#../###', 'F': '###/#../##./#../#..', 'G': '.##/#../#.#/#.#/.##', 'H': '#.#/#.#/###/#.#/#.#',
    'I': '###/.#./.#./.#./###', 'J': '..#/..#/..#/#.#/.#.', 'K': '#.#/#.#/##./#.#/#.#', 'L': '#../#../#../#../###',
    'M': '#.#/###/###/#.#/#.#', 'N': '##./#.#/#.#/#.#/#.#', 'O': '.#./#.#/#.#/#.#/.#.', 'P': '##./#.#/##./#../#..',
    'Q': '.#./#.#/#.#/##./.##', 'R': '##./#.#/##./#.#/#.#', 'S': '.##/#../.#./..#/##.', 'T': '###/.#./.#./.#./.#.',
    'U': '#.#/#.#/#.#/#.#/###', 'V': '#.#/#.#/#.#/#.#/.#.', 'W': '#.#/#.#/###/###/#.#', 'X': '#.#/#.#/.#./#.#/#.#',
    'Y': '#.#/#.#/.#./.#./.#.', 'Z': '###/..#/.#./#../###', '0': '###/#.#/#.#/#.#/###', '1': '.#./##./.#./.#./###',
    '2': '##./..#/.#./#../###', '3': '##./..#/.#./..#/##.', '4': '#.#/#.#/###/..#/..#', '5': '###/#../##./..#/##.',
    '6': '.##/#../###/#.#/###', '7': '###/..#/..#/.#./.#.', '8': '###/#.#/###/#.#/###', '9': '###/#.#/###/..#/##.',
    ' ': '.../.../.../.../...', '.': '.../.../.../.../.#.', ',': '.../.../.../.#./#..', ':': '.../.#./.../.#./...',
    ';': '.../.#./.../.#./#..', '!': '.#./.#./.#./.../.#.', '?': '##./..#/.#./.../.#.', '-': '.../.../###/.../...',
    '_': '.../.../.../.../###', '+': '.../.#./###/.#./...', '=': '.../###/.../###/...', '/': '..#/..#/.#./#../#..',
    "'": '.#./.#./.../.../...', '"': '#.#/#.#/.../.../...', '(': '..#/.#./.#./.#./..#', ')': '#../.#./.#./.#./#..',
    '%': '#.#/..#/.#./#../#.#', '&': '.#./#.#/.#./#.#/.##', '@': '###/#.#/###/#../.##', '#': '#.#/###/#.#/###/#.#',
    '*': '#.#/.#./#.#/.../...', '<': '..#/.#./#../.#./..#', '>': '#../.#./..#/.#./#..', '[': '##./#../#../#../##.',
    ']': '.##/..#/..#/..#/.##', '$': '.##/##./.#./.##/##.', '^': '.#./#.#/.../.../...',
}
"""3x5 glyphs, rows top to bottom separated by "/", "#" for ink."""
# fmt: on


_GLYPHS: dict[str, np.ndarray] = {
    ch: np.array([[c == "#" for c in row] for row in rows.split("/")], dtype=bool)
    for ch, rows in _FONT.items()
}


@lru_cache(maxsize=1024)  # labels are cut to what fits, so entries stay small
def text_mask(text: str, scale: int = 1) -> np.ndarray:
    """Boolean [5*scale, width, 3] bitmap of `text` in the 3x5 font (upper-cased; unknown characters as '?').

    The channel axis is repeated so that drawing is one `np.copyto(..., where=mask)`, the fastest way.
    """
    glyphs = [_GLYPHS.get(ch, _GLYPHS["?"]) for ch in text.upper()] or [_GLYPHS[" "]]
    spaced = [np.pad(g, ((0, 0), (0, 1))) for g in glyphs[:-1]] + [glyphs[-1]]
    mask = np.kron(np.concatenate(spaced, axis=1), np.ones((scale, scale), dtype=bool))
    mask = np.repeat(mask[:, :, None], 3, axis=2)
    mask.flags.writeable = False
    return mask


@lru_cache(maxsize=512)
def element_kind(cls: str, has_text: bool, has_desc: bool, scrollable: bool) -> str:
    """The drawing kind of an element, from its class name (the part after the last dot) and flags."""
    name = cls.rsplit(".", 1)[-1]
    if scrollable:
        return "scroll"
    if any(k in name for k in ("Switch", "CheckBox", "RadioButton", "ToggleButton")):
        return "toggle"
    if "EditText" in name:
        return "edit"
    if ("TextView" in name or "Image" in name) and has_desc and not has_text:
        return "icon"
    if "Button" in name:
        return "button"
    if "Image" in name:
        return "image"
    if "TextView" in name:
        return "text"
    return "view"


_ROW = 2048


def _rgb(color: Color) -> np.ndarray:
    """A row of `color` [_ROW, 3]: assigning a row slice copies whole runs, ~10x faster than an RGB triple."""
    row = np.tile(np.array(color, dtype=np.uint8), (_ROW, 1))
    row.flags.writeable = False
    return row


_FILL = {kind: None if c is None else _rgb(c) for kind, c in KIND_FILL.items()}
_EDGE = {kind: None if c is None else _rgb(tuple(int(v * 0.6) for v in c)) for kind, c in KIND_FILL.items()}
_VIEW_EDGE, _FOCUS, _ACCENT = _rgb((158, 158, 158)), _rgb(FOCUS), _rgb(ACCENT)
_DARK, _LIGHT = _rgb(DARK_TEXT), _rgb(LIGHT_TEXT)
_TRACK_ON, _TRACK_OFF, _KNOB_OFF = _rgb((128, 203, 196)), _rgb((189, 189, 189)), _rgb((97, 97, 97))


def _fill(img: np.ndarray, x0: int, y0: int, x1: int, y1: int, color: np.ndarray) -> None:
    """Fill [y0:y1, x0:x1], clipped to the image (coordinates may lie outside it)."""
    h, w = img.shape[:2]
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 > x0 and y1 > y0:
        img[y0:y1, x0:x1] = color[: x1 - x0] if x1 - x0 <= _ROW else color[0]


def _blit(img: np.ndarray, mask: np.ndarray, x: int, y: int, color: np.ndarray) -> None:
    """Paint `color` where `mask` is set, with its top-left corner at (x, y), clipped to the image."""
    h, w = img.shape[:2]
    mh, mw = mask.shape[:2]
    cx0, cy0, cx1, cy1 = max(x, 0), max(y, 0), min(x + mw, w), min(y + mh, h)
    if cx1 - cx0 > _ROW:
        cx1 = cx0 + _ROW
    if cx1 > cx0 and cy1 > cy0:
        where = mask[cy0 - y : cy1 - y, cx0 - x : cx1 - x]
        np.copyto(img[cy0:cy1, cx0:cx1], color[: cx1 - cx0], where=where)


def _text(
    img: np.ndarray, label: str, x0: int, x1: int, yc: int, k: int, color: np.ndarray, center: bool
) -> None:
    """Draw as much of `label` as fits between x0 and x1, vertically centred on yc."""
    n = (x1 - x0 + k) // (4 * k)
    if n <= 0 or not label:
        return
    mask = text_mask(label[:n], k)
    x = (x0 + x1 - mask.shape[1]) // 2 if center else x0
    _blit(img, mask, x, yc - mask.shape[0] // 2, color)


def _text_scale(sx: float, sy: float) -> int:
    """Glyphs are 50 screen pixels tall (about 19 sp on a 1080x2400 phone), and at least 5 output pixels."""
    return max(1, int(min(sx, sy) * 10 + 1e-6))


def keyboard_layout(
    screen_size: tuple[int, int] = (1080, 2400),
) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(label, bounds in screen pixels) of every soft-keyboard key, so the env can make keys tappable."""
    w, h = screen_size
    top = int(h * KEYBOARD_TOP)
    row_h = (h - top) / 4.6  # a thin suggestion strip (0.6 row) above four key rows
    unit = w / 10
    keys = []
    rows: list[list[tuple[str, float]]] = [[(c, 1.0) for c in r] for r in KEY_ROWS]
    rows[2][0], rows[2][-1] = (rows[2][0][0], 1.5), (rows[2][-1][0], 1.5)  # wide shift and backspace
    rows.append([("?123", 1.5), (",", 1.0), (" ", 5.0), (".", 1.0), (">", 1.5)])
    for r, row in enumerate(rows):
        x = (w - unit * sum(width for _, width in row)) / 2
        y = top + row_h * (0.6 + r)
        for label, width in row:
            keys.append((label, (int(x), int(y), int(x + unit * width), int(y + row_h))))
            x += unit * width
    return keys


@lru_cache(maxsize=16)
def _base_layer(screen_size: tuple[int, int], out_size: tuple[int, int]) -> np.ndarray:
    """Background plus the status bar with signal and battery marks; read-only, copied per render."""
    (sw, sh), (w, h) = screen_size, out_size
    img = np.empty((h, w, 3), dtype=np.uint8)
    _fill(img, 0, 0, w, h, _rgb(BACKGROUND))
    bar = max(1, round(STATUS_BAR_PX * h / sh))
    _fill(img, 0, 0, w, bar, _rgb(STATUS_BAR))
    k = _text_scale(w / sw, h / sh)
    x, y0, y1 = w - 2 * k, max(0, (bar - 5 * k) // 2), min(bar, (bar + 5 * k) // 2 + 1)
    _fill(img, x - 5 * k, y0, x, y1, _LIGHT)  # battery
    for i in range(3):  # signal bars of rising height
        _fill(
            img, x - (11 - 2 * i) * k, y1 - (i + 1) * max(1, (y1 - y0) // 3), x - (10 - 2 * i) * k, y1, _LIGHT
        )
    img.flags.writeable = False
    return img


@lru_cache(maxsize=16)
def _keyboard_layer(screen_size: tuple[int, int], out_size: tuple[int, int]) -> np.ndarray:
    """The keyboard rows below KEYBOARD_TOP, pre-rendered once per size; read-only, pasted per render."""
    (sw, sh), (w, h) = screen_size, out_size
    sx, sy, k = w / sw, h / sh, _text_scale(w / sw, h / sh)
    top = int(h * KEYBOARD_TOP)
    img = np.empty((h, w, 3), dtype=np.uint8)
    _fill(img, 0, 0, w, h, _rgb((207, 216, 220)))
    for label, (left, t, right, b) in keyboard_layout(screen_size):
        x0, y0, x1, y1 = int(left * sx), int(t * sy), int(right * sx), int(b * sy)
        _fill(img, x0, y0, x1 - 1, y1 - 1, _rgb((120, 144, 156)))  # 1 px gap between keys
        _fill(img, x0, y0, x1 - 1, y1 - 2, _rgb((250, 250, 250)))  # key face above its shadow
        _text(img, label.strip(), x0 + 1, x1 - 1, (y0 + y1 - 1) // 2, k, _DARK, center=True)
    layer = img[top:].copy()
    layer.flags.writeable = False
    return layer


def _draw_element(img: np.ndarray, el: UIElement, sx: float, sy: float, k: int) -> None:
    left, top, right, bottom = el.bounds
    if right <= left or bottom <= top:
        return
    # floor both edges so touching boxes tile exactly; keep at least one pixel for thin boxes
    x0, y0 = math.floor(left * sx), math.floor(top * sy)
    x1, y1 = max(math.floor(right * sx), x0 + 1), max(math.floor(bottom * sy), y0 + 1)
    h, w = img.shape[:2]
    if x1 <= 0 or y1 <= 0 or x0 >= w or y0 >= h:
        return
    kind = "system" if el.resource_id.startswith("com.android.systemui") else None
    kind = kind or element_kind(el.cls, bool(el.text), bool(el.content_desc), el.scrollable)
    fill, edge = _FILL[kind], _EDGE[kind]
    label, pad, yc = el.label, 2 * k, (y0 + y1) // 2
    color = _LIGHT if kind in ("button", "system") else _DARK
    if kind == "icon":  # a square tile, with the label below it when there is room
        line = 5 * k + 2 if y1 - y0 >= 15 * k else 0
        side = max(1, min(x1 - x0, y1 - y0 - line) * 3 // 4)
        tx, ty = (x0 + x1 - side) // 2, y0 + (y1 - y0 - line - side) // 2
        _fill(img, tx, ty, tx + side, ty + side, edge)
        _fill(img, tx + 1, ty + 1, tx + side - 1, ty + side - 1, fill)
        if line:
            _text(img, label, x0 + 1, x1 - 1, y1 - line // 2 - 1, k, color, center=True)
        elif side >= 5 * k + 2:
            _text(img, label, tx + 1, tx + side - 1, ty + side // 2, k, color, center=True)
        if el.focused:
            _fill(img, x0, y1 - k, x1, y1, _FOCUS)
        return
    border = 2 * k if el.focused else (1 if fill is not None or el.clickable else 0)
    edge = _FOCUS if el.focused else (edge if edge is not None else _VIEW_EDGE)
    if fill is not None:  # the border colour under the whole box, the fill inset by the border
        _fill(img, x0, y0, x1, y1, edge)
        _fill(img, x0 + border, y0 + border, x1 - border, y1 - border, fill)
    elif border:  # transparent layout: a frame only, what lies under it stays visible
        for fx0, fy0, fx1, fy1 in ((x0, y0, x1, y0 + border), (x0, y1 - border, x1, y1)):
            _fill(img, fx0, fy0, fx1, fy1, edge)
        for fx0, fx1 in ((x0, x0 + border), (x1 - border, x1)):
            _fill(img, fx0, y0, fx1, y1, edge)
    text_x1 = x1 - pad
    if kind == "toggle":  # a track on the right with its knob at the right end when checked
        th = max(1, min(y1 - y0 - 2, 6 * k))
        tx1, ty = x1 - pad, yc - th // 2
        _fill(img, tx1 - 2 * th, ty, tx1, ty + th, _TRACK_ON if el.checked else _TRACK_OFF)
        kx = tx1 - th if el.checked else tx1 - 2 * th
        _fill(img, kx, ty, kx + th, ty + th, _ACCENT if el.checked else _KNOB_OFF)
        text_x1 = tx1 - 2 * th - pad
    elif el.checked:  # any other checked view (tabs, list items) gets an accent bar on the left
        _fill(img, x0, y0, x0 + 2 * k, y1, _ACCENT)
    elif kind == "scroll":  # a scrollbar thumb marks what can be swiped
        _fill(
            img, x1 - border - k, y0 + border, x1 - border, y0 + border + max(1, (y1 - y0) // 4), _EDGE[kind]
        )
    if label and y1 - y0 >= 5 * k + 2:
        _text(img, label, x0 + pad, text_x1, yc, k, color, center=kind == "button")


def render_screenshot(
    elements: Sequence[UIElement],
    screen_size: tuple[int, int] = (1080, 2400),
    out_size: tuple[int, int] = (108, 240),
    keyboard: bool = False,
) -> np.ndarray:
    """The screen as uint8 RGB [out_h, out_w, 3]; out_size is (width, height) like screen_size.

    Elements are drawn in list order, so later ones cover earlier ones; boxes outside the screen are
    clipped and empty or inverted ones skipped. With `keyboard` the soft keyboard covers the bottom
    (1 - KEYBOARD_TOP) of the screen, on top of everything.
    """
    screen_size, out_size = tuple(screen_size), tuple(out_size)
    img = _base_layer(screen_size, out_size).copy()
    sx, sy = out_size[0] / screen_size[0], out_size[1] / screen_size[1]
    k = _text_scale(sx, sy)
    for el in elements:
        _draw_element(img, el, sx, sy, k)
    if keyboard:
        layer = _keyboard_layer(screen_size, out_size)
        img[out_size[1] - layer.shape[0] :] = layer
    return img


def encode_png(img: np.ndarray) -> bytes:
    """A uint8 RGB [H, W, 3] array as PNG bytes, for logs and debugging, without an imaging library."""
    h, w = img.shape[:2]
    raw = np.concatenate([np.zeros((h, 1), np.uint8), np.ascontiguousarray(img, np.uint8).reshape(h, -1)], 1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes()))
        + chunk(b"IEND", b"")
    )
