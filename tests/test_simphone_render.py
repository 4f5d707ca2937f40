"""SimPhone screenshots: kinds get their colours where their boxes are, state and text show, clipping is safe."""

from __future__ import annotations

import os
import string
import zlib
from pathlib import Path

import numpy as np
import pytest

from actors.envs.simphone.render import (
    BACKGROUND,
    KEYBOARD_TOP,
    KIND_FILL,
    encode_png,
    keyboard_layout,
    render_screenshot,
)
from common.types import UIElement

TEXT, BUTTON, EDIT = "android.widget.TextView", "android.widget.Button", "android.widget.EditText"
SWITCH, IMAGE = "android.widget.Switch", "android.widget.ImageView"
BOX = (100, 600, 700, 900)
"""A box in screen pixels; at the default 1/10 scale it covers x 10..70, y 60..90 of the 108x240 output."""


def region(img: np.ndarray, bounds=BOX, scale: float = 0.1) -> np.ndarray:
    left, top, right, bottom = (int(v * scale) for v in bounds)
    return img[top:bottom, left:right]


def outside(img: np.ndarray, bounds=BOX, scale: float = 0.1) -> np.ndarray:
    """Every pixel outside the box, flattened, so changes confined to the box can be checked."""
    mask = np.ones(img.shape[:2], dtype=bool)
    left, top, right, bottom = (int(v * scale) for v in bounds)
    mask[top:bottom, left:right] = False
    return img[mask]


def dominant(pixels: np.ndarray) -> tuple[int, ...]:
    colours, counts = np.unique(pixels.reshape(-1, 3), axis=0, return_counts=True)
    return tuple(int(v) for v in colours[counts.argmax()])


def home_screen() -> list[UIElement]:
    apps = ("Settings", "Clock", "Messages", "Browser", "Notes", "Camera", "Maps", "Music")
    els = [
        UIElement(TEXT, text="12:00", resource_id="com.android.systemui:id/clock", bounds=(0, 0, 1080, 80))
    ]
    for i, app in enumerate(apps):
        col, row = i % 4, i // 4
        box = (col * 270, 1600 + row * 300, col * 270 + 270, 1900 + row * 300)
        els.append(UIElement(TEXT, content_desc=app, bounds=box, clickable=True))
    return els


def settings_screen() -> list[UIElement]:
    els = [UIElement(TEXT, text="Settings", resource_id="android:id/title", bounds=(0, 80, 1080, 240))]
    for i, (name, on) in enumerate((("Wi-Fi", True), ("Bluetooth", False), ("Airplane mode", True))):
        box = (0, 300 + i * 200, 1080, 500 + i * 200)
        els.append(UIElement(SWITCH, text=name, bounds=box, clickable=True, checked=on))
    return els


def typical_screen() -> list[UIElement]:
    """About 20 elements of every kind, the load the 500 steps/s budget is sized for."""
    els = home_screen() + settings_screen()
    els.append(UIElement(EDIT, text="buy milk", bounds=(40, 1000, 1040, 1140), clickable=True, focused=True))
    els.append(UIElement(BUTTON, text="Save", bounds=(40, 1200, 400, 1320), clickable=True))
    els.append(UIElement(IMAGE, bounds=(40, 1350, 1040, 1550)))
    els.append(UIElement("android.widget.ListView", bounds=(0, 240, 1080, 2400), scrollable=True))
    els.append(UIElement("android.widget.ImageButton", content_desc="Back", bounds=(0, 2250, 150, 2400)))
    els.append(UIElement(BUTTON, text="More options", bounds=(700, 2250, 1080, 2400), clickable=True))
    return els


@pytest.mark.parametrize("out_size", [(108, 240), (216, 480), (54, 120), (100, 100), (33, 71)])
def test_shape_and_dtype(out_size):
    img = render_screenshot(typical_screen(), out_size=out_size, keyboard=True)
    assert img.shape == (out_size[1], out_size[0], 3)
    assert img.dtype == np.uint8
    assert img.flags.writeable and img.flags.c_contiguous


def test_other_screen_size_scales_boxes():
    el = UIElement(BUTTON, bounds=(72, 160, 648, 480))  # a 720x1600 screen: x 10.8..90, y 24..72 on 108x240
    img = render_screenshot([el], screen_size=(720, 1600))
    assert tuple(img[48, 50]) == KIND_FILL["button"]
    assert tuple(img[100, 50]) == BACKGROUND


@pytest.mark.parametrize(
    ("element", "kind"),
    [
        (UIElement(BUTTON, bounds=BOX), "button"),
        (UIElement(TEXT, bounds=BOX), "text"),
        (UIElement(EDIT, bounds=BOX), "edit"),
        (UIElement(SWITCH, bounds=BOX), "toggle"),
        (UIElement("android.widget.CheckBox", bounds=BOX), "toggle"),
        (UIElement(IMAGE, bounds=BOX), "image"),
        (UIElement(IMAGE, content_desc="Camera", bounds=BOX), "icon"),
        (UIElement("androidx.recyclerview.widget.RecyclerView", bounds=BOX, scrollable=True), "scroll"),
    ],
)
def test_kind_colour_fills_the_scaled_box(element, kind):
    img = render_screenshot([element])
    box = region(img)
    drawn = box[(box != BACKGROUND).any(-1)]
    assert dominant(drawn) == KIND_FILL[kind]
    share = (drawn == KIND_FILL[kind]).all(-1).sum() / box[..., 0].size
    assert share > (0.1 if kind == "icon" else 0.6), "an icon is a square tile in its box; others fill it"
    assert (outside(img) == render_screenshot([])[~_box_mask()]).all(), "nothing drawn outside the box"
    assert tuple(img[55, 40]) == tuple(img[95, 40]) == tuple(img[75, 5]) == tuple(img[75, 80]) == BACKGROUND


def _box_mask(bounds=BOX, shape=(240, 108)) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    left, top, right, bottom = (int(v * 0.1) for v in bounds)
    mask[top:bottom, left:right] = True
    return mask


def test_kinds_have_distinct_colours():
    fills = [c for c in KIND_FILL.values() if c is not None]
    assert len(set(fills)) == len(fills)
    assert BACKGROUND not in fills


def test_later_elements_paint_over_earlier_ones():
    text, button = UIElement(TEXT, bounds=BOX), UIElement(BUTTON, bounds=(200, 700, 600, 800))
    img = render_screenshot([text, button])
    assert tuple(img[75, 40]) == KIND_FILL["button"]
    assert tuple(img[65, 15]) == KIND_FILL["text"]
    img = render_screenshot([button, UIElement(TEXT, bounds=BOX)])
    assert tuple(img[75, 40]) == KIND_FILL["text"]


def test_checked_switch_differs_with_knob_on_the_right():
    on, off = (
        render_screenshot([UIElement(SWITCH, text="Wi-Fi", bounds=BOX, checked=c)]) for c in (True, False)
    )
    assert not np.array_equal(region(on), region(off))
    assert np.array_equal(outside(on), outside(off))
    knob = np.array([0, 150, 136], dtype=np.uint8)  # ACCENT
    cols = np.nonzero((region(on) == knob).all(-1).any(0))[0]
    assert cols.size and cols.min() > region(on).shape[1] * 3 // 4, "the checked knob sits at the right end"
    assert not (region(off) == knob).all(-1).any()


def test_focused_field_differs():
    focused, plain = (
        render_screenshot([UIElement(EDIT, text="milk", bounds=BOX, focused=f)]) for f in (True, False)
    )
    assert not np.array_equal(region(focused), region(plain))
    assert np.array_equal(outside(focused), outside(plain))


def test_text_is_drawn_and_labels_differ():
    empty = render_screenshot([UIElement(BUTTON, bounds=BOX)])
    ok = render_screenshot([UIElement(BUTTON, text="OK", bounds=BOX)])
    cancel = render_screenshot([UIElement(BUTTON, text="Cancel", bounds=BOX)])
    desc = render_screenshot([UIElement(BUTTON, content_desc="Cancel", bounds=BOX)])
    assert not np.array_equal(region(ok), region(empty))
    assert not np.array_equal(region(ok), region(cancel))
    assert np.array_equal(outside(ok), outside(empty))
    assert np.array_equal(desc, cancel), "an element without text shows its content description"
    assert np.array_equal(
        render_screenshot([UIElement(TEXT, text="wifi", bounds=BOX)]),
        render_screenshot([UIElement(TEXT, text="WIFI", bounds=BOX)]),
    ), "the font is upper case"


def test_icon_labels_differ():
    a, b = (render_screenshot([UIElement(TEXT, content_desc=n, bounds=BOX)]) for n in ("Maps", "Music"))
    assert not np.array_equal(region(a), region(b))


def test_keyboard_changes_only_the_bottom():
    els = typical_screen()
    plain, kb = render_screenshot(els), render_screenshot(els, keyboard=True)
    rows = np.nonzero((plain != kb).any(axis=(1, 2)))[0]
    top = int(240 * KEYBOARD_TOP)
    assert rows.min() >= top, "nothing above the keyboard line changes"
    assert rows.size > 0.9 * (240 - top)
    bare = render_screenshot([], keyboard=True)
    assert np.array_equal(kb[top:], bare[top:]), "the keyboard covers what lies under it"
    assert not np.array_equal(bare[top:], render_screenshot([])[top:])


def test_keyboard_layout_keys():
    keys = keyboard_layout((1080, 2400))
    labels = {label for label, _ in keys}
    assert set(string.ascii_uppercase) <= labels and " " in labels
    for _, (left, top, right, bottom) in keys:
        assert 0 <= left < right <= 1080 and 2400 * KEYBOARD_TOP <= top < bottom <= 2400


@pytest.mark.parametrize("out_size", [(108, 240), (216, 480), (7, 9)])
def test_clipping_never_raises(out_size):
    rng = np.random.default_rng(0)
    classes = [TEXT, BUTTON, EDIT, SWITCH, IMAGE, "android.widget.FrameLayout", "android.view.View"]
    els = []
    for _ in range(300):
        x0, y0 = (int(v) for v in rng.integers(-3000, 4000, size=2))
        w, h = (int(v) for v in rng.integers(-50, 3000, size=2))
        els.append(
            UIElement(
                str(rng.choice(classes)),
                text=str(rng.choice(["", "Hello, world!", "é漢字~`{}|", "x" * 200])),
                content_desc=str(rng.choice(["", "Icon"])),
                bounds=(x0, y0, x0 + w, y0 + h),
                clickable=bool(rng.integers(2)),
                checked=bool(rng.integers(2)),
                focused=bool(rng.integers(2)),
                scrollable=bool(rng.integers(2)),
            )
        )
    img = render_screenshot(els, out_size=out_size, keyboard=True)
    assert img.shape == (out_size[1], out_size[0], 3)


def test_boxes_outside_or_empty_draw_nothing():
    blank = render_screenshot([])
    gone = [
        UIElement(BUTTON, text="left", bounds=(-500, 100, -1, 300), focused=True),
        UIElement(BUTTON, text="below", bounds=(0, 2400, 1080, 2600), checked=True),
        UIElement(SWITCH, text="far", bounds=(5000, 5000, 9000, 9000), checked=True),
        UIElement(BUTTON, text="zero width", bounds=(300, 300, 300, 600)),
        UIElement(BUTTON, text="inverted", bounds=(600, 600, 300, 300)),
    ]
    assert np.array_equal(render_screenshot(gone), blank)


def test_partly_outside_box_is_clipped():
    img = render_screenshot([UIElement(BUTTON, bounds=(-500, 300, 200, 5000), focused=False)])
    assert tuple(img[100, 5]) == KIND_FILL["button"]
    assert tuple(img[239, 5]) == KIND_FILL["button"]
    assert tuple(img[100, 30]) == BACKGROUND
    thin = render_screenshot([UIElement(BUTTON, bounds=(500, 500, 503, 1500))])
    assert (thin[60:140, 50] != BACKGROUND).any(), "a box thinner than an output pixel still shows"


def test_deterministic_and_independent_of_earlier_renders():
    els = typical_screen()
    first = render_screenshot(els, keyboard=True)
    first[:] = 0  # the caller owns the array; cached layers must not change
    render_screenshot(settings_screen(), out_size=(216, 480))
    again, third = render_screenshot(els, keyboard=True), render_screenshot(els, keyboard=True)
    assert np.array_equal(again, third)
    assert again.any()


def test_example_screens(tmp_path):
    """The three example screens look like a phone; set SIMPHONE_RENDER_DIR to also save them as PNG."""
    notes = [
        UIElement(TEXT, text="Notes", resource_id="android:id/title", bounds=(0, 80, 1080, 240)),
        UIElement(EDIT, text="Write a note", bounds=(40, 300, 1040, 440), clickable=True, focused=True),
    ]
    screens = {"home": (home_screen(), False), "settings": (settings_screen(), False), "notes": (notes, True)}
    out_dir = os.environ.get("SIMPHONE_RENDER_DIR")
    for name, (els, kb) in screens.items():
        img = render_screenshot(els, keyboard=kb)
        assert len(np.unique(img.reshape(-1, 3), axis=0)) >= 5, name
        png = encode_png(img)
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert png[16:24] == (108).to_bytes(4, "big") + (240).to_bytes(4, "big")
        idat = png.index(b"IDAT")
        size = int.from_bytes(png[idat - 4 : idat], "big")
        assert len(zlib.decompress(png[idat + 4 : idat + 4 + size])) == 240 * (1 + 108 * 3)
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / f"{name}.png").write_bytes(png)
    assert not list(tmp_path.iterdir())
