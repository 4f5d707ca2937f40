"""Issue 34's final numbers: `python -m benchmarks generalization_final --learner-args='FLAGS'` trains the
flags chosen on validation (benchmarks/generalization.py) on `train`, three seeds of the 15-minute run,
and measures greedily `general`/train (about 50 episodes per training template: 1,900 per seed) and
`general`/test (about 50 per template: 2,350 per seed, drawn uniformly over the templates) with its nine
held-out templates per template: the issue's goals are train >= 0.95, test >= 0.90, held-out >= 0.75 on
average with none at 0.
Run it once the choice is made; the results say nothing that may feed back into the choice.
"""

from __future__ import annotations

import numpy as np

from actors.envs.simphone.tasks import available
from benchmarks.generalization import (
    EPISODES_PER_TEMPLATE,
    HELD_OUT,
    OUT,
    RUN_S,
    SEEDS,
    TEMPLATES,
    cell,
    mean_range,
)

TEST_TEMPLATES = len(TEMPLATES)
TRAIN_TEMPLATES = sum(available(t, "train") for t in TEMPLATES)


def run(quick: bool, extra: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    seeds, seconds = ((0,), 90) if quick else (SEEDS, RUN_S)
    out = OUT / ("final-quick" if quick else "final")
    per = 2 if quick else EPISODES_PER_TEMPLATE
    rows = []
    for seed in seeds:
        splits = {"train": TRAIN_TEMPLATES, "test": TEST_TEMPLATES}
        row = cell(out, "chosen", extra, seed, seconds, per, "train", splits)
        row.pop("train_per_template")
        per_template = row.pop("test_per_template")
        held = [per_template.get(t, float("nan")) for t in HELD_OUT]
        row["held_out_mean"] = float(np.nanmean(held))
        row["held_out_at_zero"] = sum(v == 0 for v in held)
        row.update({f"held/{t}": per_template.get(t) for t in HELD_OUT})
        rows.append(row)
    summary = {
        "learner_args": " ".join(extra),
        **{split: mean_range([r[split] for r in rows]) for split in splits},
        "held_out_mean": f"{np.mean([r['held_out_mean'] for r in rows]):.3f}",
    }
    return rows, summary
