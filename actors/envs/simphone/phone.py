"""The SimPhone device: launcher, app drawer, per-app navigation stacks, keyboard, dialogs.

The phone holds two kinds of state. `state` is the task-visible tree that success predicates read
(`settings.wifi`, `clock.alarms[*].time`, ...; every path is listed in docs/SIMPHONE.md). The UI state
(which app is in front, each app's page stack, typed text, scroll positions, an open dialog) decides
what is on screen. Actions follow Android: back closes a dialog, then the keyboard, then pops a page,
and leaves an app from its root page; home returns to the launcher; a swipe up on the home screen opens
the app drawer; `type` writes into the focused field; enter submits the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from actors.envs.simphone.ui import BUTTON, FRAME, IMAGE, LIST, TEXT, Page, PageView, Widget
from common.types import Action, ActionType, SwipeDirection, UIElement

WIDTH, HEIGHT = 1080, 2400
STATUS_BAR = 80
TITLE_BAR = 160
FOOTER_HEIGHT = 180
KEYBOARD_TOP = 1560
HOME_GRID_TOP = 1200
ICON_SIZE = 270


class App(Protocol):
    """What an app module provides (see actors/envs/simphone/apps/)."""

    NAME: str

    def init_state(self, rng: np.random.Generator) -> Any: ...

    def root(self) -> Page: ...

    def view(self, phone: SimPhone, page: Page) -> PageView: ...


@dataclass
class Dialog:
    title: str
    message: str
    buttons: list[str]


@dataclass
class Screen:
    """One rendered screen: the elements as uiautomator reports them, and each one's widget (if any)."""

    elements: list[UIElement] = field(default_factory=list)
    widgets: list[Widget | None] = field(default_factory=list)
    keyboard: bool = False

    def add(self, element: UIElement, widget: Widget | None = None) -> None:
        self.elements.append(element)
        self.widgets.append(widget)


class SimPhone:
    def __init__(self, apps: dict[str, App], rng: np.random.Generator, dialog_probability: float = 0.1):
        self.apps = apps
        self.rng = rng
        self.dialog_probability = dialog_probability
        self.state: dict[str, Any] = {}
        self.stacks: dict[str, list[Page]] = {}
        self.app: str | None = None
        self.drawer_open = False
        self.drawer_scroll = 0
        self.dialog: Dialog | None = None
        self.home_icons: list[str] = []
        self.clock = "12:00"
        self.layout: dict[str, Any] = {}
        """Per-episode layout randomization apps draw lazily (row orders, result lists)."""
        self._screen: Screen | None = None

    # ---- episode set-up ------------------------------------------------------------------------
    def reset(self) -> None:
        rng = self.rng
        self.state = {name.lower(): app.init_state(rng) for name, app in self.apps.items()}
        for app in self.apps.values():
            extra = getattr(app, "init_extra_state", None)
            if extra is not None:
                self.state.update(extra(rng))
        self.state["app"] = "Launcher"
        self.state["screen"] = "home"
        self.stacks, self.layout = {}, {}
        self.app, self.drawer_open, self.drawer_scroll, self.dialog = None, False, 0, None
        names = list(self.apps)
        count = min(len(names), int(rng.integers(4, 9)))
        self.home_icons = [str(n) for n in rng.permutation(names)[:count]]
        self.clock = f"{int(rng.integers(7, 23)):02d}:{int(rng.integers(0, 60)):02d}"
        self._screen = None

    def shuffled(self, key: str, items: list) -> list:
        """`items` in an order drawn once per episode (so positions cannot be memorized)."""
        if key not in self.layout:
            self.layout[key] = [items[i] for i in self.rng.permutation(len(items))]
        return self.layout[key]

    # ---- navigation used by apps -----------------------------------------------------------------
    def open_app(self, name: str) -> None:
        self.app, self.drawer_open = name, False
        if name not in self.stacks:
            self.stacks[name] = [self.apps[name].root()]
        if self.rng.random() < self.dialog_probability:
            self.dialog = Dialog(
                f"Allow {name} to send you notifications?", "You can change this in Settings.",
                ["Don't allow", "Allow"],
            )  # fmt: skip
        self._changed()

    def page(self) -> Page | None:
        return self.stacks[self.app][-1] if self.app else None

    def push(self, page: Page) -> None:
        self.stacks[self.app].append(page)
        self._changed()

    def pop(self) -> None:
        stack = self.stacks[self.app]
        if len(stack) > 1:
            stack.pop()
        else:
            self.go_home()
        self._changed()

    def replace(self, page: Page) -> None:
        self.stacks[self.app][-1] = page
        self._changed()

    def go_home(self) -> None:
        self.app, self.drawer_open, self.dialog = None, False, None
        self._changed()

    def _changed(self) -> None:
        self._screen = None
        page = self.page()
        self.state["app"] = self.app or "Launcher"
        self.state["screen"] = (
            f"{self.app}.{page.name}" if page else ("drawer" if self.drawer_open else "home")
        )

    # ---- actions -------------------------------------------------------------------------------------
    def act(self, action: Action) -> str | None:
        """Apply one action; returns a flag naming what could not be done (None when it took effect)."""
        kind = action.type
        if kind == ActionType.TAP:
            if not (0.0 <= action.x <= 1.0 and 0.0 <= action.y <= 1.0):
                return "tap_outside_screen"
            return self._tap(action.x * WIDTH, action.y * HEIGHT)
        if kind == ActionType.SWIPE:
            return self._swipe(action.direction)
        if kind == ActionType.TYPE:
            page = self.page()
            if self.dialog or page is None or page.focused is None:
                return "no_focused_field"
            # Tapping a field selects its text (as many Android forms do), so the first `type` replaces it.
            # Text typed after existing text gets a space first, as a keyboard's word suggestions do, so a
            # policy that types one instruction word at a time can enter a phrase.
            old = "" if page.select_all else page.fields.get(page.focused, "")
            space = " " if old and not old.endswith(" ") and not action.text.startswith(" ") else ""
            page.fields[page.focused] = old + space + action.text
            page.select_all = False
            self._changed()
            return None
        if kind == ActionType.PRESS_BACK:
            self._back()
            return None
        if kind == ActionType.PRESS_HOME:
            self.go_home()
            return None
        if kind == ActionType.PRESS_ENTER:
            page = self.page()
            view = self.apps[self.app].view(self, page) if page else None
            if self.dialog or view is None or view.on_enter is None:
                return "enter_ignored"
            view.on_enter()
            self._changed()
            return None
        if kind == ActionType.NOOP:
            return "noop"
        return None  # STATUS_COMPLETE is the evaluator's business

    def _back(self) -> None:
        page = self.page()
        if self.dialog:
            self.dialog = None
        elif page is not None and page.focused is not None:
            page.focused = None  # the first back only hides the keyboard
        elif self.app:
            self.pop()
        elif self.drawer_open:
            self.drawer_open = False
        self._changed()

    def _tap(self, x: float, y: float) -> str | None:
        screen = self.screen()
        for element, widget in zip(reversed(screen.elements), reversed(screen.widgets), strict=True):
            left, top, right, bottom = element.bounds
            if widget is not None and widget.clickable and left <= x < right and top <= y < bottom:
                if widget.field is not None:
                    self.page().focused = widget.field
                    self.page().select_all = True
                if widget.on_tap is not None:
                    widget.on_tap()
                self._changed()
                return None
        return "tap_missed"

    def _swipe(self, direction: SwipeDirection) -> str | None:
        if self.dialog:
            return "nothing_to_scroll"
        if self.app is None:
            if direction == SwipeDirection.UP and not self.drawer_open:
                self.drawer_open, self.drawer_scroll = True, 0
            elif direction == SwipeDirection.DOWN and self.drawer_open and self.drawer_scroll == 0:
                self.drawer_open = False
            elif self.drawer_open and direction in (SwipeDirection.UP, SwipeDirection.DOWN):
                step = 4 if direction == SwipeDirection.UP else -4
                self.drawer_scroll = max(0, min(self.drawer_scroll + step, max(0, len(self.apps) - 8)))
            else:
                return "nothing_to_scroll"
            self._changed()
            return None
        page = self.page()
        view = self.apps[self.app].view(self, page)
        visible = self._visible_rows(view, page)
        if direction == SwipeDirection.UP:
            new = min(page.scroll + max(1, visible - 1), max(0, len(view.items) - visible))
        elif direction == SwipeDirection.DOWN:
            new = max(0, page.scroll - max(1, visible - 1))
        else:
            return "nothing_to_scroll"
        if new == page.scroll:
            return "nothing_to_scroll"
        page.scroll = new
        self._changed()
        return None

    # ---- what is on screen ---------------------------------------------------------------------------
    def screen(self) -> Screen:
        if self._screen is None:
            self._screen = self._build_screen()
        return self._screen

    def _add_status_icons(self, s: Screen) -> None:
        """What Android's status bar shows of the radios, right to left before the battery: an airplane
        while airplane mode is on, Bluetooth while it is on, the Wi-Fi signal while Wi-Fi is on (each with
        the content description and view id SystemUI gives it)."""
        st = self.state.get("settings", {})
        icons = [
            ("airplane", "Airplane mode on", st.get("airplane_mode")),
            ("bluetooth", "Bluetooth on", st.get("bluetooth")),
            ("wifi_combo", "Wi-Fi signal full", st.get("wifi")),
        ]
        right = 960
        for rid, desc, shown in reversed(icons):
            if shown:
                bounds = (right - 80, 0, right, STATUS_BAR)
                s.add(
                    UIElement(
                        IMAGE, content_desc=desc, resource_id=f"com.android.systemui:id/{rid}", bounds=bounds
                    )
                )
                right -= 80

    def _build_screen(self) -> Screen:
        s = Screen()
        s.add(
            UIElement(
                TEXT,
                text=self.clock,
                resource_id="com.android.systemui:id/clock",
                bounds=(0, 0, 200, STATUS_BAR),
            )
        )
        s.add(UIElement(IMAGE, content_desc="Battery 80 percent", resource_id="com.android.systemui:id/battery", bounds=(960, 0, 1080, STATUS_BAR)))  # fmt: skip
        self._add_status_icons(s)
        if self.dialog:
            self._add_dialog(s)
        elif self.app is None:
            self._add_launcher(s)
        else:
            self._add_page(s)
        return s

    def _add_dialog(self, s: Screen) -> None:
        d = self.dialog
        s.add(
            UIElement(TEXT, text=d.title, resource_id="android:id/alertTitle", bounds=(100, 900, 980, 1060))
        )
        s.add(
            UIElement(TEXT, text=d.message, resource_id="android:id/message", bounds=(100, 1060, 980, 1200))
        )
        width = 880 // len(d.buttons)
        for i, label in enumerate(d.buttons):
            widget = Widget(BUTTON, text=label, on_tap=self._dismiss_dialog)
            box = (100 + i * width, 1220, 100 + (i + 1) * width, 1360)
            s.add(
                UIElement(
                    BUTTON, text=label, resource_id=f"android:id/button{i + 1}", bounds=box, clickable=True
                ),
                widget,
            )

    def _dismiss_dialog(self) -> None:
        self.dialog = None

    def _add_launcher(self, s: Screen) -> None:
        if self.drawer_open:
            names = sorted(self.apps)[self.drawer_scroll : self.drawer_scroll + 16]
            s.add(UIElement(LIST, resource_id="com.android.launcher3:id/apps_list_view", bounds=(0, 240, WIDTH, HEIGHT), scrollable=True))  # fmt: skip
            top = 300
        else:
            names = self.home_icons
            search = Widget(TEXT, desc="Search", on_tap=lambda: None)
            s.add(UIElement(TEXT, content_desc="Search", resource_id="com.google.android.googlequicksearchbox:id/search_widget", bounds=(60, 200, 1020, 340), clickable=True), search)  # fmt: skip
            top = HOME_GRID_TOP
        for i, name in enumerate(names):
            col, row_i = i % 4, i // 4
            box = (col * ICON_SIZE, top + row_i * 300, (col + 1) * ICON_SIZE, top + row_i * 300 + 300)
            widget = Widget(TEXT, desc=name, on_tap=lambda n=name: self.open_app(n))
            s.add(UIElement(TEXT, content_desc=name, resource_id="com.android.launcher3:id/icon", bounds=box, clickable=True), widget)  # fmt: skip

    def _visible_rows(self, view: PageView, page: Page) -> int:
        top = STATUS_BAR + TITLE_BAR + sum(w.height for w in view.header)
        bottom = (KEYBOARD_TOP if page.focused else HEIGHT) - (FOOTER_HEIGHT if view.footer else 0)
        rows, y = 0, top
        for w in view.items[page.scroll :]:
            if y + w.height > bottom:
                break
            y += w.height
            rows += 1
        return max(rows, 1)

    def _add_page(self, s: Screen) -> None:
        page = self.page()
        view = self.apps[self.app].view(self, page)
        page.scroll = min(page.scroll, max(0, len(view.items) - 1))
        y = STATUS_BAR
        s.add(
            UIElement(
                TEXT, text=view.title, resource_id="android:id/title", bounds=(160, y, WIDTH, y + TITLE_BAR)
            )
        )
        if len(self.stacks[self.app]) > 1:
            up = Widget(IMAGE, desc="Navigate up", on_tap=self.pop)
            s.add(
                UIElement(
                    IMAGE, content_desc="Navigate up", bounds=(0, y, 160, y + TITLE_BAR), clickable=True
                ),
                up,
            )
        y += TITLE_BAR
        for w in view.header:
            s.add(self._element(w, (40, y, WIDTH - 40, y + w.height), page), w)
            y += w.height
        bottom = (KEYBOARD_TOP if page.focused else HEIGHT) - (FOOTER_HEIGHT if view.footer else 0)
        visible = self._visible_rows(view, page)
        if view.items:
            overflow = len(view.items) > visible or page.scroll > 0
            s.add(
                UIElement(
                    LIST, resource_id="android:id/list", bounds=(0, y, WIDTH, bottom), scrollable=overflow
                )
            )
        for w in view.items[page.scroll : page.scroll + visible]:
            s.add(self._element(w, (0, y, WIDTH, y + w.height), page), w)
            y += w.height
        if view.footer:
            total = sum(w.width_share for w in view.footer)
            x = 0.0
            for w in view.footer:
                width = WIDTH * w.width_share / total
                box = (int(x), bottom, int(x + width), bottom + FOOTER_HEIGHT)
                s.add(self._element(w, box, page), w)
                x += width
        if page.focused:
            s.keyboard = True
            s.add(UIElement(FRAME, content_desc="Keyboard", resource_id="com.google.android.inputmethod.latin:id/keyboard_holder", bounds=(0, KEYBOARD_TOP, WIDTH, HEIGHT)))  # fmt: skip

    @staticmethod
    def _element(w: Widget, box: tuple[int, int, int, int], page: Page) -> UIElement:
        return UIElement(
            w.cls,
            text=w.text,
            content_desc=w.desc,
            hint=w.hint,
            resource_id=w.rid,
            bounds=box,
            clickable=w.clickable,
            checked=w.checked,
            focused=w.field is not None and w.field == page.focused,
        )
