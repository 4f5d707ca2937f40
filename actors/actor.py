"""The actor loop: N environments, one batched policy call per step, finished episodes streamed out.

handshake -> ask for the newest parameters -> repeat:
    take in replies and snapshots (swap to a newer version at once)
    featurize all observations -> one jitted call samples every env's action -> step every env
    episodes that ended go out in one TRAJ message; heartbeat every few seconds
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

from actors.config import ActorConfig
from actors.connection import LearnerConnection
from actors.envs.factory import make_env, task_name
from actors.envs.simphone.emulator import DeviceFault
from actors.policy_runner import PolicyRunner, to_action
from common import featurize, protocol
from common.config import ModelConfig
from common.types import Step, Trajectory


class Actor:
    def __init__(self, cfg: ActorConfig, log=print):
        self.cfg = cfg
        self.log = log
        self.stats = Counter()
        self._stop_reason = ""
        self._rejoin = False
        """Set when the learner answers not_welcomed (it restarted or expired us): handshake again."""

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason

    def _should_stop(self) -> bool:
        if not self._stop_reason and self.cfg.parent_pid and os.getppid() != self.cfg.parent_pid:
            self._stop_reason = "parent exited"
        return bool(self._stop_reason)

    def run(self) -> Counter:
        cfg = self.cfg
        conn = LearnerConnection(cfg.host, cfg.ingest_port, cfg.params_port, self.log)
        try:
            while not self._should_stop():
                welcome = conn.handshake(
                    cfg.name, cfg.num_envs, cfg.handshake_timeout, cfg.max_backoff, self._should_stop
                )
                if welcome is None:
                    break
                self._rejoin = False
                self._loop(conn, welcome)  # returns on stop, or when the learner no longer knows us
        finally:
            conn.close()
            self.log(f"actor: stopped ({self._stop_reason}); {dict(self.stats)}")
        return self.stats

    def _loop(self, conn: LearnerConnection, welcome: dict) -> None:
        cfg = self.cfg
        model_cfg = ModelConfig.from_dict(protocol.require(welcome, "model", dict))
        max_steps = protocol.require(welcome, "max_steps", int)
        self.log(f"actor {conn.actor_id}: joined run {welcome.get('run_id')} at {conn.ingest_addr}")
        runner = PolicyRunner(model_cfg, cfg.seed)
        conn.request_params(runner.version)
        while runner.params is None and not self._should_stop() and not self._rejoin:
            conn.wait(200)
            self._take_in(conn, runner)
        if runner.params is None:
            return

        envs = [
            make_env(cfg.env, max_steps, cfg.tasks, cfg.split, cfg.emulator, i) for i in range(cfg.num_envs)
        ]
        first_seed = cfg.seed * 100_003 + self.stats["rejoins"] * 1009
        observations = [env.reset(seed=first_seed + i)[0] for i, env in enumerate(envs)]
        episodes = [Trajectory(task_name(env)) for env in envs]
        seq = 0
        last_beat = last_status = time.monotonic()
        while not self._should_stop():
            self._take_in(conn, runner)
            if self._rejoin:
                self.stats["rejoins"] += 1
                self.stats["episodes_abandoned"] += sum(bool(ep.steps) for ep in episodes)
                self.log(f"actor {conn.actor_id}: the learner no longer knows this actor; joining again")
                return
            features = [featurize.featurize(o, model_cfg) for o in observations]
            choices, logps = runner.act(featurize.stack(features))
            finished = []
            for i, env in enumerate(envs):
                episode, choice = episodes[i], choices[i]
                try:
                    obs, reward, terminated, truncated, info = env.step(
                        to_action(observations[i], choice, model_cfg)
                    )
                except DeviceFault as fault:
                    # The device failed mid-step: the episode ends here, truncated (it would have gone
                    # on), with the last observation we have; reset() restarts or reconnects the device.
                    self.stats[f"device_{fault.kind}"] += 1
                    obs, reward, terminated, truncated = observations[i], 0.0, False, True
                    info = {"success": False, "fault": fault.kind}
                done = terminated or truncated
                episode.steps.append(
                    Step(features[i], choice, float(logps[i]), float(reward), done, runner.version)
                )
                self.stats["env_steps"] += 1
                if done:
                    episode.final_features = featurize.featurize(obs, model_cfg)
                    episode.success = bool(info["success"])
                    episode.truncated = bool(truncated and not terminated)
                    finished.append(protocol.trajectory_fields(episode))
                    self.stats["successes"] += episode.success
                    obs, _ = env.reset()
                    episodes[i] = Trajectory(task_name(env))
                observations[i] = obs
            if finished:
                seq += 1
                traj = protocol.message(protocol.TRAJ, actor_id=conn.actor_id, seq=seq, episodes=finished)
                if conn.send(traj):
                    self.stats["episodes_sent"] += len(finished)
                else:  # no acknowledged delivery yet: the loss is counted, never silent
                    self.stats["episodes_dropped_send_queue_full"] += len(finished)
                if cfg.max_episodes and self.stats["episodes_sent"] >= cfg.max_episodes:
                    self.request_stop("episode limit")
            now = time.monotonic()
            if now - last_beat >= cfg.heartbeat_every:
                last_beat = now
                conn.send(protocol.message(protocol.HEARTBEAT, actor_id=conn.actor_id))
            if now - last_status >= cfg.status_every:
                last_status = now
                self.log(f"actor {conn.actor_id}: policy v{runner.version} {dict(self.stats)}")

    def _take_in(self, conn: LearnerConnection, runner: PolicyRunner) -> None:
        replies, newest = conn.receive()
        for msg in replies:
            if msg["kind"] == protocol.ACK:
                self.stats["episodes_acked"] += int(msg.get("accepted", 0))
            elif msg["kind"] == protocol.ERROR:
                self.stats["errors"] += 1
                self._rejoin |= msg.get("code") == "not_welcomed"
                self.log(f"actor: learner refused a message: {msg.get('code')}: {msg.get('reason')}")
        if newest is not None and newest[0] > runner.version:
            try:
                runner.load(*newest)
                self.stats["param_swaps"] += 1
            except ValueError as e:
                self.stats["bad_snapshots"] += 1
                self.log(f"actor: snapshot v{newest[0]} does not fit the model: {e}")


def install_signal_handlers(actor: Actor) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, _f: actor.request_stop(signal.Signals(signum).name))
