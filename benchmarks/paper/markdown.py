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


def _end(value: float | None) -> str:
    """An interval's end; None is an end without a bound (verdict.py writes inf as null)."""
    return "inf" if value is None else str(value)


def _rule_lines(judged: dict) -> list[str]:
    """The claims and ablations as benchmarks/paper/verdict.py judges them, one table each."""
    lines = ["Verdicts by the rules fixed before the run (benchmarks/paper/verdict.py):", ""]
    lines += [
        "| claim | per seed (low to high) | paper | holds at | verdict | direction |",
        "|---|---|---|---|---|---|",
    ]
    for claim, c in judged["claims"].items():
        seeds = "; ".join(
            f"s{s}: {_end(v['low'])} to {_end(v['high'])} ({v['kind']})" for s, v in c["per_seed"].items()
        )
        left = f"; left out: {c['left_out']}" if c["left_out"] else ""
        cells = [claim, seeds + left, c["paper"], c["threshold"], c["verdict"], c["direction"]]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    lines += [
        "",
        "| ablation | alternative - default, final train (se) per seed: the rule decides on train | decision | why |",
        "|---|---|---|---|",
    ]
    for name, a in judged["ablations"].items():
        seeds = "; ".join(f"s{s}: {v['difference']} ({v['se']})" for s, v in a["per_seed"].items())
        lines.append(f"| {name} | {seeds} | {a['decision']} | {a['reason']} |")
    return [*lines, ""]


def write_markdown(
    recipe: Recipe, rows: list[dict], summary: dict, path: Path, judged: dict | None = None
) -> None:
    """The whole summary as one markdown file (overwritten); `judged`: verdict.judge's output per N."""
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
        lines += [f"## N = {n}", "", "| claim | measured | mean against the paper |", "|---|---|---|"]
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
        if judged:
            lines += _rule_lines(judged[f"N{n}"])
    lines += ["## Runs", "", "| " + " | ".join(RUN_COLUMNS) + " |", "|" + "---|" * len(RUN_COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in RUN_COLUMNS) + " |" for r in rows]
    lines += ["", "## Cells", ""] + [f"- `{k}`: {v}" for k, v in CELLS.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
