"""The chaos soak's short version (`python -m benchmarks chaos` is the long one, BENCHMARKS.md "chaos"):
a real learner in the production configuration (its write-ahead log pruned at every checkpoint, with an
audit log), a relay and three actors (one through the relay, one on the learner's inference service),
every process killed and restarted, stopped and continued, the learner's disk made full, and a proxy
dropping, duplicating, delaying and reordering ingest messages; then the same invariants as the long
run, from the processes' own records."""

from __future__ import annotations

import pytest

from benchmarks.chaos.benchmark import soak


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
