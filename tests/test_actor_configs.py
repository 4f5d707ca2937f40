"""The actor side's configs check their own values (`__post_init__`), naming the flag; the CLI shows that
message and exits non-zero before anything runs."""

from __future__ import annotations

import dataclasses

import pytest

from actors.config import ActorConfig
from actors.envs.adb.config import AdbConfig, JudgeConfig
from actors.tools.demos import DemosConfig
from actors.tools.doctor import DoctorConfig
from actors.tools.relay import RelayConfig
from tests.conftest import run_in_one_process

NAN = float("nan")


@pytest.mark.parametrize(
    ("config", "fields", "says"),
    [
        (ActorConfig, {"num_envs": 0}, "--num-envs must be positive, got 0"),
        (ActorConfig, {"max_pending_episodes": -1}, "--max-pending-episodes must be positive, got -1"),
        (ActorConfig, {"handshake_timeout": 0.0}, "--handshake-timeout must be positive, got 0.0"),
        (ActorConfig, {"max_backoff": 0.0}, "--max-backoff must be positive, got 0.0"),
        (ActorConfig, {"heartbeat_every": NAN}, "--heartbeat-every must be positive, got nan"),
        (ActorConfig, {"learner_timeout": -1.0}, "--learner-timeout must be positive, got -1.0"),
        (ActorConfig, {"ack_timeout": 0.0}, "--ack-timeout must be positive, got 0.0"),
        (ActorConfig, {"status_every": 0.0}, "--status-every must be positive, got 0.0"),
        (ActorConfig, {"max_batch_episodes": 0}, "--max-batch-episodes must be in [1, 256], got 0"),
        (ActorConfig, {"max_batch_episodes": 257}, "--max-batch-episodes must be in [1, 256], got 257"),
        (ActorConfig, {"flush_timeout": -0.5}, "--flush-timeout must be >= 0, got -0.5"),
        (ActorConfig, {"max_episodes": -1}, "--max-episodes must be >= 0, got -1"),
        (ActorConfig, {"seed": -3}, "--seed must be >= 0 (or -1: drawn), got -3"),
        (ActorConfig, {"parent_pid": -1}, "--parent-pid must be >= 0, got -1"),
        (ActorConfig, {"ingest_port": 0}, "--ingest-port must be in [1, 65535], got 0"),
        (ActorConfig, {"params_port": 70000}, "--params-port must be in [1, 65535], got 70000"),
        (AdbConfig, {"port": 0}, "--adb.port must be in [1, 65535], got 0"),
        (AdbConfig, {"emulator_port": 65536}, "--adb.emulator-port must be in [1, 65535], got 65536"),
        (AdbConfig, {"boot_timeout": 0.0}, "--adb.boot-timeout must be positive, got 0.0"),
        (AdbConfig, {"command_timeout": -1.0}, "--adb.command-timeout must be positive, got -1.0"),
        (AdbConfig, {"reset_timeout": NAN}, "--adb.reset-timeout must be positive, got nan"),
        (AdbConfig, {"max_restarts": -1}, "--adb.max-restarts must be >= 0, got -1"),
        (AdbConfig, {"restart_backoff": -0.1}, "--adb.restart-backoff must be >= 0, got -0.1"),
        (AdbConfig, {"settle_interval": -1.0}, "--adb.settle-interval must be >= 0, got -1.0"),
        (AdbConfig, {"settle_max": float("inf")}, "--adb.settle-max must be >= 0, got inf"),
        (AdbConfig, {"screenshot": (0, 100)}, "--adb.screenshot must be a positive WIDTH HEIGHT"),
        (JudgeConfig, {"timeout": 0.0}, "--adb.judge.timeout must be positive, got 0.0"),
        (RelayConfig, {"params_port": 0}, "--params-port must be in [1, 65535], got 0"),
        (RelayConfig, {"port": -1}, "--port must be in [0, 65535], got -1"),
        (RelayConfig, {"status_every": -1.0}, "--status-every must be >= 0, got -1.0"),
        (DoctorConfig, {"adb_port": 0}, "--adb-port must be in [1, 65535], got 0"),
        (DoctorConfig, {"timeout": 0.0}, "--timeout must be positive, got 0.0"),
        (DemosConfig, {"noise": 1.5}, "--noise must be in [0, 1], got 1.5"),
        (DemosConfig, {"episodes": 0}, "--episodes must be at least 1, got 0"),
        (DemosConfig, {"max_steps": 0}, "--max-steps must be at least 1, got 0"),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else None,
)
def test_a_bad_value_is_refused_naming_its_flag(config, fields, says):
    with pytest.raises(ValueError) as e:
        config(**fields)
    assert str(e.value).startswith(says), str(e.value)


@pytest.mark.parametrize(
    "config", [ActorConfig, AdbConfig, JudgeConfig, RelayConfig, DoctorConfig, DemosConfig]
)
def test_the_defaults_and_the_edges_are_accepted(config):
    config()
    edges = {
        ActorConfig: {"max_batch_episodes": 256, "flush_timeout": 0.0, "max_episodes": 0, "ingest_port": 65535},
        AdbConfig: {"max_restarts": 0, "restart_backoff": 0.0, "settle_interval": 0.0, "settle_max": 0.0,
                    "screenshot": (1, 1)},
        JudgeConfig: {"timeout": 0.01},
        RelayConfig: {"port": 0, "status_every": 0.0},
        DoctorConfig: {"timeout": 0.01},
        DemosConfig: {"noise": 1.0, "episodes": 1, "max_steps": 1},
    }[config]  # fmt: skip
    config(**edges)


def test_a_config_changed_later_is_checked_again():
    with pytest.raises(ValueError, match="--num-envs"):
        dataclasses.replace(ActorConfig(), num_envs=0)


CLI_REFUSALS = [
    (("--num-envs", "0"), "--num-envs must be positive, got 0"),
    (("--adb.settle-max", "-1"), "--adb.settle-max must be >= 0, got -1.0"),
    (("--adb.judge.timeout", "0"), "--adb.judge.timeout must be positive"),
    (("relay", "--port", "-1"), "--port must be in [0, 65535], got -1"),
    (("doctor", "--timeout", "0"), "--timeout must be positive, got 0.0"),
    (("demos", "--noise", "2"), "--noise must be in [0, 1], got 2.0"),
]


@pytest.fixture(scope="module")
def cli_refusals() -> dict:
    """args -> `python -m actors ARGS` finished, for every case of CLI_REFUSALS, all run in one Python
    process (tests/conftest.py run_in_one_process): a process each cost more than the checks."""
    done = run_in_one_process([["actors", *args] for args, _ in CLI_REFUSALS])
    return {args: proc for (args, _), proc in zip(CLI_REFUSALS, done, strict=True)}


@pytest.mark.parametrize(("args", "says"), CLI_REFUSALS)
def test_the_cli_says_which_flag_and_exits_non_zero(cli_refusals, args, says):
    done = cli_refusals[args]
    assert done.returncode != 0
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "no answer from the learner" not in done.stdout  # refused before trying to connect


def test_actors_started_without_a_seed_draw_their_own_and_say_which():
    from actors.actor import Actor

    logged: list[str] = []
    seeds = {Actor(ActorConfig(), log=logged.append).cfg.seed for _ in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**31 for s in seeds)  # not all the same stream
    assert all(f"--seed {s} repeats it" in "\n".join(logged) for s in seeds)
    assert Actor(ActorConfig(seed=7), log=logged.append).cfg.seed == 7  # a given seed is kept
