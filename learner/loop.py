"""The learner's training loop, readable in one sitting.

open the session (learner/setup.py: mesh, trainer, replay, restore, sockets, version published, local
actors) -> compile the update while serving actors -> repeat:
    ask the schedule (learner/schedule.py) whether to stop, imitate or train
    take in messages: trajectories go into the prioritized replay, ACKed once stored
    when an update is ready: a batch (demonstrations, or sampled from the replay) -> one jitted,
        sharded update (learner/trainer.py) -> refresh the sampled priorities -> publish a new
        version when due (async: every few updates; sync: when the round's data is used up)
    every few seconds: a metrics.jsonl line, the dashboards and the console
until the time limit, the update limit, the success target, or Ctrl-C / SIGTERM; then save a checkpoint,
write the last record, stop the local actors and close the sockets.
"""

from __future__ import annotations

import signal
import time

import numpy as np
from rich.console import Console

from learner import multihost
from learner.algorithm import step_mask
from learner.augment import piece_table, rename_batch
from learner.batch import Batch, collate
from learner.config import LearnerConfig
from learner.setup import Session, open_session


class _Stop:
    """SIGINT / SIGTERM: finish the current update, then stop cleanly (a checkpoint, the last record)."""

    def __init__(self):
        self.reason = ""

    def __call__(self, signum, _frame):
        self.reason = signal.Signals(signum).name


def run(cfg: LearnerConfig, console: Console | None = None) -> dict:
    """Train until a stop condition; returns the last metrics record."""
    console = console or Console(stderr=True, soft_wrap=True)
    stop = _Stop()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        s = open_session(cfg, console)
    except BaseException:
        _restore_handlers(old_handlers)
        raise
    stopped = ""
    try:
        s.stats.timing["compile_s"] = s.trainer.compile(bool(s.demos), serve=lambda: _serve_while_busy(s))
        console.print(f"learner: train step compiled in {s.stats.timing['compile_s']:.1f}s")
        stopped = _train(s, stop)
    finally:
        last = s.close(stopped)
        _restore_handlers(old_handlers)
        console.print(
            f"learner: stopped ({last['stopped']}) after {last['update']} updates, {last['episodes']} episodes"
        )
    return last


def _train(s: Session, stop: _Stop) -> str:
    """The loop of the module docstring; returns why it stopped."""
    schedule, trainer, replay = s.schedule, s.trainer, s.replay
    while True:
        wanted = schedule.stop_reason(trainer.update, s.stats.success_reached(s.cfg.stop_at_success))
        wanted = wanted or stop.reason
        in_warmup = schedule.in_warmup(trainer.update)
        if not in_warmup:
            s.stats.mark_rl_start()
            if s.prefill_pending:  # offline data joins the replay as reinforcement learning starts
                s.prefill()
        imitation = schedule.imitates(trainer.update)
        can_train = schedule.can_train(len(replay), replay.counts["added"])
        round_done = schedule.sync and schedule.round_complete(s.server.connected_envs())
        if round_done and not in_warmup and not can_train:
            # The round's data is used up (as much as --samples-per-insert allows): the next round
            # starts on a new version. Warm-up imitation happens before the first round ends.
            s.publish()
            schedule.next_round()
            round_done = False
        ready = imitation or (can_train and (round_done or not schedule.sync))
        s.serve(0 if ready else 50)
        ready, stopping = multihost.agree(ready, bool(wanted))  # every process steps together
        if stopping:
            return wanted or "another learner process stopped"
        if ready:
            _update(s, imitation)
            if schedule.publishes_after(trainer.update):
                s.publish()
            if s.checkpointer is not None and trainer.update % s.cfg.checkpoint_every == 0:
                s.save()
        s.log_if_due()


def _update(s: Session, imitation: bool) -> None:
    """One update: a batch of demonstrations (imitation) or from the replay, the jitted step, and the
    sampled trajectories' new priorities (DPER); a non-finite update is skipped and counted."""
    t0 = time.monotonic()
    sample = None
    if imitation:  # behavior cloning on demonstrations; actors keep acting meanwhile
        picks = s.trainer.demo_rng.integers(len(s.demos), size=s.trainer.local_batch)
        batch = collate([s.demos[i] for i in picks], s.cfg.max_steps)
        s.stats.totals["imitation_updates"] += 1
    else:
        sample = s.replay.sample(s.trainer.local_batch, s.trainer.version, progress=s.trainer.update)
        batch = _replay_batch(s, sample.items, sample.weights)
        s.schedule.rl_updates += 1
    result = s.trainer.step(_renamed(s, batch), imitation)
    s.stats.train_metrics = result.metrics
    if result.skipped:
        s.stats.totals["skipped_nonfinite"] += 1
        s.console.print(f"learner: update {s.trainer.update} had a non-finite loss or gradient; skipped")
    elif result.priorities and sample is not None:
        p = result.priorities
        s.replay.update_priorities(
            sample.indices,
            sample.generations,
            p["priority_delta"],
            p["priority_rho_clipped"],
            p["priority_entropy"],
        )
    s.stats.timing["train_s"] += time.monotonic() - t0


def _replay_batch(s: Session, episodes: list, weights: np.ndarray) -> Batch:
    """A replay sample as a Batch: importance weights, the instruction-level filter (--instruction-filter)
    on the actor loss, and the policy lag of its steps logged."""
    batch = collate(episodes, s.cfg.max_steps, weights)
    bounds = s.cfg.loss.instruction_filter
    if bounds is not None:
        batch = batch._replace(keep=s.stats.tasks.keep([ep.task for ep in episodes], *bounds))
        s.stats.totals["instruction_filtered"] += int((~batch.keep).sum())
    mask = np.asarray(step_mask(batch.length, s.cfg.max_steps))
    s.stats.observe_lag(s.trainer.version, batch.policy_version, mask)
    return batch


def _renamed(s: Session, batch: Batch) -> Batch:
    """Word renaming (learner/augment.py), seeded per (update, process): a resumed run renames exactly as
    an uninterrupted one."""
    loss, model = s.cfg.loss, s.cfg.model
    seed = [s.cfg.seed, s.trainer.update, s.rank]
    pieces = piece_table(model.text_encoder) if loss.rename_word_pieces and model.uses_text_encoder else None
    return rename_batch(
        batch, loss.word_rename_rate, loss.typed_word_rename_rate, model.vocab_size, seed, pieces
    )


def _serve_while_busy(s: Session) -> None:
    """What the main thread does while a helper thread compiles: answer actors, log."""
    s.server.poll(50)
    s.log_if_due()


def _restore_handlers(handlers: dict) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
