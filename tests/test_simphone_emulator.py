"""The emulator model: its latencies and fault rates match the config, `EmulatedPhone` waits exactly the
sampled delays (on a fake clock), raises each fault without touching the wrapped phone, keeps a crashed
device down until reset, and is a pass-through when disabled.

Statistical checks use 10^5 seeded draws and 5-sigma bounds, so they are deterministic and would fail by
chance for a correct model with probability below 10^-6 per check, were the seed changed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from actors.envs.simphone.emulator import (
    DeviceCrash,
    DeviceDisconnected,
    DeviceFault,
    DeviceHang,
    EmulatedPhone,
    EmulatorModel,
    StepOutcome,
    maybe_wrap,
)
from actors.envs.standin import StandInPhoneEnv
from actors.envs.standin_oracle import oracle_action
from common.config import EmulatorModelConfig
from common.types import Action, ActionType, SwipeDirection

N = 100_000
NO_FAULTS = {"hang_prob": 0.0, "crash_prob": 0.0, "disconnect_prob": 0.0}


def cfg(**kw) -> EmulatorModelConfig:
    return EmulatorModelConfig(**{"enabled": True, **kw})


class FakeClock:
    """Records every sleep instead of sleeping."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        assert seconds > 0
        self.calls.append(seconds)

    @property
    def now(self) -> float:
        return sum(self.calls)


class Scripted(EmulatorModel):
    """An EmulatorModel whose step outcomes are given in advance (reset delays are still sampled)."""

    def __init__(self, config: EmulatorModelConfig, outcomes: list[StepOutcome]):
        super().__init__(config)
        self.outcomes = list(outcomes)

    def step_outcome(self, rng):
        return self.outcomes.pop(0)


def strip_emulator(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "emulator"}


# ---- sampling ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("mean", "sigma"), [(1.0, 0.6), (0.25, 1.2), (3.0, 0.1)])
def test_step_latency_is_lognormal_with_configured_mean_and_spread(mean, sigma):
    model = EmulatorModel(
        cfg(step_latency_mean=mean, step_latency_sigma=sigma, stall_prob=0.0, step_timeout=1e9, **NO_FAULTS)
    )
    rng = np.random.default_rng(0)
    outs = [model.step_outcome(rng) for _ in range(N)]
    assert all(o.fault is None and o.stall_s == 0.0 for o in outs)
    delays = np.array([o.delay_s for o in outs])
    logs = np.log(delays)
    # mean of logs: mu = ln(mean) - sigma^2 / 2, standard error sigma / sqrt(N)
    mu = math.log(mean) - sigma**2 / 2
    assert abs(logs.mean() - mu) < 5 * sigma / math.sqrt(N)
    # spread of logs: standard error of the sample std of a normal is about sigma / sqrt(2N)
    assert abs(logs.std(ddof=1) - sigma) < 5 * sigma / math.sqrt(2 * N)
    # mean of delays: standard error mean * sqrt(exp(sigma^2) - 1) / sqrt(N)
    assert abs(delays.mean() - mean) < 5 * mean * math.sqrt(math.expm1(sigma**2)) / math.sqrt(N)


def test_reset_delay_is_lognormal_with_configured_mean_and_spread():
    mean, sigma = 4.0, 0.5
    model = EmulatorModel(cfg(reset_latency_mean=mean, reset_latency_sigma=sigma))
    rng = np.random.default_rng(1)
    logs = np.log([model.reset_delay(rng) for _ in range(N)])
    assert abs(logs.mean() - (math.log(mean) - sigma**2 / 2)) < 5 * sigma / math.sqrt(N)
    assert abs(logs.std(ddof=1) - sigma) < 5 * sigma / math.sqrt(2 * N)


def test_zero_spread_and_zero_mean_are_exact():
    model = EmulatorModel(
        cfg(
            step_latency_mean=0.7, step_latency_sigma=0.0, stall_prob=0.0, reset_latency_mean=0.0, **NO_FAULTS
        )
    )
    rng = np.random.default_rng(2)
    assert [model.step_outcome(rng).delay_s for _ in range(100)] == [pytest.approx(0.7)] * 100
    assert {model.reset_delay(rng) for _ in range(100)} == {0.0}


def within_binomial(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p))


def test_fault_and_stall_frequencies_match_their_probabilities():
    probs = {"hang": 0.05, "crash": 0.03, "disconnect": 0.02}
    stall_prob, stall_mean = 0.1, 5.0
    c = cfg(
        hang_prob=probs["hang"],
        crash_prob=probs["crash"],
        disconnect_prob=probs["disconnect"],
        stall_prob=stall_prob,
        stall_mean=stall_mean,
        step_timeout=1e9,
    )
    model = EmulatorModel(c)
    rng = np.random.default_rng(3)
    outs = [model.step_outcome(rng) for _ in range(N)]
    for kind, p in probs.items():
        hits = [o for o in outs if o.fault == kind]
        assert within_binomial(len(hits), N, p), (kind, len(hits))
    assert {o.delay_s for o in outs if o.fault == "hang"} == {c.step_timeout}
    assert {o.delay_s for o in outs if o.fault == "disconnect"} == {0.0}
    assert all(0.0 < o.delay_s < 1e9 and o.stall_s == 0.0 for o in outs if o.fault == "crash")
    # Stalls come only on successful steps, independently of the fault draw.
    stalls = np.array([o.stall_s for o in outs if o.stall_s > 0])
    assert all(o.fault is None for o in outs if o.stall_s > 0)
    assert within_binomial(len(stalls), N, stall_prob * (1 - sum(probs.values())))
    # Exponential stall: standard deviation equals the mean.
    assert abs(stalls.mean() - stall_mean) < 5 * stall_mean / math.sqrt(len(stalls))


def test_default_config_is_off_and_resembles_an_emulator():
    c = EmulatorModelConfig()
    assert not c.enabled
    assert c.time_scale == 1.0
    assert 0.5 <= c.step_latency_mean <= 2.0 and 0.3 <= c.step_latency_sigma <= 1.0
    assert c.hang_prob + c.crash_prob + c.disconnect_prob < 0.01
    assert c.restart_seconds > c.reset_latency_mean > 0 and c.step_timeout > 10 * c.step_latency_mean


def test_a_step_that_would_outlast_the_timeout_is_a_hang():
    model = EmulatorModel(
        cfg(step_latency_mean=2.0, step_latency_sigma=0.0, step_timeout=1.5, time_scale=0.1, **NO_FAULTS)
    )
    out = model.step_outcome(np.random.default_rng(4))
    assert out == StepOutcome(pytest.approx(0.15), "hang")


def test_sampling_is_deterministic_given_the_generator():
    model = EmulatorModel(cfg(hang_prob=0.1, crash_prob=0.1, disconnect_prob=0.1, stall_prob=0.2))

    def draw(seed):
        rng = np.random.default_rng(seed)
        return [model.step_outcome(rng) for _ in range(500)] + [model.reset_delay(rng) for _ in range(50)]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_time_scale_scales_every_delay():
    base = dict(hang_prob=0.1, crash_prob=0.1, disconnect_prob=0.1, stall_prob=0.3, step_timeout=6.0)
    slow, fast = EmulatorModel(cfg(**base)), EmulatorModel(cfg(**base, time_scale=0.01))
    rng_slow, rng_fast = np.random.default_rng(7), np.random.default_rng(7)
    kinds = set()
    for _ in range(2000):
        s, f = slow.step_outcome(rng_slow), fast.step_outcome(rng_fast)
        assert f.fault == s.fault
        assert f.delay_s == pytest.approx(0.01 * s.delay_s, abs=1e-12)
        assert f.stall_s == pytest.approx(0.01 * s.stall_s, abs=1e-12)
        kinds.add(s.fault)
        assert slow.reset_delay(rng_slow) * 0.01 == pytest.approx(fast.reset_delay(rng_fast))
    assert kinds == {None, "hang", "crash", "disconnect"}
    assert fast.step_timeout_s == pytest.approx(0.06)
    assert fast.restart_s == pytest.approx(0.01 * slow.restart_s)
    assert fast.reconnect_s == pytest.approx(0.01 * slow.reconnect_s)


# ---- the wrapper --------------------------------------------------------------------------------------------
def test_wrapper_sleeps_exactly_the_sampled_delays():
    c = cfg(stall_prob=0.2, time_scale=0.001, step_timeout=1e9, **NO_FAULTS)
    clock = FakeClock()
    phone = EmulatedPhone(StandInPhoneEnv(), c, rng=np.random.default_rng(11), sleep=clock)
    twin_model, twin_rng = EmulatorModel(c), np.random.default_rng(11)
    expected = []
    obs, info = phone.reset(seed=0)
    expected.append(twin_model.reset_delay(twin_rng))
    assert info["emulator"] == {"delay_s": expected[-1], "recovered": None}
    for _ in range(300):
        obs, _, terminated, truncated, info = phone.step(oracle_action(phone.unwrapped, obs))
        out = twin_model.step_outcome(twin_rng)
        expected.append(out.delay_s)
        assert info["emulator"] == {"delay_s": out.delay_s, "stall_s": out.stall_s}
        if terminated or truncated:
            obs, info = phone.reset()
            expected.append(twin_model.reset_delay(twin_rng))
    assert clock.calls == expected
    stats = phone.stats
    assert stats["steps"] == stats["steps_ok"] == 300
    assert stats["wait_s_step"] + stats["wait_s_stall"] + stats["wait_s_reset"] == pytest.approx(
        sum(expected)
    )
    assert stats["wait_s_stall"] > 0


@pytest.mark.parametrize(
    ("kind", "exc"), [("hang", DeviceHang), ("crash", DeviceCrash), ("disconnect", DeviceDisconnected)]
)
def test_each_fault_raises_its_exception_and_leaves_the_phone_untouched(kind, exc):
    c = cfg(**{**NO_FAULTS, f"{kind}_prob": 1.0}, time_scale=0.01, step_latency_sigma=0.0, stall_prob=0.0)
    clock = FakeClock()
    phone = EmulatedPhone(StandInPhoneEnv(), c, sleep=clock)
    twin = StandInPhoneEnv()
    inner = phone.unwrapped
    for seed in range(10):
        obs, _ = phone.reset(seed=seed)
        assert twin.reset(seed=seed)[0] == obs
        action = oracle_action(inner, obs)  # always changes the screen or a switch
        clock.calls.clear()
        with pytest.raises(exc) as err:
            phone.step(action)
        assert isinstance(err.value, DeviceFault) and err.value.kind == kind
        want_elapsed = {"hang": 0.3, "crash": 0.01, "disconnect": 0.0}[kind]
        assert err.value.elapsed_s == pytest.approx(want_elapsed)
        assert clock.now == pytest.approx(want_elapsed)
        assert inner._observe() == obs and inner._steps == 0
        if kind != "crash":
            # The next successful step acts on the untouched phone, exactly as the first step of a bare twin.
            phone.model = EmulatorModel(dataclasses.replace(c, **NO_FAULTS))
            got, want = phone.step(action), twin.step(action)
            assert got[:4] == want[:4] and strip_emulator(got[4]) == want[4]
            phone.model = EmulatorModel(c)
    assert phone.stats[f"fault_{kind}"] == 10
    assert phone.stats[f"wait_s_{kind}"] == pytest.approx(10 * want_elapsed)


def test_after_a_crash_every_step_raises_until_reset_which_pays_the_restart():
    c = cfg(time_scale=0.01, restart_seconds=50.0, reset_latency_sigma=0.0, reset_latency_mean=2.0)
    ok = StepOutcome(0.01)
    clock = FakeClock()
    model = Scripted(c, [ok, StepOutcome(0.02, "crash"), ok, ok])
    phone = EmulatedPhone(StandInPhoneEnv(), c, sleep=clock, model=model)
    obs, _ = phone.reset(seed=3)
    phone.step(Action(ActionType.PRESS_HOME))
    clock.calls.clear()
    with pytest.raises(DeviceCrash) as err:
        phone.step(Action(ActionType.PRESS_HOME))
    assert err.value.elapsed_s == pytest.approx(0.02) and clock.calls == [pytest.approx(0.02)]
    assert phone.needs == "restart"
    for _ in range(5):
        with pytest.raises(DeviceCrash) as err:
            phone.step(Action(ActionType.PRESS_HOME))
        assert err.value.elapsed_s == 0.0
    assert clock.calls == [pytest.approx(0.02)]  # a dead device refuses at once
    assert len(model.outcomes) == 2  # and draws nothing
    obs, info = phone.reset(seed=4)
    assert clock.calls[1:] == [pytest.approx(0.5), pytest.approx(0.02)]  # restart, then the reset itself
    assert info["emulator"] == {"delay_s": pytest.approx(0.52), "recovered": "restart"}
    assert obs == StandInPhoneEnv().reset(seed=4)[0]
    phone.step(Action(ActionType.PRESS_HOME))
    s = phone.stats
    assert (s["steps"], s["steps_ok"], s["fault_crash"], s["dead_steps"], s["restarts"], s["resets"]) == (
        8,
        2,
        1,
        5,
        1,
        2,
    )
    assert s["wait_s_restart"] == pytest.approx(0.5) and s["wait_s_crash"] == pytest.approx(0.02)


def test_a_disconnect_is_paid_for_by_the_next_reset_or_step():
    c = cfg(time_scale=0.01, reconnect_seconds=4.0, reset_latency_sigma=0.0, reset_latency_mean=2.0)
    ok = StepOutcome(0.01)
    clock = FakeClock()
    phone = EmulatedPhone(
        StandInPhoneEnv(),
        c,
        sleep=clock,
        model=Scripted(c, [StepOutcome(0.0, "disconnect"), StepOutcome(0.0, "disconnect"), ok]),
    )
    phone.reset(seed=0)
    clock.calls.clear()
    with pytest.raises(DeviceDisconnected):
        phone.step(Action(ActionType.PRESS_HOME))
    assert clock.calls == [] and phone.needs == "reconnect"
    _, info = phone.reset(seed=1)
    assert clock.calls == [pytest.approx(0.04), pytest.approx(0.02)]
    assert info["emulator"]["recovered"] == "reconnect"
    with pytest.raises(DeviceDisconnected):
        phone.step(Action(ActionType.PRESS_HOME))
    clock.calls.clear()
    phone.step(Action(ActionType.PRESS_HOME))  # reconnects first, then steps
    assert clock.calls == [pytest.approx(0.04), pytest.approx(0.01)]
    assert phone.needs is None and phone.stats["reconnects"] == 2


def test_each_wrapped_env_gets_its_own_stream():
    c = cfg(time_scale=0.001, **NO_FAULTS)
    clocks = [FakeClock() for _ in range(3)]
    phones = [EmulatedPhone(StandInPhoneEnv(), c, index=i, sleep=clocks[i]) for i in range(2)]
    phones.append(EmulatedPhone(StandInPhoneEnv(), c, index=0, sleep=clocks[2]))
    for p in phones:
        p.reset(seed=0)
        for _ in range(3):
            p.step(Action(ActionType.PRESS_HOME))
    assert clocks[0].calls == clocks[2].calls != clocks[1].calls


# ---- disabled --------------------------------------------------------------------------------------------
def random_action(rng: np.random.Generator) -> Action:
    t = ActionType(int(rng.integers(len(ActionType))))
    return Action(t, x=float(rng.random()), y=float(rng.random()), direction=SwipeDirection.DOWN, text="milk")


def test_disabled_config_is_a_pass_through():
    off = EmulatorModelConfig(hang_prob=1.0, crash_prob=0.0, disconnect_prob=0.0)  # would always hang if on
    bare = StandInPhoneEnv()
    assert maybe_wrap(bare, off) is bare
    assert isinstance(maybe_wrap(bare, dataclasses.replace(off, enabled=True)), EmulatedPhone)

    def never_sleep(seconds):
        raise AssertionError("a disabled emulator model must not wait")

    phone = EmulatedPhone(StandInPhoneEnv(), off, sleep=never_sleep)
    twin = StandInPhoneEnv()
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    for episode in range(20):
        assert phone.reset(seed=episode) == twin.reset(seed=episode)
        for _ in range(10):
            got, want = phone.step(random_action(rng_a)), twin.step(random_action(rng_b))
            assert got == want
            if got[2] or got[3]:
                break
    assert not phone.stats


# ---- validation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"step_latency_mean": -1.0}, "step_latency_mean"),
        ({"step_latency_sigma": -0.1}, "step_latency_sigma"),
        ({"stall_mean": -2.0}, "stall_mean"),
        ({"reset_latency_mean": float("nan")}, "reset_latency_mean"),
        ({"restart_seconds": -5.0}, "restart_seconds"),
        ({"reconnect_seconds": float("inf")}, "reconnect_seconds"),
        ({"time_scale": -0.5}, "time_scale"),
        ({"step_timeout": 0.0}, "step_timeout"),
        ({"hang_prob": 1.5}, "hang_prob"),
        ({"crash_prob": -0.1}, "crash_prob"),
        ({"stall_prob": 2.0}, "stall_prob"),
        ({"disconnect_prob": "often"}, "disconnect_prob"),
        (
            {"hang_prob": 0.5, "crash_prob": 0.4, "disconnect_prob": 0.2},
            "hang-prob \\+ --emulator.crash-prob",
        ),
        ({"seed": 1.5}, "seed"),
        ({"seed": -1}, "seed"),
        ({"enabled": 1}, "enabled"),
    ],
)
def test_config_validation_names_the_flag(kw, field):
    with pytest.raises(ValueError, match="--emulator." + field.replace("_", "-")):
        EmulatorModelConfig(**kw)


def test_config_builds_a_cli_with_field_help(capsys):
    tyro = pytest.importorskip("tyro")
    c = tyro.cli(EmulatorModelConfig, args=["--enabled", "--time-scale", "0.01", "--crash-prob", "0.2"])
    assert c == EmulatorModelConfig(enabled=True, time_scale=0.01, crash_prob=0.2)
    with pytest.raises(SystemExit):
        tyro.cli(EmulatorModelConfig, args=["--help"])
    assert "Probability per step that the device dies" in capsys.readouterr().out
