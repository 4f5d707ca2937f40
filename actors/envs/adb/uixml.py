"""Parse `uiautomator dump` XML into the UIElement list SimPhone produces.

The dump comes from a device we do not control, so every limit is checked here: size, DTD/entity
declarations (billion laughs, external entities), depth, node count, bounds and text length.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from actors.envs.adb.errors import DeviceOutputError
from common.types import UIElement

MAX_XML_BYTES = 4 * 1024 * 1024
"""A busy real screen dumps to ~100 KB; anything far larger is garbage or an attack."""
MAX_DEPTH = 64
MAX_NODES = 5000
MAX_TEXT = 512
"""Longest text kept per field; a label longer than this is useless to the policy anyway."""

_BOUNDS = re.compile(r"\[(-?\d{1,6}),(-?\d{1,6})\]\[(-?\d{1,6}),(-?\d{1,6})\]")
_FORBIDDEN = (b"<!DOCTYPE", b"<!ENTITY", b"<!ELEMENT", b"<!ATTLIST")
_EDITABLE_HINTS = ("EditText", "AutoCompleteTextView")
# Control characters (except tab/newline) that survived decoding; XML 1.0 forbids most of them anyway.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def parse_bounds(raw: str) -> tuple[int, int, int, int]:
    """`[x1,y1][x2,y2]` -> (left, top, right, bottom); raises on anything else."""
    m = _BOUNDS.fullmatch(raw.strip())
    if m is None:
        raise DeviceOutputError("bad_bounds", repr(raw[:64]))
    left, top, right, bottom = (int(g) for g in m.groups())
    return left, top, right, bottom


def _clip(bounds: tuple[int, int, int, int], screen: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """Clip to the screen; None when nothing visible is left."""
    w, h = screen
    left, top = max(0, bounds[0]), max(0, bounds[1])
    right, bottom = min(w, bounds[2]), min(h, bounds[3])
    if right <= left or bottom <= top:
        return None
    return left, top, right, bottom


def _text(node: ET.Element, name: str) -> str:
    value = _CONTROL.sub("", node.get(name, "") or "")
    return value[:MAX_TEXT]


def _flag(node: ET.Element, name: str) -> bool:
    return node.get(name, "false") == "true"


def _decode(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", errors="replace")
    return bytes(data)


def _root(data: bytes | str) -> ET.Element:
    raw = _decode(data)
    if len(raw) > MAX_XML_BYTES:
        raise DeviceOutputError("too_large", f"{len(raw)} bytes")
    if not raw.strip():
        raise DeviceOutputError("empty", "no XML in the dump")
    upper = raw.upper()
    for bad in _FORBIDDEN:
        if bad in upper:
            raise DeviceOutputError("dtd", f"refused {bad.decode()} declaration")
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as e:
        raise DeviceOutputError("bad_xml", str(e)) from None
    if root.tag != "hierarchy":
        raise DeviceOutputError("bad_root", f"root is <{root.tag[:32]}>, not <hierarchy>")
    return root


def parse_dump(data: bytes | str, screen_size: tuple[int, int]) -> list[UIElement]:
    """The elements a policy can act on or read, in tree order, bounds clipped to `screen_size`.

    Kept: visible (`visible-to-user` not false), non-empty after clipping, and carrying a label
    (text / content-desc / hint / resource id) or being clickable / editable / scrollable.
    """
    root = _root(data)
    elements: list[UIElement] = []
    count = 0
    stack: list[tuple[ET.Element, int]] = [(child, 1) for child in reversed(root)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise DeviceOutputError("too_many_nodes", f"more than {MAX_NODES}")
        if depth > MAX_DEPTH:
            raise DeviceOutputError("too_deep", f"deeper than {MAX_DEPTH}")
        if node.tag != "node":
            continue
        stack.extend((child, depth + 1) for child in reversed(node))
        element = _element(node, screen_size)
        if element is not None:
            elements.append(element)
    return elements


def _element(node: ET.Element, screen_size: tuple[int, int]) -> UIElement | None:
    if node.get("visible-to-user", "true") == "false":
        return None
    raw_bounds = node.get("bounds")
    if raw_bounds is None:
        return None
    bounds = _clip(parse_bounds(raw_bounds), screen_size)
    if bounds is None:
        return None
    cls = _text(node, "class")
    text, desc, hint, rid = (_text(node, n) for n in ("text", "content-desc", "hint", "resource-id"))
    clickable = _flag(node, "clickable") or _flag(node, "long-clickable")
    editable = any(h in cls for h in _EDITABLE_HINTS)
    scrollable = _flag(node, "scrollable")
    if _flag(node, "password"):
        text = ""  # never carry a typed password into observations or logs
    if not (text or desc or hint or rid or clickable or editable or scrollable):
        return None
    return UIElement(
        cls=cls,
        text=text,
        content_desc=desc,
        hint=hint,
        resource_id=rid,
        bounds=bounds,
        clickable=clickable,
        checked=_flag(node, "checked"),
        focused=_flag(node, "focused"),
        scrollable=scrollable,
    )
