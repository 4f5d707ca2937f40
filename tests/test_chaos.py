"""The chaos soak's short version (`python -m benchmarks chaos` is the long one, BENCHMARKS.md "chaos"):
a real learner in the production configuration (its write-ahead log pruned at every checkpoint, with an
audit log), a relay and three actors (one through the relay, one on the learner's inference service),
every process killed and restarted, stopped and continued, the learner's disk made full, and a proxy
dropping, duplicating, delaying and reordering ingest messages; then the same invariants as the long
run, from the processes' own records."""

from __future__ import annotations

import signal
import sys

import pytest

from benchmarks.chaos.benchmark import soak
from benchmarks.chaos.soak import Soak, SoakConfig


@pytest.mark.long
@pytest.mark.timeout(900)
def test_a_short_soak_keeps_every_invariant(tmp_path):
    # Faults for 52 s, one every 1.75 s on average (about 30: kill, stop and full disk in turn, so each
    # kind about 10 times against the 5 asserted); the calm (110 s at most, for a learner that must compile
    # again on a busy machine) ends once the final learner trained 20 updates after the last fault.
    report = soak(
        2.7, seed=3, out=tmp_path / "chaos", calm_s=110.0, calm_updates=20, fault_every_s=(1.0, 2.5)
    )
    assert report["violations"] == [], report
    assert min(report["faults"].get(kind, 0) for kind in ("kill", "stop", "disk")) >= 5, report["faults"]
    assert min(report["proxy_faults"].get(k, 0) for k in ("drop", "duplicate", "delay", "reorder")) > 0
    assert report["updates_after_last_fault"] >= 20
    assert report["batches_acked"] > 100 and report["exit_codes"]["learner"] == 0, report


def _job_args(role) -> tuple[str, str]:
    args = role.proc.args
    return args[args.index("--coordinator") + 1], args[args.index("--process-id") + 1]


def test_a_two_process_learner_goes_down_and_restarts_as_one_job(tmp_path):
    """The soak's harness for a two-process learner (processes stand in for the learner's): one process
    killed or exiting by itself takes the other down, and both restart together on a new coordinator."""
    s = Soak(SoakConfig(out=tmp_path, minutes=1.0, processes=2))
    for role in s.roles:
        role.cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        s._start_learners()
        first = [_job_args(role) for role in s.learners]
        assert first[0][0] == first[1][0] and [rank for _, rank in first] == ["0", "1"]
        assert "--inference" not in s._actor(1).cmd  # a multi-process learner serves no inference
        assert (
            s.learners[0].env["JAX_COMPILATION_CACHE_DIR"] == s.learners[1].env["JAX_COMPILATION_CACHE_DIR"]
        )
        s.learners[1].proc.send_signal(signal.SIGKILL)
        s.learners[1].proc.wait()
        s._restart_exited(s.clock())
        assert not s.learners[0].alive() and s.exits == {"learner1": 1}
        assert [e["role"] for e in s.events if e["event"] == "job_kill"] == ["learner0"]
        s._due(s.clock() + 10.0)
        assert all(role.alive() and role.incarnation == 2 for role in s.learners)
        again = [_job_args(role) for role in s.learners]
        assert again[0][0] == again[1][0] and [rank for _, rank in again] == ["0", "1"]
    finally:
        s.kill_all()
        for proxy in s.proxies:
            proxy.stop()
