"""The actor loop: N environments, one batched policy call per step, finished episodes streamed out.

handshake -> ask for the newest parameters -> repeat:
    take in replies and snapshots (swap to a newer version at once; settle ACKs, raise the grant)
    featurize the ready environments' observations -> one jitted call samples their actions -> step them
    (inline, or each on its own thread for real devices: actors/slots.py)
    finished episodes go to the outbox; send the parcels the learner's grant allows; heartbeat

Nothing is lost on a reconnect: the environments, the episodes in progress and every unacknowledged
parcel survive it (actors/outbox.py), and the parcels are sent again under the same `seq`.

The parts: the session with the learner, joining and joining again (actors/membership.py); the policy,
here or on the learner's inference service (actors/local_inference.py, actors/remote_inference.py); one
step and its recording (actors/stepper.py); when a slot starts its next episode, --mode sync's rounds and
--max-episode-rate (actors/rounds.py). This module holds the loop that drives them.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import time
import uuid
from collections import Counter

from actors.ack_log import AckLog
from actors.config import ActorConfig, curve_client
from actors.connection import LearnerConnection
from actors.envs.factory import build_envs
from actors.local_inference import LocalInference
from actors.membership import Membership
from actors.outbox import Outbox
from actors.pacing import TokenBucket
from actors.remote_inference import RemoteInference
from actors.rounds import Rounds
from actors.slots import EnvSlots
from actors.stepper import Stepper
from actors.world import World
from common import protocol
from common.config import ModelConfig


class Actor:
    """One actor process: its environments, its policy, and its side of the protocol with one learner.

    It holds the configuration (checked by ActorConfig itself), the counters it reports (`stats`), its
    random `instance` (the id under which the learner numbers its parcels, across reconnects), the
    `outbox` of finished episodes not yet acknowledged, its `membership` in the learner's run, its
    `inference` (local or remote) and its `stepper`. `run` owns the sockets (a LearnerConnection) and the
    `World` (environments and policy runner, built on the first WELCOME): it joins, loops (take in
    replies and snapshots, step, send what the grant allows, heartbeat) and, when a session breaks,
    joins again without losing the environments, the episodes in progress or the outbox. Everything
    runs on the caller's thread; only device steps (actors/slots.py) and the first compile use others."""

    def __init__(self, cfg: ActorConfig, log=print):
        if cfg.seed < 0:  # actors started by hand without --seed: a stream of their own, logged
            cfg = dataclasses.replace(cfg, seed=secrets.randbelow(2**31))
            log(f"actor: seed {cfg.seed} (drawn; --seed {cfg.seed} repeats it)")
        self.cfg = cfg
        self.log = log
        self.stats = Counter()
        self.instance = uuid.uuid4().hex
        self.outbox = Outbox(cfg.max_pending_episodes, cfg.max_batch_episodes, cfg.when_blocked, self.stats)
        self.ack_log = AckLog(cfg.ack_log, self.instance) if cfg.ack_log is not None else None
        if self.ack_log is not None:
            self.outbox.on_settled = self.ack_log.write
        self._stop_reason = ""
        self._hurry = False
        """A second stop request: skip the flush."""
        self._devices: tuple[list, bool] | None = None
        """Environments built before joining (devices: booting takes minutes, a bad setup stops us first)."""
        self.pacer = TokenBucket(cfg.max_episode_rate) if cfg.max_episode_rate else None
        """--max-episode-rate: what lets a slot start its next episode (None: no limit)."""
        self.membership = Membership(cfg, self.outbox, self.stats, log, self.instance)
        self.inference: LocalInference | RemoteInference = (
            RemoteInference(cfg, self.stats, self.membership.end, self._should_stop)
            if cfg.inference == "remote"
            else LocalInference(cfg, self.stats, log)
        )
        """The policy: here, on the newest snapshot (--inference local), or on the learner's service."""
        self.stepper = Stepper(self.stats, self.inference.act)

    def request_stop(self, reason: str) -> None:
        """Stop taking steps, then deliver what is held (up to --flush-timeout); a second request means
        now (what is held is counted in episodes_unacked_at_exit)."""
        if self._stop_reason:
            self._hurry = True
        else:
            self._stop_reason = reason

    def _should_stop(self) -> bool:
        if not self._stop_reason and self.cfg.parent_pid and os.getppid() != self.cfg.parent_pid:
            self._stop_reason = "parent exited"
        return bool(self._stop_reason)

    def run(self) -> Counter:
        cfg = self.cfg
        conn = LearnerConnection(
            cfg.host, cfg.ingest_port, cfg.params_port, self.log, cfg.params_endpoint, curve_client(cfg),
            stats=self.stats, subscribe=not self.inference.remote,
        )  # fmt: skip
        world = None
        try:
            if cfg.env == "adb":
                self._devices = build_envs(cfg, 0, self.log)
            while not self._should_stop():
                welcome = self.membership.handshake(conn, self._should_stop)
                if welcome is None:
                    break
                world = self._join(conn, welcome, world)
                if world is not None:
                    self._loop(conn, world)  # returns on stop, or when the session must start again
            if world is not None and not self._hurry:
                self._flush(conn, world)
        finally:
            self._close(conn, world)
        return self.stats

    def _close(self, conn: LearnerConnection, world: World | None) -> None:
        self.stats["episodes_unacked_at_exit"] = self.outbox.held()
        if world is not None:
            self.inference.close(world.runner)
        conn.close()
        if self.ack_log is not None:
            self.ack_log.close()
        if world is not None:
            world.slots.close()
        elif self._devices is not None:
            for env in self._devices[0]:
                env.close()
        self.log(f"actor: stopped ({self._stop_reason}); {dict(self.stats)}")

    def _join(self, conn: LearnerConnection, welcome: protocol.Welcome, world: World | None) -> World | None:
        """Start a session: settle what the learner already stores, rebuild only what changed, re-send."""
        model_cfg, max_steps, version = welcome.model, welcome.max_steps, welcome.policy_version
        self.membership.join(conn, welcome)
        if world is not None and (world.model_cfg != model_cfg or world.max_steps != max_steps):
            self.log("actor: the learner runs another model now; starting the environments again")
            self.stats["episodes_lost_model_changed"] += self.outbox.held()
            self.outbox.pending.clear()
            self.outbox.unacked.clear()
            world.slots.close(close_envs=self._devices is None)  # devices are kept for the new model
            world = None
        refusal = self.inference.refusal(welcome)
        if refusal:
            self.request_stop(refusal)
            return None
        if world is None:
            world = self._build(conn, model_cfg, max_steps)  # asks for parameters and waits for them
            if world is None:
                return None
        else:
            self.inference.rejoined(conn, welcome, world.runner)
        if welcome.run_id != self.membership.run_id and world.runner.version > version:
            # A restarted learner numbers its versions again from its checkpoint's and refuses newer ones.
            changed = self.outbox.relabel_versions(version)
            changed += sum(ep.cap_versions(version) for ep in world.episodes if ep is not None)
            world.runner.version, world.reload = version, True
            self.stats["steps_relabelled"] += changed
        self.membership.run_id = welcome.run_id
        world.rounds.sync = welcome.sync
        self.membership.send(conn, self.outbox.to_resend())
        return world

    def _build(self, conn: LearnerConnection, model_cfg: ModelConfig, max_steps: int) -> World | None:
        """The policy runner (waiting for its first parameters, heartbeating) and the environments."""
        runner = self.inference.open(conn, model_cfg)
        while not self.inference.ready(runner) and not self._should_stop() and not self.membership.rejoin:
            conn.heartbeat_if_due(
                self.cfg.heartbeat_every
            )  # building the policy took a while: say we are here
            conn.wait(200)
            self._take_in(conn, runner)
            self.membership.check(conn)
        if not self.inference.ready(runner):
            return None
        return self._start_envs(conn, runner, model_cfg, max_steps)

    def _start_envs(self, conn: LearnerConnection, runner, model_cfg: ModelConfig, max_steps: int) -> World:
        """The environments (or the devices held since start-up) for this model, and the policy compiled
        for their batch (locally; a remote policy compiles on the learner)."""
        cfg = self.cfg
        if self._devices is not None:
            envs, threaded = self._devices
            for env in envs:
                env.max_steps = max_steps  # the learner's limit, known only now
        else:
            envs, threaded = build_envs(cfg, max_steps, self.log)
        self.inference.prepare(conn, runner, len(envs), lambda: self._take_in(conn, runner))
        seeds = [cfg.seed * 100_003 + i for i in range(len(envs))]
        slots = EnvSlots(envs, seeds, threaded, self.stats, self.log)
        for i in range(len(slots)):
            slots.reset(i)
        spec = runner.policy.episode_spec()
        return World(
            model_cfg, max_steps, runner, slots, [None] * len(slots), spec, Rounds(slots, self.pacer)
        )

    def _loop(self, conn: LearnerConnection, world: World) -> None:
        cfg, rounds = self.cfg, world.rounds
        last_status = time.monotonic()
        last_steps = self.stats["env_steps"]  # for the status line's steps/s
        while not self._should_stop():
            self._take_in(conn, world.runner, world)
            self.membership.check(conn)
            if self.membership.rejoin:
                self.log(f"actor {conn.actor_id}: {self.membership.rejoin}; joining again")
                return
            if self.outbox.blocked():  # the learner is behind: wait for credit instead of stepping
                t0 = time.monotonic()
                conn.wait(100)
                self.stats["blocked_s"] = round(self.stats["blocked_s"] + time.monotonic() - t0, 1)
            elif rounds.sync and not rounds.next_round(world.runner.version):
                conn.wait(50)  # this actor's part of the round is done: wait for the learner's next version
            elif not rounds.release():  # every slot waits for --max-episode-rate (or a version)
                conn.wait(rounds.wait_ms())
            else:
                self._step(world)
            self.membership.send(conn, self.outbox.take_parcels())
            conn.heartbeat_if_due(cfg.heartbeat_every)
            now = time.monotonic()
            if now - last_status >= cfg.status_every:
                rate = (self.stats["env_steps"] - last_steps) / max(now - last_status, 1e-9)
                last_status, last_steps = now, self.stats["env_steps"]
                version, held = world.runner.version, self.outbox.held()
                self.log(status_line(conn.actor_id, version, rate, self.stats, held))

    def _step(self, world: World) -> None:
        """One step of every ready environment (actors/stepper.py); finished episodes go to the outbox."""
        finished = self.stepper.step(world)
        if finished:
            self.stats["episodes_finished"] += len(finished)
            self.outbox.add(finished)
            if self.cfg.max_episodes and self.stats["episodes_finished"] >= self.cfg.max_episodes:
                self.request_stop("episode limit")

    def _flush(self, conn: LearnerConnection, world: World) -> None:
        """On stop (episode limit, signal, parent gone), up to --flush-timeout seconds for the learner to
        acknowledge what is held: still heartbeating, and joining again (a restarted learner too) when the
        session breaks."""
        cfg, membership = self.cfg, self.membership
        deadline = time.monotonic() + cfg.flush_timeout
        while self.outbox.held() and time.monotonic() < deadline and not self._hurry:
            membership.check(conn)
            if membership.rejoin:
                self.log(f"actor {conn.actor_id}: {membership.rejoin}; joining again to deliver what is held")
                welcome = membership.handshake(conn, lambda: time.monotonic() >= deadline or self._hurry)
                if welcome is None:
                    break
                self._join(conn, welcome, world)
            membership.send(conn, self.outbox.take_parcels())
            conn.wait(100)
            self._take_in(conn, world.runner, world)
            conn.heartbeat_if_due(cfg.heartbeat_every)

    def _take_in(self, conn: LearnerConnection, runner, world: World | None = None) -> None:
        """Settle the learner's replies; swap to a newer snapshot (an equal one after a restart)."""
        newest = self.membership.take_in(conn)
        if self.inference.swap(runner, newest, world is not None and world.reload) and world is not None:
            world.reload = False


def status_line(actor_id: object, version: int, steps_per_s: float, stats: Counter, held: int) -> str:
    """The periodic status line: short enough to read at a glance (the final "stopped" line has every
    counter). Faults count device_<kind> and reset_<kind>, not their refinements (device_<kind>_<detail>)
    nor reset_retries, which count the same faults again. `act` is the mean time of one batched policy
    call, with its stages' means in brackets for a two-stage family (the lm family's prefill and decode)."""
    kinds = [k for k in stats if k.startswith(("device_", "reset_")) and k != "reset_retries"]
    faults = sum(stats[k] for k in kinds if not any(k.startswith(f"{other}_") for other in kinds))
    episodes = stats["episodes_finished"]
    success = stats["successes"] / episodes if episodes else 0.0
    act = ""
    if stats["act_calls"]:
        calls = stats["act_calls"]
        stages = [
            (k[4:-3], v)
            for k, v in stats.items()
            if k.startswith("act_") and k.endswith("_us") and k != "act_us"
        ]
        split = " + ".join(f"{name} {us / calls / 1e3:.0f}" for name, us in stages)
        act = f", act {stats['act_us'] / calls / 1e3:.0f} ms" + (f" ({split})" if split else "")
    return (
        f"actor {actor_id}: policy v{version}, {steps_per_s:.1f} steps/s, {episodes} episodes "
        f"(success {success:.2f}), sent {stats['batches_sent']}, acked {stats['episodes_acked']}, "
        f"held {held}, faults {faults}{act}"
    )


def install_signal_handlers(actor: Actor) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, _f: actor.request_stop(signal.Signals(signum).name))
