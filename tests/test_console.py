"""What users watch: the learner's live panel and progress lines (learner/observe/console.py), the actors' status line."""

from __future__ import annotations

import io
import re
from collections import Counter

import numpy as np
import pytest
from rich.console import Console

from actors.actor import status_line
from common.protocol import Episode
from learner.observe.console import Progress, next_checkpoint, pick_live, print_line, render, success_columns
from learner.observe.metrics import interval
from learner.observe.run_stats import RunStats

FAMILIES = {
    f"{app}.{n}": rate for app, rate in [("app", 0.9), ("notes", 0.5), ("clock", 0.2)] for n in range(3)
}


def window(rates: dict[str, float], n: int = 10) -> dict[str, dict[str, int]]:
    """The record's success_rate window by task: `n` episodes of each task, succeeding at its rate."""
    return {
        "recent_episodes_by_task": dict.fromkeys(rates, n),
        "recent_successes_by_task": {task: round(rate * n) for task, rate in rates.items()},
    }


def episode(task: str, success: bool) -> Episode:
    steps = {"policy_version": np.zeros(3, np.int32), "reward": np.zeros(3, np.float32)}
    return Episode(task, success, False, {}, steps)


def record(wall: float, update: int, env_steps: int, **fields) -> dict:
    """A metrics record as learner/session.py's Session.record builds it (the fields the console reads)."""
    return {
        "run_id": "3f2a9c1b7d4e", "wall": wall, "update": update, "phase": "rl", "env_steps": env_steps,
        "episodes": env_steps // 8, "success_rate": 0.62, "success_by_task": dict(FAMILIES),
        **window(FAMILIES),
        "policy_version": update // 2, "policy_lag_mean": 1.5, "policy_lag_max": 5, "actors": 2,
        "replay_size": 2048, "rejected": 3, "duplicates": 4, "dropped_replies": {"full": 2, "gone": 5},
        "dropped_episodes": 12, "time/train_s": 0.0, **fields,
    }  # fmt: skip


RECORDS = [record(100.0, 1000, 80_000), record(102.0, 1006, 81_600), record(106.0, 1010, 82_000)]


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def text(renderable, width: int = 110) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_rates_come_from_consecutive_records():
    rates = interval(RECORDS[0], RECORDS[1])
    assert rates["rate/env_steps_per_s"] == pytest.approx(800.0)  # 1600 steps in 2 s
    assert rates["rate/updates_per_s"] == pytest.approx(3.0)
    assert interval(RECORDS[1], RECORDS[2])["rate/updates_per_s"] == pytest.approx(1.0)
    assert interval(None, RECORDS[0]) == {}  # the first record has no interval yet
    assert interval(RECORDS[0], RECORDS[0]) == {}


def test_a_share_a_rounding_above_one_is_one_and_time_counted_twice_still_shows():
    """Records written during one long update: wall and time/train_s each rounded to the millisecond, so
    the interval's train time can exceed its wall by up to 2 ms (the suite once saw a share of 1.00x)."""
    during = [
        record(100.0, 5, 800, **{"time/train_s": 40.0}),
        record(100.5, 5, 800, **{"time/train_s": 40.501}),
    ]
    assert interval(*during)["time/train_share"] == 1.0
    assert interval(*during)["time/train_interval_s"] == pytest.approx(0.5)
    twice = [during[0], record(100.5, 5, 800, **{"time/train_s": 41.0})]
    assert interval(*twice)["time/train_share"] == pytest.approx(2.0)


def test_panel_shows_every_field():
    out = text(render(RECORDS[1], interval(RECORDS[0], RECORDS[1]), checkpoint_every=200))
    for expected in (
        r"actors\s+2", r"env steps/s\s+800\.0", r"updates/s\s+3\.0", r"replay\s+2048", r"update\s+1006",
        r"policy\s+v503", r"success\s+0\.62", r"policy lag\s+1\.5 mean / 5 max", r"rejected\s+3",
        r"dropped episodes\s+12", r"dropped replies\s+7", r"duplicates\s+4",
        r"next checkpoint\s+update 1200 in ~65s",  # 194 updates at 3/s
        r"app\s+0\.90", r"notes\s+0\.50", r"clock\s+0\.20",  # 9 templates: grouped by family
        "run 3f2a9c1b7d4e", "learner · rl · 102s",
    ):  # fmt: skip
        assert re.search(expected, out), (expected, out)
    assert "app.0" not in out


def test_panel_before_any_interval_and_without_checkpoints():
    out = text(render(RECORDS[0], {}, checkpoint_every=0))
    assert re.search(r"env steps/s\s+-", out) and re.search(r"updates/s\s+-", out), out
    assert re.search(r"next checkpoint\s+-", out), out


def test_next_checkpoint():
    assert next_checkpoint(0, 0, 5.0) == "-"
    assert next_checkpoint(190, 200, 2.0) == "update 200 in ~5s"
    assert next_checkpoint(200, 200, 2.0) == "update 400 in ~100s"  # just saved: the next one
    assert next_checkpoint(10, 200, None) == "update 200"  # no rate yet
    assert next_checkpoint(10, 200, 0.0) == "update 200"  # not training (waiting for data)


def test_few_tasks_are_shown_by_name():
    few = record(1.0, 0, 0, **window({"open_app": 0.75, "toggle": 0.25}, n=4))
    out = text(render(few, {}, 0))
    assert re.search(r"open_app\s+0\.75", out) and re.search(r"toggle\s+0\.25", out), out


def test_lines_mode_prints_the_progress_line():
    console = Console(file=FakeTTY(), width=200, force_terminal=True)  # lines even on a terminal
    progress = Progress(console, "lines", checkpoint_every=200)
    assert not progress.live
    for m in RECORDS[:2]:
        progress.show(m)
    progress.close(RECORDS[2])  # the final record is printed too
    lines = console.file.getvalue().splitlines()
    assert lines == [
        f"{m['wall']:6.1f}s rl     upd {m['update']:5d} v{m['policy_version']:<4d} eps {m['episodes']:6d} "
        "success 0.62 lag 1.5 actors 2 replay 2048 rej 3 | app 0.90 notes 0.50 clock 0.20"
        for m in RECORDS
    ]


def test_print_line_keeps_the_documented_format():
    console = Console(file=io.StringIO(), width=300)
    print_line(console, record(12.34, 5, 96, phase="warmup", **window({"open_app": 0.5})))
    print_line(console, record(87.2, 189, 96, **window({"open_app": 0.5})))
    assert console.file.getvalue().splitlines() == [
        "  12.3s warmup upd     5 v2    eps     12 success 0.62 lag 1.5 actors 2 replay 2048 rej 3 | open_app 0.50",
        "  87.2s rl     upd   189 v94   eps     12 success 0.62 lag 1.5 actors 2 replay 2048 rej 3 | open_app 0.50",
    ]  # the phase in a column of its own


def test_the_family_columns_and_the_headline_share_one_window():
    """A warm-up of 300 failures, then 100 episodes: the headline is those 100, and each family column is
    the success of that family's episodes among the same 100 (not a mean of per-template windows that
    reach back into the warm-up), so the headline is the columns' mean weighted by their episodes."""
    stats = RunStats()
    templates = [f"{app}.{k}" for app, n in [("app", 4), ("browser", 3), ("clock", 3)] for k in range(n)]
    warmup = [(templates[i % len(templates)], False) for i in range(300)]
    last = [(f"app.{i % 4}", i < 30) for i in range(40)] + [(f"browser.{i % 3}", i < 15) for i in range(30)]
    last += [(f"clock.{i % 3}", False) for i in range(30)]
    stats.on_episodes([episode(task, ok) for task, ok in warmup + last], newest_version=0)
    m = record(
        9.0, 1, 8000, success_rate=stats.success_rate(), success_by_task=stats.tasks.values(),
        **stats.recent_by_task(),
    )  # fmt: skip
    assert success_columns(m) == {"app": 30 / 40, "browser": 15 / 30, "clock": 0.0}
    in_window = {
        f: [ok for task, ok in last if task.startswith(f + ".")] for f in ("app", "browser", "clock")
    }
    assert success_columns(m) == {f: sum(oks) / len(oks) for f, oks in in_window.items()}
    assert m["success_rate"] == pytest.approx(0.45)
    weights = {f: len(oks) for f, oks in in_window.items()}
    weighted = sum(success_columns(m)[f] * n for f, n in weights.items()) / sum(weights.values())
    assert weighted == pytest.approx(m["success_rate"])
    per_template = [v for task, v in m["success_by_task"].items() if task.startswith("app.")]
    assert sum(per_template) / len(per_template) < success_columns(m)["app"]  # what the line showed before
    console = Console(file=io.StringIO(), width=300)
    print_line(console, m)
    assert (
        console.file.getvalue()
        .rstrip()
        .endswith("success 0.45 lag 1.5 actors 2 replay 2048 rej 3 | app 0.75 browser 0.50 clock 0.00")
    )


def test_auto_is_live_on_a_terminal_only():
    assert not pick_live("auto", Console(file=io.StringIO()))
    assert pick_live("auto", Console(file=FakeTTY()))
    assert not pick_live("auto", Console(file=io.StringIO(), force_terminal=True))  # e.g. FORCE_COLOR in CI
    assert pick_live("live", Console(file=io.StringIO()))
    assert not pick_live("lines", Console(file=FakeTTY()))


def test_live_panel_redraws_prints_messages_above_and_stops():
    console = Console(file=FakeTTY(), width=110, force_terminal=True, record=True)
    progress = Progress(console, "auto", checkpoint_every=200)
    assert progress.live
    progress.show(RECORDS[0])
    console.print("learner: train step compiled in 1.0s")  # other messages go through the same console
    progress.show(RECORDS[1])
    progress.close(RECORDS[2])
    progress.close()  # idempotent
    raw = console.file.getvalue()
    assert raw.rindex("\x1b[?25h") > raw.rindex("\x1b[?25l")  # the cursor is visible again: stopped
    out = console.export_text()
    assert "learner: train step compiled in 1.0s" in out
    assert re.search(r"updates/s\s+1\.0", out), out  # the final frame (4 updates in 4 s)
    assert "upd  1000" not in out  # no progress lines in live mode


def test_a_live_panel_that_never_showed_a_record_closes_quietly():
    console = Console(file=FakeTTY(), force_terminal=True)
    Progress(console, "live", checkpoint_every=0).close()
    assert console.file.getvalue() == ""


def test_actor_status_line_is_short():
    stats = Counter(
        episodes_finished=40, successes=10, batches_sent=12, episodes_acked=36, env_steps=900, param_swaps=3,
        device_hang=2, device_bad_output=1, device_bad_output_bad_xml=1, reset_crash=1, reset_retries=1,
    )  # fmt: skip
    line = status_line(3, 17, 41.25, stats, held=4)
    assert line == (
        "actor 3: policy v17, 41.2 steps/s, 40 episodes (success 0.25), sent 12, acked 36, held 4, faults 4"
    )
    assert status_line(1, 0, 0.0, Counter(), held=0).endswith(
        "0 episodes (success 0.00), sent 0, acked 0, held 0, faults 0"
    )
    timed = status_line(1, 0, 0.0, Counter(act_us=3_000_000, act_calls=2), held=0)
    assert timed.endswith("faults 0, act 1500 ms")  # the mean batched policy call
    staged = Counter(act_us=3_000_000, act_calls=2, act_prefill_us=2_400_000, act_decode_us=600_000)
    assert status_line(1, 0, 0.0, staged, held=0).endswith("act 1500 ms (prefill 1200 + decode 300)")
