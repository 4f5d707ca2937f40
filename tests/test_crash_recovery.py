"""Nothing acknowledged is ever lost: a real learner process under load from two actors, killed with
SIGKILL at 8 seeded random moments and restarted each time on the same run dir and ports.

The actors are the test's side: threads speaking the protocol (docs/PROTOCOL.md §2) with the reference
actor's delivery rules (keep every batch until its ACK or a WELCOME's `acked_upto` covers it, send it
again under the same seq after every new handshake, join again on silence or a new run_id). Each
episode has random content, so its digest names it. Half the kills land in the first seconds after the
learner's sockets are up (start-up, recovery, compile), half after its train step is compiled (training,
checkpoints), and every fourth only once that learner has completed a checkpoint, so that restarts
resume from a checkpoint's replay however slow the machine. At the end the actors deliver what they
still hold, the learner stops cleanly, and the test reads what a restart would: the newest complete
checkpoint's replay plus the log's batches after it that its ledger lacks (read here by a slow
reference, not by the learner's code). Every episode any ACK covered is there exactly once (the replay
is big enough that training evicts nothing, and --max-policy-lag 0 drops nothing as stale), and no
learner ever counted a batch lost.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import threading
import time
from collections import Counter, OrderedDict

import numpy as np
import pytest
import zmq

from benchmarks.ingest import random_arrays
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from learner.ingest.settler import LoggedEpisodes
from learner.ingest.wal import WriteAheadLog, unpack_batch
from learner.replay.file import load_replay
from learner.replay.prioritized import PrioritizedReplay
from learner.training.checkpoint import Checkpointer
from tests.conftest import START_S
from tests.test_faults import FAST_LEARNER, free_ports, wait_for

KILLS = 8
"""Eight kills cover each kind of moment at least twice: kills 0, 2, 4, 6 in start-up (4), 1 and 5 in
training (2), 3 and 7 after a completed checkpoint (2). Twenty were run until issue 31 and ten until the
suite needed the time again (ten gave 5, 3 and 2: the ninth and tenth added a start-up and a training
kill, kinds already covered; the invariants are the same)."""
MAX_STEPS = 8
CAPACITY = 50_000
WINDOW = 4
"""Batches an actor keeps in flight (below the learner's credit of 8)."""
SEND_EVERY_S = 0.1
"""An actor sends a new batch at most this often: steady load, and a replay small enough (a few thousand
episodes) that checkpoints complete between kills, so recovery starts from checkpoints as well as from
the log's start."""
RECOVERED = re.compile(r"write-ahead log: (\d+) batches \((\d+) episodes\)")
RESUMED = re.compile(
    r"resuming from the checkpoint at update \d+ \(policy v\d+\), (\d+) episodes in the replay"
)


def digest(obs: dict[str, np.ndarray], steps: dict[str, np.ndarray]) -> str:
    """An episode's name: its content, without the policy versions (a restarted learner may cap those)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(obs):
        h.update(np.ascontiguousarray(obs[name]).tobytes())
    for name in ("action_type", "element", "word", "direction", "behavior_logp", "reward"):
        h.update(np.ascontiguousarray(steps[name]).tobytes())
    return h.hexdigest()


class CrashActor(threading.Thread):
    """An actor instance that keeps every batch until it is acknowledged, whatever the learner does."""

    def __init__(self, index: int, ingest_port: int):
        super().__init__(name=f"crash-actor-{index}", daemon=True)
        self.instance, self.port = f"crash-actor-{index}", ingest_port
        self.rng = np.random.default_rng(1000 + index)
        self.unacked: OrderedDict[int, tuple[list[str], list[dict]]] = OrderedDict()
        self.acked: list[str] = []
        self.next_seq = 1
        self.refused: Counter[str] = Counter()
        self.sessions = 0
        self.failure = ""
        self.producing = threading.Event()
        self.producing.set()
        self.done = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context()
        try:
            while not self.done.is_set():
                self._session(ctx)
        except Exception as e:  # surfaced by the test
            self.failure = f"{type(e).__name__}: {e}"
        finally:
            ctx.destroy(0)

    def settled(self) -> bool:
        return not self.unacked

    def _ack(self, seq: int) -> None:
        hashes, _ = self.unacked.pop(seq)
        self.acked.extend(hashes)

    def _session(self, ctx: zmq.Context) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{self.port}")
        try:
            first_unacked = next(iter(self.unacked), self.next_seq)
            sock.send(wire.encode(protocol.Hello(self.instance, 1, self.instance, first_unacked).to_msg()))
            if not sock.poll(2000):
                return  # Lazy Pirate: a new socket, HELLO again
            msg = protocol.parse(sock.recv())
            if msg["kind"] != protocol.WELCOME:
                return
            welcome = protocol.Welcome.from_msg(msg)
            self.sessions += 1
            for seq in [s for s in self.unacked if s <= welcome.acked_upto]:
                self._ack(seq)
            model, grant, actor_id = welcome.model, welcome.grant, welcome.actor_id
            for seq, (_, episodes) in self.unacked.items():
                sock.send(wire.encode(protocol.Traj(actor_id, seq, episodes).to_msg()))
            heard = beat = sent = time.monotonic()
            while not self.done.is_set():
                now = time.monotonic()
                ready = self.producing.is_set() and self.next_seq <= grant and len(self.unacked) < WINDOW
                if ready and now - sent >= SEND_EVERY_S:
                    self._send_new(sock, actor_id, model)
                    sent = now
                if now - beat > 1.0:
                    sock.send(wire.encode(protocol.ActorHeartbeat(actor_id).to_msg()))
                    beat = now
                if not sock.poll(20):
                    if time.monotonic() - heard > 3.0:
                        return  # the learner is gone: join again
                    continue
                heard = time.monotonic()
                msg = protocol.parse(sock.recv())
                if msg["kind"] == protocol.ACK:
                    ack = protocol.Ack.from_msg(msg)
                    grant = max(grant, ack.grant)
                    if ack.seq in self.unacked:
                        self._ack(ack.seq)
                elif msg["kind"] == protocol.HEARTBEAT:
                    beat_msg = protocol.Heartbeat.from_msg(msg)
                    if beat_msg.run_id != welcome.run_id:
                        return  # a restarted learner
                    grant = max(grant, beat_msg.grant)
                elif msg["kind"] == protocol.ERROR:
                    error = protocol.Error.from_msg(msg)
                    self.refused[error.code] += 1
                    if error.code not in ("not_welcomed", "no_credit", "unavailable"):
                        raise AssertionError(f"the learner refused a valid batch: {error}")
                    return  # join again and send everything held
        finally:
            sock.close(0)

    def _send_new(self, sock: zmq.Socket, actor_id: int, model: ModelConfig) -> None:
        episodes, hashes = [], []
        for _ in range(2):
            obs, steps = random_arrays(self.rng, model, int(self.rng.integers(1, MAX_STEPS + 1)))
            hashes.append(digest(obs, steps))
            episodes.append(
                protocol.episode_fields("crash", bool(self.rng.random() < 0.5), False, obs, steps)
            )
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.unacked[seq] = (hashes, episodes)
        sock.send(wire.encode(protocol.Traj(actor_id, seq, episodes).to_msg()))


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_eight_kill9s_lose_no_acknowledged_episode(learner_process, tmp_path):
    ingest, params = free_ports(2)
    run_dir = tmp_path / "crashing"
    args = (*FAST_LEARNER, "--checkpoint-every", "3", "--batch-size", "4", "--max-steps", str(MAX_STEPS))
    args += ("--max-policy-lag", "0", "--replay-capacity", str(CAPACITY), "--actor-timeout", "5")
    args += ("--ingest-port", str(ingest), "--params-port", str(params))
    rng = np.random.default_rng(17)
    actors = [CrashActor(i, ingest) for i in range(2)]
    learners, logs = [], []
    try:
        for actor in actors:
            actor.start()
        for kill in range(KILLS):
            before = _ledgers(run_dir)
            learner = learner_process(*args, run_dir=run_dir)  # returns once its sockets are bound
            learners.append(learner)
            if kill % 2:  # in training: updates, publishes, checkpoints
                wait_for(
                    lambda p=learner: "train step compiled" in p.log(), START_S, "the compiled step", 0.05
                )
            if kill % 4 == 3:  # after a checkpoint this learner completed, however slow the machine
                wait_for(lambda b=before: _ledgers(run_dir) - b, START_S, "a completed checkpoint", 0.05)
            time.sleep(rng.uniform(0.0, 2.0))
            learner.proc.send_signal(signal.SIGKILL)
            learner.proc.wait()
            logs.append(learner.log())  # the next learner writes the same run_dir/learner.log
            assert not any(a.failure for a in actors), [a.failure for a in actors]
        last = learner_process(*args, run_dir=run_dir)
        learners.append(last)
        for actor in actors:
            actor.producing.clear()
        wait_for(
            lambda: all(a.settled() for a in actors), START_S, "the actors' held batches to be acknowledged"
        )
        assert last.stop() == 0, last.log()[-4000:]
        logs.append(last.log())
    finally:
        for actor in actors:
            actor.done.set()
            actor.join(10)

    assert not any(a.failure for a in actors), [a.failure for a in actors]
    acked = Counter(h for a in actors for h in a.acked)
    assert len(acked) == sum(len(a.acked) for a in actors), "an episode was acknowledged twice"
    assert len(acked) > 100, f"too little load to mean anything: {len(acked)} episodes"

    # Every learner process, killed or not, counted no batch lost in its restart.
    lost = [m["batches_lost_in_restart"] for m in learners[-1].metrics()]  # every process's (one file)
    assert lost and max(lost) == 0, Counter(lost)
    recovered = [sum(int(b) for b, _ in RECOVERED.findall(log)) for log in logs]
    assert sum(recovered) > 0, "no restart recovered anything from the log: the kills never hit unsaved data"
    resumed = [int(m[1]) for log in logs for m in [RESUMED.search(log)] if m]
    assert any(resumed), "no restart resumed from a checkpoint's replay: only the log's start was tested"

    stored = Counter(digest(ep.obs, ep.steps) for ep in _what_a_restart_reads(run_dir))
    twice = [h for h, n in stored.items() if n > 1]
    assert not twice, f"{len(twice)} episodes are stored more than once"
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged episodes are not in the replay"
    assert set(stored) == set(acked), "the replay holds episodes no actor sent"
    print(
        f"{KILLS} kills: {len(acked)} episodes acknowledged, all in the final replay once; "
        f"{sum(recovered)} batches recovered from the log over {len(logs)} starts, "
        f"{sum(r > 0 for r in resumed)} of them on a checkpoint's replay; "
        f"actor sessions {[a.sessions for a in actors]}, refusals {sum((a.refused for a in actors), Counter())}"
    )


def _ledgers(run_dir) -> set[str]:
    """The delivery ledgers in `run_dir`: one per complete checkpoint (the last file a save writes)."""
    return {p.name for p in (run_dir / "checkpoints" / "replay").glob("*.delivery.json")}


def _what_a_restart_reads(run_dir) -> list[protocol.Episode]:
    """The newest complete checkpoint's replay, then the log's batches after its position that its ledger
    does not hold: the replay a learner started on `run_dir` now would have."""
    model = ModelConfig.from_dict(json.loads((run_dir / "config.json").read_text())["model"])
    spec = featurize.episode_spec(model, text_vocab_size=0)
    wal = WriteAheadLog(run_dir / "wal", "os")
    logged = LoggedEpisodes(wal, lambda traj, newest: traj.validate(spec, MAX_STEPS, newest))
    ckpt = Checkpointer(run_dir / "checkpoints")
    try:
        update = ckpt.latest_update()
        episodes: list[protocol.Episode] = []
        stored: dict[str, tuple[int, set[int]]] = {}
        start = 0
        if update is not None and ckpt.delivery_path(update).is_file():  # a replay only with its ledger
            replay: PrioritizedReplay = PrioritizedReplay(CAPACITY)
            load_replay(ckpt.replay_path(update), replay, model, max_steps=MAX_STEPS, logged=logged)
            assert replay.counts.get("evicted_fifo", 0) == 0 == replay.counts.get("dropped_stale", 0)
            episodes = replay.items()
            ledger = ckpt.restore_delivery(update)
            stored = {k: (w, set(above)) for k, (w, above, _) in ledger["streams"].items()}
            start = ledger["wal_next_lsn"]
    finally:
        ckpt.close()
    for record in wal.recover(start):
        instance, seq, raw = unpack_batch(record.payload)
        watermark, above = stored.setdefault(instance, (0, set()))
        if seq <= watermark or seq in above:
            continue
        above.add(seq)
        traj = protocol.Traj.from_msg(protocol.parse(raw))
        episodes += traj.validate(spec, MAX_STEPS, 2**31 - 1)
    wal.close()
    return episodes
