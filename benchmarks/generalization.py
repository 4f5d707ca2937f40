"""Issue 34's protocol for the pointer policy's generalization features, decided on validation only.

`python -m benchmarks generalization`: for each variant and seed, the README's default run
(`python -m learner`, 2 local actors, MiniLM) for RUN_S seconds trained on `--split dev` (the training
templates without the six validation ones, docs/SIMPHONE.md "Splits"), then its final checkpoint
evaluated greedily (`python -m learner eval`) on `validation` (new phrasings of trained capabilities
and a composed task: 50 episodes per template) and on `dev`. The test split and the held-out templates
are not touched here: `python -m benchmarks generalization_final --learner-args='FLAGS'` trains the
chosen flags on `train` and measures `train` and `test` (about 50 episodes per template) with the nine
held-out templates one by one, for the final numbers only.

Each cell's results are kept under OUT/VARIANT/seedS/ (the run dir and eval JSON): a rerun skips finished
cells (a cell whose training was cut short is trained again), so the hours this takes can be spread over
sessions. Cells run seed by seed, so one seed of every variant comes first. `--learner-args` replaces the
variants by one of its own ("custom"). `--quick`: one seed, two variants, 90 s runs, 10 episodes per template.
The decision (`decide`) is printed with the summary; `python -m benchmarks.generalization` prints what the
finished cells say so far without training anything and, once the baseline's seeds are all done, which
variants no outcome of their missing seeds could keep (`can_be_kept`): their cells cannot change the choice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from actors.envs.simphone.tasks import available, load_templates
from benchmarks.collection import ROOT, run_learner

VARIANTS: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "memory": ("--model.history", "4"),
    "compose": ("--local-actor-args=--compose-rate 0.3",),
    "span": ("--model.span-words", "4"),
    "raw_text": ("--model.raw-instruction",),
    "rename": ("--word-rename-rate", "0.3"),
    "all": ("--model.history", "4", "--model.span-words", "4", "--model.raw-instruction",
            "--word-rename-rate", "0.3", "--local-actor-args=--compose-rate 0.3"),
}  # fmt: skip
"""What is compared, each against `baseline` (the default run); "all" combines them."""
SEEDS = (0, 1, 2)
RUN_S = 900
EPISODES_PER_TEMPLATE = 50
TEMPLATES = load_templates("general")
VALIDATION_TEMPLATES = sum(available(t, "validation") for t in TEMPLATES)
DEV_TEMPLATES = sum(available(t, "dev") for t in TEMPLATES)
HELD_OUT = tuple(t.id for t in TEMPLATES if t.split == "test")
"""general's held-out templates (split "test"), reported per template in the final stage only."""
OUT = ROOT / "runs" / "generalization"


def _learner(run_dir: Path, split: str, seed: int, seconds: int, flags: tuple[str, ...]) -> None:
    cmd = [sys.executable, "-m", "learner", "--run-dir", str(run_dir), "--ingest-port", "0", "--params-port", "0",
           "--split", split, "--seed", str(seed), "--time-limit", str(seconds), "--local-actors", "2",
           "--console", "lines", "--no-tensorboard", *flags]  # fmt: skip
    run_learner(cmd, run_dir, seconds + 900)


def _evaluate(run_dir: Path, split: str, episodes: int, out: Path) -> dict:
    if not out.is_file():
        cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(run_dir), "--split", split,
               "--episodes", str(episodes), "--json", str(out)]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            raise RuntimeError(
                f"eval failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
    return json.loads(out.read_text())


def cell(out: Path, variant: str, flags: tuple[str, ...], seed: int, seconds: int, per_template: int,
         train_split: str, eval_splits: dict[str, int]) -> dict:  # fmt: skip
    """Train one (variant, seed) once and evaluate it on each split of `eval_splits` (split -> templates);
    what is already on disk is reused."""
    folder = out / variant / f"seed{seed}"
    run_dir, trained = folder / "run", folder / "trained"
    if not trained.is_file():  # a run cut short (a session's end) is discarded, not evaluated
        shutil.rmtree(folder, ignore_errors=True)
        _learner(run_dir, train_split, seed, seconds, flags)
        trained.touch()
    row: dict = {"variant": variant, "seed": seed}
    for split, templates in eval_splits.items():
        report = _evaluate(run_dir, split, per_template * templates, folder / f"{split}.json")
        row[split] = report["success"]
        row[f"{split}_min_template"] = min(report["per_template"].values())
        row[f"{split}_per_template"] = report["per_template"]
    return row


def summarize(rows: list[dict], splits: tuple[str, ...]) -> dict:
    """Per variant and split: the mean over seeds and the range."""
    out: dict = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for split in splits:
            values = [r[split] for r in rows if r["variant"] == variant]
            out[f"{variant}/{split}"] = mean_range(values)
    return out


def mean_range(values: list[float]) -> str:
    """The mean and the range over seeds, as text: MEAN [MIN, MAX]."""
    return f"{np.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


DEV_DROP = 0.02
"""The most a kept variant's mean `dev` success may fall below the baseline's."""


def decide(rows: list[dict], baseline: str = "baseline") -> dict:
    """The rule written before any measurement (BENCHMARKS.md "generalization"), applied to complete
    seeds: a variant is kept when its mean `validation` success beats the baseline's by more than the
    seeds' range (the wider of the variant's and the baseline's, the strict reading) and its mean `dev` success
    is at most DEV_DROP below the baseline's. `chosen` is the kept variant with the best validation mean
    (a configuration measured as a whole, never an untried union of flags), or the baseline."""
    by_variant: dict[str, list[dict]] = {}
    for r in rows:
        by_variant.setdefault(r["variant"], []).append(r)
    base = by_variant[baseline]
    base_val = [r["validation"] for r in base]
    verdicts = {}
    for name, cells in by_variant.items():
        if name == baseline:
            continue
        val = [r["validation"] for r in cells]
        spread = float(max(np.ptp(val), np.ptp(base_val)))
        gain = float(np.mean(val) - np.mean(base_val))
        dev_drop = float(np.mean([r["dev"] for r in base]) - np.mean([r["dev"] for r in cells]))
        verdicts[name] = {"gain": gain, "range": spread, "dev_drop": dev_drop,
                          "kept": gain > spread and dev_drop <= DEV_DROP, "mean": float(np.mean(val))}  # fmt: skip
    kept = [name for name, v in verdicts.items() if v["kept"]]
    chosen = max(kept, key=lambda name: verdicts[name]["mean"], default=baseline)
    return {"seeds": len(base), "verdicts": verdicts, "chosen": chosen}


def can_be_kept(rows: list[dict], variant: str, seeds: tuple[int, ...] = SEEDS, steps: int = 300) -> bool:
    """Whether some validation scores of `variant`'s missing seeds would get it kept by `decide`, the
    baseline's seeds complete in `rows`. When not, those cells cannot change the choice and need no
    training. One value for all missing seeds is enough: raising every missing score to their highest
    raises the mean and never widens the range. Their dev scores are taken at 1.0, the best case."""
    have = {r["seed"] for r in rows if r["variant"] == variant}
    missing = [s for s in seeds if s not in have]
    for x in np.linspace(0.0, 1.0, steps + 1):
        filled = rows + [{"variant": variant, "seed": s, "validation": x, "dev": 1.0} for s in missing]
        if decide([r for r in filled if r["variant"] in ("baseline", variant)])["verdicts"][variant]["kept"]:
            return True
    return False


def finished(out: Path = OUT / "full") -> list[dict]:
    """The rows of the cells on disk whose evaluations are written (a report between sessions)."""
    rows = []
    for variant in VARIANTS:
        for seed in SEEDS:
            folder = out / variant / f"seed{seed}"
            reports = {split: folder / f"{split}.json" for split in ("validation", "dev")}
            if all(path.is_file() for path in reports.values()):
                row = {"variant": variant, "seed": seed}
                row.update(
                    {split: json.loads(path.read_text())["success"] for split, path in reports.items()}
                )
                rows.append(row)
    return rows


def run(quick: bool, extra: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    variants = {"custom": extra} if extra else VARIANTS
    if quick:
        variants = dict(list(variants.items())[:2])
    seeds, seconds, per = ((0,), 90, 10) if quick else (SEEDS, RUN_S, EPISODES_PER_TEMPLATE)
    out = OUT / ("quick" if quick else "full")
    splits = {"validation": VALIDATION_TEMPLATES, "dev": DEV_TEMPLATES}
    rows = [
        cell(out, name, flags, seed, seconds, per, "dev", splits)
        for seed in seeds  # seed-major: one seed of every variant first, and a shared machine's load
        for name, flags in variants.items()  # falls on all variants alike
    ]
    table = [{k: v for k, v in r.items() if not k.endswith("_per_template")} for r in rows]
    summary = {"out_dir": str(out), **summarize(rows, tuple(splits))}
    if not extra:
        decision = decide(rows)
        summary["chosen"] = decision["chosen"]
        summary["flags"] = " ".join(variants[decision["chosen"]])
    return table, summary


if __name__ == "__main__":  # python -m benchmarks.generalization: what the finished cells say so far
    done = finished()
    print(json.dumps(summarize(done, ("validation", "dev")), indent=1))
    complete = {r["seed"] for r in done if r["variant"] == "baseline"}
    full_seeds = [s for s in sorted(complete) if sum(r["seed"] == s for r in done) == len(VARIANTS)]
    print(f"seeds with every variant: {full_seeds}")
    if len(complete) == len(SEEDS):
        open_variants = [v for v in VARIANTS if sum(r["variant"] == v for r in done) < len(SEEDS)]
        hopeless = [v for v in open_variants if not can_be_kept(done, v)]
        print(f"variants with missing seeds: {open_variants}; kept by no outcome of those seeds: {hopeless}")
        if hopeless == open_variants:
            print("the decision (the missing cells cannot change it):")
            print(json.dumps(decide(done), indent=1))
    elif full_seeds:
        print("provisional: the rule is for three seeds")
        print(json.dumps(decide([r for r in done if r["seed"] in full_seeds]), indent=1))
