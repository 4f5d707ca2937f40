"""The local actors' command line: the learner's choices (loopback, names, seeds, a short pending queue so
the insert side of the rate limit holds them back within a few episodes) parse with the actor's own config."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import tyro

from actors.config import ActorConfig
from learner.launch.local_actors import STOP_GRACE_S, LocalActors, local_actor_command, stop_grace


def test_local_actors_wait_after_a_few_pending_episodes():
    argv = local_actor_command(1, 6001, 6002, num_envs=5, seed=3, env="standin")
    assert argv[:3] == [sys.executable, "-m", "actors"]
    cfg = tyro.cli(ActorConfig, args=argv[3:])
    assert cfg.max_pending_episodes == 10  # 2 per environment, not the actor's default of 256
    assert (cfg.host, cfg.name, cfg.seed, cfg.env, cfg.flush_timeout) == (
        "127.0.0.1",
        "local-1",
        3001,
        "standin",
        0,
    )


def test_extra_flags_win_over_the_short_queue():
    argv = local_actor_command(0, 6001, 6002, 5, 3, ("--max-pending-episodes", "64"))
    assert tyro.cli(ActorConfig, args=argv[3:]).max_pending_episodes == 64


def test_stop_kills_what_has_not_stopped_within_the_grace_and_says_which(tmp_path):
    """Two children: one stops on SIGTERM, one ignores it (an actor stuck past the grace); stop() kills
    the second after `grace` seconds and names it (the learner prints it and counts it in its last record:
    learner/session.py `close`)."""
    actors = LocalActors(0, 6001, 6002, num_envs=1, seed=0, run_dir=tmp_path, grace=1.0)
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    for code in ("import time; print('ready', flush=True); time.sleep(60)", ignores):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"  # its handler is set
        actors.procs.append(proc)
    started = time.monotonic()
    assert actors.stop() == [1]
    assert 1.0 <= time.monotonic() - started < 14  # it waited its grace, not the default 15 s
    assert [p.returncode for p in actors.procs] == [-signal.SIGTERM, -signal.SIGKILL]


def test_the_grace_covers_an_act_the_actor_timeout_allows():
    """An actor stops between acts; the lm recipe's --actor-timeout 120 says an act may take a minute on
    a loaded machine, so a stopping learner waits for half of it, and at least the pointer's 15 s."""
    assert stop_grace(120.0) == 60.0
    assert stop_grace(15.0) == STOP_GRACE_S == 15.0


@pytest.mark.timeout(300)
def test_actors_after_warmup_start_when_reinforcement_learning_does(learner_process):
    """--actors-after-warmup: the local actor starts after the warm-up's updates (the learner compiled
    its step and made them before the console says it started), no episode arrives during the warm-up,
    and reinforcement learning then trains on the actor's episodes."""
    learner = learner_process(
        *("--env", "simphone", "--warmup-demos", "16", "--warmup-updates", "6", "--local-actors", "1"),
        *("--envs-per-actor", "2", "--actors-after-warmup", "--max-updates", "9", "--log-every", "1"),
        *("--checkpoint-every", "0", "--batch-size", "4", "--model.text-encoder", "none"),
    )
    assert learner.proc.wait(timeout=240) == 0, learner.log()
    log = learner.log()
    assert "the 1 local actor(s) start when the warm-up ends (--actors-after-warmup)" in log
    assert log.index("train step compiled") < log.index("started 1 local actor(s)"), log
    metrics = learner.metrics()
    assert all(m["episodes"] == 0 for m in metrics if m["phase"] == "warmup"), metrics
    assert metrics[-1]["episodes"] > 0 and metrics[-1]["update"] == 9, metrics[-1]
