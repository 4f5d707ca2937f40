"""A scripted solver for SimPhone tasks: it follows the template's plan (`solution`) step by step,
reading only the observation, so it also shows that a task is solvable from what the policy sees.

Each plan step is turned into primitive actions from the current screen: a dialog is dismissed first;
`open` goes home, then taps the icon or swipes up into the app drawer and scrolls until it is found;
`tap` scrolls the list until an element with that label is visible; `type` focuses the field, then
types the phrase one word at a time (as the policy does), reading the field to see how far it got.
When the plan is done, the oracle answers `status_complete`.

It recovers from actions it did not choose (the random ones of noisy demonstrations): a phrase typed
wrong is selected again (tapping a field selects its text) and retyped, and a plan that finds itself
on the home screen, or on a screen without its target and nothing to scroll, goes up a page when the
app offers one (an app reopened where it was left, below the page the step needs) and otherwise back to
its last `open` step, and carries on from there; when a reopened app shows a later step's target, it
skips ahead.
`undo` takes back a decision that was replaced by another action.
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
        self._selected = False  # the oracle just tapped the field of its `type` step: its text is selected
        self._typing = False  # the oracle has typed words of its `type` step
        self._before: dict = {}
        self.phrase = ""
        """The rest of the phrase of the current `type` step (set with each word typed): a policy that
        types a whole phrase at once (the `lm` family's demonstrations) types this instead of the word."""

    def act(self, obs: Observation) -> Action:
        """The next action; the oracle assumes it is taken (see `undo`)."""
        self._before = {k: v for k, v in vars(self).items() if k != "_before"}
        return self._act(obs)

    def undo(self) -> None:
        """Forget the last `act`: another action was taken instead (the progress it counted did not happen)."""
        vars(self).update(self._before)

    def _act(self, obs: Observation) -> Action:
        els = obs.elements
        dialog = _find(els, "Don't allow")
        if dialog is not None and any(e.resource_id == "android:id/alertTitle" for e in els):
            return _tap(dialog)
        done = self.index >= len(self.plan)
        step = self.plan[-1 if done else self.index]
        left_app = not ({"open", "back", "home"} & step.keys()) or (done and "open" in step)
        if left_app and _on_launcher(els) and self._rewind():  # e.g. home pressed mid-task: reopen the app
            return self._act(obs)
        if done:
            return Action(ActionType.STATUS_COMPLETE)
        kind = next(iter(step.keys() & {"open", "tap", "tap_nth", "type", "enter", "back", "home", "swipe"}))
        if kind == "open":
            return self._open(els, step["open"])
        if kind == "tap":
            return self._tap_label(obs, step["tap"])
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
                return self._lost(obs)
            return self._type(obs, field, str(step["type"]).split())
        self._advance()
        if kind == "swipe":
            return Action(ActionType.SWIPE, direction=SwipeDirection[step["swipe"].upper()])
        return Action(
            {"enter": ActionType.PRESS_ENTER, "back": ActionType.PRESS_BACK, "home": ActionType.PRESS_HOME}[
                kind
            ]
        )

    def _advance(self) -> None:
        self._goto(self.index + 1)

    def _goto(self, index: int) -> None:
        """Make plan step `index` the current one, with fresh scroll and typing state."""
        self.index = index
        self._scrolls = 0
        self._scroll_dir = SwipeDirection.UP
        self._selected = self._typing = False

    def _type(self, obs: Observation, field: UIElement, words: list[str]) -> Action:
        """The next word of the phrase, judged from the field's text; reselect the field if it went wrong."""
        if not field.focused:
            self._selected, self._typing = True, False
            return _tap(field)
        shown = field.text.split()
        if self._selected or not self._typing:  # selected text or an empty field's hint: the word replaces it
            done = 0
        elif shown == words:
            self._advance()
            return self._act(obs)
        elif shown == words[: len(shown)]:
            done = len(shown)
        else:  # something else got typed: select the text and start over
            self._selected, self._typing = True, False
            return _tap(field)
        self._selected, self._typing = False, True
        self.phrase = " ".join(words[done:])
        return Action(ActionType.TYPE, text=words[done])

    def _rewind(self) -> bool:
        """Go back to the last `open` step before the current one (the app was left); False if none."""
        opens = [i for i in range(self.index) if "open" in self.plan[i]]
        if not opens:
            return False
        self._goto(opens[-1])
        return True

    def _lost(self, obs: Observation) -> Action:
        """The current step's target is not on screen. A later step's target is (the app reopened where it
        was, past this step): skip to it. Otherwise scroll for it, or reopen the app if nothing scrolls."""
        els = obs.elements
        for j in range(self.index + 1, len(self.plan)):
            later = self.plan[j]
            if "open" in later:
                break
            if ("tap" in later and _find(els, later["tap"])) or (
                "type" in later and _field(els, later["field"])
            ):
                self._goto(j)
                return self._act(obs)
        if not any(e.scrollable for e in els):
            up = next((e for e in els if e.clickable and e.content_desc == "Navigate up"), None)
            if up is not None:  # a page below the step's (an app reopened where it was left): go up
                return _tap(up)
            if self._rewind():
                return self._open(els, self.plan[self.index]["open"])
        return self._scroll(els)

    def _open(self, els, app: str) -> Action:
        on_launcher = _on_launcher(els)
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

    def _tap_label(self, obs: Observation, label: str) -> Action:
        els = obs.elements
        target = _find(els, label)
        if target is not None:
            self._advance()
            return _tap(target)
        return self._lost(obs)

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


def _on_launcher(els) -> bool:
    return any(e.resource_id == "com.android.launcher3:id/icon" for e in els)


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
