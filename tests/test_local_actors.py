"""The local actors' command line: the learner's choices (loopback, names, seeds, a short pending queue so
the insert side of the rate limit holds them back within a few episodes) parse with the actor's own config."""

from __future__ import annotations

import sys

import tyro

from actors.config import ActorConfig
from learner.launch.local_actors import local_actor_command


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
