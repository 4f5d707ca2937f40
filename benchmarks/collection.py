"""Data collection, asynchronous (DistRL) against synchronous (DigiRL), on emulator-like devices.

DistRL's claim: with devices whose step times vary widely, asynchronous collection gathers data about
2.4x faster than DigiRL's synchronous rounds (every environment runs one episode on one policy version,
the round waits for the slowest, then the learner trains and publishes while collection waits).

What runs: the real learner (`python -m learner --mode async|sync`) with its local actors, 16 SimPhone
environments in 2 actor processes, every step behind the emulator model (`--emulator.*`): lognormal
step latency of mean 1 s and log-sigma 1.0 (median 0.61 s, 95th percentile 3.2 s), 1% stalls of mean
5 s, resets of mean 0.5 s, no faults, all scaled by `time_scale` so that a run takes a minute or two.
Same seeds, same model and algorithm (A-RIDE, samples-per-insert 4, batch 16) for both modes; no
warm-up, so the policy is near uniform and episode lengths vary from 1 step to the 16-step limit.

Measured from the learner's metrics.jsonl over the window after the first episode arrives (start-up
and compilation excluded): env steps stored per second, a least-squares slope. `ideal_steps_per_s` is
the physical limit N / (mean step latency) of the latency model; `efficiency` = async / ideal. That
limit ignores resets, which take every environment a mean 0.5 s (scaled) per episode: with the async
run's mean episode length L, `ideal_with_resets_steps_per_s` = N / (step latency + reset latency / L)
is the limit with them, and `efficiency_with_resets` the async rate against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.pinning import run_pinned

ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, ACTORS = 16, 2
LATENCY = {
    "step-latency-mean": 1.0,
    "step-latency-sigma": 1.0,
    "stall-prob": 0.01,
    "stall-mean": 5.0,
    "reset-latency-mean": 0.5,
    "reset-latency-sigma": 0.5,
    "hang-prob": 0.0,
    "crash-prob": 0.0,
    "disconnect-prob": 0.0,
}


def mean_step_latency(time_scale: float) -> float:
    """Mean seconds per step of the latency model above (lognormal mean + expected stall)."""
    return (LATENCY["step-latency-mean"] + LATENCY["stall-prob"] * LATENCY["stall-mean"]) * time_scale


def emulator_flags(time_scale: float) -> list[str]:
    """The learner flags that put every local environment behind the latency model above."""
    flags = ["--emulator.enabled", "--emulator.time-scale", str(time_scale)]
    for key, value in LATENCY.items():
        flags += [f"--emulator.{key}", str(value)]
    return flags


def learner_command(
    mode: str, run_dir: Path, seconds: float, time_scale: float, extra: tuple = ()
) -> list[str]:
    emulator = emulator_flags(time_scale)
    return [
        sys.executable, "-m", "learner", "--mode", mode, "--run-dir", str(run_dir),
        "--ingest-port", "0", "--params-port", "0",
        "--local-actors", str(ACTORS), "--envs-per-actor", str(NUM_ENVS // ACTORS),
        "--env", "simphone", "--tasks", "general", "--warmup-demos", "0", "--warmup-updates", "0",
        "--batch-size", "16", "--time-limit", str(seconds), "--log-every", "1", "--seed", "0",
        *emulator, *extra,
    ]  # fmt: skip


def run_learner(cmd: list[str], run_dir: Path, timeout: float, pinned: bool = False) -> list[dict]:
    """Run one learner to its time limit; its metrics lines. `pinned`: the learner on one core, its
    actors on the others (benchmarks/pinning.py)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    kw = dict(cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    done = run_pinned(cmd, **kw) if pinned else subprocess.run(cmd, **kw)
    if done.returncode != 0:
        raise RuntimeError(
            f"learner failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_per_second(lines: list[dict], key: str = "env_steps") -> tuple[float, float]:
    """(`key` per second, env steps by default, as the least-squares slope of `key` over wall, window
    seconds), from the first line with an episode on."""
    rows = [(m["wall"], m[key]) for m in lines if "stopped" not in m]
    first = next(i for i, (_, steps) in enumerate(rows) if steps > 0)
    wall, steps = np.array(rows[first:], dtype=float).T
    slope = np.polyfit(wall, steps, 1)[0] if len(wall) >= 3 else float("nan")
    return float(slope), float(wall[-1] - wall[0])


def run(quick: bool) -> list[dict]:
    seconds, scales = (60.0, (0.2,)) if quick else (120.0, (0.05, 0.2))
    return [_compare(seconds, scale) for scale in scales]


def _compare(seconds: float, time_scale: float) -> dict:
    """Both modes at one time scale: one row."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("async", "sync"):
            run_dir = Path(tmp) / mode
            lines = run_learner(learner_command(mode, run_dir, seconds, time_scale), run_dir, seconds + 300)
            rate, window = steps_per_second(lines)
            results[mode] = {"rate": rate, "window": window, "last": lines[-1]}
    ideal = NUM_ENVS / mean_step_latency(time_scale)
    a, s = results["async"], results["sync"]
    # Each episode also pays one reset; with the async run's mean episode length, the physical limit is:
    length = a["last"]["env_steps"] / max(a["last"]["episodes"], 1)
    reset_s = LATENCY["reset-latency-mean"] * time_scale
    ideal_with_resets = NUM_ENVS / (mean_step_latency(time_scale) + reset_s / length)
    return {
        "envs": NUM_ENVS,
        "time_scale": time_scale,
        "mean_step_latency_s": round(mean_step_latency(time_scale), 4),
        "window_s": round(min(a["window"], s["window"]), 1),
        "async_steps_per_s": round(a["rate"], 2),
        "sync_steps_per_s": round(s["rate"], 2),
        "ideal_steps_per_s": round(ideal, 2),
        "speedup": round(a["rate"] / s["rate"], 3),
        "efficiency": round(a["rate"] / ideal, 3),
        "mean_episode_steps": round(length, 2),
        "ideal_with_resets_steps_per_s": round(ideal_with_resets, 2),
        "efficiency_with_resets": round(a["rate"] / ideal_with_resets, 3),
        "async_updates": a["last"]["update"],
        "sync_updates": s["last"]["update"],
        "sync_rounds": s["last"].get("sync_rounds", 0),
    }
