"""A learner process's run once it is built (learner/setup/open_session.py builds it): the parts, and the actions the
loop (learner/loop.py) takes on them. The loop reads the parts where a read is simple (the update count,
the replay's size, the schedule's answers) and changes them only through these actions."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from rich.console import Console

from common.protocol import Episode
from learner.config import LearnerConfig, flat_dict
from learner.ingest.server import IngestServer
from learner.launch.local_actors import LocalActors
from learner.observe.run_outputs import RunOutputs
from learner.observe.run_stats import RunStats
from learner.replay.file import snapshot
from learner.replay.prioritized import PrioritizedReplay, ReplaySample, oldest_origin
from learner.schedule import Schedule
from learner.serving.inference import InferenceService
from learner.serving.snapshots import DECODER_SNAPSHOT, WARMUP_END, WallSnapshots, write_file
from learner.training import multihost
from learner.training.checkpoint import Checkpointer
from learner.training.checkpoint_files import CheckpointFiles
from learner.training.trainer import StepResult, Trainer, run_while_serving
from learner.warmup import Warmup


class Draw(NamedTuple):
    """The episodes of one update, drawn on the main thread (the step collates them on a helper thread)."""

    episodes: list[Episode]
    weights: np.ndarray | None = None
    """Importance weights of a replay sample; None for demonstrations."""
    keep: np.ndarray | None = None
    """The instruction-level filter's answer per episode (Batch.keep); None without the filter."""
    sample: ReplaySample[Episode] | None = None
    """The replay sample, to refresh its slots' priorities after the step; None for demonstrations."""


@dataclass
class Session:
    """One learner process's run: the Trainer and everything around it (replay, sockets, schedule,
    outputs, checkpoints, local actors), with the actions that touch them."""

    cfg: LearnerConfig
    console: Console
    run_dir: Path
    """Where this process writes: cfg.run_dir, or cfg.run_dir/process-I for processes other than 0."""
    rank: int
    """This process's index in a multi-host run (0 alone)."""
    trainer: Trainer
    replay: PrioritizedReplay[Episode]
    checkpointer: Checkpointer | None
    """None with --checkpoint-every 0."""
    demos: list[Episode]
    """The demonstrations of imitation updates and the prefill (empty without)."""
    warmup: Warmup
    """Their draws in epochs and the held-back ones' validation (learner/warmup.py)."""
    stats: RunStats
    schedule: Schedule
    server: IngestServer
    outputs: RunOutputs
    actors: LocalActors | None = None
    start_actors: Callable[[], LocalActors | None] | None = None
    """--actors-after-warmup: starts the local actors when reinforcement learning starts (`start_rl`);
    None once they started, or when they start with the learner."""
    inference: InferenceService | None = None
    """The inference service remote actors act through (learner/serving/inference.py); None without."""
    prefill_pending: bool = False
    """The demonstrations still have to join the replay (they do as reinforcement learning starts)."""
    warmup_end_pending: bool = False
    """This run imitates before reinforcement learning, and the parameters it ends with still have to be
    written (RUN_DIR/snapshots/warmup-end.safetensors, as reinforcement learning starts)."""
    saved_update: int = 0
    """The update of the newest checkpoint on disk."""
    resumed_update: int = 0
    """The update this run started from (its checkpoint's; 0 for a new run), in every metrics record: what
    a restart trained again is the predecessor's last update minus this, whenever the first record came."""
    saved_lsn: int = 0
    """The write-ahead log position of the checkpoint this run resumed from: every record below it is in
    it (its replay may still need older ones: `CheckpointFiles.log_needed_from`)."""
    checkpoint_files: CheckpointFiles | None = None
    """Writes each checkpoint's replay file and ledger on a helper thread (None with --checkpoint-every 0)."""
    abandoned: str = ""
    """What a stop signal left running on a helper thread (learner/loop.py `_Stop`): "compile", or
    "update", whose parameters were donated to the step, so `close` saves no checkpoint (the newest one
    and the write-ahead log hold everything acknowledged); "" when nothing was."""
    update_started: float | None = None
    """When the update in flight started (time.monotonic()); None between updates. A record written
    meanwhile counts its seconds so far as training (time/train_s) and shows them (update_in_flight_s)."""
    updates_before: int = 0
    """The updates finished when the one in flight started: what a record written meanwhile shows as
    "update". The step counts its update on the helper thread before it returns, ahead of its priorities
    and its publish, so Trainer.update read then would name an update whose version is not out yet."""
    _last_log: float = 0.0
    _snapshots: WallSnapshots | None = None
    _last_save: float = field(default_factory=time.monotonic)
    """When the newest checkpoint was saved (or the session opened): --checkpoint-every-s counts from it."""

    def compile(self, serve: Callable[[], None], abandon: Callable[[], bool] | None = None) -> float:
        """Compile the update(s) while `serve` answers actors (Trainer.compile); the seconds it took. Raises
        trainer.Abandoned when `abandon()` turns true first."""
        seconds = self.trainer.compile(bool(self.demos), serve=serve, abandon=abandon)
        self.stats.timing["compile_s"] = seconds
        self.outputs.compiled()
        return seconds

    def start_rl(self) -> None:
        """Reinforcement learning has started (called every turn after the warm-up): later success counts
        for the target, the warm-up's parameters are written (snapshots.WARMUP_END), local actors held
        back by --actors-after-warmup start, and the demonstrations join
        the replay once, stamped with the current version: fresh data whose exact behavior log-probs still
        drive the off-policy correction, ageing out by max_policy_lag."""
        self.stats.mark_rl_start()
        self.schedule.start_rl(self.stats.totals["episodes"])
        if self.warmup_end_pending:  # every process: the host copy is a collective; process 0 writes
            self.warmup_end_pending = False
            fields = {
                "update": self.trainer.update,
                "version": self.trainer.version,
                "max_steps": self.cfg.max_steps,
            }
            flat = self.trainer.snapshot()
            path = self.run_dir / "snapshots" / WARMUP_END
            try:
                if self.rank == 0:
                    write_file(path, flat, self.cfg.model, fields)
            except OSError as e:  # a full disk: a convenience for evaluation lost, never the run
                self.console.print(f"learner: could not write {path} ({e}); the run goes on without it")
        if self.start_actors is not None:
            self.actors, self.start_actors = self.start_actors(), None
        if not self.prefill_pending:
            return
        self.prefill_pending = False
        version = self.trainer.version
        for ep in self.demos:
            stamped = np.full_like(ep.steps["policy_version"], version)
            self.replay.add(dataclasses.replace(ep, steps={**ep.steps, "policy_version": stamped}), version)
        self.console.print(f"learner: {len(self.demos)} demonstrations added to the replay")

    def publish(self, serve: Callable[[], None] | None = None) -> None:
        """A new policy version: its snapshot goes to every actor (and answers PARAM_REQ from now on). With
        `serve`, the parameters' host copy (seconds for a large model) is made on a helper thread while
        this one keeps serving; every process publishes at the same point, so its collectives line up."""
        t0 = time.monotonic()
        version = self.trainer.new_version()
        publish_version(self.server, self.inference, self.trainer, version, serve)
        self.stats.timing["publish_s"] += time.monotonic() - t0

    def end_round(self, serve: Callable[[], None] | None = None) -> None:
        """--mode sync: the round's data is used up; a new version starts the next round."""
        self.publish(serve)
        self.schedule.next_round()

    def publish_if_due(self, serve: Callable[[], None] | None = None) -> None:
        """After an update: a new version when the schedule says so (async: every --publish-every)."""
        if self.schedule.publishes_after(self.trainer.update):
            self.publish(serve)

    def save_if_due(self, updated: bool = True) -> None:
        """Every loop iteration (`updated`: right after an update): a checkpoint every --checkpoint-every
        updates, or once --checkpoint-every-s seconds have passed since the last and something was trained
        since (every process agrees: the save is a collective). Between updates too: a learner that
        trained and then waits for data (its actors down, say) still saves within the interval, so a
        kill never makes it train again more than one interval's updates (the chaos soak found a learner
        idle for 45 s past its interval whose 4 updates a restart redid)."""
        if self.checkpointer is None:
            return
        due = updated and self.trainer.update % self.cfg.checkpoint_every == 0
        limit = self.cfg.checkpoint_every_s
        if limit:
            late = time.monotonic() - self._last_save >= limit and self.trainer.update > self.saved_update
            _, by_time = multihost.agree(True, late)
            due = due or by_time
        if due:
            self.save()

    def save(self) -> None:
        """A checkpoint: the training state (orbax, collectively, on this thread), then this process's
        replay file and delivery ledger written on a helper thread from a snapshot taken here
        (learner/training/checkpoint_files.py). With a write-ahead log the replay file references the episodes the
        log holds instead of copying them, and the log keeps their records until a newer checkpoint is
        complete without them."""
        t0 = time.monotonic()
        files = self.checkpoint_files
        assert files is not None, "save() needs checkpoints (--checkpoint-every > 0)"
        files.wait()  # one save's files at a time, in order
        update, wal, cfg = self.trainer.update, self.server.wal, self.cfg
        self._last_save = time.monotonic()  # a failed save is tried again one interval later, not at once
        try:
            self.trainer.save(self.checkpointer, flat_dict(cfg))
            self.trainer.write_decoder(self.run_dir / DECODER_SNAPSHOT)
        except (OSError, ValueError, RuntimeError) as e:  # a full disk: orbax's files, now or the last's
            files.failed(update, e)
            return
        snap = snapshot(self.replay, cfg.max_steps, by_reference=wal is not None)
        position = wal.next_lsn if wal is not None else 0  # no batch waits for a sync between polls
        ledger = {**self.server.ledger.state(), "wal_next_lsn": position}
        keep = self.checkpointer.kept_updates(update)
        checkpointer, rank = self.checkpointer, self.rank

        def write() -> int:  # on the helper thread: only this save's files and the old ones it replaces
            size = checkpointer.write_replay(update, snap, cfg.model, cfg.max_steps, rank, keep)
            checkpointer.save_delivery(update, ledger, rank)
            return size

        oldest = oldest_origin(self.replay)
        files.start(update, write, position if oldest is None else min(position, oldest))
        self.saved_update = update
        self.stats.timing["checkpoint_s"] += time.monotonic() - t0

    def snapshot_if_due(self, at_time_limit: bool = False) -> None:
        """--snapshot-every: the parameters for the latest multiple of the period the wall clock has
        passed (learner/serving/snapshots.py). Every process agrees first (the host copy is a collective of all of
        them); process 0 writes. Counted as checkpoint time. `at_time_limit`: the run stops by its
        --time-limit, up to one update before it, so the parameters it stops with stand for the limit
        (without it a benchmark's last grid time, the limit, raced the stop)."""
        if not self.cfg.snapshot_every:
            return
        if self._snapshots is None:
            self._snapshots = WallSnapshots(
                self.run_dir / "snapshots", self.cfg.snapshot_every, self.rank == 0
            )
        wall = time.monotonic() - self.schedule.start
        stands_for = self.cfg.time_limit if at_time_limit and self.cfg.time_limit else None
        _, due = multihost.agree(True, self._snapshots.due(wall if stands_for is None else stands_for))
        if not due:
            return
        t0 = time.monotonic()
        update, totals = self.trainer.update, self.stats.totals
        fields = {"update": update, "version": self.trainer.version, "episodes": totals["episodes"]}
        fields |= {"env_steps": totals["env_steps"], "phase": self.schedule.phase(update)}
        self._snapshots.write(wall, self.trainer.snapshot(), self.cfg.model, fields, stands_for)
        self.stats.timing["checkpoint_s"] += time.monotonic() - t0

    def draw_demos(self) -> Draw:
        """An imitation update's batch: the training demonstrations in epochs (learner/warmup.py)."""
        picks = self.warmup.picks()
        self.stats.totals["imitation_updates"] += 1
        self.schedule.count_update(imitation=True)
        return Draw([self.demos[i] for i in picks])

    def draw_replay(self) -> Draw:
        """A reinforcement-learning update's batch from the replay (stale items dropped first), with the
        instruction filter's answer; its policy lag is observed and the update counted for the rate limit."""
        trainer = self.trainer
        sample = self.replay.sample(
            trainer.local_batch, trainer.version, progress=self.schedule.beta_progress(trainer.update)
        )
        episodes = sample.items
        bounds = self.cfg.loss.instruction_filter
        keep = None if bounds is None else self.stats.tasks.filter([ep.task for ep in episodes], *bounds)
        versions = np.concatenate([ep.steps["policy_version"] for ep in episodes])
        self.stats.observe_lag(trainer.version, versions, np.ones(versions.shape, bool))
        self.schedule.count_update(imitation=False)
        return Draw(episodes, sample.weights, keep, sample)

    def finish_update(self, result: StepResult, draw: Draw, seconds: float) -> None:
        """After the step: its metrics, a skipped (non-finite) update counted, or the sampled slots' new
        priorities (DPER; slots refilled during the step, whose generation moved on, are skipped)."""
        self.stats.train_metrics = result.metrics
        if result.skipped:
            self.stats.totals["skipped_nonfinite"] += 1
            self.console.print(
                f"learner: update {self.trainer.update} had a non-finite loss or gradient; skipped"
            )
        elif result.priorities is not None and draw.sample is not None:
            p, sample = result.priorities, draw.sample
            self.replay.update_priorities(
                sample.indices, sample.generations, p.delta, p.rho_clipped, p.entropy
            )
        self.stats.timing["train_s"] += seconds
        self.update_started = None
        self.schedule.update_times.finished(seconds)

    def record(self) -> dict:
        """One metrics record: what metrics.jsonl, the dashboards and the console show."""
        s, server, replay, update = self.stats, self.server, self.replay, self.trainer.update
        now, in_flight = time.monotonic(), 0.0
        if self.update_started is not None:
            in_flight, update = now - self.update_started, self.updates_before
        timing = {**s.timing, "train_s": s.timing["train_s"] + in_flight}
        return {
            "run_id": server.run_id,
            "wall": round(now - self.schedule.start, 3),
            "update": update,
            "resumed_update": self.resumed_update,
            "update_in_flight_s": round(in_flight, 3),
            "mode": self.cfg.mode,
            "sync_rounds": self.schedule.rounds,
            "sync_rounds_timed_out": self.schedule.rounds_timed_out,
            "phase": self.schedule.phase(update),
            "env_steps": s.totals["env_steps"],
            "episodes": s.totals["episodes"],
            "success_rate": s.success_rate(),
            "success_by_task": s.tasks.values(),
            **s.recent_by_task(),  # the success_rate window by task, for the console's columns
            "policy_version": self.trainer.version,
            "policy_lag_mean": s.lag_mean,
            "policy_lag_max": s.lag_max,
            "policy_lag_trained": s.trained_lag.summary(),
            "policy_lag_at_arrival": s.arrival_lag.summary(),
            "skipped_nonfinite": s.totals["skipped_nonfinite"],
            "instruction_filtered": s.totals["instruction_filtered"],
            "imitation_updates": s.totals["imitation_updates"],
            "behavior_version_max": s.totals["behavior_version_max"],
            "actors": server.connected_actors(),
            "replay_size": len(replay),
            "rejected": sum(server.rejected.values()),
            "rejected_by_reason": dict(server.rejected),
            "duplicates": server.duplicates,
            "dropped_replies": dict(server.drops),
            "batches_lost_in_restart": server.ledger.lost_in_restart,
            "durability": self.cfg.durability(),
            "storage_error": server.storage_error,
            **({f"wal/{k}": v for k, v in server.wal.stats.items()} if server.wal is not None else {}),
            "accepting": server.accepting,
            "metrics_lines_dropped": self.outputs.writer.dropped,
            **(self.inference.metrics() if self.inference is not None else {}),
            "dropped_episodes": replay.counts["evicted_fifo"] + replay.counts["dropped_stale"],
            **{f"replay/{k}": v for k, v in replay.stats().items()},
            **{f"train/{k}": v for k, v in s.train_metrics.items()},
            **s.validation,
            **{f"time/{k}": round(v, 3) for k, v in timing.items()},
            **(
                {f"checkpoint/{k}": v for k, v in self.checkpoint_files.stats.items()}
                if self.checkpoint_files is not None
                else {}
            ),
        }

    def log_if_due(self) -> None:
        """Every --log-every seconds: a metrics.jsonl line, the dashboards and the console."""
        if time.monotonic() - self._last_log >= self.cfg.dashboards.log_every:
            self._last_log = time.monotonic()
            self.outputs.write(self.record())

    def refresh_inference(self) -> None:
        """Between updates: a remote actor found the inference service behind the newest version (its
        publishes came while nobody asked), so it gets that version's parameters now; the next publish may
        never come while training waits for that actor's data."""
        service = self.inference
        if service is not None and service.behind():
            service.publish(self.trainer.version, self.trainer.serving_copy())

    def serve(self, timeout_ms: int, timed: bool = True) -> None:
        """Take in waiting messages (up to timeout_ms for the first), timed as ingest; `timed=False` while
        a helper thread compiles or trains (those seconds are the compile's or the update's)."""
        t0 = time.monotonic()
        self.outputs.turned()
        self.server.poll(timeout_ms)
        if timed:
            self.stats.timing["ingest_s"] += time.monotonic() - t0

    def close(self, stopped: str) -> dict:
        """Save what is unsaved, write the last record (with why it stopped), stop the local actors and
        close the sockets. `stopped` is "" after an error: the parameters may be gone (donated) then.
        The local actors stop first, while the learner still serves them (after a clean stop: not after
        an error, which may have come from serving): what they send last is acknowledged (and in the
        checkpoint) instead of waiting out their flush timeout."""
        killed = []
        if self.actors is not None:
            killed = self.actors.stop(serve=(lambda: self.server.poll(10)) if stopped else None)
            if killed:
                self.console.print(
                    f"learner: local actor(s) {', '.join(map(str, killed))} had not stopped within seconds "
                    "of SIGTERM and were killed (what they held unacknowledged is lost)"
                )
        if self.checkpointer is not None:
            if self.trainer.update > self.saved_update and self.abandoned != "update":
                self.save()
            if self.checkpoint_files is not None:
                self.checkpoint_files.wait()
            try:
                self.checkpointer.close()  # waits for orbax's last save
            except (OSError, ValueError, RuntimeError) as e:
                self.checkpoint_files.failed(self.trainer.update, e)
        last = self.record()
        last["stopped"] = stopped or "error"
        last["abandoned"] = self.abandoned
        last["local_actors_killed"] = len(killed)
        if stopped and not self.abandoned:
            last["params_digest"] = self.trainer.digest()
        self.outputs.close(last)
        if self.inference is not None:
            self.inference.close()  # before the ingest's sockets: it shares their ZeroMQ context
        self.server.close()
        return last


def publish_version(
    server: IngestServer,
    service: InferenceService | None,
    trainer: Trainer,
    version: int,
    serve: Callable[[], None] | None,
) -> None:
    """The trainer's parameters as `version`: their snapshot to every actor and, with an inference service
    that remote actors use, a device copy to act with (both taken between updates, on a helper thread while
    `serve` runs)."""
    copy = service is not None and service.wants_params()  # not while no remote actor asks

    def take() -> tuple[dict[str, np.ndarray], Any]:
        return trainer.snapshot(), trainer.serving_copy() if copy else None

    flat, served = run_while_serving(take, serve, "publish")
    server.publish(version, flat)
    if service is not None:
        service.publish(version, served)
