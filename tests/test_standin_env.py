"""The stand-in phone: its tasks are solvable (by the scripted oracle), its screens are well formed, and its
mechanics (home, typing, status_complete, the step limit) behave as documented."""

from __future__ import annotations

import numpy as np
import pytest

from actors.envs.standin import APPS, SCREEN, SWITCHES, TASK_FAMILIES, WORDS, StandInPhoneEnv
from actors.envs.standin_oracle import current_screen, oracle_action
from common.config import ModelConfig
from common.policies import PointerPolicy
from common.policies.pointer import featurize
from common.types import Action, ActionType, Observation, PolicyChoice, SwipeDirection

SEEDS = range(60)
PLAN_LENGTH = {"toggle": 2, "write_note": 3, "search": 4}  # open_app: 1 from home, else 2


def run_oracle(env: StandInPhoneEnv, obs: Observation, use_obs: bool = True):
    """Drive one episode with the oracle; returns the per-step (reward, terminated, truncated, info)."""
    out = []
    while True:
        action = oracle_action(env, obs if use_obs else None)
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((reward, terminated, truncated, info))
        if terminated or truncated:
            return out


def home_icons(obs: Observation):
    return [el for el in obs.elements if el.content_desc in APPS]


def tap(obs: Observation, label: str) -> Action:
    (el,) = [e for e in obs.elements if e.label == label]
    return Action.tap_element(el, obs.screen_size)


# ---- the oracle solves everything ---------------------------------------------------------------------
@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_oracle_solves_every_family(family):
    env = StandInPhoneEnv(max_steps=6, families=(family,))
    for seed in SEEDS:
        obs, info = env.reset(seed=seed)
        assert info["task"] == family == env.task.family
        start_home = current_screen(obs) == "home"
        steps = run_oracle(env, obs)
        want = PLAN_LENGTH.get(family, 1 if start_home else 2)
        assert len(steps) == want, (seed, env.task)
        *before, (reward, terminated, truncated, info) = steps
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True), seed
        assert info["steps"] == want
        assert all(r == 0.0 and not te and not tr and not i["success"] for r, te, tr, i in before), seed


def test_oracle_covers_all_targets_and_both_open_app_starts():
    env = StandInPhoneEnv()
    tasks, starts = set(), set()
    for seed in range(400):
        obs, _ = env.reset(seed=seed)
        tasks.add((env.task.family, env.task.target, env.task.want_on))
        if env.task.family == "open_app":
            starts.add(current_screen(obs) == "home")
        steps = run_oracle(env, obs)
        assert 1 <= len(steps) <= 4 and steps[-1][0] == 1.0 and steps[-1][1], seed
    assert {t for f, t, _ in tasks if f == "open_app"} == set(APPS)
    assert {(t, on) for f, t, on in tasks if f == "toggle"} == {
        (s, on) for s in SWITCHES for on in (True, False)
    }
    assert {t for f, t, _ in tasks if f == "write_note"} == set(WORDS)
    assert {t for f, t, _ in tasks if f == "search"} == set(WORDS)
    assert starts == {True, False}


def test_oracle_without_the_observation_reads_the_env():
    a, b = StandInPhoneEnv(), StandInPhoneEnv()
    for seed in range(40):
        obs_a, _ = a.reset(seed=seed)
        b.reset(seed=seed)
        while True:
            act = oracle_action(a, obs_a)
            assert act == oracle_action(b)
            obs_a, _, term, trunc, _ = a.step(act)
            b.step(act)
            if term or trunc:
                break


def test_oracle_taps_through_the_policy_action_mapping():
    """The oracle's tap targets, expressed as the policy's element index, solve the task via the pointer policy's to_action."""
    cfg = ModelConfig(max_elements=24)
    env = StandInPhoneEnv()
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        while True:
            action = oracle_action(env, obs)
            if action.type == ActionType.TAP:
                centers = [Action.tap_element(el, obs.screen_size) for el in obs.elements]
                choice = PolicyChoice(int(ActionType.TAP), element=centers.index(action))
            elif action.type == ActionType.TYPE:
                words = featurize.instruction_words(obs.instruction, cfg)
                choice = PolicyChoice(int(ActionType.TYPE), word=words.index(action.text))
            else:
                choice = PolicyChoice(int(action.type))
            obs, reward, term, trunc, _ = env.step(PointerPolicy(cfg).to_action(obs, choice.as_dict()))
            if term or trunc:
                assert reward == 1.0 and term, seed
                break


# ---- observations -------------------------------------------------------------------------------------
def all_screens(seed: int) -> list[Observation]:
    """The home screen and every app screen (Notes and Browser also after typing and a search).

    A toggle task starts at home, and only tapping its switch could end it: nothing here does.
    """
    env = StandInPhoneEnv(max_steps=100, families=("toggle",))
    home, _ = env.reset(seed=seed)
    out = [home]
    for app in APPS:
        obs, *_ = env.step(tap(home, app))
        out.append(obs)
        if app in ("Notes", "Browser"):
            field = next(e for e in obs.elements if "EditText" in e.cls)
            env.step(Action.tap_element(field, SCREEN))
            env.step(Action(ActionType.TYPE, text="pizza"))
            obs, *_ = env.step(Action(ActionType.PRESS_ENTER))
            out.append(obs)
        home, _, terminated, truncated, _ = env.step(Action(ActionType.PRESS_HOME))
        assert not terminated and not truncated
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_observation_structure(seed):
    screens = all_screens(seed)
    home = screens[0]
    for obs in screens:
        assert obs.screen_size == SCREEN == (1080, 2400)
        assert obs.instruction
        bar = obs.elements[0]  # the status bar clock comes first on every screen
        assert bar.text == "12:00" and bar.resource_id == "com.android.systemui:id/clock"
        assert bar.bounds == (0, 0, 1080, 80) and not bar.clickable
        for el in obs.elements:
            left, top, right, bottom = el.bounds
            assert 0 <= left < right <= SCREEN[0] and 0 <= top < bottom <= SCREEN[1], el
            assert el.label, el
    icons = home_icons(home)
    assert sorted(el.content_desc for el in icons) == sorted(APPS)
    assert all(el.clickable and not el.text for el in icons)
    boxes = [el.bounds for el in icons]
    assert len(set(boxes)) == len(APPS)  # icons do not overlap
    for box_a in boxes:
        for box_b in boxes:
            if box_a != box_b:
                assert (
                    box_a[2] <= box_b[0]
                    or box_b[2] <= box_a[0]
                    or box_a[3] <= box_b[1]
                    or box_b[3] <= box_a[1]
                )
    titles = [current_screen(o) for o in screens]
    assert titles[0] == "home" and set(titles[1:]) == set(APPS)
    settings = next(o for o in screens if current_screen(o) == "Settings")
    switches = [el for el in settings.elements if el.cls == "android.widget.Switch"]
    assert sorted(el.text for el in switches) == sorted(SWITCHES) and all(el.clickable for el in switches)
    browser = [o for o in screens if current_screen(o) == "Browser"][-1]
    assert any(el.text == "Results for pizza" for el in browser.elements)
    notes = [o for o in screens if current_screen(o) == "Notes"][-1]
    field = next(el for el in notes.elements if "EditText" in el.cls)
    assert field.focused and field.text == "pizza"


def test_icon_order_differs_across_seeds_and_repeats_per_seed():
    env = StandInPhoneEnv(families=("toggle",))  # toggle episodes start on the home screen
    orders = []
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        orders.append(tuple(el.content_desc for el in home_icons(obs)))
        again, _ = env.reset(seed=seed)
        assert again == obs
    assert len(set(orders)) >= 15


def test_icon_positions_follow_the_order():
    env = StandInPhoneEnv(families=("toggle",))
    obs, _ = env.reset(seed=5)
    for i, el in enumerate(home_icons(obs)):
        col, row = i % 4, i // 4
        assert el.bounds == (col * 270, 1600 + row * 300, col * 270 + 270, 1900 + row * 300)


# ---- mechanics ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", [ActionType.PRESS_HOME, ActionType.PRESS_BACK])
def test_home_and_back_return_home(key):
    env = StandInPhoneEnv(max_steps=100, families=("write_note",))
    obs, _ = env.reset(seed=3)
    for app in ("Clock", "Settings", "Browser", "Maps"):
        obs, *_ = env.step(tap(obs, app))
        assert current_screen(obs) == app
        obs, reward, term, trunc, _ = env.step(Action(key))
        assert current_screen(obs) == "home" and reward == 0.0 and not term and not trunc
        assert len(home_icons(obs)) == len(APPS)
    obs2, *_ = env.step(Action(key))  # at home already: nothing changes
    assert obs2 == obs


def test_typing_without_a_focused_field_changes_nothing():
    env = StandInPhoneEnv(max_steps=100, families=("write_note",))
    obs, _ = env.reset(seed=4)
    word = env.task.target
    same, reward, term, _, _ = env.step(Action(ActionType.TYPE, text=word))  # at home
    assert same == obs and reward == 0.0 and not term
    notes, *_ = env.step(tap(obs, "Notes"))
    after, reward, term, _, info = env.step(Action(ActionType.TYPE, text=word))  # field not focused
    assert after == notes and reward == 0.0 and not term and not info["success"]
    field = next(el for el in notes.elements if "EditText" in el.cls)
    focused, *_ = env.step(Action.tap_element(field, SCREEN))
    assert next(el for el in focused.elements if "EditText" in el.cls).focused
    _, reward, term, _, info = env.step(Action(ActionType.TYPE, text=word))  # now it lands
    assert reward == 1.0 and term and info["success"]


def test_home_drops_focus():
    env = StandInPhoneEnv(max_steps=100, families=("search",))
    obs, _ = env.reset(seed=6)
    obs, *_ = env.step(tap(obs, "Browser"))
    field = next(el for el in obs.elements if "EditText" in el.cls)
    env.step(Action.tap_element(field, SCREEN))
    obs, *_ = env.step(Action(ActionType.PRESS_HOME))
    obs, *_ = env.step(tap(obs, "Browser"))
    field = next(el for el in obs.elements if "EditText" in el.cls)
    assert not field.focused
    after, *_ = env.step(Action(ActionType.TYPE, text="jazz"))
    assert after == obs


def test_toggle_flips_the_switch_each_tap():
    env = StandInPhoneEnv(max_steps=100, families=("toggle",))
    obs, _ = env.reset(seed=7)
    obs, *_ = env.step(tap(obs, "Settings"))
    other = next(s for s in SWITCHES if s != env.task.target)
    state = next(el.checked for el in obs.elements if el.text == other)
    for _ in range(3):
        obs, reward, term, *_ = env.step(tap(obs, other))
        now = next(el.checked for el in obs.elements if el.text == other)
        assert now == (not state) and reward == 0.0 and not term
        state = now
    target = next(el for el in obs.elements if el.text == env.task.target)
    assert target.checked == (not env.task.want_on)
    obs, reward, term, *_ = env.step(tap(obs, env.task.target))
    assert reward == 1.0 and term
    assert next(el.checked for el in obs.elements if el.text == env.task.target) == env.task.want_on


def test_tapping_empty_space_or_text_does_nothing():
    env = StandInPhoneEnv(max_steps=100, families=("toggle",))
    obs, _ = env.reset(seed=8)
    for x, y in [(0.5, 0.02), (0.5, 0.3), (0.999, 0.999), (0.0, 0.0)]:
        after, reward, *_ = env.step(Action.tap(x, y))
        assert after == obs and reward == 0.0


def test_status_complete_ends_without_reward():
    env = StandInPhoneEnv()
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        # even one step short of success
        for _ in range(PLAN_LENGTH.get(env.task.family, 2) - 1):
            obs, *_ = env.step(oracle_action(env, obs))
        _, reward, terminated, truncated, info = env.step(Action(ActionType.STATUS_COMPLETE))
        assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)


@pytest.mark.parametrize("max_steps", [1, 3])
def test_step_limit_truncates(max_steps):
    env = StandInPhoneEnv(max_steps=max_steps)
    for seed in range(10):
        env.reset(seed=seed)
        for step in range(1, max_steps + 1):
            _, reward, terminated, truncated, info = env.step(
                Action(ActionType.SWIPE, direction=SwipeDirection.UP)
            )
            assert reward == 0.0 and not terminated and not info["success"]
            assert truncated == (step == max_steps) and info["steps"] == step


def test_success_on_the_last_allowed_step_is_termination_not_truncation():
    env = StandInPhoneEnv(max_steps=2, families=("toggle",))
    obs, _ = env.reset(seed=9)
    steps = run_oracle(env, obs)
    assert len(steps) == 2 and steps[-1][:3] == (1.0, True, False)


def test_reset_is_seeded():
    env = StandInPhoneEnv()
    first = [env.reset(seed=s)[0] for s in range(10)]
    again = [env.reset(seed=s)[0] for s in range(10)]
    assert first == again
    assert len({(o.instruction, tuple(o.elements)) for o in first}) > 5


def test_unknown_family_is_refused():
    with pytest.raises(ValueError):
        StandInPhoneEnv(families=("open_app", "fly"))


# ---- random play ----------------------------------------------------------------------------------------
def random_action(rng: np.random.Generator, obs: Observation) -> Action:
    kind = ActionType(int(rng.integers(len(ActionType))))
    if kind == ActionType.TAP:
        return Action.tap_element(obs.elements[rng.integers(len(obs.elements))], obs.screen_size)
    if kind == ActionType.TYPE:
        words = featurize.instruction_words(obs.instruction, ModelConfig())
        return Action(kind, text=words[rng.integers(len(words))])
    if kind == ActionType.SWIPE:
        return Action(kind, direction=SwipeDirection(int(rng.integers(4))))
    return Action(kind)


def test_random_play_rarely_succeeds_while_the_oracle_always_does():
    env = StandInPhoneEnv(max_steps=6)
    rng = np.random.default_rng(0)
    episodes, random_wins, oracle_wins = 400, 0, 0
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        while True:
            obs, reward, terminated, truncated, info = env.step(random_action(rng, obs))
            if terminated or truncated:
                random_wins += info["success"]
                assert reward == float(info["success"])
                break
        obs, _ = env.reset(seed=seed)
        oracle_wins += run_oracle(env, obs)[-1][3]["success"]
    assert oracle_wins == episodes
    assert random_wins / episodes < 0.10
    assert random_wins > 0  # not impossible either: the tasks are reachable by chance
