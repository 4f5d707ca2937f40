"""The paper benchmark's verdict rules (benchmarks/paper/verdict.py), fixed before the standard run, against
cases computed by hand: a claim holds when every seed reaches 0.75 of the paper's number, fails when a
seed certainly falls short, and a censored time to target gives a bound that counts only where it
settles the question."""

from __future__ import annotations

import math

import pytest

from benchmarks.paper.verdict import (
    Interval,
    ablation_decision,
    binomial_se,
    claim_verdict,
    direction,
    efficiency_interval,
    gain_interval,
    judge,
    judge_claims,
)


def _row(cell: str, seed: int, **kw) -> dict:
    base = {"cell": cell, "base_envs": 16, "seed": seed, "env_steps_per_s": 10.0, "time_to_target": 100,
            "time_to_target_bound": 100, "final_test": 0.4, "final_train": 0.5}  # fmt: skip
    return base | kw


def _exact(*values: float) -> list[Interval]:
    return [Interval(v, v) for v in values]


def test_a_claim_holds_only_when_every_seed_reaches_three_quarters_of_the_paper():
    assert claim_verdict(_exact(4.0, 3.6, 1.8), threshold=0.75 * 2.4) == "holds"  # 1.8 is exactly 0.75 x 2.4
    assert claim_verdict(_exact(4.0, 3.6, 1.7), threshold=1.8) == "does not hold"  # one seed short
    assert claim_verdict(_exact(4.0), threshold=1.8) == "not measurable"  # one seed has no range


def test_a_gain_of_exactly_the_threshold_holds_despite_float_rounding():
    gain = gain_interval(_row("async", 0, final_test=0.46), _row("sync", 0, final_test=0.4), "test")
    assert gain.low == pytest.approx(0.15)
    assert claim_verdict([gain, gain], threshold=0.75 * 0.2) == "holds"


def test_a_censored_time_to_target_is_a_bound_on_the_ratio():
    sync_missed = efficiency_interval(
        _row("async", 0, time_to_target=120), _row("sync", 0, time_to_target=None, time_to_target_bound=360)
    )
    assert sync_missed == Interval(3.0, math.inf) and sync_missed.kind == "lower bound"  # 360 / 120
    async_missed = efficiency_interval(
        _row("async", 0, time_to_target=None, time_to_target_bound=360), _row("sync", 0, time_to_target=200)
    )
    assert async_missed.low == 0.0 and async_missed.high == pytest.approx(200 / 360)
    assert async_missed.kind == "upper bound"
    both = efficiency_interval(_row("async", 0, time_to_target=80), _row("sync", 0, time_to_target=240))
    assert both == Interval(3.0, 3.0) and both.kind == "exact"
    neither = efficiency_interval(_row("async", 0, time_to_target=None), _row("sync", 0, time_to_target=None))
    assert neither is None


def test_bounds_enter_the_verdict_only_where_they_settle_it():
    exact = Interval(3.0, 3.0)
    assert claim_verdict([exact, Interval(3.0, math.inf)], threshold=2.25) == "holds"  # bound above the line
    assert claim_verdict([exact, Interval(1.8, math.inf)], threshold=2.25) == "not measurable"  # straddles
    assert claim_verdict([exact, Interval(0.0, 0.56)], threshold=2.25) == "does not hold"  # surely below
    assert claim_verdict([Interval(1.8, math.inf), Interval(2.0, 2.0)], 2.25) == "does not hold"


def test_efficiency_leaves_out_a_seed_where_neither_mode_reaches_the_target():
    a = {
        0: _row("async", 0, time_to_target=100),
        1: _row("async", 1, time_to_target=120),
        2: _row("async", 2, time_to_target=None, time_to_target_bound=360),
    }
    s = {
        0: _row("sync", 0, time_to_target=300),  # 3.0
        1: _row("sync", 1, time_to_target=None, time_to_target_bound=360),  # >= 3.0
        2: _row("sync", 2, time_to_target=None, time_to_target_bound=360),  # nothing
    }
    got = judge_claims(a, s)["training_efficiency"]
    assert got["verdict"] == "holds" and got["left_out"] == [2]
    assert got["per_seed"]["1"] == {"low": 3.0, "high": None, "kind": "lower bound"}  # null: no upper bound
    assert got["min"] == 3.0 and got["max"] is None and got["threshold"] == 2.25


def test_the_three_claims_from_rows():
    a = {
        s: _row("async", s, env_steps_per_s=r, final_test=t) for s, r, t in [(0, 40.0, 0.39), (1, 36.0, 0.3)]
    }
    s = {0: _row("sync", 0, final_test=0.12), 1: _row("sync", 1, final_test=0.0)}
    got = judge_claims(a, s)
    assert got["collection"]["verdict"] == "holds"  # 4.0 and 3.6
    assert (got["collection"]["min"], got["collection"]["max"]) == (3.6, 4.0)
    assert got["collection"]["direction"] == "async better in every seed"
    assert got["final_success_test"]["per_seed"]["0"]["low"] == pytest.approx(0.39 / 0.12 - 1, abs=1e-4)
    assert got["final_success_test"]["per_seed"]["1"]["kind"] == "unbounded"  # sync at 0, async above
    assert got["final_success_test"]["verdict"] == "holds"
    assert got["training_efficiency"]["verdict"] == "does not hold"  # both at 100 s: ratio 1
    assert got["training_efficiency"]["direction"] == "mixed"
    a[1]["final_test"] = 0.0  # both at 0: nothing to compare, one seed left: not measurable
    got = judge_claims(a, s)["final_success_test"]
    assert got["left_out"] == [1] and got["verdict"] == "not measurable"


def test_direction_is_every_seed_or_mixed():
    assert direction(_exact(1.2, 1.5), neutral=1.0) == "async better in every seed"
    assert direction(_exact(0.8, 0.9), neutral=1.0) == "async worse in every seed"
    assert direction([Interval(0.0, 1.5), Interval(1.2, 1.2)], neutral=1.0) == "mixed"
    assert direction(_exact(-0.1, 0.3), neutral=0.0) == "mixed"


def test_the_binomial_error_of_a_difference():
    assert binomial_se(0.62, 0.5, 100) == pytest.approx(math.sqrt(0.62 * 0.38 / 100 + 0.25 / 100))
    assert binomial_se(0.62, 0.5, 100) == pytest.approx(0.0697, abs=1e-4)


def _ablation(default: list[float], alternative: list[float]) -> dict:
    d = {s: _row("async", s, final_train=p) for s, p in enumerate(default)}
    a = {s: _row("async_uniform", s, final_train=p, final_test=0.9) for s, p in enumerate(alternative)}
    return ablation_decision(d, a, 100, ("prioritized replay", "uniform replay"))


def test_an_ablation_switches_the_default_only_if_the_alternative_wins_every_seed_beyond_the_error():
    # differences 0.12, 0.15, 0.15 against errors 0.070, 0.065, 0.068
    got = _ablation([0.50, 0.60, 0.55], [0.62, 0.75, 0.70])
    assert got["decision"] == "switch to uniform replay" and got["switch"]
    assert got["per_seed"]["0"] == {"difference": 0.12, "se": 0.0697}
    assert got["mean_difference"] == pytest.approx(0.14)
    got = _ablation([0.50, 0.60, 0.55], [0.62, 0.75, 0.60])  # seed 2: 0.05 < its error 0.070
    assert got["decision"] == "keep prioritized replay" and "do not separate" in got["reason"]
    assert got["test_difference"]["2"] == 0.5  # far apart on general/test, which never decides
    got = _ablation([0.62, 0.75, 0.70], [0.50, 0.60, 0.55])
    assert got["decision"] == "keep prioritized replay" and "default is better" in got["reason"]
    got = _ablation([0.5], [0.9])
    assert not got["switch"] and got["reason"].startswith("not measured")


def test_judge_pairs_the_cells_of_one_n():
    rows = [
        _row("sync", 0), _row("sync", 1),
        _row("async", 0, env_steps_per_s=25.0, final_test=0.5),
        _row("async", 1, env_steps_per_s=25.0, final_test=0.5),
        _row("async_no_correction", 0, final_train=0.8), _row("async_no_correction", 1, final_train=0.8),
        _row("async", 0, base_envs=64, env_steps_per_s=1.0),  # another N: not paired with N = 16
    ]  # fmt: skip
    got = judge(rows, envs=16, episodes=100)
    assert got["claims"]["collection"]["min"] == 2.5 and got["claims"]["collection"]["verdict"] == "holds"
    assert got["ablations"]["correction"]["decision"] == "switch to no correction"
    assert got["ablations"]["replay"]["reason"].startswith("not measured")  # async_uniform not run
