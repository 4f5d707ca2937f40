"""Two learner processes as one jax.distributed job on the CPU (gloo): they take identical steps, killed
together they resume together, and a SIGTERM to both stops them together.

Each process serves its own local actor and contributes its half of every batch; the gradient
all-reduce inside the sharded step makes their parameters bit-identical (the final metrics record
carries a digest of them). Both are killed mid-run, restart from the newest checkpoint complete on both,
and continue; nothing either acknowledged is lost.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.chaos.audit import logged_batches
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


def _start_pair(run_dir: Path, max_updates: int, tag: str) -> list[tuple[subprocess.Popen, Path]]:
    """Both processes of a pair (each with a local actor that records what was acknowledged in
    run_dir/../acks-p{rank}-{tag}.jsonl, and a write-ahead log kept whole), started."""
    coordinator = f"127.0.0.1:{_free_port()}"
    started = []
    for rank in (0, 1):
        log = run_dir.parent / f"{run_dir.name}-{rank}-{tag}.log"
        acks = run_dir.parent / f"acks-p{rank}-{tag}.jsonl"
        cmd = [
            sys.executable, "-m", "learner", "--run-dir", str(run_dir), "--ingest-port", "0", "--params-port", "0",
            "--env", "standin", "--warmup-updates", "0", "--max-steps", "8", "--samples-per-insert", "1",
            "--model.text-encoder", "none", "--local-actors", "1", "--envs-per-actor", "4", "--batch-size", "8", "--max-updates", str(max_updates),
            "--checkpoint-every", "3", "--publish-every", "1", "--time-limit", str(PAIR_S - 60), "--audit-log",
            f"--local-actor-args=--ack-log {acks}",
            "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(rank),
        ]  # fmt: skip
        with log.open("wb") as out:
            started.append(
                (subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=ACTOR_ENV), log)
            )
    return started


def _finish(started: list[tuple[subprocess.Popen, Path]], timeout: float) -> list[int]:
    """Wait for both (killing what is left at the deadline); their exit codes."""
    try:
        return [p.wait(timeout=timeout) for p, _ in started]
    finally:
        for p, _ in started:
            if p.poll() is None:
                p.kill()
                p.wait()


def _newest_update(metrics: Path, skip: int) -> int:
    """The update of the newest metrics line after the first `skip` lines (-1: none yet)."""
    lines = metrics.read_text().splitlines()[skip:] if metrics.is_file() else []
    return json.loads(lines[-1])["update"] if lines else -1


def _final_records(run_dir: Path) -> list[dict]:
    return [json.loads(m.read_text().splitlines()[-1])
            for m in (run_dir / "metrics.jsonl", run_dir / "process-1" / "metrics.jsonl")]  # fmt: skip


def test_two_learner_processes_killed_together_resume_consistently_and_lose_nothing(tmp_path):
    """The first pair trains until both processes completed the checkpoint at update 6 and went on, then
    both die by SIGKILL (a node failure; their actors exit with them). The second pair resumes on both
    processes from one checkpoint, takes identical steps, stops together on SIGTERM (bit-identical
    parameters at the end), and every
    batch any actor saw acknowledged is in its process's audit log (its write-ahead log pruned as in production), stored exactly once."""
    run_dir = tmp_path / "run"
    first = _start_pair(run_dir, 1000, "killed")
    replay = run_dir / "checkpoints" / "replay"
    deadline = time.monotonic() + PAIR_S
    metrics = [run_dir / "metrics.jsonl", run_dir / "process-1" / "metrics.jsonl"]
    # Checkpoint 6 complete: both ledgers and orbax's own directory (its asynchronous save renames it
    # into place, on a loaded machine after the ledgers are written; a restart then resumes from 3).
    while not (all((replay / f"6.p{r}.delivery.json").is_file() for r in (0, 1))
               and (run_dir / "checkpoints" / "6").is_dir()
               and all(m.is_file() and json.loads(m.read_text().splitlines()[-1])["update"] >= 7 for m in metrics)):  # fmt: skip
        assert time.monotonic() < deadline and all(p.poll() is None for p, _ in first), [
            log.read_text(errors="replace")[-3000:] for _, log in first
        ]
        time.sleep(0.2)
    for p, _ in first:
        p.send_signal(signal.SIGKILL)
    assert _finish(first, 60) == [-signal.SIGKILL] * 2

    # The second pair trains 6 updates past the newest checkpoint both processes completed: on a fast
    # machine the first may have saved at 9 or 12 before the kill, and a pair resuming at its update
    # limit would take no step to compare.
    complete = [int(f.name.split(".")[0]) for f in replay.glob("*.p0.delivery.json")]
    target = max(n for n in complete if (replay / f"{n}.p1.delivery.json").is_file()) + 6
    # It is stopped as a supervisor stops a job (SIGTERM to every process) once both passed the target:
    # they agree on the stop, and each writes a final checkpoint and record.
    seen = [len(m.read_text().splitlines()) for m in metrics]
    second = _start_pair(run_dir, 1000, "resumed")
    while not all(_newest_update(m, n) >= target for m, n in zip(metrics, seen, strict=True)):
        assert time.monotonic() < deadline + PAIR_S and all(p.poll() is None for p, _ in second), [
            log.read_text(errors="replace")[-3000:] for _, log in second
        ]
        time.sleep(0.2)
    for p, _ in second:
        p.send_signal(signal.SIGTERM)
    codes = _finish(second, 120)
    texts = [log.read_text(errors="replace") for _, log in second]
    assert codes == [0, 0], "\n\n".join(texts)
    resumed = [int(re.search(r"resuming from the checkpoint at update (\d+)", t)[1]) for t in texts]
    assert resumed[0] == resumed[1] >= 6, resumed  # one checkpoint, on both processes
    assert resumed[0] <= target - 6, (resumed, target)  # (an orbax save may lag its ledgers: not newer)
    finals = _final_records(run_dir)
    assert "SIGTERM" in {rec["stopped"] for rec in finals}, finals
    for rec in finals:
        assert rec["stopped"] in ("SIGTERM", "another learner process stopped")
        assert rec["update"] == finals[0]["update"] >= target and rec["policy_version"] == rec["update"]
        assert rec["batches_lost_in_restart"] == 0
    assert finals[0]["params_digest"] == finals[1]["params_digest"]
    assert finals[0]["train/param_norm"] == finals[1]["train/param_norm"]
    for rank, rec in enumerate(finals):
        pairs, episodes, _ = logged_batches(run_dir / ("" if rank == 0 else "process-1") / "audit.jsonl")
        acked = {}
        for acks in tmp_path.glob(f"acks-p{rank}-*.jsonl"):
            acked |= {
                (r["instance"], r["seq"]): r["episodes"]
                for r in map(json.loads, acks.read_text().splitlines())
            }
        assert acked and all(key in pairs for key in acked), f"process {rank} lost acknowledged batches"
        assert all(len(lsns) == 1 for lsns in pairs.values()) and all(
            episodes[k] == n for k, n in acked.items()
        )
        assert rec["replay/added"] + rec["replay/dropped_stale_at_add"] == sum(episodes.values())  # once each
