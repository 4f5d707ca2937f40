"""The paper's three claims, their decomposition and a prediction, from the rows of `benchmarks paper`.

Every comparison pairs runs of the same seed and N (same demonstrations, tasks, initial parameters and
evaluation episodes), and reports the mean over seeds with the range:

- **collection**: async env steps/s over sync's (DistRL: 2.4x);
- **training efficiency**: sync's time to the greedy target over async's (DistRL: 3x); a run that never
  reaches it counts its whole length, which makes the ratio a bound (`efficiency_bound` says which way),
  and a seed where neither reaches it is left out;
  also the ratio of the areas under the greedy test curves;
- **final success**: mean async greedy success at the end over sync's, minus 1, on general/test
  (held-out) and general/train (DistRL: +20% relative);
- **decomposition** (the same three measures between the controls): async_throttled against sync is
  freshness and pipelining alone (same episode rate), async against async_throttled is the extra data,
  sync_matched against sync is what sync loses to stragglers;
- **predicted training speedup** = min(straggler factor, learner headroom): async cannot use data
  faster than it collects it (the collection ratio) nor train faster than its learner alone can (its
  updates/s of train time over the updates/s sync actually made).
"""

from __future__ import annotations

import numpy as np

from benchmarks.paper.plan import CELLS

PAPER = {"collection": 2.4, "training_efficiency": 3.0, "final_success_test": 0.2}
"""DistRL's reported numbers (Wang et al. 2024)."""
CELL_NAMES = set(CELLS)


def _by(rows: list[dict], envs: int, cell: str) -> dict[int, dict]:
    return {r["seed"]: r for r in rows if r["base_envs"] == envs and r["cell"] == cell}


def _stats(values: list[float]) -> dict:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    if not vals:
        return {"mean": None, "min": None, "max": None, "seeds": 0}
    return {"mean": round(float(np.mean(vals)), 3), "min": round(min(vals), 3),
            "max": round(max(vals), 3), "seeds": len(vals)}  # fmt: skip


def _ratios(a: dict[int, dict], b: dict[int, dict], key: str, invert: bool = False) -> list[float]:
    """Per seed a[key] / b[key] (b / a with invert), seeds both have."""
    out = []
    for seed in sorted(a.keys() & b.keys()):
        num, den = (b[seed][key], a[seed][key]) if invert else (a[seed][key], b[seed][key])
        out.append(num / den if den else float("inf"))
    return out


def compare(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """a against b: collection ratio, efficiency ratio (b's time to target over a's), AUC ratio, and the
    relative final success on each split (mean over mean), each with its per-seed range."""
    if not a or not b:
        return {}
    seeds = sorted(a.keys() & b.keys())
    out = {
        "collection": _stats(_ratios(a, b, "env_steps_per_s")),
        "training_efficiency": _stats(_efficiency(a, b, seeds)),
        "efficiency_bound": _bound(a, b, seeds),
        "auc_test_ratio": _stats(_ratios(a, b, "auc_test")),
    }
    for split in ("test", "train"):
        mean_a = np.mean([a[s][f"final_{split}"] for s in seeds])
        mean_b = np.mean([b[s][f"final_{split}"] for s in seeds])
        per_seed = [
            a[s][f"final_{split}"] / b[s][f"final_{split}"] - 1 for s in seeds if b[s][f"final_{split}"]
        ]
        out[f"final_success_{split}"] = {
            "relative": round(float(mean_a / mean_b - 1), 3) if mean_b else None,
            "first": round(float(mean_a), 3), "second": round(float(mean_b), 3),
            "per_seed": _stats(per_seed),
        }  # fmt: skip
    return out


def _efficiency(a: dict[int, dict], b: dict[int, dict], seeds: list[int]) -> list[float]:
    """Per seed b's time to the target over a's, a run that missed it counting its whole length; seeds
    where neither reached it say nothing and are left out (their count is the `seeds` it lacks)."""
    both_missed = {s for s in seeds if a[s]["time_to_target"] is None and b[s]["time_to_target"] is None}
    kept = [s for s in seeds if s not in both_missed]
    return _ratios({s: a[s] for s in kept}, {s: b[s] for s in kept}, "time_to_target_bound", invert=True)


def _bound(a: dict[int, dict], b: dict[int, dict], seeds: list[int]) -> str:
    """Whether the efficiency ratio is exact or a bound: a lower bound when the second never reached
    the target in some seed, an upper bound when the first did not."""
    seeds = [s for s in seeds if a[s]["time_to_target"] is not None or b[s]["time_to_target"] is not None]
    if not seeds:
        return "neither run reached the target in any seed"
    a_missed = any(a[s]["time_to_target"] is None for s in seeds)
    b_missed = any(b[s]["time_to_target"] is None for s in seeds)
    return {(False, False): "exact", (False, True): "lower", (True, False): "upper"}.get(
        (a_missed, b_missed), "mixed: lower in some seeds, upper in others"
    )


def predicted_speedup(async_: dict[int, dict], sync: dict[int, dict]) -> dict:
    """min(straggler factor, learner headroom) per seed, as in the module docstring."""
    out = []
    for seed in sorted(async_.keys() & sync.keys()):
        straggler = async_[seed]["env_steps_per_s"] / max(sync[seed]["env_steps_per_s"], 1e-9)
        alone = async_[seed]["alone_updates_per_s"] or 0.0
        headroom = alone / max(sync[seed]["updates_per_s"], 1e-9)
        out.append(min(straggler, headroom))
    return _stats(out)


def verdict(name: str, value: float | None, quick: bool) -> str:
    """Reproduced (the mean reaches the paper's number), direction only (async better, less than the
    paper), or not reproduced; a quick run is a check of the pipeline, never evidence."""
    if value is None:
        return "not measured"
    paper = PAPER[name]
    better = value > (0.0 if name.startswith("final") else 1.0)
    word = "reproduced" if value >= paper else ("same direction, smaller" if better else "not reproduced")
    return word + (" (quick run: a pipeline check, not evidence)" if quick else "")


def summarize(rows: list[dict], envs: tuple[int, ...], quick: bool) -> dict:
    """The claims, the decomposition, the ablations and the prediction for each N."""
    return {f"N{n}": _one_n(rows, n, quick) for n in envs}


def _one_n(rows: list[dict], n: int, quick: bool) -> dict:
    cells = {r["cell"] for r in rows}
    cell = {name: _by(rows, n, name) for name in cells} | {name: {} for name in CELL_NAMES - cells}
    main = compare(cell["async"], cell["sync"])
    claims = {k: main.get(k) for k in ("collection", "training_efficiency")}
    claims |= {k: main.get(k) for k in ("final_success_test", "final_success_train")}
    verdicts = {
        k: verdict(k, (v or {}).get("mean", (v or {}).get("relative")), quick)
        for k, v in claims.items()
        if k in PAPER
    }
    return {
        "claims": claims,
        "verdicts": verdicts,
        "async_vs_sync": main,
        "freshness_and_pipelining": compare(cell["async_throttled"], cell["sync"]),
        "more_data": compare(cell["async"], cell["async_throttled"]),
        "straggler_cost": compare(cell["sync_matched"], cell["sync"]),
        "prioritized_vs_uniform": compare(cell["async"], cell["async_uniform"]),
        "correction_vs_none": compare(cell["async"], cell["async_no_correction"]),
        "predicted_speedup": predicted_speedup(cell["async"], cell["sync"]),
    }
