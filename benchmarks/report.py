"""Timing helpers and the table + JSON output every benchmark shares."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table


def best_seconds(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    """Best-of-`repeats` wall time of `inner` calls, per call (the least disturbed run on a noisy machine)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def compiled_gflop(jitted: Callable, *args) -> float:
    """GFLOP of one call of a jitted function on `args`, from XLA's cost_analysis of the compiled call."""
    cost = jitted.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0)) / 1e9


def machine() -> dict:
    import os

    import jax

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
    }


def emit(name: str, rows: list[dict], json_path: str | None, summary: dict | None = None) -> dict:
    """Print rows as tables and write {"benchmark", "machine", "rows", **summary} as JSON (a summary
    over the rows, e.g. the mean over seeds, goes to the top level and is printed under the table).
    Consecutive rows with the same fields share a table: a benchmark of several kinds of rows (act,
    update, bytes) prints a table per kind, not one with every field of every kind as a column."""
    console = Console(width=200)
    for i, group in enumerate(_same_fields(rows)):
        table = Table(title=name if i == 0 else None)
        columns = list(group[0])
        for key in columns:
            table.add_column(key)
        for row in group:
            table.add_row(*(_cell(row.get(k, "")) for k in columns))
        console.print(table)
    if summary:
        console.print("  ".join(f"{k} {_cell(v)}" for k, v in summary.items()))
    result = {"benchmark": name, "machine": machine(), "rows": rows, **(summary or {})}
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    return result


def _same_fields(rows: list[dict]) -> list[list[dict]]:
    """Runs of consecutive rows with the same keys."""
    groups: list[list[dict]] = []
    for row in rows:
        if groups and set(groups[-1][0]) == set(row):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def matmul_gflops(d: int, repeats: int) -> float:
    """A jitted chain of three [4096, d] x [d, d] matmuls on one device (jax.devices()[0]); GFLOP/s: the
    reference that train-step throughput is stated against (jax imported here: workers set devices first)."""
    import jax
    import jax.numpy as jnp

    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (4096, d), jnp.float32)
    w = jax.random.normal(kw, (d, d), jnp.float32) / d
    f = jax.jit(lambda x, w: jnp.tanh(jnp.tanh(x @ w) @ w) @ w)
    f(x, w).block_until_ready()
    inner = 20 if d <= 256 else 2  # ~0.3 ms per call at d=64, ~0.1 s at d=1024
    sec = best_seconds(lambda: f(x, w).block_until_ready(), repeats, inner=inner)
    return 3 * 2 * 4096 * d * d / sec / 1e9
