"""What `python -m benchmarks chaos` checks after its soak, from the processes' own records only: the
actors' --ack-log files, the learner's audit log (--audit-log: a line per batch its write-ahead log took;
the log itself is pruned at every checkpoint, as in production) and its metrics.jsonl and output, the
soak's events and samples, and /proc.

- `lost`: batches an actor saw acknowledged that the learner (with several processes: the process it
  delivers to) never logged (must be 0);
- `logged_twice`: (instance, seq) pairs logged at more than one log position (must be 0);
- `episode_mismatches`: acknowledged batches whose episode count differs from their record's (must be 0);
- `stored_twice`: the final learner's replay counted `added + dropped_stale_at_add` episodes against the
  logged batches' episodes: anything above 0 was stored more than once (must be 0), anything below is
  missing (a restore that lost records would show here); with several processes, the one furthest off;
- `diverged`: with several processes, 1 when their final records differ in update or parameters digest
  (every process of the job takes the same steps; must be 0);
- `replay_unaccounted`: metrics lines whose replay size is not what was added minus what was evicted or
  dropped as stale, so a restore that came back with fewer episodes than its checkpoint held (must be 0);
- `restores`: learner restarts that resumed a checkpoint, and the episodes they read back from the log;
- `log_mb`: the write-ahead log's size on disk over the run, reported: its largest, the largest in each
  half, at the end;
- `log_pruning`: after the stop, each process's log against the last two complete checkpoints
  (benchmarks/chaos/log_pruning.py): `excess_segments`, kept though all their records are older than what
  the checkpoint before the final one needs (a stalled prune: the log grows with the run; must be 0),
  and `short`, logs missing a record the final checkpoint needs (must be 0);
- `lost_in_restart`: the largest `batches_lost_in_restart` any learner counted (must be 0);
- `left_running`: processes whose command line names the soak's folder, after the stop (must be 0);
- per role, the largest resident memory, and its growth over each long incarnation;
- `recovery_after_disk_s`: per lifted disk fault, seconds until the next batch was acknowledged;
- `restart_recovery_s`: per learner restart, seconds until any actor had a batch acknowledged again (the
  learner's own start-up: restore, bind, accept), the part of `remote_recovery_s` that is not the
  inference service's;
- `remote_recovery_s`: per learner restart, seconds until the actor on the inference service had a batch
  acknowledged again; the inference service's requests and refusals over the learner's incarnations;
- `updates_after_last_fault`: what the final learner trained in the calm period (must be > 0);
- per learner restart, the updates trained again (killed at update U, resumed from the checkpoint at R),
  and `redone_past_interval`: restarts that trained again more than the checkpoint interval's updates
  (must be none, unless that learner's saves failed on the full disk: `checkpoint_errors`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.chaos.log_pruning import judge
from benchmarks.chaos.processes import dir_bytes
from benchmarks.chaos.soak import REMOTE_ACTOR, Soak, metrics_lines
from learner.ingest import audit as audit_file

SAVE_MARGIN_S = 15.0
"""Slack on the checkpoint interval: a save that was due may still be writing (orbax, then the files)."""


def logged_batches(path: Path) -> tuple[dict[tuple[str, int], set[int]], dict[tuple[str, int], int], int]:
    """From the learner's audit log: (log positions per (instance, seq) of stored batches, their
    episodes, tombstones)."""
    positions: dict[tuple[str, int], set[int]] = {}
    episodes: dict[tuple[str, int], int] = {}
    tombstones = set()
    for line in audit_file.read(path):
        key = (line["instance"], line["seq"])
        if line["outcome"] == "refused":
            tombstones.add(line["lsn"])
            continue
        positions.setdefault(key, set()).add(line["lsn"])
        episodes[key] = line["episodes"]
    return positions, episodes, len(tombstones)


def acks_after(soak: Soak, times: list[float], actor: str | None = None) -> list[float]:
    """Per soak time in `times`, seconds until the next new acknowledgement (of `actor`'s, or anyone's)."""
    pattern = f"acks-{actor or '*'}.jsonl"
    acks = sorted(
        row["time"] - soak.t0_unix
        for path in soak.out.glob(pattern)
        for row in map(json.loads, filter(str.strip, path.read_text().splitlines()))
        if row["how"] == "ack"
    )
    delays = []
    for t in times:
        after = [a for a in acks if a >= t]
        if after:
            delays.append(after[0] - t)
    return delays


def recovery_after_disk(soak: Soak) -> list[float]:
    """Per lifted disk fault, seconds until the first batch was newly acknowledged after it (actors resend
    what was refused `unavailable` at the learner's next HEARTBEAT, sent at once when its log works)."""
    return acks_after(soak, [e["t"] for e in soak.events if e["event"] == "disk_back"])


def learner_restarts(soak: Soak) -> list[float]:
    """Soak times at which the learner (process 0 of a job) was started again."""
    first = soak.learners[0].name
    return [e["t"] for e in soak.events if e["event"] == "start" and e["role"] == first][1:]


def remote_recovery(soak: Soak) -> list[float]:
    """Per learner restart, seconds until the actor on the inference service had a batch acknowledged
    (none: a multi-process learner runs no inference service)."""
    if soak.cfg.processes > 1:
        return []
    return acks_after(soak, learner_restarts(soak), f"actor{REMOTE_ACTOR}")


def replay_unaccounted(lines: list[dict]) -> int:
    """Metrics lines whose replay size differs from what its counters say it holds."""
    bad = 0
    for m in lines:
        held = (
            m["replay/added"]
            - m["replay/evicted_fifo"]
            - (m["replay/dropped_stale"] - m["replay/dropped_stale_at_add"])
        )
        bad += held != m["replay/size"]
    return bad


RESTORED = re.compile(
    r"resuming from the checkpoint at update (\d+).*?(\d+) episodes in the replay \((\d+) read back"
)


def restores(log: Path) -> list[dict]:
    """Each learner start that resumed a checkpoint: its update, the replay's episodes, how many of them
    were read back from the write-ahead log (the rest were copied into the replay file)."""
    found = RESTORED.findall(log.read_text(errors="replace")) if log.exists() else []
    return [{"update": int(u), "episodes": int(n), "read_back": int(r)} for u, n, r in found]


def log_size(soak: Soak) -> dict:
    """The write-ahead log's size on disk: the largest, the largest in each half of the run, and after
    the stop (its final checkpoint pruned it)."""
    final = sum(dir_bytes(soak.process_dir(rank) / "wal") for rank in range(soak.cfg.processes)) / 2**20
    if not soak.log_bytes:
        return {"max_mb": 0.0, "first_half_mb": 0.0, "second_half_mb": 0.0, "final_mb": final}
    t, size = np.array(soak.log_bytes, np.float64).T
    half = t <= t[-1] / 2
    mb = size / 2**20
    return {"max_mb": float(mb.max()), "first_half_mb": float(mb[half].max()),
            "second_half_mb": float(mb[~half].max()) if (~half).any() else 0.0, "final_mb": final}  # fmt: skip


def inference_service(lines: list[dict]) -> dict:
    """The inference service's requests and refusals, summed over the learner's incarnations (each
    incarnation's last metrics line)."""
    last = {m["run_id"]: m for m in lines}
    requests = sum(m.get("inference/requests", 0) for m in last.values())
    refused: Counter = Counter()
    for m in last.values():
        refused.update(m.get("inference/rejected_by_reason") or {})
    return {"requests": requests, "refused": dict(refused)}


def acknowledged(out: Path, pattern: str = "acks-*.jsonl") -> dict[tuple[str, int], int]:
    """Every batch any actor (or those whose --ack-log matches `pattern`) saw acknowledged, with its
    episode count (from their --ack-log files)."""
    acked: dict[tuple[str, int], int] = {}
    for path in sorted(out.glob(pattern)):
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
        last, resumed = before[-1], after[0]["resumed_update"]  # a first record may come after updates
        floor = [m["update"] for m in before if m["wall"] <= last["wall"] - interval_s - SAVE_MARGIN_S]
        out.append({
            "reached": last["update"], "resumed": resumed, "redone": last["update"] - resumed,
            "bound": last["update"] - max(floor, default=before[0]["resumed_update"]),
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


def processes(soak: Soak) -> list[dict]:
    """Per learner process: what its audit log holds, what its actors saw acknowledged, its metrics."""
    out = []
    for rank in range(soak.cfg.processes):
        pairs, episodes, tombstones = logged_batches(soak.process_dir(rank) / audit_file.FILE_NAME)
        acked: dict[tuple[str, int], int] = {}
        for i in range(rank, soak.cfg.actors, soak.cfg.processes):
            acked |= acknowledged(soak.out, f"acks-actor{i}.jsonl")
        lines = metrics_lines(soak.process_dir(rank))
        stored = lines[-1]["replay/added"] + lines[-1]["replay/dropped_stale_at_add"]
        out.append({"pairs": pairs, "episodes": episodes, "tombstones": tombstones, "acked": acked,
                    "lines": lines, "stored_twice": stored - sum(episodes.values())})  # fmt: skip
    return out


def delivery(per: list[dict]) -> dict:
    """The delivery invariants over every process: each process's actors against its own audit log."""
    lost = twice = mismatched = 0
    for p in per:
        lost += sum(1 for key in p["acked"] if key not in p["pairs"])
        twice += sum(len(lsns) - 1 for lsns in p["pairs"].values())
        mismatched += sum(1 for k, n in p["acked"].items() if k in p["episodes"] and p["episodes"][k] != n)
    return {
        "batches_acked": sum(len(p["acked"]) for p in per),
        "episodes_acked": sum(sum(p["acked"].values()) for p in per),
        "batches_logged": sum(len(p["pairs"]) for p in per),
        "tombstones": sum(p["tombstones"] for p in per),
        "lost": lost,
        "logged_twice": twice,
        "episode_mismatches": mismatched,
        # the process furthest off (above 0: stored twice; below: missing from its replay)
        "stored_twice": max((p["stored_twice"] for p in per), key=abs),
        "replay_unaccounted": sum(replay_unaccounted(p["lines"]) for p in per),
        "lost_in_restart": max(m.get("batches_lost_in_restart", 0) for p in per for m in p["lines"]),
    }


def diverged(per: list[dict]) -> int:
    """With several processes: 1 when their final records differ in update or parameters (every process
    takes the same steps, so the job's processes must end bit-identical), else 0."""
    finals = [p["lines"][-1] for p in per]
    keys = {(m["update"], m.get("params_digest")) for m in finals}
    return int(len(finals) > 1 and len(keys) > 1)


def audit(soak: Soak) -> dict:
    per = processes(soak)
    lines = per[0]["lines"]
    last = lines[-1]
    final_run = [m for m in lines if m["run_id"] == last["run_id"]]
    redo = [restarts(p["lines"], soak.cfg.checkpoint_every_s) for p in per]  # per process
    counts = soak.proxy_counts
    return {
        "processes": soak.cfg.processes,
        "faults": dict(soak.faults),
        "exits": dict(soak.exits),
        "exit_reasons": sorted(
            {f"status {e['code']}: {e['why']}" for e in soak.events if e["event"] == "exited"}
        ),
        "proxy_faults": {k: v for k, v in counts.items() if k != "pass"},
        "messages_proxied": sum(counts.values()),
        "batches_acked_by_actor": {
            path.stem.removeprefix("acks-"): len(acknowledged(soak.out, path.name))
            for path in sorted(soak.out.glob("acks-*.jsonl"))
        },
        **delivery(per),
        "diverged": diverged(per),
        "recovery_after_disk_s": _percentiles(recovery_after_disk(soak)),
        "restart_recovery_s": _percentiles(acks_after(soak, learner_restarts(soak))),
        "remote_recovery_s": _percentiles(remote_recovery(soak)),
        "inference": inference_service(lines),
        "restores": [r for role in soak.learners for r in restores(role.log)],
        "log_mb": log_size(soak),
        "log_pruning": judge(
            soak.run_dir / "checkpoints", [soak.process_dir(r) / "wal" for r in range(soak.cfg.processes)]
        ),
        "left_running": left_running(str(soak.out)),
        "memory": memory(soak),
        "updates_after_last_fault": soak.updates_since_last_fault(final_run),
        "learner_restarts": len(redo[0]),
        "updates_redone": [r["redone"] for r in redo[0]],
        "redone_past_interval": [r for process in redo for r in process if r["redone"] > r["bound"]],
        "final_update": last["update"],
        "checkpoint_errors": sum(p["lines"][-1].get("checkpoint/errors", 0) for p in per),
        "metrics_lines_dropped": max(m.get("metrics_lines_dropped", 0) for p in per for m in p["lines"]),
        "stopped": last.get("stopped"),
    }
