"""Building blocks of SimPhone screens: widgets an app declares and the page stack that holds them.

Apps describe a page as lists of Widgets (header, scrollable list, footer); the phone lays them out
in pixels, turns them into `UIElement`s exactly like `uiautomator dump` would report them, and keeps
the callbacks that run when a widget is tapped. Widgets are rebuilt from state on every observation,
so app code stays a pure "state -> screen" function plus small event handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BUTTON = "android.widget.Button"
TEXT = "android.widget.TextView"
EDIT = "android.widget.EditText"
SWITCH = "android.widget.Switch"
IMAGE = "android.widget.ImageView"
LIST = "androidx.recyclerview.widget.RecyclerView"
FRAME = "android.widget.FrameLayout"


@dataclass
class Widget:
    """One element an app puts on screen, with what happens when it is used."""

    cls: str
    text: str = ""
    desc: str = ""
    hint: str = ""
    """For text fields: the placeholder shown while the field is empty."""
    rid: str = ""
    on_tap: Callable[[], None] | None = None
    field: str | None = None
    """For text fields: the key of the page's field buffer this widget edits (tapping focuses it)."""
    checked: bool = False
    height: int = 150
    """Row height in pixels (list and footer layout)."""
    width_share: float = 1.0
    """Footer widgets share a row in proportion to this."""

    @property
    def clickable(self) -> bool:
        return self.on_tap is not None or self.field is not None


@dataclass
class PageView:
    """What an app shows for one page: a title, a scrollable list and a bottom bar."""

    title: str
    items: list[Widget] = field(default_factory=list)
    header: list[Widget] = field(default_factory=list)
    """Fixed widgets under the title (search boxes, tabs)."""
    footer: list[Widget] = field(default_factory=list)
    """Fixed widgets at the bottom, laid out side by side."""
    on_enter: Callable[[], None] | None = None
    """What the enter key does on this page (submit a search, send a message)."""


@dataclass
class Page:
    """One entry of an app's navigation stack: which page, its arguments, its typed text, its scroll."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    focused: str | None = None
    scroll: int = 0
    """Index of the first list item shown."""
    select_all: bool = False
    """The focused field's text is selected: the next `type` replaces it."""


def row(
    text: str, on_tap: Callable[[], None] | None = None, *, desc: str = "", rid: str = "", cls: str = TEXT
) -> Widget:
    return Widget(cls, text=text, desc=desc, rid=rid, on_tap=on_tap)


def button(text: str, on_tap: Callable[[], None], *, rid: str = "", width_share: float = 1.0) -> Widget:
    return Widget(BUTTON, text=text, rid=rid, on_tap=on_tap, width_share=width_share)


def switch(text: str, checked: bool, on_tap: Callable[[], None], *, rid: str = "") -> Widget:
    return Widget(SWITCH, text=text, rid=rid, on_tap=on_tap, checked=checked)


def text_field(page: Page, key: str, hint: str, *, rid: str = "") -> Widget:
    """An EditText showing the page's buffer for `key` (its hint shows while the buffer is empty)."""
    return Widget(EDIT, text=page.fields.get(key, ""), hint=hint, rid=rid or f"field_{key}", field=key)
