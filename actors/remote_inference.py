"""`--inference remote`: the learner's inference service acts for this actor (actors/remote_policy.py), so
it takes no parameter snapshots and compiles nothing; the service's refusals are counted and the step is
tried again, or the session joined again."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from actors.config import ActorConfig, curve_client
from actors.connection import LearnerConnection, Snapshot
from actors.policy_runner import ChosenRows
from actors.remote_policy import InferenceRefused, RemotePolicy
from common import protocol
from common.config import ModelConfig


class RemoteInference:
    """The calls of actors/local_inference.py:LocalInference, answered with a RemotePolicy. `end_session`
    is called with a reason when the service does not know this actor (the actor then joins again);
    `stopping` says whether the actor was asked to stop (a request waited on is then given up)."""

    remote = True

    def __init__(
        self,
        cfg: ActorConfig,
        stats: Counter,
        end_session: Callable[[str], None],
        stopping: Callable[[], bool] = lambda: False,
    ):
        self.cfg, self.stats, self.end_session, self.stopping = cfg, stats, end_session, stopping

    def refusal(self, welcome: protocol.Welcome) -> str:
        if welcome.sync:
            return "--inference remote does not run DigiRL's synchronous rounds (--mode sync) yet"
        if not welcome.inference_port:
            return "the learner has no inference service (it runs with --inference-port -1)"
        return ""

    def open(self, conn: LearnerConnection, model_cfg: ModelConfig) -> RemotePolicy:
        cfg = self.cfg
        return RemotePolicy(
            model_cfg, self._address(conn.welcome), conn.actor_id, cfg.inference_timeout, curve_client(cfg),
            while_waiting=self._heartbeats(conn), stopping=self.stopping,
        )  # fmt: skip

    def ready(self, runner: RemotePolicy) -> bool:
        return True

    def prepare(
        self, conn: LearnerConnection, runner: RemotePolicy, batch: int, take_in: Callable[[], None]
    ) -> None:
        """Nothing to compile here: the service compiles on the learner."""

    def rejoined(self, conn: LearnerConnection, welcome: protocol.Welcome, runner: RemotePolicy) -> None:
        """A new session (perhaps a restarted learner on another port): the next request goes there."""
        runner.reconnect(self._address(welcome), conn.actor_id, self._heartbeats(conn))

    def swap(self, runner: RemotePolicy, newest: Snapshot | None, reload: bool) -> bool:
        """Never: the parameters stay on the learner."""
        return False

    def act(self, runner: RemotePolicy, features: dict[str, np.ndarray]) -> ChosenRows | None:
        """The runner's choices; None when the service refused or did not answer (counted, and the step
        is tried again: `unavailable` before the first parameters, `no_answer` while the learner may be
        gone; `not_welcomed` after a rejoin; `stopping`: the actor stops instead)."""
        try:
            return runner.act(features)
        except InferenceRefused as e:
            self.stats[f"inference_refused_{e.code}"] += 1
            if e.code == "not_welcomed":
                self.end_session("the inference service does not know this actor")
            elif e.code == "stopping":
                pass
            elif e.code in ("unavailable", "no_answer"):
                time.sleep(0.2)
            else:
                raise
            return None

    def close(self, runner: RemotePolicy) -> None:
        """Count the service's waits and reconnects (inference_*) and close the socket."""
        self.stats.update({f"inference_{k}": round(v, 1) for k, v in runner.stats.items()})
        runner.close()

    def _address(self, welcome: protocol.Welcome) -> str:
        return f"tcp://{self.cfg.host}:{welcome.inference_port}"

    def _heartbeats(self, conn: LearnerConnection) -> Callable[[], None]:
        """What a remote policy does while it waits for the service: keep this session alive."""
        return lambda: conn.heartbeat_if_due(self.cfg.heartbeat_every)
