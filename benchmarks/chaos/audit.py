"""What `python -m benchmarks chaos` checks after its soak, from the processes' own records only: the
actors' --ack-log files, the learner's write-ahead log (kept whole by --keep-log) and its metrics.jsonl,
the soak's events and memory samples, and /proc.

- `lost`: batches an actor saw acknowledged that no intact log record holds (must be 0);
- `logged_twice`: (instance, seq) pairs with more than one intact batch record (must be 0);
- `episode_mismatches`: acknowledged batches whose episode count differs from their record's (must be 0);
- `stored_twice`: the final learner's replay counted `added + dropped_stale_at_add` episodes against the
  log's episodes: anything above 0 was stored more than once (must be 0), anything below is missing;
- `lost_in_restart`: the largest `batches_lost_in_restart` any learner counted (must be 0);
- `left_running`: processes whose command line names the soak's folder, after the stop (must be 0);
- per role, the largest resident memory, and its growth over each long incarnation;
- `recovery_after_disk_s`: per lifted disk fault, seconds until the next batch was acknowledged;
- `updates_after_last_fault`: what the final learner trained in the calm period (must be > 0);
- per learner restart, the updates trained again (killed at update U, resumed from the checkpoint at R),
  and `redone_past_interval`: restarts that trained again more than the checkpoint interval's updates
  (must be none, unless that learner's saves failed on the full disk: `checkpoint_errors`).
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.chaos.soak import Soak, metrics_lines
from common.trajectory_file import parse_record
from learner.ingest.wal import WriteAheadLog, scan_segment, unpack_batch

SAVE_MARGIN_S = 15.0
"""Slack on the checkpoint interval: a save that was due may still be writing (orbax, then the files)."""


def logged_batches(wal_dir: Path) -> tuple[Counter, dict[tuple[str, int], int], int]:
    """(records per (instance, seq), episodes per (instance, seq), tombstones) of the intact records."""
    pairs: Counter = Counter()
    episodes: dict[tuple[str, int], int] = {}
    tombstones = 0
    for _first, path in WriteAheadLog(wal_dir, "os").segments():
        records, _ = scan_segment(path.read_bytes(), Counter())
        for record in records:
            instance, seq, raw = unpack_batch(record.payload)
            if len(raw) == 0:
                tombstones += 1
                continue
            pairs[(instance, seq)] += 1
            episodes[(instance, seq)] = len(parse_record(raw)["episodes"]["task"])  # packed: one task each
    return pairs, episodes, tombstones


def recovery_after_disk(soak: Soak) -> list[float]:
    """Per lifted disk fault, seconds until the first batch was newly acknowledged after it (actors resend
    what was refused `unavailable` at the learner's next HEARTBEAT, sent at once when its log works)."""
    acks = sorted(
        row["time"] - soak.t0_unix
        for path in soak.out.glob("acks-*.jsonl")
        for row in map(json.loads, filter(str.strip, path.read_text().splitlines()))
        if row["how"] == "ack"
    )
    delays = []
    for event in soak.events:
        if event["event"] == "disk_back":
            after = [t for t in acks if t >= event["t"]]
            if after:
                delays.append(after[0] - event["t"])
    return delays


def acknowledged(out: Path) -> dict[tuple[str, int], int]:
    """Every batch any actor saw acknowledged, with its episode count (from their --ack-log files)."""
    acked: dict[tuple[str, int], int] = {}
    for path in sorted(out.glob("acks-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():  # a killed actor's last line is whole: each is one flushed write
                row = json.loads(line)
                acked[(row["instance"], row["seq"])] = row["episodes"]
    return acked


def left_running(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def restarts(lines: list[dict], interval_s: float) -> list[dict]:
    """Per learner restart (a new run_id): the update its predecessor reached, the one it resumed at, and
    the most it may train again: what the predecessor trained in its last `interval_s` (the wall-time
    checkpoint interval) plus SAVE_MARGIN_S, so a restart never redoes more than one interval."""
    by_run: dict[str, list[dict]] = {}
    for m in lines:
        by_run.setdefault(m["run_id"], []).append(m)
    out = []
    for before, after in itertools.pairwise(by_run.values()):
        last = before[-1]
        floor = [m["update"] for m in before if m["wall"] <= last["wall"] - interval_s - SAVE_MARGIN_S]
        out.append({
            "reached": last["update"], "resumed": after[0]["update"],
            "redone": last["update"] - after[0]["update"],
            "bound": last["update"] - max(floor, default=before[0]["update"]),
            "checkpoint_errors": last.get("checkpoint/errors", 0),
        })  # fmt: skip
    return out


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"n": len(values), "p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)),
            "max": float(max(values))}  # fmt: skip


WARMUP_SAMPLES = 60
"""Memory samples (2 s apart) left out at the start of an incarnation: start-up, the compile, the first
snapshot and the replay filling up all grow it legitimately."""
JUDGED_SAMPLES = 120
"""Samples after the warm-up an incarnation needs before its growth is judged (4 minutes)."""


def memory(soak: Soak) -> dict:
    """Per role: the largest resident memory, and the largest growth of a long incarnation after its
    warm-up (its last quarter's mean over its first quarter's); None when no incarnation lived that long."""
    out = {}
    for role in soak.roles:
        samples = np.array(role.rss_mb) if role.rss_mb else np.zeros((0, 3))
        growth = []
        for inc in np.unique(samples[:, 1]) if len(samples) else []:
            series = samples[samples[:, 1] == inc, 2][WARMUP_SAMPLES:]
            if len(series) >= JUDGED_SAMPLES:
                q = len(series) // 4
                growth.append(float(series[-q:].mean() / series[:q].mean()))
        out[role.name] = {"max_mb": float(samples[:, 2].max()) if len(samples) else 0.0,
                          "growth": max(growth, default=None)}  # fmt: skip
    return out


def audit(soak: Soak) -> dict:
    pairs, episodes, tombstones = logged_batches(soak.run_dir / "wal")
    acked = acknowledged(soak.out)
    lines = metrics_lines(soak.run_dir)
    last = lines[-1]
    final_run = [m for m in lines if m["run_id"] == last["run_id"]]
    log_episodes = sum(episodes.values())
    stored = last["replay/added"] + last["replay/dropped_stale_at_add"]
    redo = restarts(lines, soak.cfg.checkpoint_every_s)
    return {
        "faults": dict(soak.faults),
        "exits": dict(soak.exits),
        "exit_reasons": sorted({e["why"] for e in soak.events if e["event"] == "exited"}),
        "proxy_faults": {k: v for k, v in soak.proxy.counts.items() if k != "pass"},
        "messages_proxied": sum(soak.proxy.counts.values()),
        "batches_acked": len(acked),
        "episodes_acked": sum(acked.values()),
        "batches_logged": len(pairs),
        "tombstones": tombstones,
        "lost": sum(1 for key in acked if key not in pairs),
        "logged_twice": sum(n - 1 for n in pairs.values() if n > 1),
        "episode_mismatches": sum(1 for key, n in acked.items() if key in episodes and episodes[key] != n),
        "stored_twice": stored - log_episodes,
        "recovery_after_disk_s": _percentiles(recovery_after_disk(soak)),
        "lost_in_restart": max(m.get("batches_lost_in_restart", 0) for m in lines),
        "left_running": left_running(str(soak.out)),
        "memory": memory(soak),
        "updates_after_last_fault": soak.updates_since_last_fault(final_run),
        "learner_restarts": len(redo),
        "updates_redone": [r["redone"] for r in redo],
        "redone_past_interval": [r for r in redo if r["redone"] > r["bound"]],
        "final_update": last["update"],
        "checkpoint_errors": last.get("checkpoint/errors", 0),
        "metrics_lines_dropped": max(m.get("metrics_lines_dropped", 0) for m in lines),
        "stopped": last.get("stopped"),
    }
