"""The rules that turn `python -m benchmarks paper`'s runs into verdicts, written down before the standard
run (issue 48), so the numbers cannot choose their own yardstick. Pure functions of the result rows.

**The claims** (async against sync, the same seed and N paired; DistRL: 2.4x collection, 3x training
efficiency, +20% relative final success). Each seed gives an interval for the claim's measure:

- collection: async env steps/s over sync's; exact, [r, r];
- training efficiency: sync's time to the greedy target on general/train over async's. A run that never
  reaches the target is censored at its length T (its `time_to_target_bound`): only async reaching it
  gives a lower bound [T / t_async, inf), only sync an upper bound [0, t_sync / T]; a seed where neither
  reaches it says nothing about the ratio and is left out (named in `left_out`). Times are the
  snapshots' grid times, as in the summary: the crossing is placed to within one snapshot spacing;
- final success: async's greedy success at the last snapshot over sync's, minus 1 (general/test is the
  claim, general/train beside it); sync at 0 with async above gives [inf, inf] (async better by any
  factor), both at 0 are left out.

(In the results file an end without a bound is null; `min` is the smallest low end, `max` the largest
high end.)

A claim **holds** when every kept seed's interval lies at or above HOLD_FRACTION of the paper's number
(its low end: a lower bound counts, since the true ratio is at least that), **does not hold** when some
seed's interval lies entirely below it (its high end: that seed cannot reach it, so the claim fails in
every-seed form whatever the others say), and is **not measurable** otherwise: fewer than MIN_SEEDS
seeds kept, or no seed surely below while some seed's bound straddles the line. The minimum over seeds, not the mean,
because three seeds are too few for an interval on a mean to mean much, and the paper's claim is that
async is better by that much, which a reader expects of every seed. HOLD_FRACTION = 0.75: the question is
whether the paper's size of effect is reproduced on this machine and simulator, not its exact value; a
quarter below leaves room for the time to target's resolution (one 40 s snapshot spacing in a crossing
near 120-160 s is 25-33%) and for 100 evaluation episodes' noise on a final success rate, while an
effect of half the paper's size still does not hold. So: collection holds at 1.8x or more in every seed,
training efficiency at 2.25x, final success at +15% relative. `direction` says beside the verdict
whether async was better in every seed (ratio above 1, gain above 0), worse in every seed, or mixed.

**The ablations** (async with the default against async with the alternative, final greedy success on
general/train, the same seed paired: a default is a choice, and choices are made on training templates;
general/test is reported beside it, never decides): the default changes only when the alternative is better in every
seed by more than the binomial standard error of the difference, sqrt(p_a (1 - p_a) / n + p_d (1 - p_d)
/ n), n the evaluation episodes per snapshot and split, with at least MIN_SEEDS seeds paired; otherwise
the default stays (the reason says whether the default was itself better beyond that error in every
seed, or whether the seeds did not separate them). A change of default costs every later result its
comparability, so it needs a difference that no seed contradicts; the two runs see the same evaluation
episodes, whose outcomes correlate, which if anything makes the independent-samples error too large
(conservative for a switch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PAPER = {"collection": 2.4, "training_efficiency": 3.0, "final_success": 0.2}
"""DistRL's reported numbers (Wang et al. 2024): ratios for collection and efficiency, a relative gain
for final success."""
HOLD_FRACTION = 0.75
"""A claim holds when every seed reaches this fraction of the paper's number (the module docstring says
why)."""
MIN_SEEDS = 2
"""Fewer seeds kept than this: not measurable (one seed has no range)."""
EPS = 1e-9
"""Float slack of the comparisons with a threshold."""
ABLATIONS = {
    "replay": ("async", "async_uniform", "prioritized replay", "uniform replay"),
    "correction": ("async", "async_no_correction", "off-policy correction", "no correction"),
}
"""Each ablation: (default cell, alternative cell, default's words, alternative's words)."""


@dataclass(frozen=True)
class Interval:
    """What one seed says about a claim's measure: exact (low == high) or bounded by censoring."""

    low: float
    """The smallest value consistent with the seed (0 when only an upper bound is known)."""
    high: float
    """The largest value consistent with the seed (inf when only a lower bound is known)."""

    @property
    def kind(self) -> str:
        """The words the results use: "exact", "lower bound", "upper bound" or "unbounded" (a gain over 0)."""
        if math.isinf(self.low):
            return "unbounded"
        if self.low == self.high:
            return "exact"
        return "lower bound" if math.isinf(self.high) else "upper bound"


def collection_interval(async_row: dict, sync_row: dict) -> Interval | None:
    """async env steps/s over sync's; None when sync collected nothing (no ratio)."""
    if not sync_row["env_steps_per_s"]:
        return None
    r = async_row["env_steps_per_s"] / sync_row["env_steps_per_s"]
    return Interval(r, r)


def efficiency_interval(async_row: dict, sync_row: dict) -> Interval | None:
    """sync's time to the target over async's, a run that missed it censored at its length (the module
    docstring); None when neither reached it."""
    t_a, t_s = async_row["time_to_target"], sync_row["time_to_target"]
    if t_a is None and t_s is None:
        return None
    if t_s is None:
        return Interval(sync_row["time_to_target_bound"] / t_a, math.inf)
    if t_a is None:
        return Interval(0.0, t_s / async_row["time_to_target_bound"])
    return Interval(t_s / t_a, t_s / t_a)


def gain_interval(async_row: dict, sync_row: dict, split: str) -> Interval | None:
    """async's final greedy success over sync's, minus 1; sync at 0: inf if async is above, None if not."""
    a, s = async_row[f"final_{split}"], sync_row[f"final_{split}"]
    if not s:
        return Interval(math.inf, math.inf) if a else None
    return Interval(a / s - 1, a / s - 1)


def claim_verdict(intervals: list[Interval], threshold: float) -> str:
    """The verdict, "holds", "does not hold" or "not measurable", by the rule of the module docstring
    (compared to within EPS, so 0.75 x 0.2 in floats does not fail a gain of exactly 0.15)."""
    if len(intervals) < MIN_SEEDS:
        return "not measurable"
    if any(i.high < threshold - EPS for i in intervals):
        return "does not hold"
    if all(i.low >= threshold - EPS for i in intervals):
        return "holds"
    return "not measurable"


def direction(intervals: list[Interval], neutral: float) -> str:
    """Whether async was better than sync in every seed (every interval above `neutral`: 1 for a ratio,
    0 for a gain), worse in every seed, or mixed (a bound across `neutral` counts as mixed)."""
    if intervals and all(i.low > neutral for i in intervals):
        return "async better in every seed"
    if intervals and all(i.high < neutral for i in intervals):
        return "async worse in every seed"
    return "mixed"


def judge_claim(per_seed: dict[int, Interval | None], paper: float, neutral: float) -> dict:
    """One claim from its per-seed intervals: the verdict, the direction, the range and the seeds."""
    kept = {s: i for s, i in sorted(per_seed.items()) if i is not None}
    threshold = HOLD_FRACTION * paper
    lows = [i.low for i in kept.values()]
    return {
        "verdict": claim_verdict(list(kept.values()), threshold),
        "direction": direction(list(kept.values()), neutral),
        "paper": paper,
        "threshold": round(threshold, 4),
        "min": _round(min(lows)) if lows else None,
        "max": _round(max(i.high for i in kept.values())) if kept else None,
        "per_seed": {
            str(s): {"low": _round(i.low), "high": _round(i.high), "kind": i.kind} for s, i in kept.items()
        },
        "left_out": [s for s, i in sorted(per_seed.items()) if i is None],
    }


def judge_claims(async_rows: dict[int, dict], sync_rows: dict[int, dict]) -> dict:
    """The three claims (final success on both splits, test the claim) from rows keyed by seed."""
    seeds = sorted(async_rows.keys() & sync_rows.keys())

    def each(fn, *args) -> dict[int, Interval | None]:
        return {s: fn(async_rows[s], sync_rows[s], *args) for s in seeds}

    return {
        "collection": judge_claim(each(collection_interval), PAPER["collection"], 1.0),
        "training_efficiency": judge_claim(each(efficiency_interval), PAPER["training_efficiency"], 1.0),
        "final_success_test": judge_claim(each(gain_interval, "test"), PAPER["final_success"], 0.0),
        "final_success_train": judge_claim(each(gain_interval, "train"), PAPER["final_success"], 0.0),
    }


def binomial_se(p_a: float, p_b: float, n: int) -> float:
    """Standard error of the difference of two success rates, each over n episodes."""
    return math.sqrt(p_a * (1 - p_a) / n + p_b * (1 - p_b) / n)


def ablation_decision(
    default_rows: dict[int, dict], alternative_rows: dict[int, dict], episodes: int, words: tuple[str, str]
) -> dict:
    """Keep the default or switch, by the rule of the module docstring, on final greedy train success
    (the test split's difference is reported, never decides)."""
    seeds = sorted(default_rows.keys() & alternative_rows.keys())
    diffs, errors = {}, {}
    for s in seeds:
        p_d, p_a = default_rows[s]["final_train"], alternative_rows[s]["final_train"]
        diffs[s], errors[s] = p_a - p_d, binomial_se(p_a, p_d, episodes)
    default, alternative = words
    if len(seeds) < MIN_SEEDS:
        decision, reason = f"keep {default}", "not measured (fewer than two seeds paired)"
    elif all(diffs[s] > errors[s] for s in seeds):
        decision, reason = (
            f"switch to {alternative}",
            "the alternative is better beyond the error in every seed",
        )
    elif all(-diffs[s] > errors[s] for s in seeds):
        decision, reason = f"keep {default}", "the default is better beyond the error in every seed"
    else:
        decision, reason = f"keep {default}", "the seeds do not separate them beyond the error"
    return {
        "decision": decision,
        "reason": reason,
        "switch": decision.startswith("switch"),
        "per_seed": {str(s): {"difference": round(diffs[s], 4), "se": round(errors[s], 4)} for s in seeds},
        "mean_difference": round(sum(diffs.values()) / len(seeds), 4) if seeds else None,
        "test_difference": {
            str(s): round(alternative_rows[s]["final_test"] - default_rows[s]["final_test"], 4) for s in seeds
        },
    }


def judge(rows: list[dict], envs: int, episodes: int) -> dict:
    """Every claim and ablation for one N, from the benchmark's rows."""
    names = {"async", "sync"} | {c for d, a, *_ in ABLATIONS.values() for c in (d, a)}
    cell = {c: {r["seed"]: r for r in rows if r["base_envs"] == envs and r["cell"] == c} for c in names}
    out = {"claims": judge_claims(cell["async"], cell["sync"]), "ablations": {}}
    for name, (default, alternative, *words) in ABLATIONS.items():
        out["ablations"][name] = ablation_decision(cell[default], cell[alternative], episodes, tuple(words))
    return out


def _round(x: float) -> float | None:
    """Rounded for the JSON; inf becomes null (no bound that way), which every JSON reader takes."""
    return None if math.isinf(x) else round(x, 4)
