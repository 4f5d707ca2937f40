"""Beta, the replay's importance-weight exponent, reaches 1 within a time-limited run (learner/schedule.py
`beta_progress`), however few updates the machine makes; without a time limit it anneals by updates."""

from __future__ import annotations

import dataclasses

import pytest

from learner.config import LearnerConfig
from learner.schedule import Schedule


def schedule(time_limit: float, beta_steps: int = 1000) -> Schedule:
    cfg = LearnerConfig(time_limit=time_limit)
    cfg = dataclasses.replace(cfg, buffer=dataclasses.replace(cfg.buffer, beta_steps=beta_steps))
    return Schedule(cfg, local_batch=4, has_demos=False, start=100.0)


@pytest.mark.parametrize(
    "now, update, want", [(100.0, 0, 0), (160.0, 10, 500), (250.0, 10, 1250), (130.0, 900, 900)]
)
def test_a_time_limited_run_anneals_by_the_further_of_time_and_updates(monkeypatch, now, update, want):
    monkeypatch.setattr("learner.schedule.time.monotonic", lambda: now)
    assert schedule(time_limit=120.0).beta_progress(update) == want


def test_without_a_time_limit_beta_anneals_by_updates(monkeypatch):
    monkeypatch.setattr("learner.schedule.time.monotonic", lambda: 1e6)
    assert schedule(time_limit=0.0).beta_progress(37) == 37
    assert schedule(time_limit=60.0, beta_steps=0).beta_progress(37) == 37  # beta is 1 from the start
