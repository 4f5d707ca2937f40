"""Continuing a run from its newest complete checkpoint, in the one order that stores every batch exactly
once:

1. the training state (parameters, optimizer state, update count, policy version, the demonstrations' RNG);
2. this process's replay, only when the delivery ledger saved after it exists (a learner killed between
   the two left it alone: without the ledger, the write-ahead log replayed from its start would store its
   batches twice); the episodes it references in the write-ahead log are read back from there;
3. the delivery ledger (which batches that replay holds, and the log position it was saved at), only with
   the replay it describes;
4. the write-ahead log's batches from that position on, into the replay and the ledger (batches the
   ledger already settled are skipped).

Steps 1-3 need a checkpoint; step 4 runs whenever there is a log (--durability), after a crash with no
checkpoint too. Without a checkpoint, --init-params gives the new run its starting parameters
(`start_from_file`).
"""

from __future__ import annotations

import time

from rich.console import Console

from common import params_file
from common.protocol import Episode
from learner.config import LearnerConfig
from learner.ingest.server import IngestServer
from learner.ingest.settler import LoggedEpisodes
from learner.replay.file import Logged
from learner.replay.prioritized import PrioritizedReplay
from learner.setup.disk import DISK_FULL_STATUS, startup_failure
from learner.training.checkpoint import Checkpointer
from learner.training.trainer import Trainer


def resume(
    cfg: LearnerConfig,
    rank: int,
    checkpointer: Checkpointer | None,
    trainer: Trainer,
    replay: PrioritizedReplay[Episode],
    server: IngestServer,
    console: Console,
) -> int:
    """Steps 1-4 of the module docstring; returns the restored checkpoint's write-ahead log position (0
    without one), below which every record is in the checkpoint. SystemExit naming the file that cannot
    be resumed from."""
    saved_lsn = 0
    if checkpointer is not None and checkpointer.latest_update() is not None:
        try:
            trainer.restore(checkpointer)  # 1
        except ValueError as e:
            raise SystemExit(str(e)) from e
        # the episodes the replay file references in the log, validated as on arrival
        logged = LoggedEpisodes(server.wal, server.check.episodes) if server.wal is not None else None
        kept = _restore_replay(cfg, rank, checkpointer, trainer.update, replay, logged)  # 2
        read_back = f" ({logged.read_back} read back from the write-ahead log)" if logged is not None else ""
        console.print(
            f"learner: resuming from the checkpoint at update {trainer.update} (policy v{trainer.version}), "
            + (
                f"{kept} episodes in the replay{read_back}"
                if kept is not None
                else "no saved replay: it starts empty"
            )
        )
        if kept is not None:
            saved_lsn = _restore_ledger(checkpointer, trainer.update, rank, server)  # 3
        if cfg.init_params is not None:
            console.print(
                f"learner: --init-params {cfg.init_params} not used: the checkpoint continues the run"
            )
    elif cfg.init_params is not None:
        start_from_file(cfg, trainer, console)
    if server.wal is not None:
        _recover(server, saved_lsn, trainer.version, console)  # 4
    return saved_lsn


def _restore_replay(
    cfg: LearnerConfig,
    rank: int,
    checkpointer: Checkpointer,
    update: int,
    replay: PrioritizedReplay[Episode],
    logged: Logged | None,
) -> int | None:
    """The episodes the replay got back, or None when the checkpoint has no replay with its ledger."""
    try:
        if not checkpointer.delivery_path(update, rank).is_file():
            return None
        return checkpointer.restore_replay(
            update, replay, cfg.model, rank, max_steps=cfg.max_steps, logged=logged
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot resume the replay: {e}") from e


def _restore_ledger(checkpointer: Checkpointer, update: int, rank: int, server: IngestServer) -> int:
    """The delivery ledger into the ingest; the log position it was saved at (0 without a ledger)."""
    try:
        ledger = checkpointer.restore_delivery(update, rank)
        if ledger is None:
            return 0
        server.ledger.load_state(ledger)
        return int(ledger.get("wal_next_lsn", 0))
    except ValueError as e:
        raise SystemExit(f"cannot resume the delivery ledger: {e}") from e


def _recover(server: IngestServer, start_lsn: int, version: int, console: Console) -> None:
    """The write-ahead log's batches after the restored checkpoint back into the replay and the ledger."""
    t0 = time.monotonic()
    try:
        counts = server.recover(start_lsn, version)
    except OSError as e:
        failure = startup_failure(e, server.wal.directory.parent)
        if failure is not None and failure[0] == DISK_FULL_STATUS:
            raise  # the audit log's line for a recovered record: one line and its status (learner/loop.py)
        raise SystemExit(f"cannot read the write-ahead log {server.wal.directory}: {e}") from e
    damage = {k: v for k, v in server.wal.stats.items() if k in ("corrupt_records", "torn_tail_bytes") and v}
    if counts or damage:
        console.print(
            f"learner: write-ahead log: {counts['batches']} batches ({counts['episodes']} episodes) after the "
            f"checkpoint recovered in {time.monotonic() - t0:.1f}s"
            + (f", {counts['skipped']} already stored" if counts["skipped"] else "")
            + (f", {counts['unreadable']} unreadable" if counts["unreadable"] else "")
            + (f", damage skipped: {damage}" if damage else ""),
            markup=False,
        )


def start_from_file(cfg: LearnerConfig, trainer: Trainer, console: Console) -> None:
    """--init-params: a new run's parameters from the file; SystemExit naming the file when it is missing,
    unreadable, of another model, or of other parameter shapes."""
    path = cfg.init_params
    try:
        model_cfg, flat = params_file.read(path)
    except ValueError as e:
        raise SystemExit(f"--init-params: {e}") from None
    if model_cfg.to_dict() != cfg.model.to_dict():
        raise SystemExit(
            f"--init-params {path}: written for another model ({model_cfg.to_dict()}), this run has "
            f"{cfg.model.to_dict()}: give the same --model.* flags"
        )
    try:
        trainer.start_from(flat)
    except ValueError as e:
        raise SystemExit(f"--init-params {path}: {e}") from None
    fields = params_file.fields(path)
    console.print(
        f"learner: parameters from {path} (its run's update {fields.get('update', '?')}); the optimizer "
        "starts fresh"
    )
