"""A learner whose updates take long (an LM update: a minute on 2 cores) stays observable and stoppable.

A real learner whose `Trainer.step` first sleeps (a stub slow update: the only change, made in the learner
process before it starts, `SLOW`), fed by a fake actor speaking the protocol. Three guarantees:
- metrics.jsonl keeps its --log-every rhythm while an update runs, each record written meanwhile marking
  it (`update_in_flight_s`), counting its seconds so far as training (time/train_s never goes back) and
  naming only finished updates (one the step counted but whose version is not out yet is not one);
- --time-limit is kept within a few seconds: an update that cannot end before the limit is not started
  (learner/schedule.py `UpdateTimes`);
- SIGTERM ends the learner within a few seconds, the update in flight abandoned (learner/loop.py `_Stop`),
  with a last record that says so, and a restart resumes with every acknowledged episode.
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from tests.conftest import read_jsonl
from tests.test_fake_actor import QUIET_ACTOR, FakeActor, wait_for_metrics

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]

SLOW = """
import os, runpy, sys, time
import learner.training.trainer as trainer
real_step = trainer.Trainer.step
def slow_step(self, batch, imitation):  # slow on both sides of the step, which counts the update
    half = float(os.environ.get("SLOW_UPDATE_S", "{seconds}")) / 2
    time.sleep(half)
    result = real_step(self, batch, imitation)
    time.sleep(half)
    return result
trainer.Trainer.step = slow_step
sys.argv[0] = "learner"
runpy.run_module("learner", run_name="__main__", alter_sys=True)
"""
COMMON = ("--batch-size", "4", "--log-every", "1", *QUIET_ACTOR)


def _slow(seconds: float) -> tuple[str, ...]:
    return ("-c", SLOW.replace("{seconds}", str(seconds)))


def _feed(learner, episodes: int) -> int:
    """`episodes` acknowledged episodes from a fake actor, which then leaves; how many were stored."""
    actor = FakeActor(learner)
    try:
        actor.hello()
        _, ack = actor.traj(actor.episodes(episodes, np.random.default_rng(0)))
    finally:
        actor.close()
    assert ack["kind"] == "ACK", ack
    return ack["accepted"]


def test_records_keep_their_rhythm_and_the_time_limit_is_kept(learner_process):
    """Updates of 8 s, --log-every 1, --time-limit 30: a record at least every 2.5 s throughout, records
    during an update mark it and show the finished updates, all published (--publish-every 1), and the run stops by 30 s plus the few seconds a stop takes, though an
    update started at 25 s would end at 33 s."""
    limit, update_s = 30.0, 8.0
    learner = learner_process(
        *COMMON,
        *("--time-limit", str(limit), "--checkpoint-every", "0", "--publish-every", "1"),
        python_args=_slow(update_s),
    )
    _feed(learner, 32)
    assert learner.proc.wait(timeout=limit + 120) == 0, learner.log()
    records = read_jsonl(learner.run_dir / "metrics.jsonl")
    last = records[-1]
    assert last["stopped"] == "time limit" and last["update"] >= 1, last
    assert last["wall"] <= limit + 3.0, (last["wall"], [r["update"] for r in records])
    walls = [r["wall"] for r in records]
    assert max(np.diff(walls)) <= 2.5, walls
    in_flight = [r["update_in_flight_s"] for r in records]
    assert max(in_flight) >= update_s - 2.5, in_flight  # records came during the updates
    shown = [(r["update"], r["policy_version"]) for r in records if "stopped" not in r]
    assert all(u == v for u, v in shown), shown  # not an update counted on the helper thread, unpublished
    trained = [r["time/train_s"] for r in records]
    assert trained == sorted(trained), trained
    assert "updating" in learner.log()  # the console line marks it too


def test_sigterm_during_an_update_ends_the_learner_at_once_and_loses_nothing(learner_process):
    """A 300 s update in flight: SIGTERM ends the learner within 10 s; its last record says the update was
    abandoned; a learner restarted in the run dir holds every acknowledged episode."""
    learner = learner_process(*COMMON, python_args=_slow(300.0))
    stored = _feed(learner, 8)
    wait_for_metrics(learner, lambda m: m["update_in_flight_s"] > 1.0, what="an update in flight")
    t0 = time.monotonic()
    learner.proc.send_signal(signal.SIGTERM)
    assert learner.proc.wait(timeout=60) == 0, learner.log()
    assert time.monotonic() - t0 <= 10.0, learner.log()
    last = read_jsonl(learner.run_dir / "metrics.jsonl")[-1]
    assert last["stopped"] == "SIGTERM" and last["abandoned"] == "update", last
    assert "left the update in flight unfinished" in learner.log()

    again = learner_process(*COMMON, "--time-limit", "1", run_dir=learner.run_dir)
    assert again.proc.wait(timeout=300) == 0, again.log()
    resumed = read_jsonl(again.run_dir / "metrics.jsonl")[-1]
    assert resumed["replay_size"] == stored and resumed["stopped"] == "time limit", resumed
