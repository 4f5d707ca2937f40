"""The learner's training loop, readable in one sitting.

open the session (learner/setup/open_session.py: mesh, trainer, replay, demonstrations, sockets, resume, version
published, local actors; learner/session.py: the actions the loop takes) -> compile the update while
serving actors -> repeat:
    ask the schedule (learner/schedule.py) whether to stop, imitate or train
    take in messages: trajectories go into the prioritized replay, ACKed once stored
    a parameter snapshot when the wall clock has passed a multiple of --snapshot-every (learner/serving/snapshots.py)
    when an update is ready: a batch (demonstrations, or sampled from the replay) -> one jitted,
        sharded update (learner/training/trainer.py) while serving actors -> refresh the sampled priorities ->
        publish a new version when due (async: every few updates; sync: when the round's data is used
        up) -> a checkpoint when due
    every few seconds: a metrics.jsonl line, the dashboards and the console
until the time limit, the update limit, the success target, or Ctrl-C / SIGTERM; then save a checkpoint,
write the last record, stop the local actors and close the sockets.

Liveness: the main thread owns the sockets, the replay and the statistics. The compile, each update
from collating its batch to fetching its metrics, and the host copy of each published snapshot run on a
helper thread while the main thread keeps serving (learner/training/trainer.py `run_while_serving`,
`_serve_while_busy`), so actors are answered within about 10 ms plus one poll however long a step takes.
Still on the main thread, between polls: drawing a sample, the PUB send of a snapshot, a wall-clock
snapshot's file (--snapshot-every), and a checkpoint's start (Session.save: orbax's save of the training
state and a snapshot of the replay, 3 ms for the default 2048-episode replay; its file and the delivery
ledger are written on a helper thread, learner/training/checkpoint_files.py). Actors wait that long for replies,
which is why --actor-timeout counts silence only once the learner has read what waited
(learner/ingest/server.py).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import jax
from rich.console import Console

from learner.batch import Batch, augmented, collate
from learner.config import LearnerConfig
from learner.session import Session
from learner.setup.disk import startup_failure
from learner.setup.open_session import open_session
from learner.training import multihost
from learner.training.trainer import Abandoned, StepResult, run_while_serving

ABANDON_AFTER_S = 3.0
"""After a stop signal, how long the loop still waits for a compile or update in flight before abandoning
it: the pointer policy's updates (milliseconds) end within it and the run saves its usual final
checkpoint; an LM update (a minute on 2 cores) is abandoned, so the learner still ends within seconds."""


class _Stop:
    """SIGINT / SIGTERM: stop cleanly (a checkpoint, the last record). A compile or update still in flight
    ABANDON_AFTER_S after the signal is abandoned (`abandons`) in a single-process run: the newest
    checkpoint and the write-ahead log hold everything acknowledged. The processes of a multi-host run
    finish the update together instead (each waits in its collectives)."""

    def __init__(self):
        self.reason = ""
        self._at = 0.0
        self.then: Callable[[], None] | None = None
        """Called at the first signal: the local actors are told to stop at once (they flush what they
        hold while the learner still serves, rather than after it)."""

    def __call__(self, signum, _frame):
        self.reason = signal.Signals(signum).name
        if not self._at and self.then is not None:
            self.then()
        self._at = self._at or time.monotonic()

    def abandons(self) -> bool:
        late = bool(self.reason) and time.monotonic() - self._at >= ABANDON_AFTER_S
        return late and jax.process_count() == 1


def run(cfg: LearnerConfig, console: Console | None = None) -> dict:
    """Train until a stop condition; returns the last metrics record."""
    console = console or Console(stderr=True, soft_wrap=True)
    stop = _Stop()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        s = open_session(cfg, console)
    except OSError as e:
        _restore_handlers(old_handlers)
        failure = startup_failure(e, cfg.run_dir)
        if failure is None:
            raise
        console.print(failure[1], markup=False, highlight=False)
        raise SystemExit(failure[0]) from None  # one line, a documented status: learner/setup/disk.py
    except BaseException:
        _restore_handlers(old_handlers)
        raise
    stopped = ""
    stop.then = s.actors.terminate if s.actors is not None else None
    try:
        seconds = s.compile(serve=lambda: _serve_while_busy(s), abandon=stop.abandons)
        bound = s.trainer.shape_bound
        if bound is not None:
            console.print(
                f"learner: the update compiles for each batch shape as it first comes (at most {bound})"
            )
        else:
            console.print(f"learner: train step compiled in {seconds:.1f}s")
        stopped = _train(s, stop)
    except Abandoned as e:
        s.abandoned, stopped = str(e), stop.reason
    finally:
        last = s.close(stopped)
        _restore_handlers(old_handlers)
        console.print(
            f"learner: stopped ({last['stopped']}) after {last['update']} updates, {last['episodes']} episodes"
        )
        if s.abandoned == "update":
            console.print(
                f"learner: left the update in flight unfinished; a resume starts from checkpoint "
                f"{s.saved_update} and the write-ahead log (nothing acknowledged is lost)"
            )
    return last


def _train(s: Session, stop: _Stop) -> str:
    """The loop of the module docstring; returns why it stopped."""
    schedule, trainer, replay = s.schedule, s.trainer, s.replay
    if trainer.update == 0 and schedule.in_warmup(0):
        s.warmup.validate_if_due(lambda: _serve_while_busy(s), stop.abandons)  # the loss before any update
    while True:
        wanted = schedule.stop_reason(trainer.update, s.stats.success_reached(s.cfg.stop_at_success))
        wanted = wanted or stop.reason
        in_warmup = schedule.in_warmup(trainer.update)
        if not in_warmup:
            s.start_rl()  # offline data joins the replay as reinforcement learning starts
        imitation = schedule.imitates(trainer.update)
        can_train = schedule.can_train(len(replay))
        round_done = schedule.sync and schedule.round_complete(s.server.connected_envs())
        if round_done and not in_warmup and not can_train:
            # The round's data is used up (as much as --samples-per-insert allows): the next round
            # starts on a new version. Warm-up imitation happens before the first round ends.
            s.end_round(serve=lambda: _serve_while_busy(s, log=False))
            round_done = False
        ready = imitation or (can_train and (round_done or not schedule.sync))
        s.serve(0 if ready else 50)
        s.refresh_inference()  # between updates: the parameters are the trainer's own, not in flight
        ready, stopping = multihost.agree(ready, bool(wanted))  # every process steps together
        if stopping:
            s.snapshot_if_due(at_time_limit=wanted == "time limit")  # the limit's own grid time
            return wanted or "another learner process stopped"
        s.snapshot_if_due()  # before the update: the parameters of the time passed (the compile's too)
        if ready:
            _update(s, imitation, stop.abandons)
            s.warmup.end_if_late()
            s.warmup.validate_if_due(lambda: _serve_while_busy(s), stop.abandons)
            s.publish_if_due(serve=lambda: _serve_while_busy(s, log=False))
        s.save_if_due(updated=ready)
        s.log_if_due()


def _update(s: Session, imitation: bool, abandon: Callable[[], bool]) -> None:
    """One update: a batch of demonstrations (imitation) or from the replay, the jitted step, and the
    sampled trajectories' new priorities (DPER); a non-finite update is skipped and counted. The batch is
    drawn here (Session.draw_demos / draw_replay); a helper thread collates, augments and trains on it
    while this one keeps serving."""
    t0 = s.update_started = time.monotonic()
    s.updates_before = s.trainer.update
    draw = s.draw_demos() if imitation else s.draw_replay()

    def update() -> StepResult:  # on the helper thread: reads the drawn episodes, changes only the Trainer
        batch = collate(draw.episodes, s.cfg.max_steps, draw.weights)
        if draw.keep is not None:
            batch = batch._replace(keep=draw.keep)
        return s.trainer.step(_augmented(s, batch), imitation)

    result = run_while_serving(update, lambda: _serve_while_busy(s), "update", abandon)
    s.finish_update(result, draw, time.monotonic() - t0)


def _augmented(s: Session, batch: Batch) -> Batch:
    """The family's augmentation of training observations (the pointer policy renames words:
    common/policies/pointer/augment.py), seeded per (update, process): a resumed run augments exactly as
    an uninterrupted one."""
    seed = [s.cfg.seed, s.trainer.update, s.rank]
    return augmented(batch, s.trainer.policy, s.cfg.augmentation(), seed)


def _serve_while_busy(s: Session, log: bool = True) -> None:
    """What the main thread does while a helper thread compiles or trains (learner/training/trainer.py,
    `run_while_serving`, which waits for it between calls): answer actors and take in their episodes
    (into the replay; an update's sampled slots that get refilled meanwhile keep their new content's
    priority), and log. Nothing here reads the parameters, which the step owns, or calls a collective
    (the processes of a multi-host run serve different numbers of times). Its time counts as the
    update's (train_s) or the compile's, not as ingest_s; a record written during an update counts the
    update's seconds so far (Session.update_started), so the console and metrics.jsonl keep their
    --log-every rhythm through a minute-long update."""
    s.serve(0, timed=False)
    if log:
        s.log_if_due()


def _restore_handlers(handlers: dict) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
