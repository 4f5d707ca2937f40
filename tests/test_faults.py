"""Fault tests: a real learner and real actor processes on loopback, with processes frozen, killed and
restarted under them. Each test ends with exact delivery accounting where the design allows it: every
episode an actor finished is either acknowledged (and stored exactly once), discarded by choice (counted),
or counted as lost with a learner that died after its last checkpoint.

Regression tests for faults found while writing these are at the end: --insert-slack below the batch
size must not wedge the learner, and an actor flushing after --max-episodes must deliver to a learner
that restarts meanwhile.
"""

from __future__ import annotations

import ast
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ACTOR_ENV, ROOT, START_S

STOPPED = re.compile(r"^actor: stopped \((?P<reason>[^)]*)\); (?P<stats>\{.*\})\s*$", re.MULTILINE)
# Short timeouts everywhere, so faults are noticed within seconds. Deadlines for processes to get going
# or to finish are long (START_S): a busy 2-core machine is several times slower than an idle one.
FAST_ACTOR = ("--heartbeat-every", "0.5", "--learner-timeout", "3", "--ack-timeout", "3")
FAST_ACTOR += ("--handshake-timeout", "1", "--max-backoff", "2", "--status-every", "2")
FAST_LEARNER = ("--log-every", "0.5")
# For tests that check a session without network faults (no rejoin, nothing refused): the learner's
# main thread trains between polls, and on a busy machine one step can keep it from answering for
# several seconds (5 s seen on 2 shared cores), longer than FAST_ACTOR's 3 s. A later flag wins.
STEADY_ACTOR = ("--learner-timeout", "60", "--ack-timeout", "60")


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free right now (for a learner that must come back on the same ones)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    """Poll until predicate() is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(every)


def ports_of(learner) -> tuple[int, int]:
    return int(learner.ingest.rsplit(":", 1)[1]), int(learner.params.rsplit(":", 1)[1])


class ActorProcess:
    """`python -m actors` on the stand-in phone, its console in a log file."""

    def __init__(self, log_path: Path, ingest_port: int, params_port: int, *extra: str):
        self.log_path = log_path
        self._log = log_path.open("wb")
        cmd = [
            sys.executable, "-m", "actors", "--host", "127.0.0.1", "--ingest-port", str(ingest_port),
            "--params-port", str(params_port), "--env", "standin", "--num-envs", "2", *FAST_ACTOR, *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=ACTOR_ENV, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the actor did not exit within {timeout:.0f}s:\n{self.log()[-4000:]}")

    def result(self) -> tuple[str, dict]:
        """(reason, stats) of the actor's final `actor: stopped (REASON); {...}` line."""
        found = STOPPED.findall(self.log())
        assert len(found) == 1, f"expected one 'actor: stopped' line:\n{self.log()[-4000:]}"
        reason, stats = found[0]
        return reason, ast.literal_eval(stats)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


@pytest.fixture
def start_actor(tmp_path):
    """Factory: start an actor process; every one is killed (if still running) at teardown."""
    started: list[ActorProcess] = []

    def start(ingest_port: int, params_port: int, *extra: str) -> ActorProcess:
        actor = ActorProcess(tmp_path / f"actor{len(started)}.log", ingest_port, params_port, *extra)
        started.append(actor)
        return actor

    yield start
    for actor in started:
        actor.kill()


def latest(learner, run_id: str | None = None) -> dict:
    """The newest metrics line (of one learner process when run_id is given); {} before the first."""
    lines = [m for m in learner.metrics() if run_id is None or m["run_id"] == run_id]
    return lines[-1] if lines else {}


def final_metrics(learner) -> dict:
    """Stop the learner (SIGTERM) and return the metrics line it writes on the way out."""
    assert learner.stop() == 0, learner.log()[-4000:]
    last = learner.metrics()[-1]
    assert "stopped" in last, last
    return last


def assert_all_delivered(stats: dict) -> None:
    """Every finished episode was acknowledged by a learner (nothing held, discarded or refused)."""
    assert stats.get("episodes_unacked_at_exit", 0) == 0, stats
    assert stats["episodes_acked"] == stats["episodes_finished"], stats
    for key in ("episodes_discarded_backlog", "episodes_refused", "episodes_lost_model_changed"):
        assert stats.get(key, 0) == 0, (key, stats)


REJOINED = re.compile(
    r"^actor \S+: joined run \S+ at \S+ \((?P<reason>.+); \d+ episodes held\)\s*$", re.MULTILINE
)
"""actors/actor.py logs every join after the first with the reason the session before it ended."""
REJOIN_REASONS = {
    "forgotten": re.compile(r"the learner no longer knows this actor"),  # an ERROR not_welcomed reached it
    "restarted": re.compile(r"the learner restarted"),  # a HEARTBEAT with another run_id
    "silent": re.compile(r"the learner was silent for \d+s"),  # nothing heard for --learner-timeout
    "no ACK": re.compile(r"no ACK for \d+s"),  # a batch unacknowledged for --ack-timeout
}
"""The reasons an actor joins again (docs/PROTOCOL.md §2.5 and §10). Which one ends a broken session is a
race, not a choice: an actor forgotten while frozen (or under a restarted learner) may first see the
ERROR not_welcomed, notice that the learner was silent (its clock ran on while it was stopped), or find
an ACK overdue; the refusal then goes to the socket it has just closed."""


def rejoin_reasons(actor: ActorProcess) -> list[str]:
    """Why the actor joined again, one entry per rejoin; fails on a reason not in REJOIN_REASONS."""
    log = actor.log()
    reasons = []
    for found in REJOINED.finditer(log):
        kind = next((k for k, p in REJOIN_REASONS.items() if p.fullmatch(found["reason"])), None)
        assert kind, f"a rejoin for an undocumented reason: {found['reason']!r}\n{log[-4000:]}"
        reasons.append(kind)
    return reasons


def assert_rejoined(actor: ActorProcess, stats: dict) -> list[str]:
    """The actor joined again at least once, each time for a documented reason; those reasons."""
    reasons = rejoin_reasons(actor)
    assert stats.get("rejoins", 0) >= 1 and len(reasons) == stats["rejoins"], (reasons, stats)
    return reasons


def assert_rejoined_and_delivered(actor: ActorProcess, timeout: float) -> dict:
    """The actor ran to its episode limit across a rejoin and delivered every episode; its stats."""
    assert actor.wait(timeout) == 0, actor.log()
    reason, stats = actor.result()
    assert reason == "episode limit", stats
    assert_rejoined(actor, stats)
    assert_all_delivered(stats)
    return stats


def refusals_explained(final: dict, *actors: ActorProcess) -> None:
    """The only refusals are of messages under an actor id the learner no longer knows (it forgot a
    silent actor, or restarted, or the actor's own newer handshake voided it): the actor shakes hands
    again and re-sends. Every rejoin is for a documented reason, and refusals come with a rejoin or a
    logged refusal. The actor need not see the ERROR itself: when it notices a silent learner, an
    overdue ACK or another run_id first, it joins again on a new socket and the refusal goes to the
    old one."""
    assert set(final["rejected_by_reason"]) <= {"not_welcomed"}, final["rejected_by_reason"]
    if final["rejected"]:
        refused = "learner refused a message: not_welcomed"
        logs = "\n".join(a.log()[-2000:] for a in actors)
        assert any(rejoin_reasons(a) or refused in a.log() for a in actors), (final["rejected"], logs)
    for a in actors:
        rejoin_reasons(a)  # fails on an undocumented reason


# ---- 1. a clean run, then emulator faults and SIGTERMs under the same learner ---------------------------
@pytest.mark.long
@pytest.mark.timeout(900)
def test_clean_run_accounts_for_every_episode_and_so_do_emulator_faults_and_sigterms(
    learner_process, start_actor
):
    """A stand-in actor with no faults at all, then (section 6 below) a SimPhone actor whose emulated
    device crashes, hangs and disconnects, then (section 3b) two actors stopped with SIGTERM, one after
    the other under one learner: each was a test with a learner of its own (the same flags), and one
    learner saves two start-ups, compiles and stops. Each part is checked as it was, on the metrics once
    its actors are done (the SIGTERM part freezes the learner and may leave refusals behind it, so the
    first two parts' accounting is checked before it starts)."""
    learner = learner_process(*FAST_LEARNER)
    actor = start_actor(*ports_of(learner), "--max-episodes", "200", "--seed", "1", *STEADY_ACTOR)
    assert actor.wait(START_S) == 0, actor.log()
    reason, stats = actor.result()
    assert reason == "episode limit", stats
    assert stats["episodes_finished"] >= 200
    assert_all_delivered(stats)
    assert stats.get("rejoins", 0) == 0 and stats.get("batches_resent", 0) == 0, stats
    # Everything it finished is stored, once, before the next actor starts.
    clean = wait_for(
        lambda: (m := latest(learner)).get("episodes") == stats["episodes_finished"] and m, 60, "its episodes"
    )
    assert clean["duplicates"] == 0 and clean["rejected"] == 0, clean["rejected_by_reason"]

    faulty_stats = actor_with_emulator_faults_delivers_every_episode(learner, start_actor)
    both = stats["episodes_finished"] + faulty_stats["episodes_finished"]
    final = wait_for(
        lambda: (m := latest(learner)).get("episodes") == both and m, 60, "both actors' episodes"
    )
    assert final["duplicates"] == 0 and final["rejected"] == 0, final["rejected_by_reason"]
    assert final["batches_lost_in_restart"] == 0

    sigterm_delivers_what_is_held_and_a_second_signal_stops_at_once(learner, start_actor)
    final = final_metrics(learner)
    assert final["duplicates"] == 0 and final["batches_lost_in_restart"] == 0


# ---- 2. an actor frozen past the learner's actor timeout -------------------------------------------
@pytest.mark.long
@pytest.mark.timeout(900)
def test_actor_frozen_past_the_timeout_rejoins_and_loses_nothing(learner_process, start_actor):
    learner = learner_process(*FAST_LEARNER, "--actor-timeout", "1.5")
    # No episode limit: the test stops the actor (SIGTERM: it delivers what it holds, then exits) once it
    # has delivered through a new handshake, so how fast it runs decides nothing.
    actor = start_actor(*ports_of(learner), "--seed", "2", "--flush-timeout", "120")
    wait_for(
        lambda: latest(learner).get("episodes", 0) > 0 and latest(learner)["actors"] == 1, START_S, "episodes"
    )
    assert actor.proc.poll() is None, actor.log()
    actor.proc.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        seen = len(learner.metrics())
        forgotten = wait_for(
            lambda: next((m for m in learner.metrics()[seen:] if m["actors"] == 0), None),
            60,
            "the actor forgotten",
        )
        # Frozen longer than its --learner-timeout too: thawed, it may notice the silence first.
        time.sleep(max(0.0, frozen_at + 4 - time.monotonic()))
    finally:
        actor.proc.send_signal(signal.SIGCONT)
    # The learner forgot the actor after reading everything it had sent, and refuses its old actor_id:
    # every episode it stores from now on came through a new handshake.
    wait_for(
        lambda: latest(learner)["episodes"] > forgotten["episodes"], START_S, "episodes after the rejoin"
    )
    actor.proc.send_signal(signal.SIGTERM)
    assert actor.wait(START_S) == 0, actor.log()
    reason, stats = actor.result()
    assert reason == "SIGTERM", stats
    # Whichever it noticed first; never "restarted": it is the same learner.
    assert set(assert_rejoined(actor, stats)) <= {"forgotten", "silent", "no ACK"}, actor.log()[-4000:]
    assert_all_delivered(stats)
    final = final_metrics(learner)
    assert final["run_id"] == forgotten["run_id"]
    # Nothing lost, and the batches sent again after the rejoin were stored once.
    assert final["episodes"] == stats["episodes_finished"], (final, stats)
    assert final["batches_lost_in_restart"] == 0
    refusals_explained(final, actor)  # the thawed actor's first messages, under its forgotten id


# ---- 3. an actor killed mid-stream ------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.timeout(900)
def test_killed_actor_is_forgotten_and_a_new_one_streams(learner_process, start_actor):
    """A acts through the learner's inference service (`--inference remote`), B on its own: a killed remote
    actor leaves the service with answers nobody takes (dropped and counted, never a crash), and loses no
    acknowledged episode either."""
    learner = learner_process(*FAST_LEARNER, "--actor-timeout", "3")
    ingest, params = ports_of(learner)
    a = start_actor(ingest, params, "--seed", "3", "--inference", "remote")
    wait_for(lambda: latest(learner).get("episodes", 0) >= 100, START_S, "episodes from actor A")
    a.kill()  # SIGKILL while it streams: mid-episode, and likely mid-send
    seen = len(learner.metrics())
    # Forgotten after --actor-timeout; from then on the learner has stored all it will of A's.
    gone = wait_for(
        lambda: next((m for m in learner.metrics()[seen:] if m["actors"] == 0), None),
        60,
        "A forgotten",
    )
    from_a = gone["episodes"]
    b = start_actor(ingest, params, "--seed", "4", "--max-episodes", "300")
    # No wait for B in the metrics: B may finish, and be forgotten, between two metrics lines (they can be
    # seconds apart on a busy machine). The final count below shows that B's episodes were all stored.
    assert b.wait(START_S) == 0, b.log()
    assert learner.proc.poll() is None, learner.log()[-4000:]  # the learner never noticed a crash
    reason, stats = b.result()
    assert reason == "episode limit", stats
    assert_all_delivered(stats)
    final = final_metrics(learner)
    assert final["episodes"] == from_a + stats["episodes_finished"], (from_a, final["episodes"], stats)
    assert final["duplicates"] == 0 and final["batches_lost_in_restart"] == 0
    refusals_explained(final, a, b)
    assert final["inference/answered"] > 0 and set(final["inference/rejected_by_reason"]) <= {"not_welcomed"}


# ---- 3b. an actor stopped with a signal ---------------------------------------------------------------
HELD = re.compile(r"held ([1-9]\d*), faults")


def sigterm_delivers_what_is_held_and_a_second_signal_stops_at_once(learner, start_actor) -> None:
    """A launcher or scheduler stops actors with SIGTERM: the first one still delivers what is held (up
    to --flush-timeout), a second one means now and counts what is held as unacknowledged at exit. The
    learner is frozen (SIGSTOP) while the signal arrives, so that the actor surely holds episodes. (Run by
    test 1, on its learner, which then checks that nothing was stored twice.)"""
    ingest, params = ports_of(learner)
    results = []
    for signals in (1, 2):
        actor = start_actor(ingest, params, "--seed", str(10 + signals), "--flush-timeout", "120")
        wait_for(
            lambda a=actor: "acked" in a.log() and latest(learner).get("episodes", 0) > 0, START_S, "acks"
        )
        learner.proc.send_signal(signal.SIGSTOP)
        try:
            mark = len(actor.log())
            wait_for(lambda a=actor, m=mark: HELD.search(a.log()[m:]), START_S, "episodes held by the actor")
            for _ in range(signals):
                actor.proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
        finally:
            learner.proc.send_signal(signal.SIGCONT)
        assert actor.wait(START_S) == 0, actor.log()
        results.append(actor.result())
    (reason, stats), (reason2, stats2) = results
    assert reason == "SIGTERM", stats
    assert_all_delivered(stats)  # the first signal delivered everything it held once the learner woke
    assert reason2 == "SIGTERM" and stats2["episodes_unacked_at_exit"] > 0, stats2  # the second: at once


# ---- 4. the learner killed and restarted under a running actor -------------------------------------
RESUMED = re.compile(
    r"resuming from the checkpoint at update (\d+) \(policy v(\d+)\), (?:(\d+) episodes|no saved)"
)


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("inference", ["local", "remote"])
def test_killed_learner_restarts_from_its_checkpoint_and_the_actor_rejoins(
    learner_process, start_actor, tmp_path, inference
):
    """With `remote`, the actor acts through the learner's inference service (learner/serving/inference.py): the
    service dies with the learner and comes back, on another port, with the restarted one; the actor, which
    holds no model, gives up its silent requests (`no_answer`), joins again, takes the new port from WELCOME
    and loses nothing either."""
    ingest, params = free_ports(2)
    run_dir = tmp_path / "restarted"
    args = (*FAST_LEARNER, "--actor-timeout", "5", "--checkpoint-every", "5", "--batch-size", "4")
    # Every stored episode stays in the replay (no stale drops, no eviction), so the resumed replay holds
    # exactly the episodes the checkpoint's ledger records; and one episode per batch, so the batches
    # the dead learner acknowledged after that checkpoint are exactly so many episodes.
    args += ("--max-policy-lag", "0", "--ingest-port", str(ingest), "--params-port", str(params))
    first = learner_process(*args, run_dir=run_dir)
    # The actor's 600 episodes must outlast two checkpoints: on a busy machine they take less time than
    # the learner's first compile, so the actor starts once the learner can train.
    wait_for(lambda: "train step compiled" in first.log(), START_S, "the learner's compiled step")
    actor = start_actor(
        ingest, params, "--max-episodes", "600", "--seed", "6", "--flush-timeout", "120",
        "--max-batch-episodes", "1", "--max-pending-episodes", "16",
        *(("--inference", "remote", "--inference-timeout", "3") if inference == "remote" else ()),
    )  # fmt: skip
    wait_for(lambda: latest(first).get("update", 0) >= 12, START_S, "two checkpoints")
    assert actor.proc.poll() is None, actor.log()
    first.proc.kill()  # SIGKILL: no checkpoint at exit; what it acknowledged since is in its write-ahead log
    first.proc.wait()
    first_run = latest(first)
    second = learner_process(*args, run_dir=run_dir)
    resumed = RESUMED.search(second.log())
    assert resumed, second.log()
    kept = int(resumed[3] or 0)
    # A checkpoint at least as new as the first (update 12 was logged, so the save at 5 had finished: orbax
    # finishes one save before it starts the next). No upper bound from the metrics: the learner trains
    # on between its metrics lines, so it may have saved a newer one than its last line shows.
    assert int(resumed[1]) >= 5 and int(resumed[1]) % 5 == 0, resumed[0]
    stats = assert_rejoined_and_delivered(actor, START_S)
    final = final_metrics(second)
    assert final["run_id"] != first_run["run_id"]
    lost = final["batches_lost_in_restart"]
    recovered = re.search(r"write-ahead log: (\d+) batches", second.log())
    print(
        f"recovered from the log: {recovered[1] if recovered else 0} batches; "
        f"restart: resumed at update {resumed[1]} with {kept} episodes; the first learner had logged "
        f"{first_run['episodes']} by its last metrics line; {lost} batches lost; second stored "
        f"{final['episodes']}, {final['duplicates']} duplicates; actor {stats}"
    )
    assert lost == 0, "the default durability (fsync) loses no acknowledged batch"
    # Every episode the actor finished is in exactly one place: the checkpoint's replay or the restarted
    # learner's episodes (those it recovered from the log and those it took in since).
    assert stats["episodes_finished"] == kept + final["episodes"] + lost, (kept, final, stats)
    refusals_explained(final, actor)
    if inference == "remote":  # every step was the service's, before and after the restart
        assert stats["inference_reconnects"] >= 1 and "param_swaps" not in stats, stats
        assert final["inference/answered"] > 0


# ---- 5. flow control: an actor faster than training -------------------------------------------------
SLACK, CREDIT, MAX_BATCH, BATCH, SPI = 20, 1, 8, 16, 16.0


@pytest.mark.long
@pytest.mark.timeout(900)
def test_insert_slack_bounds_what_the_learner_stores_ahead_of_training(learner_process, start_actor):
    """Both --when-blocked modes, one actor after the other under one learner: "wait" (100 episodes),
    then "discard" (600). Each was a test with a learner of its own; one learner saves a start-up and a
    train-step compile, and each actor is checked as it was, on its own part of the metrics."""
    # Training consumes BATCH / SPI = 1 episode per update (about 10 a second here); the actor makes
    # about 150 a second. (Below the batch size the tap waits for a first batch: see the regression test at the end.)
    learner = learner_process(
        *FAST_LEARNER, "--insert-slack", str(SLACK), "--actor-credit", str(CREDIT),
        "--batch-size", str(BATCH), "--samples-per-insert", str(SPI),
    )  # fmt: skip
    # The rate limit applies from the training loop on: while the train step compiles the learner accepts
    # everything (see the module notes), so the actor starts after that.
    wait_for(lambda: "train step compiled" in learner.log(), START_S, "the train step compiled")
    phases = []
    for when_blocked, episodes in (("wait", 100), ("discard", 600)):
        # Training has caught up with what the actor before stored (the tap is open): a closed tap in the
        # metrics from here on is this actor's doing.
        wait_for(lambda: latest(learner).get("accepting"), START_S, "an open tap")
        mark = len(learner.metrics())
        actor = start_actor(
            *ports_of(learner), "--seed", "7", "--when-blocked", when_blocked, "--max-pending-episodes", "8",
            "--max-batch-episodes", str(MAX_BATCH), "--max-episodes", str(episodes), "--flush-timeout", "120", *STEADY_ACTOR,
        )  # fmt: skip
        assert actor.wait(START_S) == 0, actor.log()
        reason, stats = actor.result()
        assert reason == "episode limit", (when_blocked, stats)
        assert stats.get("episodes_unacked_at_exit", 0) == 0, (when_blocked, stats)
        phases.append((when_blocked, stats, mark))
    final = final_metrics(learner)
    lines = learner.metrics()
    acked = sum(stats["episodes_acked"] for _, stats, _ in phases)
    assert final["episodes"] == acked and final["duplicates"] == 0, (final, phases)
    assert final["rejected"] == 0, final["rejected_by_reason"]
    # learner/loop.py closes the credit tap while episodes - rl_updates * batch / samples_per_insert
    # > slack (no warm-up here: update == rl_updates). It is checked once per loop iteration, before the
    # poll, so one iteration can still take the CREDIT batches already granted, each ACK of which grants
    # CREDIT more (they arrive after the tap closed): the bound is slack + 2 x credit x batch episodes, not
    # slack + credit x batch episodes (30 > 28 seen here).
    ahead = [m["episodes"] - m["update"] * BATCH / SPI for m in lines]
    assert max(ahead) <= SLACK + 2 * CREDIT * MAX_BATCH, ahead
    ends = [mark for _, _, mark in phases[1:]] + [len(lines)]
    for (when_blocked, stats, mark), end in zip(phases, ends, strict=True):
        assert any(not m["accepting"] for m in lines[mark:end]), f"{when_blocked}: the tap never closed"
        if when_blocked == "discard":
            assert stats["episodes_discarded_backlog"] > 0, stats
            assert stats.get("blocked_s", 0) == 0, stats
            assert stats["episodes_finished"] == stats["episodes_acked"] + stats["episodes_discarded_backlog"]
        else:
            assert stats["blocked_s"] > 0, stats
            assert_all_delivered(stats)  # waited, discarded nothing


# ---- 6. emulator faults under a real learner (run by test 1, on its learner) --------------------------
def actor_with_emulator_faults_delivers_every_episode(learner, start_actor) -> dict:
    """A SimPhone actor with emulated device faults runs to its episode limit and every episode it
    finished is acknowledged; its stats."""
    faults = ("--emulator.enabled", "--emulator.time-scale", "0.0005", "--emulator.crash-prob", "0.05",
              "--emulator.hang-prob", "0.05", "--emulator.disconnect-prob", "0.05")  # fmt: skip
    actor = start_actor(
        *ports_of(learner),
        "--env",
        "simphone",
        *faults,
        "--max-episodes",
        "120",
        "--seed",
        "8",
        *STEADY_ACTOR,
    )
    assert actor.wait(START_S) == 0, actor.log()
    reason, stats = actor.result()
    assert reason == "episode limit", stats
    assert_all_delivered(stats)
    faults_counted = sum(stats.get(f"device_{kind}", 0) for kind in ("crash", "hang", "disconnect"))
    assert faults_counted >= 1, stats
    return stats


# ---- regressions: faults found while writing these tests ------------------------------------------------
@pytest.mark.timeout(900)
def test_insert_slack_below_the_batch_size_does_not_wedge_the_learner(learner_process, start_actor):
    learner = learner_process(
        *FAST_LEARNER, "--insert-slack", "20", "--batch-size", "32", "--actor-credit", "1"
    )
    wait_for(lambda: "train step compiled" in learner.log(), START_S, "the train step compiled")
    start_actor(*ports_of(learner), "--seed", "9", "--max-batch-episodes", "1", "--max-pending-episodes", "8")
    # With one-episode batches and credit 1, a slack of 20 alone would close the tap at about 22 stored
    # episodes, fewer than a batch; the tap stays open until the learner can train, and it does.
    wait_for(lambda: latest(learner)["update"] >= 1, START_S, "the first update", every=0.5)
    closed = [m for m in learner.metrics() if m.get("accepting") is False]
    assert all(m["episodes"] >= 32 for m in closed), closed[:1]


@pytest.mark.long
@pytest.mark.timeout(900)
def test_flush_survives_a_learner_restart(learner_process, start_actor, tmp_path):
    ingest, params = free_ports(2)
    args = (*FAST_LEARNER, "--ingest-port", str(ingest), "--params-port", str(params))
    first = learner_process(*args, run_dir=tmp_path / "flush")
    actor = start_actor(
        ingest, params, "--seed", "10", "--max-episodes", "600", "--when-blocked", "discard",
        "--max-pending-episodes", "8", "--flush-timeout", "120", "--learner-timeout", "20", "--ack-timeout", "20",
    )  # fmt: skip
    wait_for(lambda: latest(first).get("episodes", 0) > 0, START_S, "episodes")
    # Frozen, the learner acknowledges nothing more; the actor discards its backlog and reaches its limit
    # within seconds (a dozen on a busy machine), before its learner and ACK timeouts (20 s), so it is
    # flushing, not joining again, when a new learner takes over the ports; that one is up within
    # --flush-timeout (starting a learner takes half a minute on a busy machine).
    first.proc.send_signal(signal.SIGSTOP)
    time.sleep(3)
    assert actor.proc.poll() is None, actor.log()
    first.proc.kill()
    first.proc.wait()
    learner_process(*args, run_dir=tmp_path / "flush")
    assert actor.wait(START_S) == 0, actor.log()
    _, stats = actor.result()
    assert stats["episodes_unacked_at_exit"] == 0, stats
