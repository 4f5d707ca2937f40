"""Two learner processes as one jax.distributed job on the CPU (gloo): they take identical steps.

Each process serves its own local actor and contributes its half of every batch; the gradient
all-reduce inside the sharded step makes their parameters bit-identical (the final metrics record
carries a digest of them). Then both restart from the shared checkpoint and continue.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ACTOR_ENV, ROOT

PAIR_S = 900
"""Deadline for one pair of learner processes (each with an actor) to reach its update limit: a couple
of minutes on an idle machine, several times that on a busy one (the --time-limit is a minute shorter,
so a stuck pair still writes its final records)."""
pytestmark = [pytest.mark.timeout(2 * PAIR_S + 60), pytest.mark.long]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(run_dir: Path, max_updates: int) -> list[dict]:
    """Both processes to `max_updates`; returns each one's final metrics record."""
    coordinator = f"127.0.0.1:{_free_port()}"
    procs, logs = [], []
    for rank in (0, 1):
        log = (run_dir.parent / f"{run_dir.name}-{rank}-{max_updates}.log").open("wb")
        cmd = [
            sys.executable, "-m", "learner", "--run-dir", str(run_dir), "--ingest-port", "0", "--params-port", "0",
            "--env", "standin", "--warmup-updates", "0", "--max-steps", "8", "--samples-per-insert", "1",
            "--model.text-encoder", "none", "--local-actors", "1", "--envs-per-actor", "4", "--batch-size", "8", "--max-updates", str(max_updates),
            "--checkpoint-every", "3", "--publish-every", "1", "--time-limit", str(PAIR_S - 60),
            "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(rank),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=ACTOR_ENV))
        logs.append(log)
    try:
        codes = [p.wait(timeout=PAIR_S) for p in procs]
    finally:
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    texts = [Path(log.name).read_text(errors="replace") for log in logs]
    assert codes == [0, 0], "\n\n".join(texts)
    finals = []
    for metrics in (run_dir / "metrics.jsonl", run_dir / "process-1" / "metrics.jsonl"):
        finals.append(json.loads(metrics.read_text().splitlines()[-1]))
    return finals


def test_two_learner_processes_take_identical_steps_and_resume_together(tmp_path):
    run_dir = tmp_path / "run"
    first = _run_pair(run_dir, 6)
    for rec in first:
        assert rec["stopped"] == "update limit" and rec["update"] == 6 and rec["policy_version"] == 6
        assert rec["episodes"] > 0  # each process trained on episodes from its own actor
    assert first[0]["run_id"] != first[1]["run_id"]
    assert first[0]["params_digest"] == first[1]["params_digest"]
    assert first[0]["train/param_norm"] == first[1]["train/param_norm"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]

    second = _run_pair(run_dir, 8)
    for rec in second:
        assert rec["update"] == 8 and rec["policy_version"] == 8
    assert second[0]["params_digest"] == second[1]["params_digest"] != first[0]["params_digest"]
    log0 = (tmp_path / "run-0-8.log").read_text()
    assert "resuming from the checkpoint at update 6" in log0 and "process 0 of 2" in log0
