"""`python -m benchmarks paper [--quick | --standard]`: DistRL's three claims (2.4x faster collection, 3x
training efficiency, +20% relative final success over synchronous DigiRL) in one experiment without the old
confounds: the same loss, replay, warm-up and demonstrations in both modes (demonstrations buy no
updates), device-like emulator latency, the learner pinned to a core the actors cannot use where the
machine allows, several seeds, and success judged by greedy evaluation of parameter snapshots taken at
fixed wall-clock times (benchmarks/paper/eval.py), on general/train and general/test separately.

The cells (benchmarks/paper/plan.py CELLS) add two controls that split the effect (async throttled to
sync's episode rate; sync with enough environments to match async's) and two ablations (uniform replay,
no off-policy correction). The summary (benchmarks/paper/summary.py) states each claim as reproduced or
not, the decomposition, and a predicted speedup beside the measured one.

Resumable: each run's result is kept in runs/paper-{full,standard,quick}/N{n}/{cell}/s{seed}/result.json
and a finished run is not run again, so the full experiment (hours) can span several sittings; a run that was
interrupted starts over. At the end: the JSON (`--json`), summary.md (a markdown table of every run and
the claims) and `python -m learner report` plots of every run (greedy curves included) in the out dir.
`--quick` is the same pipeline reduced (N = 16, 2 seeds, 100 s runs at time scale 0.25, the four main
cells) so it finishes within about 20 minutes here; it writes the same keys. `--standard` (issue 48) is the
size that settles the claims within 150 minutes here (plan.py STANDARD: N = 16, 3 seeds, all six cells,
360 s runs): it prints its estimate before the first run and the time left after each
(benchmarks/paper/progress.py), judges the claims and ablations by the rules fixed before it ran
(benchmarks/paper/verdict.py), and writes benchmarks/results/paper-standard.json (every run with its
greedy curve, results.py) and the figures in docs/paper-standard/ (figure.py). The other sizes write
that file and the figures into their out dir.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import pinning
from benchmarks.collection import ROOT, run_learner
from benchmarks.paper import results
from benchmarks.paper.eval import curve_summary, evaluate_snapshots, run_rates
from benchmarks.paper.figure import draw
from benchmarks.paper.markdown import write_markdown
from benchmarks.paper.plan import (
    FULL,
    QUICK,
    STANDARD,
    Recipe,
    Run,
    learner_command,
    matched_run,
    plain_run,
    throttled_run,
)
from benchmarks.paper.progress import Progress
from benchmarks.paper.summary import summarize
from benchmarks.paper.verdict import judge

BATCH_SIZE = 32
"""The learner's default --batch-size (every cell uses it), for the replay ratio."""


def run(quick: bool, extra: tuple[str, ...] = (), standard: bool = False) -> tuple[list[dict], dict]:
    """`extra`: learner flags for every run (`--learner-args`), e.g. another actor loss; its results go to
    a folder of their own. `standard`: the 150-minute size instead of the full one."""
    if quick and standard:
        raise SystemExit("paper: --quick and --standard are two sizes; give one")
    return experiment(QUICK if quick else STANDARD if standard else FULL, extra)


def experiment(
    recipe: Recipe, extra: tuple[str, ...] = (), out: Path | None = None
) -> tuple[list[dict], dict]:
    """Every run of `recipe` (kept ones read back), then the summary, the verdicts, the results file and
    the figures. `out`: the runs' folder (default the recipe's, kept between sittings)."""
    out = out or recipe.out_dir(extra)
    pinned = pinning.available()
    progress = Progress.begin(recipe, out)
    rows = [
        row
        for n in recipe.envs
        for seed in recipe.seeds
        for row in _cells(recipe, out, n, seed, pinned, extra, progress)
    ]
    summary = summarize(rows, recipe.envs, recipe.name == "quick")
    judged = {f"N{n}": judge(rows, n, recipe.eval_episodes) for n in recipe.envs}
    write_markdown(recipe, rows, summary, out / "summary.md", judged)
    _plots(recipe, out, rows)
    meta = {"recipe": recipe.__dict__, "pinned": pinned, "out_dir": str(out), "learner_args": " ".join(extra)}
    published = _publish(recipe, out, extra, rows, judged, meta)
    return rows, {**meta, **summary, "verdicts_by_rule": judged, **published}


def _publish(
    recipe: Recipe, out: Path, extra: tuple[str, ...], rows: list[dict], judged: dict, meta: dict
) -> dict:
    """The results file (every run with its greedy curve) and the figures drawn from it."""
    json_path, figure_dir = results.published_paths(recipe, out, extra)
    curves = {results.run_key(r): results.read_curve(out / results.run_key(r)) for r in rows}
    doc = results.document(recipe, rows, curves, judged, meta)
    results.write(json_path, doc)
    files = draw(json.loads(json_path.read_text()), figure_dir)
    print(f"paper: results in {json_path}, figures in {figure_dir}", flush=True)
    return {"results_json": str(json_path), "figures": [str(f) for n in files.values() for f in n["files"]]}


def _cells(
    recipe: Recipe,
    out: Path,
    envs: int,
    seed: int,
    pinned: bool,
    extra: tuple[str, ...],
    progress: Progress | None = None,
) -> list[dict]:
    """Every cell of one (N, seed), sync and async first: the controls are sized from their rates."""
    done: dict[str, dict] = {}
    for cell in recipe.cells:
        if cell == "async_throttled":
            spec = throttled_run(recipe, envs, seed, done["sync"]["episodes_per_s"])
        elif cell == "sync_matched":
            a, s = done["async"]["env_steps_per_s"], done["sync"]["env_steps_per_s"]
            spec = matched_run(recipe, envs, seed, a, s)
        else:
            spec = plain_run(recipe, cell, envs, seed)
        done[cell] = _one(recipe, out / spec.key, spec, pinned, extra)
        if progress:
            progress.finished(done[cell])
    return list(done.values())


def _one(recipe: Recipe, run_dir: Path, spec: Run, pinned: bool, extra: tuple[str, ...]) -> dict:
    """One run, trained and evaluated, or its kept result."""
    result = run_dir / "result.json"
    if result.exists():
        row = json.loads(result.read_text())
        print(f"paper: {spec.key}: kept from an earlier sitting", flush=True)
        return row
    if run_dir.exists():
        shutil.rmtree(run_dir)  # interrupted: start over
    run_dir.mkdir(parents=True)
    print(f"paper: {spec.key}: training {recipe.seconds} s ({spec.envs} envs)", flush=True)
    started = time.monotonic()
    lines = run_learner(learner_command(recipe, spec, run_dir, extra), run_dir, recipe.seconds + 600, pinned)
    points = evaluate_snapshots(recipe, run_dir)
    row = {
        "cell": spec.cell, "base_envs": spec.base_envs,
        "envs": spec.envs, "seed": spec.seed, "episode_rate_per_actor": spec.episode_rate_per_actor,
        **run_rates(lines, BATCH_SIZE), **curve_summary(points, recipe.target, recipe.seconds, recipe.snapshot_every),
        "duration_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    result.write_text(json.dumps(row, indent=1))
    print(f"paper: {spec.key}: {json.dumps(row)}", flush=True)
    return row


def _plots(recipe: Recipe, out_dir: Path, rows: list[dict]) -> None:
    """`python -m learner report` over every run of each N: training curves and greedy curves."""
    for n in recipe.envs:
        chosen = [r for r in rows if r["base_envs"] == n and r["seed"] == recipe.seeds[0]]
        dirs = [str(out_dir / f"N{n}" / r["cell"] / f"s{r['seed']}") for r in chosen]
        labels = [r["cell"] for r in chosen]
        out = out_dir / f"report-N{n}"
        cmd = [sys.executable, "-m", "learner", "report", *dirs, "--labels", *labels, "--out", str(out)]
        cmd += ["--target", str(recipe.target)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"paper: report failed: {done.stderr[-1000:]}", file=sys.stderr)
