"""A scripted oracle for the stand-in phone: the next correct action for the current task and screen.

`oracle_action(env, obs)` reads only public things: `env.task` (family, target word/app/switch, wanted
switch state) and the observation the env last returned (the UI elements on screen). The screen is
recognized from the elements the way a person would read it:

    home screen     app icons (clickable, with a content description naming an app)
    an app          a title element (resource id `android:id/title`) whose text is the app's name
    Settings        switches (`android.widget.Switch`) whose text is the setting and `checked` its state
    Notes, Browser  one `EditText` whose `focused` flag tells whether typing reaches it

The plans, from a freshly reset env (so every task takes 1 to 4 steps):

    open_app    [home if elsewhere] -> tap the app icon                              1 or 2 steps
    toggle      tap Settings -> tap the switch                                       2 steps
    write_note  tap Notes -> tap the text field -> type the word                     3 steps
    search      tap Browser -> tap the search box -> type the word -> press enter    4 steps

Any screen that is not on the plan's path (another app) is left with `press_home`. The oracle cannot
clear text that something else typed into a field, so it is meant to drive an episode from its reset
(as tests and demonstrations do), not to recover after arbitrary actions.

When `obs` is omitted the current screen is rendered from the env (`env._observe()`, which only reads
state); pass the observation from `reset`/`step` to stay on the public interface.
"""

from __future__ import annotations

from actors.envs.standin import StandInPhoneEnv
from common.types import Action, ActionType, Observation, UIElement

_TITLE_ID = "android:id/title"
_APP_OF_FAMILY = {"toggle": "Settings", "write_note": "Notes", "search": "Browser"}


def current_screen(obs: Observation) -> str:
    """The screen shown: the app named by the title element, or "home" (app icons, no title)."""
    for el in obs.elements:
        if el.resource_id == _TITLE_ID:
            return el.text
    return "home"


def _icon(obs: Observation, app: str) -> UIElement:
    for el in obs.elements:
        if el.clickable and el.content_desc == app:
            return el
    raise LookupError(f"no icon for {app!r} on this screen")


def _tap(el: UIElement, obs: Observation) -> Action:
    return Action.tap_element(el, obs.screen_size)


def _open(app: str, obs: Observation) -> Action:
    """Go to `app`: tap its icon on the home screen, or go home first."""
    if current_screen(obs) == "home":
        return _tap(_icon(obs, app), obs)
    return Action(ActionType.PRESS_HOME)


def oracle_action(env: StandInPhoneEnv, obs: Observation | None = None) -> Action:
    """The next action of the shortest plan for `env.task` from the screen in `obs`."""
    if obs is None:
        obs = env._observe()
    task = env.task
    screen = current_screen(obs)
    family = str(task.family)
    if family == "open_app":
        return _open(str(task.target), obs)
    app = _APP_OF_FAMILY[family]
    if screen != app:
        return _open(app, obs)
    if family == "toggle":
        for el in obs.elements:
            if el.cls == "android.widget.Switch" and el.text == task.target:
                if el.checked == task.want_on:  # already right: the episode would have ended
                    return Action(ActionType.STATUS_COMPLETE)
                return _tap(el, obs)
        raise LookupError(f"no switch {task.target!r} in Settings")
    field = next(el for el in obs.elements if "EditText" in el.cls)
    if not field.focused:
        return _tap(field, obs)
    if family == "search" and field.text == task.target:
        return Action(ActionType.PRESS_ENTER)
    return Action(ActionType.TYPE, text=str(task.target))
