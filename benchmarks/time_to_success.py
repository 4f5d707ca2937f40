"""Wall time to a training success target, asynchronous (DistRL) against synchronous (DigiRL).

DistRL's claim: about 3x better training efficiency than synchronous collection. What runs: the real
learner with 16 SimPhone environments (`general` tasks) in 2 local actors behind the emulator latency
model of `benchmarks/collection.py`, the same seeds and configuration in both modes: a short
behavior-cloning warm-up on oracle demonstrations (identical in both: the actors collect with the
initial policy meanwhile), then A-RIDE until the training success rate over the last 100 episodes, all
collected after the warm-up, reaches `target` (`--stop-at-success`) or the time limit passes.

Each seed runs both modes (`--seed`, so the same demonstrations, tasks and initial parameters in a pair).
Where the machine allows (Linux, 2+ cores) the learner is pinned to one core and its actors to the
others (benchmarks/pinning.py), mimicking the paper's separate learner hardware.

Reported per seed: `async_s` and `sync_s`, seconds from the end of the warm-up to the target (the part
where the modes differ), `ratio` = sync_s / async_s; the same including the warm-up (`*_total_s`,
`ratio_total`); and `stale_dropped_share`, the async episodes dropped as too stale over all it received.
A run that misses the target within its limit reports the limit as a lower bound (`reached` False).
Over the seeds (the JSON's top level): `ratio_mean`, `ratio_min`, `ratio_max`, `seeds`,
`stale_dropped_share` (the mean over the async runs).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import pinning
from benchmarks.collection import learner_command, run_learner

SEEDS = (0, 1, 2)


def _time_to_target(lines: list[dict]) -> dict:
    """Seconds from the first RL line to the stop line, and in total."""
    rl_start = next((m["wall"] for m in lines if m.get("phase") == "rl"), lines[-1]["wall"])
    last = lines[-1]
    return {
        "reached": last.get("stopped") == "success target",
        "after_warmup_s": last["wall"] - rl_start,
        "total_s": last["wall"],
        "updates": last["update"],
        "success": last["success_rate"],
        "env_steps": last["env_steps"],
        "stale_dropped_share": last.get("replay/stale_dropped_share", 0.0),
    }


def run(quick: bool, extra: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """`extra`: learner flags added to both modes' runs (`--learner-args`)."""
    target, limit, time_scale = (0.4, 200.0, 0.2) if quick else (0.5, 600.0, 0.2)
    pinned = pinning.available()
    rows = [_pair(seed, target, limit, time_scale, pinned, extra) for seed in SEEDS]
    ratios = [r["ratio"] for r in rows]
    summary = {
        "seeds": len(rows),
        "ratio_mean": round(sum(ratios) / len(ratios), 2),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "stale_dropped_share": round(sum(r["stale_dropped_share"] for r in rows) / len(rows), 3),
        "pinned": pinned,
        "learner_args": " ".join(extra),
    }
    return rows, summary


def _pair(seed: int, target: float, limit: float, time_scale: float, pinned: bool, extra: tuple) -> dict:
    flags = (
        "--warmup-demos", "400", "--warmup-updates", "60", "--batch-size", "32",
        "--stop-at-success", str(target), "--seed", str(seed), *extra,
    )  # fmt: skip
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("async", "sync"):
            run_dir = Path(tmp) / mode
            cmd = learner_command(mode, run_dir, limit, time_scale, flags)
            results[mode] = _time_to_target(run_learner(cmd, run_dir, limit + 300, pinned))
    a, s = results["async"], results["sync"]
    return {
        "seed": seed,
        "target": target,
        "time_scale": time_scale,
        "limit_s": limit,
        "async_s": round(a["after_warmup_s"], 1),
        "sync_s": round(s["after_warmup_s"], 1),
        "ratio": round(s["after_warmup_s"] / max(a["after_warmup_s"], 1e-9), 2),
        "async_total_s": round(a["total_s"], 1),
        "sync_total_s": round(s["total_s"], 1),
        "ratio_total": round(s["total_s"] / max(a["total_s"], 1e-9), 2),
        "async_reached": a["reached"],
        "sync_reached": s["reached"],
        "async_updates": a["updates"],
        "sync_updates": s["updates"],
        "async_env_steps": a["env_steps"],
        "sync_env_steps": s["env_steps"],
        "stale_dropped_share": round(a["stale_dropped_share"], 3),
    }
