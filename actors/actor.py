"""The actor loop: N environments, one batched policy call per step, finished episodes streamed out.

handshake -> ask for the newest parameters -> repeat:
    take in replies and snapshots (swap to a newer version at once; settle ACKs, raise the grant)
    featurize the ready environments' observations -> one jitted call samples their actions -> step them
    (inline, or each on its own thread for real devices: actors/slots.py)
    finished episodes go to the outbox; send the batches the learner's grant allows; heartbeat

Nothing is lost on a reconnect: the environments, the episodes in progress and every unacknowledged
batch survive it (actors/outbox.py), and the batches are sent again under the same `seq`.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from actors.ack_log import AckLog
from actors.config import ActorConfig
from actors.connection import LearnerConnection
from actors.envs.factory import build_envs, task_name
from actors.envs.faults import DeviceFault
from actors.outbox import Batch, Outbox
from actors.pacing import TokenBucket
from actors.policy_runner import PolicyRunner, stack
from actors.remote_policy import InferenceRefused, RemotePolicy
from actors.slots import EnvSlots
from common import protocol
from common.config import ModelConfig
from common.episode import EpisodeBuilder
from common.net.curve import CurveClient, CurveError
from common.types import NOOP_PENALTY, ActionType

KEEP_ON_ERROR = frozenset({"no_credit", "not_welcomed", "unavailable"})
"""ERROR codes after which a refused batch is kept and sent again (after a new grant or handshake)."""


@dataclasses.dataclass
class _World:
    """The environments and the policy: built on the first WELCOME, kept across reconnects."""

    model_cfg: ModelConfig
    max_steps: int
    runner: PolicyRunner
    slots: EnvSlots
    episodes: list[EpisodeBuilder | None]
    """The episode in progress per slot (None while the slot's reset is due or running)."""
    spec: protocol.EpisodeSpec
    """The arrays the policy family's episodes carry (their choices' dtypes)."""
    reload: bool = False
    """Load the next snapshot even at an equal version (after joining a restarted learner)."""
    started: dict[int, int] = dataclasses.field(default_factory=dict)
    """Policy version each slot's episode began with."""
    parked: set[int] = dataclasses.field(default_factory=set)
    """--mode sync: slots whose episode of this round is done, waiting for a newer version to start again."""
    waiting: deque[int] = dataclasses.field(default_factory=deque)
    """--max-episode-rate: slots whose episode ended, oldest first, waiting for a token to start again."""


class Actor:
    """One actor process: its environments, its policy, and its side of the protocol with one learner.

    It holds the configuration (checked by ActorConfig itself), the counters it reports (`stats`), its
    random `instance` (the id under which the learner numbers its batches, across reconnects) and the
    `outbox` of finished episodes not yet acknowledged. `run` owns the sockets (a LearnerConnection) and
    the `_World` (environments and policy runner, built on the first WELCOME): it joins, loops (take in
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
        self._rejoin = ""
        """Why the session ended (not_welcomed, a silent learner, an overdue ACK): handshake again."""
        self._run_id = ""
        self._welcomed = False
        self._sync = False
        """The learner runs DigiRL's synchronous loop: one episode per environment per policy version."""
        self._devices: tuple[list, bool] | None = None
        """Environments built before joining (devices: booting takes minutes, a bad setup stops us first)."""
        self._pacer = TokenBucket(cfg.max_episode_rate) if cfg.max_episode_rate else None
        """--max-episode-rate: what lets a slot start its next episode (None: no limit)."""
        self.remote = cfg.inference == "remote"
        """--inference remote: the learner's inference service acts (actors/remote_policy.py); no snapshots."""

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
            stats=self.stats, subscribe=not self.remote,
        )  # fmt: skip
        world = None
        try:
            if cfg.env == "adb":
                self._devices = build_envs(cfg, 0, self.log)
            while not self._should_stop():
                welcome = self._handshake(conn, self._should_stop)
                if welcome is None:
                    break
                world = self._join(conn, welcome, world)
                if world is not None:
                    self._loop(conn, world)  # returns on stop, or when the session must start again
            if world is not None and not self._hurry:
                self._flush(conn, world)
        finally:
            self.stats["episodes_unacked_at_exit"] = self.outbox.held()
            if world is not None and isinstance(world.runner, RemotePolicy):
                self.stats.update({f"inference_{k}": round(v, 1) for k, v in world.runner.stats.items()})
                world.runner.close()
            conn.close()
            if self.ack_log is not None:
                self.ack_log.close()
            if world is not None:
                world.slots.close()
            elif self._devices is not None:
                for env in self._devices[0]:
                    env.close()
            self.log(f"actor: stopped ({self._stop_reason}); {dict(self.stats)}")
        return self.stats

    def _handshake(self, conn: LearnerConnection, give_up) -> protocol.Welcome | None:
        cfg = self.cfg
        return conn.handshake(
            cfg.name, planned_envs(cfg), self.instance, lambda: self.outbox.first_unacked,
            cfg.handshake_timeout, cfg.max_backoff, give_up,
        )  # fmt: skip

    def _join(
        self, conn: LearnerConnection, welcome: protocol.Welcome, world: _World | None
    ) -> _World | None:
        """Start a session: settle what the learner already stores, rebuild only what changed, re-send."""
        model_cfg, max_steps = welcome.model, welcome.max_steps
        version, run_id = welcome.policy_version, welcome.run_id
        self.outbox.on_welcome(welcome.acked_upto, welcome.grant)
        if self._welcomed:  # every WELCOME after the first, including one that came before any parameters
            self.stats["rejoins"] += 1
        self._welcomed = True
        self.log(
            f"actor {conn.actor_id}: joined run {run_id} at {conn.ingest_addr}"
            + (f" ({self._rejoin}; {self.outbox.held()} episodes held)" if self._rejoin else "")
        )
        self._rejoin = ""
        if world is not None and (world.model_cfg != model_cfg or world.max_steps != max_steps):
            self.log("actor: the learner runs another model now; starting the environments again")
            self.stats["episodes_lost_model_changed"] += self.outbox.held()
            self.outbox.pending.clear()
            self.outbox.unacked.clear()
            world.slots.close(close_envs=self._devices is None)  # devices are kept for the new model
            world = None
        if self.remote and welcome.sync:
            self.request_stop("--inference remote does not run DigiRL's synchronous rounds (--mode sync) yet")
            return None
        if self.remote and not welcome.inference_port:
            self.request_stop("the learner has no inference service (it runs with --inference-port -1)")
            return None
        if world is None:
            world = self._build(conn, model_cfg, max_steps)  # asks for parameters and waits for them
            if world is None:
                return None
        elif self.remote:
            world.runner.reconnect(self._inference_address(welcome), conn.actor_id, self._heartbeats(conn))
        else:
            conn.request_params(world.runner.version)
        if run_id != self._run_id and world.runner.version > version:
            # A restarted learner numbers its versions again from its checkpoint's and refuses newer ones.
            changed = self.outbox.relabel_versions(version)
            changed += sum(ep.cap_versions(version) for ep in world.episodes if ep is not None)
            world.runner.version, world.reload = version, True
            self.stats["steps_relabelled"] += changed
        self._run_id = run_id
        self._sync = welcome.sync
        self._send(conn, self.outbox.to_resend())
        return world

    def _build(self, conn: LearnerConnection, model_cfg: ModelConfig, max_steps: int) -> _World | None:
        cfg = self.cfg
        if self.remote:
            address = self._inference_address(conn.welcome)
            runner = RemotePolicy(
                model_cfg, address, conn.actor_id, cfg.inference_timeout, curve_client(cfg),
                while_waiting=self._heartbeats(conn),
            )  # fmt: skip
            return self._start_envs(conn, runner, model_cfg, max_steps)
        conn.request_params(-1)  # first: building the policy takes seconds, and the learner hears from us now
        runner = PolicyRunner(model_cfg, cfg.seed)
        while runner.params is None and not self._should_stop() and not self._rejoin:
            conn.heartbeat_if_due(cfg.heartbeat_every)  # building the policy took a while: say we are here
            conn.wait(200)
            self._take_in(conn, runner)
            self._check_session(conn)
        if runner.params is None:
            return None
        return self._start_envs(conn, runner, model_cfg, max_steps)

    def _start_envs(self, conn: LearnerConnection, runner, model_cfg: ModelConfig, max_steps: int) -> _World:
        """The environments (or the devices held since start-up) for this model, and the policy compiled
        for their batch (locally; a remote policy compiles on the learner)."""
        cfg = self.cfg
        if self._devices is not None:
            envs, threaded = self._devices
            for env in envs:
                env.max_steps = max_steps  # the learner's limit, known only now
        else:
            envs, threaded = build_envs(cfg, max_steps, self.log)
        if isinstance(runner, PolicyRunner):
            self._compile_ahead(conn, runner, len(envs))
        seeds = [cfg.seed * 100_003 + i for i in range(len(envs))]
        slots = EnvSlots(envs, seeds, threaded, self.stats, self.log)
        for i in range(len(slots)):
            slots.reset(i)
        spec = runner.policy.episode_spec()
        return _World(model_cfg, max_steps, runner, slots, [None] * len(slots), spec)

    def _act(self, runner, features):
        """The runner's choices; None when a remote policy's service refused or did not answer (counted, and
        the step is tried again: `unavailable` before the first parameters, `no_answer` while the learner
        may be gone; `not_welcomed` after a rejoin)."""
        try:
            return runner.act(features)
        except InferenceRefused as e:
            self.stats[f"inference_refused_{e.code}"] += 1
            if e.code == "not_welcomed":
                self._rejoin = "the inference service does not know this actor"
            elif e.code in ("unavailable", "no_answer"):
                time.sleep(0.2)
            else:
                raise
            return None

    def _heartbeats(self, conn: LearnerConnection) -> Callable[[], None]:
        """What a remote policy does while it waits for the service: keep this session alive."""
        return lambda: conn.heartbeat_if_due(self.cfg.heartbeat_every)

    def _inference_address(self, welcome: protocol.Welcome) -> str:
        return f"tcp://{self.cfg.host}:{welcome.inference_port}"

    def _compile_ahead(self, conn: LearnerConnection, runner: PolicyRunner, batch: int) -> None:
        """Compile the policy for `batch` rows on a thread while still heartbeating: a first compile
        takes 10-30 s on a busy CPU, longer than the learner waits before it forgets a silent actor."""
        dummy = runner.example_features(batch)
        with ThreadPoolExecutor(1, thread_name_prefix="compile") as pool:
            compiled = pool.submit(runner.compile, dummy)
            while not compiled.done():
                conn.heartbeat_if_due(self.cfg.heartbeat_every)
                conn.wait(100)
                self._take_in(conn, runner)
            compiled.result()

    def _loop(self, conn: LearnerConnection, world: _World) -> None:
        cfg = self.cfg
        last_status = time.monotonic()
        last_steps = self.stats["env_steps"]  # for the status line's steps/s
        while not self._should_stop():
            self._take_in(conn, world.runner, world)
            self._check_session(conn)
            if self._rejoin:
                self.log(f"actor {conn.actor_id}: {self._rejoin}; joining again")
                return
            if self.outbox.blocked():  # the learner is behind: wait for credit instead of stepping
                t0 = time.monotonic()
                conn.wait(100)
                self.stats["blocked_s"] = round(self.stats["blocked_s"] + time.monotonic() - t0, 1)
            elif self._sync and not self._next_round(world):
                conn.wait(50)  # this actor's part of the round is done: wait for the learner's next version
            elif not self._release(world):  # every slot waits for --max-episode-rate (or a version)
                conn.wait(min(50, 1 + int(1000 * self._pacer.wait_s())) if self._pacer else 50)
            else:
                self._step(world)
            self._send(conn, self.outbox.take_batches())
            conn.heartbeat_if_due(cfg.heartbeat_every)
            now = time.monotonic()
            if now - last_status >= cfg.status_every:
                rate = (self.stats["env_steps"] - last_steps) / max(now - last_status, 1e-9)
                last_status, last_steps = now, self.stats["env_steps"]
                version, held = world.runner.version, self.outbox.held()
                self.log(status_line(conn.actor_id, version, rate, self.stats, held))

    def _step(self, world: _World) -> None:
        """One batched policy call for every ready environment, then whatever steps and resets have
        finished (all of them when stepping inline); finished episodes go to the outbox."""
        runner, slots = world.runner, world.slots
        ready = slots.ready()
        if ready:
            features = [runner.featurize(slots[i].obs, _history(world.episodes[i])) for i in ready]
            # Threaded slots act on any subset: pad to one batch shape so the policy compiles once.
            batch = features + features[:1] * (len(slots) - len(ready)) if slots.threaded else features
            t0 = time.perf_counter()
            acted = self._act(runner, stack(batch))
            if acted is None:
                return
            self.stats["act_us"] += int((time.perf_counter() - t0) * 1e6)
            self.stats["act_calls"] += 1
            for stage, seconds in runner.stage_seconds.items():
                self.stats[f"act_{stage}_us"] += int(seconds * 1e6)
            for k, i in enumerate(ready):
                obs, choice = slots[i].obs, acted.choices[k]
                estimates = (float(acted.logp[k]), float(acted.value[k]), float(acted.entropy[k]))
                action = runner.to_action(obs, choice)
                tag = (features[k], choice, action, estimates, runner.version)
                slots.step(i, action, tag)
        finished = []
        for out in slots.collect(timeout=0.0 if ready else 0.05):
            if out.kind == "reset":
                if out.fault is None:
                    world.episodes[out.slot] = EpisodeBuilder(task_name(slots[out.slot].env))
                    world.started[out.slot] = runner.version
            else:
                finished += self._settle(world, out)
        if finished:
            self.stats["episodes_finished"] += len(finished)
            self.outbox.add(finished)
            if self.cfg.max_episodes and self.stats["episodes_finished"] >= self.cfg.max_episodes:
                self.request_stop("episode limit")

    def _settle(self, world: _World, out) -> list[dict]:
        """Record one step's outcome in its episode; the finished episode's wire fields when it ended."""
        features_i, choice, action, (logp, value, entropy), version = out.tag
        if out.fault is not None:
            return self._faulted(world, out.slot, out.fault, features_i)
        obs, reward, terminated, truncated, info = out.result
        episode = world.episodes[out.slot]
        # min(): a step in flight while the actor joined a restarted learner gets its version capped too.
        version = min(version, world.runner.version)
        if action.type == ActionType.NOOP:  # an action that did not parse: a step lost, penalised
            reward = float(reward) - NOOP_PENALTY
            self.stats["invalid_actions"] += 1
        episode.add(features_i, choice, logp, float(reward), version, action, value, entropy)
        self.stats["env_steps"] += 1
        if not (terminated or truncated):
            return []
        success = bool(info.get("success", False))
        self.stats["successes"] += success
        final = world.runner.featurize(obs, episode.actions)
        return [self._finish(world, out.slot, final, success, bool(truncated and not terminated))]

    def _faulted(self, world: _World, i: int, fault: DeviceFault, chosen_on: dict) -> list[dict]:
        """The device failed mid-step: the step's outcome is unknown, so it is dropped, and the episode
        ends truncated (it would have gone on) at the step before, bootstrapping from the observation
        the dropped action was chosen on: the last real one (`chosen_on`, its features). Keeping the
        step with that observation as its own bootstrap would teach -(1 - gamma) V(s) for it. A fault on
        the first step leaves nothing to send: counted as episodes_dropped_fault, and the slot starts
        again at once (in --mode sync too: this round still needs its episode)."""
        self._count_fault(fault)
        if world.episodes[i].length:
            return [self._finish(world, i, chosen_on, False, True)]
        self.stats["episodes_dropped_fault"] += 1
        world.episodes[i] = None
        self._begin(world, i)  # its reset restarts or reconnects the device
        return []

    def _finish(self, world: _World, i: int, final: dict, success: bool, truncated: bool) -> dict:
        """Close slot i's episode with its final observation's features, then park the slot (--mode
        sync) or start its next episode."""
        episode = world.episodes[i].finish(final, success, truncated, world.spec)
        world.episodes[i] = None
        if self._sync:
            world.parked.add(i)
            world.slots.park(i)
        else:
            self._begin(world, i)
        return episode

    def _begin(self, world: _World, i: int) -> None:
        """Start slot i's next episode now, or, under --max-episode-rate, once `_release` lets it."""
        if self._pacer is None:
            world.slots.reset(i)
        else:
            world.slots.park(i)
            world.waiting.append(i)

    def _release(self, world: _World) -> bool:
        """--max-episode-rate: start the waiting slots' episodes the token bucket allows, oldest first;
        False when no slot has anything to step (every one waits for a token or, in --mode sync, for a
        newer version)."""
        while world.waiting and self._pacer.take():
            world.slots.reset(world.waiting.popleft())
        return len(world.waiting) + len(world.parked) < len(world.slots)

    def _next_round(self, world: _World) -> bool:
        """--mode sync: start the next episode of every parked slot whose episode used an older version
        than the newest; False when every slot is parked (nothing to step until a new version comes)."""
        for i in [i for i in world.parked if world.runner.version > world.started.get(i, -1)]:
            world.parked.discard(i)
            self._begin(world, i)
        return len(world.parked) < len(world.slots)

    def _count_fault(self, fault: DeviceFault) -> None:
        self.stats[f"device_{fault.kind}"] += 1
        detail = getattr(fault, "detail", "")
        if detail:
            self.stats[f"device_{fault.kind}_{detail}"] += 1

    def _check_session(self, conn: LearnerConnection) -> None:
        """Mark the session broken when the learner has gone silent or an ACK is overdue: the caller then
        joins again on a fresh socket (Lazy Pirate) and re-sends what is unacknowledged."""
        silent = time.monotonic() - conn.last_heard
        if not self._rejoin and silent > self.cfg.learner_timeout:
            self._rejoin = f"the learner was silent for {silent:.0f}s"
        if not self._rejoin and self.outbox.overdue(self.cfg.ack_timeout):
            self._rejoin = f"no ACK for {self.cfg.ack_timeout:.0f}s"

    def _send(self, conn: LearnerConnection, batches: list[Batch]) -> None:
        for batch in batches:
            if conn.send(protocol.Traj(conn.actor_id, batch.seq, batch.episodes).to_msg()):
                self.stats["batches_sent"] += 1
            else:  # kept in the outbox: sent again when its ACK is overdue
                self.stats["send_queue_full"] += 1

    def _flush(self, conn: LearnerConnection, world: _World) -> None:
        """On stop (episode limit, signal, parent gone), up to --flush-timeout seconds for the learner to
        acknowledge what is held: still heartbeating, and joining again (a restarted learner too) when the
        session breaks."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.flush_timeout
        while self.outbox.held() and time.monotonic() < deadline and not self._hurry:
            self._check_session(conn)
            if self._rejoin:
                self.log(f"actor {conn.actor_id}: {self._rejoin}; joining again to deliver what is held")
                welcome = self._handshake(conn, lambda: time.monotonic() >= deadline or self._hurry)
                if welcome is None:
                    break
                self._join(conn, welcome, world)
            self._send(conn, self.outbox.take_batches())
            conn.wait(100)
            self._take_in(conn, world.runner, world)
            conn.heartbeat_if_due(cfg.heartbeat_every)

    def _take_in(self, conn: LearnerConnection, runner: PolicyRunner, world: _World | None = None) -> None:
        replies, newest = conn.receive()  # parsed: a malformed reply was counted in bad_replies there
        for reply in replies:
            if isinstance(reply, protocol.Ack):
                self.outbox.on_grant(reply.grant)
                self.outbox.on_ack(reply.seq, reply.accepted, reply.duplicate)
            elif isinstance(reply, protocol.Heartbeat):
                self.outbox.on_grant(reply.grant)
                if self._run_id and reply.run_id != self._run_id:
                    self._rejoin = "the learner restarted"
                else:  # its storage may work again: what it refused `unavailable` goes again now
                    self._send(conn, self.outbox.to_retry())
            elif isinstance(reply, protocol.Error):
                self._refused(reply)
        reload = world is not None and world.reload
        if (
            newest is not None
            and not self.remote
            and (newest[0] > runner.version or (reload and newest[0] >= runner.version))
        ):
            try:
                runner.load(*newest)
                self.stats["param_swaps"] += 1
                if world is not None:
                    world.reload = False
            except ValueError as e:
                self.stats["bad_snapshots"] += 1
                self.log(f"actor: snapshot v{newest[0]} does not fit the model: {e}")

    def _refused(self, error: protocol.Error) -> None:
        code, seq = error.code, error.seq
        self.stats["errors"] += 1
        if code == "not_welcomed":
            self._rejoin = "the learner no longer knows this actor"
        again = code == "unavailable" and self.outbox.storage_down  # said once until an ACK comes
        if code == "unavailable" and seq is not None:
            self.outbox.on_unavailable(seq)
        if seq is not None and seq in self.outbox.unacked and code not in KEEP_ON_ERROR:
            # The learner will never take this batch (it is malformed): drop it, counted, not re-sent forever.
            self.stats["episodes_refused"] += len(self.outbox.unacked.pop(seq).episodes)
        if not again:
            self.log(f"actor: learner refused a message: {code}: {error.reason}")


def _history(episode: EpisodeBuilder | None) -> list:
    """The actions of the episode in progress (none when its reset is still being collected)."""
    return [] if episode is None else episode.actions


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


def planned_envs(cfg: ActorConfig) -> int:
    """How many environments this actor will run (announced in HELLO before they are built)."""
    if cfg.env == "adb":
        return len(cfg.adb.serials) or len(cfg.adb.avds) or 1
    return cfg.num_envs


def curve_client(cfg: ActorConfig) -> CurveClient | None:
    """The actor's CURVE keys, or None; a missing or unusable key file stops the actor with its name."""
    if bool(cfg.curve_secret_key) != bool(cfg.curve_server_key):
        raise SystemExit("--curve-secret-key and --curve-server-key go together")
    if not cfg.curve_secret_key:
        return None
    try:
        return CurveClient(Path(cfg.curve_secret_key), Path(cfg.curve_server_key))
    except CurveError as e:
        raise SystemExit(f"CURVE: {e}") from e


def install_signal_handlers(actor: Actor) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, _f: actor.request_stop(signal.Signals(signum).name))
