"""The learner answers actors on time while it compiles and trains, however long an update takes.

A real learner with a deliberately heavy update (a large batch of long episodes: seconds per update on a
CPU, a real configuration rather than a sleep in the code) and an --actor-timeout shorter than one
update, and a fake actor speaking the protocol through common/protocol/: it heartbeats every 0.1 s and
sends a batch of episodes every second, and times every reply. Each update runs on a helper thread
while the learner's main thread keeps serving (learner/training/trainer.py `run_while_serving`), so every reply
comes within a fraction of a second, the actor stays welcome throughout, and batches that arrive during
an update are stored at once, refilling replay slots that update sampled (whose new priorities are then
skipped: `replay/stale_updates`). A learner that trained on its main thread would answer only between
updates: replies would wait up to a whole update.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from common import protocol, wire
from tests.test_fake_actor import make_episode, read_metrics

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]  # half a minute: a learner compiles and trains

MAX_STEPS = 16
BATCH = 256
HEAVY = (
    "--batch-size", str(BATCH), "--max-steps", str(MAX_STEPS), "--replay-capacity", str(BATCH),
    "--model.d-model", "64", "--model.num-layers", "1", "--model.mlp-dim", "128",
    "--checkpoint-every", "0", "--publish-every", "1", "--log-every", "0.25",
)  # fmt: skip
"""An update of BATCH episodes of MAX_STEPS steps: 2-4 s on a 2-core CPU, and a replay that holds
exactly one batch, so every batch that arrives during an update refills slots it sampled."""
ACTOR_TIMEOUT_S = 1.0
"""--actor-timeout: shorter than one update."""
REPLY_SHARE = 0.5
"""The longest any reply may take, as a share of the measured update: the learner polls every 10 ms while
it compiles, trains (collating the batch included) or copies a snapshot to the host; between updates its
main thread only draws a sample and sends the snapshot. A ratio, not a fixed time, so a machine shared
with other work (which slows the update as much as the replies) does not fail it; a learner that trained
on its main thread keeps a heartbeat sent as an update starts waiting for all of it (a share near 1)."""
BEAT_EVERY_S = 0.1
TRAJ_EVERY_S = 1.0
TRAJ_EPISODES = 32
UPDATES = 2
"""Updates to watch after the compile."""
DEADLINE_S = 240.0
"""How long a broken learner may take to fail the test (a passing run takes well under a minute)."""


class TimedActor:
    """A DEALER that heartbeats, sends batches of episodes, and times the learner's reply to each."""

    def __init__(self, ingest: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(ingest)
        self.actor_id = 0
        self.model: dict = {}
        self.version = 0
        """The newest policy version the learner has announced (the episodes' behavior version)."""
        self.seq = 0
        self.rng = np.random.default_rng(0)
        self.beat_sent: float | None = None
        """When the heartbeat waiting for its reply was sent."""
        self.traj_sent: dict[int, float] = {}
        self.beat_latencies: list[float] = []
        self.ack_latencies: list[float] = []
        self.errors: list[protocol.Error] = []

    def hello(self, timeout_s: float) -> None:
        self.sock.send(wire.encode(protocol.Hello("timed", 4, "timed-actor", 1).to_msg()))
        assert self.sock.poll(int(timeout_s * 1000)), "no WELCOME"
        welcome = protocol.Welcome.from_msg(protocol.parse(self.sock.recv()))
        self.actor_id, self.model = welcome.actor_id, welcome.model.to_dict()

    def beat(self) -> None:
        self.beat_sent = time.monotonic()
        self.sock.send(wire.encode(protocol.ActorHeartbeat(self.actor_id).to_msg()))

    def traj(self) -> None:
        self.seq += 1
        episodes = [
            make_episode(self.model, MAX_STEPS, self.rng, version=self.version) for _ in range(TRAJ_EPISODES)
        ]
        self.traj_sent[self.seq] = time.monotonic()
        self.sock.send(wire.encode(protocol.Traj(self.actor_id, self.seq, episodes).to_msg()))

    def take_replies(self, wait_s: float) -> None:
        """Read what the learner sent within `wait_s`, timing the replies. A HEARTBEAT counts as the reply
        to the one waiting: it may be one of the learner's unsolicited beats (one a second), sent by the
        same thread that answers, so it proves that thread is serving just as well."""
        if not self.sock.poll(int(wait_s * 1000)):
            return
        while self.sock.poll(0):
            frames = self.sock.recv_multipart()
            now = time.monotonic()
            if len(frames) > 1:  # PARAMS: not asked for here
                continue
            msg = protocol.parse(frames[0])
            if msg["kind"] == protocol.HEARTBEAT:
                self.version = max(self.version, protocol.Heartbeat.from_msg(msg).policy_version)
                if self.beat_sent is not None:
                    self.beat_latencies.append(now - self.beat_sent)
                    self.beat_sent = None
            elif msg["kind"] == protocol.ACK:
                ack = protocol.Ack.from_msg(msg)
                assert ack.accepted == TRAJ_EPISODES, ack
                self.ack_latencies.append(now - self.traj_sent.pop(ack.seq))
            else:
                error = protocol.Error.from_msg(msg)
                self.errors.append(error)
                self.traj_sent.pop(error.seq, None)

    def close(self) -> None:
        self.ctx.destroy(0)


def test_actors_are_answered_on_time_while_the_learner_compiles_and_trains(learner_process):
    learner = learner_process(*HEAVY, "--actor-timeout", str(ACTOR_TIMEOUT_S))
    actor = TimedActor(learner.ingest)
    try:
        actor.hello(timeout_s=DEADLINE_S)  # the learner is compiling by now, or soon
        deadline = time.monotonic() + DEADLINE_S
        next_beat = next_traj = time.monotonic()
        trained = False
        while not trained:
            assert time.monotonic() < deadline, f"no {UPDATES} updates in time\n{learner.log()[-3000:]}"
            assert learner.proc.poll() is None, f"the learner exited\n{learner.log()[-3000:]}"
            now = time.monotonic()
            if now >= next_beat and actor.beat_sent is None:
                actor.beat()
                next_beat = now + BEAT_EVERY_S
            if now >= next_traj and not actor.traj_sent:
                actor.traj()
                next_traj = now + TRAJ_EVERY_S
            actor.take_replies(0.01)
            assert actor.errors == [], f"refused: {actor.errors}"  # never not_welcomed: never forgotten
            trained = any(m["update"] >= UPDATES for m in read_metrics(learner.run_dir))
        while (actor.beat_sent is not None or actor.traj_sent) and time.monotonic() < deadline:
            actor.take_replies(0.1)  # the replies still on their way
        assert actor.errors == [], f"refused: {actor.errors}"
        beats, acks = np.array(actor.beat_latencies), np.array(actor.ack_latencies)
        connected = [m["actors"] for m in read_metrics(learner.run_dir) if m["episodes"] > 0]
    finally:
        actor.close()
    assert learner.stop() == 0, learner.log()[-3000:]  # SIGTERM: it finishes the update under way
    line = read_metrics(learner.run_dir)[-1]  # the last record: every update counted, and its time
    step_s = line["time/train_s"] / line["update"]
    summary = (
        f"{len(beats)} heartbeats answered in at most {beats.max():.3f} s (median {np.median(beats):.3f} s), "
        f"{len(acks)} batches acknowledged in at most {acks.max():.3f} s; an update takes {step_s:.2f} s"
    )
    print(summary)
    assert step_s > ACTOR_TIMEOUT_S, f"HEAVY is too light for this machine: {summary}"
    bound = REPLY_SHARE * step_s
    assert len(beats) >= UPDATES * step_s / (BEAT_EVERY_S + bound), summary
    assert beats.max() < bound and acks.max() < bound, summary
    assert actor.beat_sent is None and not actor.traj_sent, "a reply never came"
    # Batches were stored during the updates: they refilled slots the update in flight had sampled, whose
    # new priorities were then skipped.
    assert line["replay/stale_updates"] > 0, line
    assert connected and set(connected) == {1}, connected  # counted as connected from its first batch on
