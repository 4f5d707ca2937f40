"""A checkpoint's replay file, before and after incremental saves (issue 35), on the default replay.

The replay: the learner's default capacity (2048) full of episodes of the default model's observations
(MiniLM word pieces included; real featurized stand-in screens of MAX_STEPS steps, benchmarks/data.py),
each batch of 8 episodes first appended to a real write-ahead log (`os` durability) as the ingest does,
so every item has its log record, as in a run once the warm-up demonstrations have been evicted.

Rows (best of `repeats`):
- `by_value`: what every save did before: the whole buffer copied into the file, snapshot and write
  both on the learner's main thread (Session.save).
- `by_reference`: what a save does now when the learner has a log: the main thread takes the snapshot
  (state arrays, references to the episodes), a helper thread writes a file that references the log's
  records (learner/training/checkpoint_files.py).
Columns: main-thread seconds (what actors wait for), write seconds (on the helper thread for
by_reference), the file's bytes, and the restore (read, validate, fill: for by_reference the log's
records are read back and validated as on arrival), each with its ratio to by_value.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import data
from benchmarks.report import best_seconds
from common import protocol, wire
from common.policies import make_policy
from learner.config import LearnerConfig
from learner.ingest.settler import LoggedEpisodes
from learner.ingest.wal import WriteAheadLog, pack_batch
from learner.replay.file import load_replay, snapshot, write_snapshot
from learner.replay.prioritized import PrioritizedReplay, oldest_version

MAX_STEPS = 16
BATCH = 8


def _filled(cfg: LearnerConfig, wal: WriteAheadLog, distinct: int) -> PrioritizedReplay[protocol.Episode]:
    """The default-capacity replay, every item stored with its log record (`distinct` episodes reused:
    the bytes and the work per episode are what matter, not their variety)."""
    episodes = data.episodes(cfg.model, distinct, steps=MAX_STEPS)
    replay = PrioritizedReplay[protocol.Episode](cfg.buffer.replay_capacity)
    for seq in range(cfg.buffer.replay_capacity // BATCH):
        batch = [episodes[(seq * BATCH + i) % distinct] for i in range(BATCH)]
        raw = wire.encode(protocol.Traj(1, seq + 1, [ep.wire_fields() for ep in batch]).to_msg())
        lsn = wal.append(pack_batch("actor-a", seq + 1, raw))
        for i, ep in enumerate(batch):
            replay.add(ep, oldest_version(ep), origin=(lsn, i))
    return replay


def _row(name: str, main_s: float, write_s: float, size: int, restore_s: float, base: dict | None) -> dict:
    row = {"mode": name, "main_thread_s": main_s, "write_s": write_s, "bytes": size, "restore_s": restore_s}
    if base is not None:
        for key in ("main_thread_s", "write_s", "bytes", "restore_s"):
            row[f"{key}_ratio"] = row[key] / base[key]
    return row


def run(quick: bool) -> list[dict]:
    cfg = LearnerConfig()
    repeats = 2 if quick else 5
    spec = make_policy(cfg.model).episode_spec()
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as tmp:
        wal = WriteAheadLog(Path(tmp) / "wal", "os")
        list(wal.recover())
        replay = _filled(cfg, wal, 16 if quick else 64)
        logged = LoggedEpisodes(wal, lambda traj, newest: traj.validate(spec, MAX_STEPS, newest))
        rows, base = [], None
        for name, by_reference in (("by_value", False), ("by_reference", True)):
            path = Path(tmp) / f"{name}.replay"
            main_s = best_seconds(lambda ref=by_reference: snapshot(replay, MAX_STEPS, ref), repeats)
            snap = snapshot(replay, MAX_STEPS, by_reference)
            size = write_snapshot(path, snap, cfg.model, MAX_STEPS)
            write_s = best_seconds(lambda s=snap, p=path: write_snapshot(p, s, cfg.model, MAX_STEPS), repeats)
            if not by_reference:  # before: the write happened on the main thread too
                main_s += write_s

            def restore(p=path) -> None:
                target = PrioritizedReplay[protocol.Episode](cfg.buffer.replay_capacity)
                assert load_replay(p, target, cfg.model, max_steps=MAX_STEPS, logged=logged) == len(replay)

            row = _row(name, main_s, write_s, size, best_seconds(restore, repeats), base)
            base = base or row
            rows.append(row)
        wal.close()
    return rows
