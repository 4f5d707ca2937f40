"""A scripted solver for SimPhone tasks: it follows the template's plan (`solution`) step by step,
reading only the observation, so it also shows that a task is solvable from what the policy sees.

Each plan step is turned into primitive actions from the current screen: a dialog is dismissed first;
`open` goes home, then taps the icon or swipes up into the app drawer and scrolls until it is found;
`tap` scrolls the list until an element with that label is visible; `type` focuses the field, then
types. When the plan is done, the oracle answers `status_complete`.
"""

from __future__ import annotations

from common.types import Action, ActionType, Observation, SwipeDirection, UIElement

WIDTH, HEIGHT = 1080, 2400


class Oracle:
    def __init__(self, plan: list[dict]):
        self.plan = list(plan)
        self.index = 0
        self._scrolls = 0
        self._scroll_dir = SwipeDirection.UP
        self._last_labels: list[str] = []

    def act(self, obs: Observation) -> Action:
        els = obs.elements
        dialog = _find(els, "Don't allow")
        if dialog is not None and any(e.resource_id == "android:id/alertTitle" for e in els):
            return _tap(dialog)
        if self.index >= len(self.plan):
            return Action(ActionType.STATUS_COMPLETE)
        step = self.plan[self.index]
        kind = next(iter(step.keys() & {"open", "tap", "tap_nth", "type", "enter", "back", "home", "swipe"}))
        if kind == "open":
            return self._open(els, step["open"])
        if kind == "tap":
            return self._tap_label(els, step["tap"])
        if kind == "tap_nth":
            items = [e for e in els if e.clickable and _inside_list(e, els)]
            self._advance()
            return (
                _tap(items[step["tap_nth"]])
                if len(items) > step["tap_nth"]
                else Action(ActionType.PRESS_BACK)
            )
        if kind == "type":
            field = _field(els, step["field"])
            if field is None:
                return self._scroll(els)
            if not field.focused:
                return _tap(field)
            self._advance()
            return Action(ActionType.TYPE, text=str(step["type"]))
        self._advance()
        if kind == "swipe":
            return Action(ActionType.SWIPE, direction=SwipeDirection[step["swipe"].upper()])
        return Action(
            {"enter": ActionType.PRESS_ENTER, "back": ActionType.PRESS_BACK, "home": ActionType.PRESS_HOME}[
                kind
            ]
        )

    def _advance(self) -> None:
        self.index += 1
        self._scrolls = 0
        self._scroll_dir = SwipeDirection.UP

    def _open(self, els, app: str) -> Action:
        on_launcher = any(e.resource_id == "com.android.launcher3:id/icon" for e in els)
        if not on_launcher:
            return Action(ActionType.PRESS_HOME)
        icon = next(
            (e for e in els if e.content_desc == app and e.resource_id == "com.android.launcher3:id/icon"),
            None,
        )
        if icon is not None:
            self._advance()
            return _tap(icon)
        return Action(ActionType.SWIPE, direction=SwipeDirection.UP)  # opens the drawer, then scrolls it

    def _tap_label(self, els, label: str) -> Action:
        target = _find(els, label)
        if target is not None:
            self._advance()
            return _tap(target)
        return self._scroll(els)

    def _scroll(self, els) -> Action:
        """Scroll up (towards later items) until the screen stops changing, then back down; give up after a while."""
        labels = [e.text or e.content_desc for e in els]
        if self._scrolls and labels == self._last_labels:
            self._scroll_dir = (
                SwipeDirection.DOWN if self._scroll_dir == SwipeDirection.UP else SwipeDirection.UP
            )
        self._last_labels = labels
        self._scrolls += 1
        if self._scrolls > 16:
            self._advance()
            return Action(ActionType.PRESS_BACK)
        return Action(ActionType.SWIPE, direction=self._scroll_dir)


def _find(els, label: str) -> UIElement | None:
    exact = [e for e in els if e.clickable and (e.text == label or e.content_desc == label)]
    if exact:
        return exact[0]
    prefix = [e for e in els if e.clickable and e.text.startswith(label)]
    return prefix[0] if prefix else None


def _field(els, name: str) -> UIElement | None:
    for e in els:
        if "EditText" in e.cls and (
            e.resource_id in (name, f"field_{name}") or e.resource_id.endswith(f":id/{name}")
        ):
            return e
    return None


def _inside_list(e: UIElement, els) -> bool:
    lists = [x for x in els if x.resource_id == "android:id/list"]
    return any(
        e.bounds[1] >= lst.bounds[1] and e.bounds[3] <= lst.bounds[3] and e is not lst for lst in lists
    )


def _tap(e: UIElement) -> Action:
    x, y = e.center
    return Action.tap(x / WIDTH, y / HEIGHT)
