"""`python -m benchmarks chaos --minutes 30 --seed 0`: a Jepsen-style soak of every process, then an audit
of the invariants from the processes' own records.

A learner as production runs it (its write-ahead log pruned at every checkpoint, an audit log beside it),
a parameter relay and three actors (one through the relay, one on the learner's inference service) on
loopback (benchmarks/chaos/soak.py); every 1-4 s one fault
in turn: SIGKILL and restart of any process, SIGSTOP/SIGCONT of any process, the learner's disk "full"
(a file size limit on it); all the while a proxy between the actors and the learner's ingest drops,
duplicates, delays and reorders 5% of the messages (benchmarks/chaos/proxy.py). The last `calm_s` are
fault-free (a short soak may end its calm early: `calm_updates`). Then the actors deliver what they
hold, everything stops, and benchmarks/chaos/audit.py checks: nothing acknowledged lost, nothing logged
or stored twice, the log pruned to what the checkpoints need (benchmarks/chaos/log_pruning.py), no
process left, memory bounded and flat, training after the last fault; it reports the
updates each learner restart trained again. `--quick`: 4 minutes. `--processes 2`: the learner as a
two-process job (its processes restarted together; benchmarks/chaos/soak.py). The run's files stay in
runs/chaos/seedS (seedS-p2 with two processes: logs, the learner's run dir, the actors' ack logs).
"""

from __future__ import annotations

import shutil

from benchmarks.chaos.audit import audit
from benchmarks.chaos.soak import Soak, SoakConfig
from benchmarks.collection import ROOT
from learner.setup.disk import DISK_FULL_STATUS

MEMORY_MB = {"learner": 6000.0, "relay": 500.0, "actor": 3000.0}
"""The resident memory bound per role (the learner holds the replay and a compiled step)."""
FAULT_EVERY_S = (1.0, 4.0)
"""Seconds between faults with a one-process learner, drawn uniformly."""
JOB_FAULT_EVERY_S = (2.0, 8.0)
"""The same with a two-process learner: every kill or exit of either process restarts the whole job (both
processes' start-up, gloo and compile), so at the one-process pace the job was restarted every 10-30 s
and never trained between kills (a 4-minute soak: 16 job restarts, 13 updates, no restore)."""
GROWTH = 1.3
"""Largest allowed ratio of a long incarnation's last-quarter memory to its first quarter's, after its
warm-up (benchmarks/chaos/audit.py `memory`)."""


def violations(report: dict) -> list[str]:
    """The invariants the report breaks (empty: all hold)."""
    broken = [f"{key} = {report[key]}" for key in ("lost", "logged_twice", "episode_mismatches", "stored_twice",
                                                    "lost_in_restart", "replay_unaccounted", "diverged") if report[key]]  # fmt: skip
    pruning = report["log_pruning"]
    if pruning["excess_segments"] or pruning["short"]:
        broken.append(f"the write-ahead log is not pruned to what the checkpoints need: {pruning}")
    if report["minutes"] >= 10 and not pruning["judged"]:
        broken.append(f"fewer than two complete checkpoints: the log's pruning went unjudged {pruning}")
    for actor, count in report["batches_acked_by_actor"].items():
        if not count:
            broken.append(f"{actor} had nothing acknowledged")
    if report["left_running"]:
        broken.append(f"left running: {report['left_running']}")
    for role, mem in report["memory"].items():
        bound = MEMORY_MB[role.rstrip("0123456789")]
        if mem["max_mb"] > bound or (mem["growth"] is not None and mem["growth"] > GROWTH):
            broken.append(f"{role} memory {mem}")
    for role, count in report["exits"].items():  # only a learner that could not write at start-up may exit
        if not role.startswith("learner"):
            broken.append(f"{role} exited by itself {count} times")
    disk_full = f"status {DISK_FULL_STATUS}:"  # a start-up on a full disk (learner/setup/disk.py)
    unexplained = [why for why in report["exit_reasons"] if not why.startswith(disk_full)]
    if unexplained:
        broken.append(f"exits other than a start-up on a full disk: {unexplained}")
    unexplained_redo = [r for r in report["redone_past_interval"] if not r["checkpoint_errors"]]
    if unexplained_redo:
        broken.append(f"restarts that trained again more than the checkpoint interval: {unexplained_redo}")
    if report["updates_after_last_fault"] <= 0:
        broken.append("no training after the last fault")
    if report["batches_acked"] == 0:
        broken.append("nothing was acknowledged: the soak measured nothing")
    return broken


def soak(minutes: float, seed: int, out=None, **overrides) -> dict:
    """One soak and its audit: the report, with `violations`."""
    out = out or ROOT / "runs" / "chaos" / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    s = Soak(SoakConfig(out=out, minutes=minutes, seed=seed, **overrides))
    try:
        s.run()
    finally:
        codes = s.stop()
        s.kill_all()
    report = {"minutes": minutes, "seed": seed, "exit_codes": codes, **audit(s)}
    report["violations"] = violations(report)
    return report


def run(
    quick: bool, minutes: float | None = None, seed: int = 0, processes: int = 1
) -> tuple[list[dict], dict]:
    minutes = minutes or (4.0 if quick else 30.0)
    out = ROOT / "runs" / "chaos" / (f"seed{seed}" if processes == 1 else f"seed{seed}-p{processes}")
    every = FAULT_EVERY_S if processes == 1 else JOB_FAULT_EVERY_S
    report = soak(
        minutes, seed, out, calm_s=90.0 if minutes < 10 else 120.0, processes=processes, fault_every_s=every
    )
    rows = [{"fault": k, "count": v} for k, v in {**report["faults"], **report["proxy_faults"]}.items()]
    summary = {k: v for k, v in report.items() if k not in ("faults", "proxy_faults")}
    return rows, summary
