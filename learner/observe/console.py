"""What the learner shows while it trains: a live panel on a terminal, one progress line per record otherwise.

The loop builds a metrics record every --log-every seconds; `Progress.show` takes each one. On a terminal a
rich `Live` panel is redrawn in place (actors, throughput, replay, lag, success per task family, rejects and
drops, the next checkpoint), and the learner's other messages, printed through the same console, scroll
above it. Logs, pipes and CI get the one-line form instead, which tools and people grep.

One window for every success number: the headline (`success`, the record's success_rate) is the last
100 episodes (learner/observe/run_stats.py SUCCESS_WINDOW), and the columns per task or family (after the
`|` of the line, "success by task" in the panel) are the success of that task's or family's episodes among
those same 100 (the record's recent_episodes_by_task and recent_successes_by_task). So the headline is the
columns' mean weighted by their episodes, and a family below it is one the policy solves less often.
(The record's success_by_task, each template's own last 100 episodes, reaches back further for rare
templates: it is what the instruction critic judges by, and what the dashboards plot per task.)
"""

from __future__ import annotations

import atexit
from typing import Any, Literal

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table

from learner.observe.metrics import interval

ConsoleMode = Literal["auto", "live", "lines"]
MAX_TASKS = 6
"""With more task templates than this in the window (SimPhone's), success is shown per family (the name
before the first dot)."""


def is_tty(console: Console) -> bool:
    """Whether the console writes to a real, capable terminal. The file's own isatty(), not rich's
    is_terminal, which FORCE_COLOR turns on in CI logs where a redrawn panel would be garbage."""
    isatty = getattr(console.file, "isatty", None)
    return bool(isatty and isatty()) and not console.is_dumb_terminal and not console.is_jupyter


def pick_live(mode: ConsoleMode, console: Console) -> bool:
    """--console: "live" or "lines" as asked; "auto" is live on a terminal only."""
    return mode == "live" or (mode == "auto" and is_tty(console))


def by_family(episodes: dict[str, int], successes: dict[str, int]) -> dict[str, float]:
    """Success per task among the headline's window, or with many templates per family (the prefix before
    the first dot): a group's successes over its episodes in that window, so that the columns and the
    headline describe the same episodes. `episodes` and `successes` are counts per task (the record's
    recent_episodes_by_task and recent_successes_by_task)."""
    many = len(episodes) > MAX_TASKS
    counts: dict[str, list[int]] = {}
    for task, n in episodes.items():
        group = counts.setdefault(task.split(".")[0] if many else task, [0, 0])
        group[0] += successes.get(task, 0)
        group[1] += n
    return {name: won / n for name, (won, n) in counts.items() if n}


def success_columns(m: dict[str, Any]) -> dict[str, float]:
    """The per-task or per-family success columns of record `m` (see `by_family`)."""
    return by_family(m["recent_episodes_by_task"], m["recent_successes_by_task"])


def print_line(console: Console, m: dict[str, Any]) -> None:
    """The one-line progress form (its format is stable: logs and tests grep it). The phase ("warmup" or
    "rl") comes first: a benchmark's numbers mean different things in each."""
    tasks = " ".join(f"{k} {v:.2f}" for k, v in success_columns(m).items())
    console.print(
        f"{m['wall']:6.1f}s {m['phase']:<6} upd {m['update']:5d} v{m['policy_version']:<4d} eps {m['episodes']:6d} "
        f"success {m['success_rate']:.2f} lag {m['policy_lag_mean']:.1f} actors {m['actors']} "
        f"replay {m['replay_size']} rej {m['rejected']}{_in_flight(m)} | {tasks}",
        highlight=False,
        soft_wrap=True,
    )


def _in_flight(m: dict[str, Any]) -> str:
    """ " updating 34s" once an update has run a second (a 135M decoder's takes a minute on 2 cores),
    else "" (the pointer policy's take milliseconds)."""
    seconds = m.get("update_in_flight_s") or 0.0
    return f" updating {seconds:.0f}s" if seconds >= 1.0 else ""


def next_checkpoint(update: int, checkpoint_every: int, updates_per_s: float | None) -> str:
    """The update of the next checkpoint and, at the current rate, about when; "-" when checkpoints are off."""
    if not checkpoint_every:
        return "-"
    due = (update // checkpoint_every + 1) * checkpoint_every
    if not updates_per_s or updates_per_s <= 0:
        return f"update {due}"
    return f"update {due} in ~{(due - update) / updates_per_s:.0f}s"


def _rate(rates: dict[str, float], key: str) -> str:
    return f"{rates[key]:.1f}" if key in rates else "-"


def render(m: dict[str, Any], rates: dict[str, float], checkpoint_every: int) -> Panel:
    """The panel for record `m`; `rates` are metrics.interval() from the previous record (empty: none)."""
    stats = Table.grid(padding=(0, 2))
    for width in (8, 22, 18):  # the widest usual values: the panel keeps its size from frame to frame
        stats.add_column(style="dim")
        stats.add_column(min_width=width)
    dropped_replies = sum(m["dropped_replies"].values())
    stats.add_row(
        "update", str(m["update"]),
        "policy", f"v{m['policy_version']}",
        "actors", str(m["actors"]),
    )  # fmt: skip
    stats.add_row(
        "env steps/s", _rate(rates, "rate/env_steps_per_s"),
        "updates/s", _rate(rates, "rate/updates_per_s"),
        "replay", str(m["replay_size"]),
    )  # fmt: skip
    stats.add_row(
        "episodes", str(m["episodes"]),
        "success", f"{m['success_rate']:.2f}",
        "policy lag", f"{m['policy_lag_mean']:.1f} mean / {m['policy_lag_max']} max",
    )  # fmt: skip
    stats.add_row(
        "rejected", str(m["rejected"]),
        "dropped episodes", str(m["dropped_episodes"]),
        "dropped replies", str(dropped_replies),
    )  # fmt: skip
    stats.add_row(
        "duplicates", str(m["duplicates"]),
        "next checkpoint", next_checkpoint(m["update"], checkpoint_every, rates.get("rate/updates_per_s")),
        "", "",
    )  # fmt: skip
    tasks = Table.grid(padding=(0, 2))
    families = success_columns(m)
    columns = 4
    for _ in range(columns):
        tasks.add_column()
        tasks.add_column(justify="right")
    cells = [(name, f"{rate:.2f}") for name, rate in families.items()]
    for row in range(0, len(cells), columns):
        chunk = cells[row : row + columns]
        tasks.add_row(*(x for cell in chunk for x in cell))
    title = f"learner · {m['phase']} · {m['wall']:.0f}s"
    body = Group(stats, Rule("success by task", style="dim"), tasks) if families else stats
    return Panel(body, title=title, subtitle=f"run {m['run_id']}", expand=False)


class Progress:
    """Shows each metrics record: redraws the live panel, or prints the progress line.

    The Live display starts at the first record (so a start-up failure leaves no terminal state behind)
    and `close` stops it; close is idempotent and also runs at interpreter exit, so a crash never
    leaves the cursor hidden."""

    def __init__(self, console: Console, mode: ConsoleMode, checkpoint_every: int):
        self.console = console
        self.live = pick_live(mode, console)
        self.checkpoint_every = checkpoint_every
        self._prev: dict[str, Any] | None = None
        self._live: Live | None = None

    def show(self, m: dict[str, Any]) -> None:
        rates = interval(self._prev, m)
        self._prev = m
        if not self.live:
            print_line(self.console, m)
            return
        panel = render(m, rates, self.checkpoint_every)
        if self._live is None:
            self._live = Live(panel, console=self.console, auto_refresh=False, redirect_stderr=True)
            self._live.start()
            atexit.register(self.close)
        self._live.update(panel, refresh=True)

    def close(self, last: dict[str, Any] | None = None) -> None:
        """Show the final record (if given), then stop the panel; it stays on screen as the last frame."""
        try:
            if last is not None:
                self.show(last)
        finally:
            if self._live is not None:
                self._live.stop()
                atexit.unregister(self.close)
                self._live = None
