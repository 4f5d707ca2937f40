"""The actor's and the demo writer's command lines are built in one place (common/actor_command.py) and
parse, with the actors' own configs, to what the builder was asked for; a bad actor-side flag is refused
with one line and status 2 before any process starts (`python -m actors check-args`, the learner's
check, the demo writer itself), never with a traceback."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import tyro

from actors.config import ActorConfig
from actors.envs.task_check import task_problem
from actors.tools.check_args import check, one_line_error
from actors.tools.demos import DemosConfig
from common.actor_command import actor_command, check_command, demos_command
from common.config import EmulatorModelConfig, ModelConfig
from learner.config import parse_args
from learner.launch.actor_check import check_actor_flags, check_local_flags
from tests.conftest import ROOT, run_in_one_process


def test_the_actor_command_parses_to_the_config_it_was_built_for():
    emulator = EmulatorModelConfig(enabled=True, time_scale=0.001, stall_prob=0.0, seed=3)
    argv = actor_command(
        host="10.0.0.7",
        ingest_port=6001,
        params_port=6002,
        params_endpoint="tcp://127.0.0.1:7557",
        name="local-3",
        seed=3003,
        parent_pid=4242,
        num_envs=5,
        flush_timeout=0,
        env="standin",
        tasks="webshop",
        split="test",
        emulator=emulator,
        extra=("--status-every", "1"),
    )
    assert argv[:3] == [sys.executable, "-m", "actors"]
    cfg = tyro.cli(ActorConfig, args=argv[3:])
    assert (cfg.host, cfg.ingest_port, cfg.params_port) == ("10.0.0.7", 6001, 6002)
    assert (cfg.params_endpoint, cfg.name, cfg.seed, cfg.parent_pid) == (
        "tcp://127.0.0.1:7557",
        "local-3",
        3003,
        4242,
    )
    assert (cfg.num_envs, cfg.flush_timeout, cfg.status_every) == (5, 0.0, 1.0)
    assert (cfg.env, cfg.tasks, cfg.split) == ("standin", "webshop", "test")
    assert cfg.emulator == emulator


def test_left_out_flags_keep_the_actor_defaults_and_extra_flags_come_last():
    argv = actor_command(host="127.0.0.1", extra=("--host", "10.1.1.1"), python=None)
    assert argv[:2] == ["-m", "actors"]  # a Ray ProcessHost prepends its own node's Python
    cfg = tyro.cli(ActorConfig, args=argv[2:])
    assert cfg.host == "10.1.1.1"  # the later flag wins: --actor-args may override what the launcher sets
    assert cfg == ActorConfig(host="10.1.1.1")
    assert "--emulator.enabled" not in actor_command(emulator=EmulatorModelConfig())  # defaults add nothing


def test_placeholders_pass_through_for_the_process_host():
    argv = actor_command(host="{node_ip}", ingest_port=1, params_port=2, parent_pid="{pid}")
    assert argv[argv.index("--parent-pid") + 1] == "{pid}"


def test_the_demos_command_parses_to_the_config_it_was_built_for(tmp_path):
    model = ModelConfig(d_model=32, max_elements=12)
    argv = demos_command(
        out=tmp_path / "d.msgpack", episodes=7, tasks="webshop", split="test", noise=0.25, max_steps=9, seed=11,
        model=model,
    )  # fmt: skip
    assert argv[:4] == [sys.executable, "-m", "actors", "demos"]
    cfg = tyro.cli(DemosConfig, args=argv[4:])
    assert cfg == DemosConfig(
        out=tmp_path / "d.msgpack", tasks="webshop", split="test", episodes=7, noise=0.25, max_steps=9, seed=11,
        model=model,
    )  # fmt: skip


def test_check_command_inserts_the_hidden_subcommand(tmp_path):
    assert check_command(actor_command(tasks="x")) == [
        sys.executable,
        "-m",
        "actors",
        "check-args",
        "--tasks",
        "x",
    ]
    demos = demos_command(out=tmp_path / "d", episodes=1)
    assert check_command(demos)[3:5] == ["check-args", "demos"]
    with pytest.raises(ValueError, match="not an actor-side command"):
        check_command([sys.executable, "-m", "learner"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tasks", "nosuchsuite"], "--tasks nosuchsuite: no such task file, folder or suite"),
        (["--split", "val"], "--split must be one of train, test, dev, validation, heldout, got 'val'"),
        (["--env", "adb", "--tasks", "webshop"], "--tasks webshop: no such task file, folder or suite"),
        (["--env", "bogus"], "invalid choice 'bogus' for argument '--backend/--env'"),
        (["--num-env", "3"], "Unrecognized options: --num-env, 3 (perhaps --num-envs INT)"),
        (["--emulator.time-scale", "-1"], "--emulator.time-scale must be >= 0, got -1.0"),
        (["demos", "--tasks", "nosuchsuite"], "--tasks nosuchsuite: no such task file"),
    ],
)
def test_a_bad_actor_flag_is_one_line(args, says):
    problem = check(args)
    assert problem is not None and says in problem and "\n" not in problem


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--env", "adb"],
        ["--env", "standin", "--tasks", "ignored-by-standin"],
        ["--tasks", "webshop", "--split", "test"],
    ],
)
def test_good_actor_flags_pass(args):
    assert check(args) is None


def test_a_suite_without_tasks_in_the_split_is_refused(tmp_path):
    general = json.loads((ROOT / "actors/envs/simphone/suites/general.json").read_text())
    held_out = [t for t in general["templates"] if t.get("split") == "test"]
    assert held_out, "the shipped suite has no held-out template to build this file from"
    suite = tmp_path / "held_out.json"
    suite.write_text(json.dumps({"suite": "held_out", "templates": held_out}))
    assert task_problem("simphone", str(suite), "test") is None
    assert (
        task_problem("simphone", str(suite), "train")
        == f"--tasks {suite}: no task of this suite is in --split train"
    )


def test_tyro_boxes_fold_to_their_message():
    box = (
        "╭─ Invalid choice ───────────╮\n│ invalid choice 'x' for     │\n│ argument '--env'.          │\n"
        "│ ────────────────────────── │\n│ For full helptext, run ... │\n╰────────────────────────────╯\n"
    )
    assert one_line_error(box) == "invalid choice 'x' for argument '--env'."


CHECK_BAD = ("actors", "check-args", "--tasks", "nosuchsuite")
CHECK_GOOD = ("actors", "check-args", "--tasks", "webshop", "--env", "simphone")
DEMOS_BAD = ("actors", "demos", "--tasks", "nosuchsuite", "--episodes", "2")


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    """CHECK_BAD, CHECK_GOOD and DEMOS_BAD (with an --out file that must not appear) -> the finished
    `python -m ...`, all run in one Python process (a process each cost more than the checks)."""
    out = tmp_path_factory.mktemp("demos") / "demos.msgpack"
    commands = [list(CHECK_BAD), list(CHECK_GOOD), [*DEMOS_BAD, "--out", str(out)]]
    done = run_in_one_process(commands)
    return {"out": out, **dict(zip((CHECK_BAD, CHECK_GOOD, DEMOS_BAD), done, strict=True))}


def test_check_args_exits_2_with_one_line_and_0_when_good(ran):
    bad = ran[CHECK_BAD]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr + bad.stdout, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "python -m actors: --tasks nosuchsuite: no such task file, folder or suite (shipped suites: general, webshop)"
    ]
    good = ran[CHECK_GOOD]
    assert good.returncode == 0 and good.stdout + good.stderr == "", good.stderr


def test_the_demo_writer_refuses_bad_tasks_with_one_line(ran):
    done = ran[DEMOS_BAD]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.stderr.strip().splitlines() == [
        "python -m actors demos: --tasks nosuchsuite: no such task file, folder or suite "
        "(shipped suites: general, webshop)"
    ]
    assert not ran["out"].exists()  # refused before writing anything


def test_the_learner_side_check_exits_2_with_the_actors_line(capsys):
    with pytest.raises(SystemExit) as e:
        check_actor_flags(actor_command(host="127.0.0.1", tasks="nosuchsuite"))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "python -m actors: --tasks nosuchsuite: no such task file, folder or suite (shipped suites: general, webshop)"
    )
    check_actor_flags(actor_command(host="127.0.0.1", tasks="webshop"))  # good flags: nothing happens


def test_the_learner_checks_what_its_local_actors_and_demo_writer_would_get(capsys):
    with pytest.raises(SystemExit) as e:  # local actors
        check_local_flags(parse_args(["--local-actors", "1", "--tasks", "nosuchsuite"]))
    assert e.value.code == 2 and "--tasks nosuchsuite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # no actors, but oracle demonstrations of those tasks
        check_local_flags(parse_args(["--split", "nope", "--warmup-demos", "8", "--warmup-updates", "5"]))
    assert (
        e.value.code == 2
        and "--split must be one of train, test, dev, validation, heldout" in capsys.readouterr().err
    )
    check_local_flags(parse_args(["--env", "standin", "--tasks", "nosuchsuite"]))  # starts neither: no check


def test_local_actor_args_are_checked_by_the_actors_parser_and_reach_the_actors(capsys):
    from learner.launch.local_actors import local_actor_command

    with pytest.raises(SystemExit) as e:
        check_local_flags(parse_args(["--local-actors", "1", "--local-actor-args=--max-episode-rate -1"]))
    assert e.value.code == 2 and "max-episode-rate" in capsys.readouterr().err
    cfg = parse_args(["--local-actors", "1", "--local-actor-args=--max-episode-rate 0.5"])
    check_local_flags(cfg)  # good flags: nothing happens
    cmd = local_actor_command(0, 1, 2, 4, 0, tuple(shlex.split(cfg.local.local_actor_args)))
    assert cmd[-2:] == ["--max-episode-rate", "0.5"]
