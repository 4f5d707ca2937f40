"""Composed training tasks (actors/envs/simphone/compose.py): which pairs compose, what a composition asks
for, that the oracle can solve nearly all of them, and that only training templates ever compose."""

from __future__ import annotations

import itertools

import pytest

from actors.config import ActorConfig
from actors.envs.simphone import compose
from actors.envs.simphone import tasks as task_lib
from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle

TEMPLATES = task_lib.load_templates("general")
BY_ID = {t.id: t for t in TEMPLATES}


def task(template_id: str, which: int = 0) -> task_lib.Task:
    template = BY_ID[template_id]
    return task_lib.bind(template, {n: v["train"][which] for n, v in template.params.items()})


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("settings.wifi_on", "settings.bluetooth_on", True),  # two keys of one app
        ("settings.wifi_on", "clock.set_alarm", True),  # two apps
        ("settings.wifi_on", "settings.wifi_off", False),  # the same key
        ("clock.set_alarm", "clock.disable_alarm", False),  # both read clock.alarms
        ("app.open", "settings.wifi_on", False),  # a final-screen condition
        ("settings.wifi_on", "settings.wifi_on", False),  # a template with itself
        ("settings.wifi_on", "settings.wifi_off_airplane_on", False),  # shares settings.wifi
    ],
)
def test_independence_is_about_the_state_keys_each_predicate_reads(a, b, expected):
    assert compose.independent(task(a), task(b)) == expected


def test_a_composition_asks_for_both_in_order_and_sums_what_they_take():
    a, b = task("settings.wifi_on"), task("clock.set_alarm")
    both = compose.compose(a, b, "{a}, then {b}")
    assert both.instruction == f"Turn on Wi-Fi, then set an alarm for {b.plan[2]['type']}"
    assert compose.compose(a, b, "First {a}, then {b}").instruction.startswith(
        "First turn on Wi-Fi, then set"
    )
    assert both.plan == [*a.plan, *b.plan] and both.setup == [*a.setup, *b.setup]
    assert both.max_steps == a.max_steps + b.max_steps
    assert both.template.id == "settings.wifi_on+clock.set_alarm"
    time = next(iter(v["train"][0] for v in BY_ID["clock.set_alarm"].params.values()))["time"]
    alarm = {"time": time, "enabled": True, "label": ""}
    states = {
        (False, False): {"settings": {"wifi": False}, "clock": {"alarms": []}},
        (True, False): {"settings": {"wifi": True}, "clock": {"alarms": []}},
        (False, True): {"settings": {"wifi": False}, "clock": {"alarms": [alarm]}},
        (True, True): {"settings": {"wifi": True}, "clock": {"alarms": [alarm]}},
    }
    for (wifi, alarm_set), state in states.items():
        assert a.predicate.evaluate(state) == wifi and b.predicate.evaluate(state) == alarm_set
        assert both.predicate.evaluate(state) == (wifi and alarm_set), state


def test_the_oracle_solves_nearly_every_composition_of_training_templates():
    """Every ordered pair of independent training templates (one value each), solved by the oracle from
    the observation alone. The two known exceptions: an incognito tab and then a new (normal) tab leave the
    current tab normal, so `browser.incognito` no longer holds (coupled state that the keys do not show)."""
    env = SimPhoneEnv(SimPhoneConfig(success_on="complete", dialog_probability=0.3))
    training = [t for t in TEMPLATES if task_lib.available(t, "train")]
    failed, pairs = [], 0
    for ta, tb in itertools.permutations(training, 2):
        a, b = task(ta.id, 0), task(tb.id, -1)
        if not compose.independent(a, b):
            continue
        pairs += 1
        both = compose.compose(a, b, compose.CONNECTIVES[pairs % len(compose.CONNECTIVES)])
        obs, _ = env.reset(seed=pairs, options={"task": both})
        oracle = Oracle(both.plan)
        while True:
            obs, _, terminated, truncated, info = env.step(oracle.act(obs))
            if terminated or truncated:
                break
        if not info["success"]:
            failed.append(both.template.id)
    assert pairs > 900
    assert set(failed) <= {"browser.incognito+browser.new_tab", "browser.incognito_site+browser.new_tab"}, (
        failed
    )


def test_only_training_templates_compose_and_only_when_asked():
    env = SimPhoneEnv(SimPhoneConfig(split="dev", compose_rate=1.0))
    dev = {t.id for t in TEMPLATES if task_lib.available(t, "dev")}
    composed = 0
    for seed in range(60):
        _, info = env.reset(seed=seed)
        parts = info["task"].split("+")
        assert set(parts) <= dev, info["task"]  # never validation or test templates
        if len(parts) == 1:  # only a task that composes with nothing (its predicate reads the screen)
            assert not any(compose.independent(env.task, task(other)) for other in dev), info["task"]
        composed += len(parts) == 2
    assert composed >= 40
    plain = SimPhoneEnv(SimPhoneConfig(split="train"))
    assert all("+" not in plain.reset(seed=seed)[1]["task"] for seed in range(60))


@pytest.mark.parametrize("split", ["test", "validation"])
def test_compositions_are_refused_outside_the_training_splits(split):
    with pytest.raises(ValueError, match="only the train and dev splits compose"):
        SimPhoneEnv(SimPhoneConfig(split=split, compose_rate=0.5))
    with pytest.raises(ValueError, match="--compose-rate composes SimPhone training tasks"):
        ActorConfig(split=split, compose_rate=0.5)
    with pytest.raises(ValueError, match=r"--compose-rate must be in \[0, 1\]"):
        ActorConfig(compose_rate=1.5)
