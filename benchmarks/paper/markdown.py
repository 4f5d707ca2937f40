"""summary.md of `python -m benchmarks paper`: the claims with their verdicts, the decomposition, and a
table of every run, in the words BENCHMARKS.md uses."""

from __future__ import annotations

from pathlib import Path

from benchmarks.paper.plan import CELLS, Recipe

RUN_COLUMNS = (
    "cell", "envs", "seed", "env_steps_per_s", "episodes_per_s", "updates", "rl_updates",
    "alone_updates_per_s", "replay_ratio", "lag_mean", "final_train", "final_test", "auc_test",
    "time_to_target",
)  # fmt: skip

COMPARISONS = (
    ("async_vs_sync", "async against sync (the claims)"),
    ("freshness_and_pipelining", "async_throttled against sync: freshness and pipelining alone"),
    ("more_data", "async against async_throttled: the extra data"),
    ("straggler_cost", "sync_matched against sync: what stragglers cost sync"),
    ("prioritized_vs_uniform", "prioritized against uniform replay (async)"),
    ("correction_vs_none", "off-policy correction against none (async)"),
)


def _fmt(stats: dict | None) -> str:
    if not stats or stats.get("mean") is None:
        return "n/a"
    return f"{stats['mean']} ({stats['min']} to {stats['max']}, {stats['seeds']} seeds)"


def _comparison_line(name: str, words: str, c: dict) -> str:
    if not c:
        return f"| {words} | not run | | | |"
    test = c["final_success_test"]
    return (
        f"| {words} | {_fmt(c['collection'])} | {_fmt(c['training_efficiency'])} ({c['efficiency_bound']}) "
        f"| {_fmt(c['auc_test_ratio'])} | {test['first']} vs {test['second']}: {test['relative']} |"
    )


def write_markdown(recipe: Recipe, rows: list[dict], summary: dict, path: Path) -> None:
    """The whole summary as one markdown file (overwritten)."""
    lines = [
        f"# `python -m benchmarks paper` ({recipe.name})",
        "",
        f"{len(recipe.seeds)} seeds, {recipe.seconds} s per run, time scale {recipe.time_scale}, "
        f"snapshots every {recipe.snapshot_every} s evaluated greedily on {recipe.eval_episodes} episodes "
        f"per split, greedy target {recipe.target} (general/train).",
        "",
    ]
    for n in recipe.envs:
        s = summary[f"N{n}"]
        lines += [f"## N = {n}", "", "| claim | measured | verdict |", "|---|---|---|"]
        for claim, verdict in s["verdicts"].items():
            value = s["claims"][claim]
            shown = _fmt(value) if "mean" in (value or {}) else str((value or {}).get("relative"))
            lines.append(f"| {claim} | {shown} | {verdict} |")
        lines += [
            "", f"Predicted training speedup (min of straggler factor and learner headroom): "
            f"{_fmt(s['predicted_speedup'])}.", "",
            "| comparison | collection | time-to-target ratio | test AUC ratio | final test (relative) |",
            "|---|---|---|---|---|",
        ]  # fmt: skip
        lines += [_comparison_line(key, words, s[key]) for key, words in COMPARISONS]
        lines.append("")
    lines += ["## Runs", "", "| " + " | ".join(RUN_COLUMNS) + " |", "|" + "---|" * len(RUN_COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in RUN_COLUMNS) + " |" for r in rows]
    lines += ["", "## Cells", ""] + [f"- `{k}`: {v}" for k, v in CELLS.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
