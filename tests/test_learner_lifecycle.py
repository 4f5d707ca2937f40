"""The learner stops cleanly on signals and limits, and never leaves actor processes behind."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.conftest import START_S, one_line, run_in_one_process
from tests.test_tensorboard import assert_a_real_run_wrote_tensorboard

pytestmark = pytest.mark.timeout(1200)  # learners with actors, started twice in one test, on a busy machine


def actor_children(learner_pid: int) -> list[int]:
    """PIDs of `python -m actors` processes started with --parent-pid learner_pid."""
    marker = f"--parent-pid\0{learner_pid}\0".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes() + b"\0"
            except OSError:
                continue
            if b"actors" in cmdline and marker in cmdline:
                pids.append(int(proc.name))
    return pids


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.long
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_learner_and_its_actors(learner_process, sig):
    learner = learner_process("--local-actors", "1", "--envs-per-actor", "2", "--log-every", "0.5")
    wait_for(
        lambda: any(m["episodes"] > 0 for m in learner.metrics()),
        START_S,
        "episodes from the local actor",
    )
    assert len(actor_children(learner.proc.pid)) == 1
    learner.proc.send_signal(sig)
    # The learner may still be compiling its train step (not interruptible), then it stops its actor.
    assert learner.proc.wait(timeout=START_S) == 0, learner.log()
    assert learner.metrics()[-1]["stopped"] == sig.name
    assert actor_children(learner.proc.pid) == []


def test_time_limit_exits_zero(learner_process):
    learner = learner_process("--time-limit", "3", "--log-every", "0.5")
    assert learner.proc.wait(timeout=START_S) == 0, learner.log()
    final = learner.metrics()[-1]
    assert final["stopped"] == "time limit"
    # Start-up and the compile (not interruptible) come first: the time limit is checked once they are
    # done, so the run lasts at least 3 s, and on a busy machine much longer than that.
    assert 3 <= final["wall"] < START_S


def test_actors_exit_when_the_learner_is_killed(learner_process):
    learner = learner_process("--local-actors", "1", "--envs-per-actor", "2", "--log-every", "0.5")
    wait_for(lambda: len(actor_children(learner.proc.pid)) == 1, START_S, "the local actor to start")
    pid = learner.proc.pid
    learner.proc.kill()
    learner.proc.wait()
    # The actor checks its parent between steps: after its start-up (model, compile), which takes a
    # minute on a busy machine.
    wait_for(lambda: actor_children(pid) == [], START_S, "the orphaned actor to exit")


@pytest.mark.long
def test_restart_resumes_from_the_checkpoint(learner_process, tmp_path):
    """A learner stopped by its update limit resumes from its checkpoint (update, policy version and
    replay). Its first run is also tests/test_tensorboard.py's real run: its progress lines and its
    TensorBoard scalars are checked before the second run writes to the same run dir."""
    run_dir = tmp_path / "resumable"
    args = ("--local-actors", "1", "--envs-per-actor", "4", "--batch-size", "4", "--checkpoint-every", "5")
    dashboards = ("--log-every", "0.3", "--console", "auto")  # several records in 6 updates, as lines
    first = learner_process(*args, *dashboards, "--max-updates", "6", run_dir=run_dir)
    assert first.proc.wait(timeout=2 * START_S) == 0, first.log()
    first_final = first.metrics()[-1]  # read now: the second run appends to the same metrics.jsonl
    assert first_final["update"] == 6 and first_final["policy_version"] == 3
    assert first_final["stopped"] == "update limit"
    assert_a_real_run_wrote_tensorboard(first, first_final)
    first.stop()
    second = learner_process(*args, "--max-updates", "10", run_dir=run_dir)
    assert second.proc.wait(timeout=2 * START_S) == 0, second.log()
    assert "resuming from the checkpoint at update 6 (policy v3)" in second.log()
    # The replay came back with the checkpoint: as many episodes as the first run held when it stopped.
    assert f"{first_final['replay_size']} episodes in the replay" in second.log()
    lines = second.metrics()
    run_ids = list(dict.fromkeys(m["run_id"] for m in lines))
    resumed = [m for m in lines if m["run_id"] == run_ids[-1]]
    assert resumed[0]["update"] >= 6 and resumed[-1]["update"] == 10 and resumed[-1]["policy_version"] == 5


LEARNER_REFUSALS = [
    (("--mesh.model", "2"), "--mesh: mesh model axis 2 does not divide the 1 available devices"),
    (("--mesh.data", "2"), "--mesh: mesh shape data=2 x model=1"),
    (("--num-processes", "2"), "needs --coordinator"),
    (("--word-rename-rate", "1.5"), "--word-rename-rate must be in [0, 1], got 1.5"),
    (("--demo-update-every", "-1"), "--demo-update-every must be >= 0, got -1"),
    (("--actor-credit", "0"), "--actor-credit must be at least 1, got 0"),
    (("--durability", "fsync", "--checkpoint-every", "0"), "--durability fsync needs checkpoints"),
    (("--curve-secret-key", "k.key_secret"), "--curve-secret-key and --curve-authorized go together"),
]
ACTOR_REFUSALS = [
    (("--max-batch-episodes", "300"), "--max-batch-episodes must be in [1, 256], got 300"),
    (("--learner-timeout", "0"), "--learner-timeout must be positive, got 0.0"),
    (("--curve-secret-key", "k.key_secret"), "--curve-secret-key and --curve-server-key go together"),
]
BAD_ACTOR_SIDE_FLAG = ("--tasks", "nosuchsuite")


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """(module, args) -> (the finished process, its run dir) for LEARNER_REFUSALS, ACTOR_REFUSALS and
    BAD_ACTOR_SIDE_FLAG, all run in one Python process: each was a process of its own, and starting one
    costs more than the refusal it checks. Each learner has a run dir of its own."""
    runs = {}
    for args in [args for args, _ in LEARNER_REFUSALS] + [BAD_ACTOR_SIDE_FLAG]:
        run_dir = tmp_path_factory.mktemp("refused")
        runs["learner", args] = run_dir, ["learner", "--run-dir", str(run_dir), "--ingest-port", "0", *args]
    for args, _ in ACTOR_REFUSALS:
        runs["actors", args] = None, ["actors", "--ingest-port", "1", *args]
    done = run_in_one_process([argv for _, argv in runs.values()])
    return {key: (proc, run_dir) for (key, (run_dir, _)), proc in zip(runs.items(), done, strict=True)}


@pytest.mark.parametrize(("args", "says"), LEARNER_REFUSALS)
def test_impossible_settings_are_refused_clearly(refusals, args, says):
    done, run_dir = refusals["learner", args]
    assert done.returncode != 0
    assert says in one_line(done.stderr), done.stderr
    assert not (run_dir / "endpoints.json").exists()  # refused before binding anything


@pytest.mark.parametrize(("args", "says"), ACTOR_REFUSALS)
def test_impossible_actor_settings_are_refused_clearly(refusals, args, says):
    done, _ = refusals["actors", args]
    assert done.returncode != 0 and says in one_line(done.stderr), done.stderr
    assert "no answer from the learner" not in done.stdout  # refused before trying to connect


def test_a_bad_actor_side_flag_stops_the_learner_before_any_process(refusals):
    done, run_dir = refusals["learner", BAD_ACTOR_SIDE_FLAG]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m actors: --tasks nosuchsuite: no such task file, folder or suite (shipped suites: general, webshop)"
    )
    assert "oracle demonstrations" not in done.stdout + done.stderr  # the demo writer never started
    assert not (run_dir / "endpoints.json").exists()
