"""`--inference local`: the actor runs the policy itself (actors/policy_runner.py) on the newest parameter
snapshot the learner publishes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from actors.config import ActorConfig
from actors.connection import LearnerConnection, Snapshot
from actors.policy_runner import ChosenRows, PolicyRunner
from common import protocol
from common.config import ModelConfig


class LocalInference:
    """What the actor asks of its inference (this one and actors/remote_inference.py answer the same
    calls): whether it can serve a learner, a policy runner per model, when the runner is ready, what to
    do before the first step, on a rejoin, on a new snapshot, per step and at the end."""

    remote = False
    """Whether the learner acts (no parameter snapshots are subscribed to)."""

    def __init__(self, cfg: ActorConfig, stats: Counter, log=print):
        self.cfg, self.stats, self.log = cfg, stats, log

    def refusal(self, welcome: protocol.Welcome) -> str:
        """Why this actor cannot serve the learner that sent `welcome` ("": it can)."""
        return ""

    def open(self, conn: LearnerConnection, model_cfg: ModelConfig) -> PolicyRunner:
        """The runner for `model_cfg`; its parameters come with the first snapshot (asked for here)."""
        conn.request_params(-1)  # first: building the policy takes seconds, and the learner hears from us now
        return PolicyRunner(model_cfg, self.cfg.seed)

    def ready(self, runner: PolicyRunner) -> bool:
        return runner.params is not None

    def prepare(
        self, conn: LearnerConnection, runner: PolicyRunner, batch: int, take_in: Callable[[], None]
    ) -> None:
        """Compile the policy for `batch` rows on a thread while still heartbeating (and taking in replies):
        a first compile takes 10-30 s on a busy CPU, longer than the learner waits before it forgets a
        silent actor."""
        dummy = runner.example_features(batch)
        with ThreadPoolExecutor(1, thread_name_prefix="compile") as pool:
            compiled = pool.submit(runner.compile, dummy)
            while not compiled.done():
                conn.heartbeat_if_due(self.cfg.heartbeat_every)
                conn.wait(100)
                take_in()
            compiled.result()

    def rejoined(self, conn: LearnerConnection, welcome: protocol.Welcome, runner: PolicyRunner) -> None:
        """A new session with the runner kept: ask for anything newer than what it has."""
        conn.request_params(runner.version)

    def swap(self, runner: PolicyRunner, newest: Snapshot | None, reload: bool) -> bool:
        """Load `newest` if it is newer than the runner's (or as new, with `reload`); True when loaded."""
        if newest is None or not (newest[0] > runner.version or (reload and newest[0] >= runner.version)):
            return False
        try:
            runner.load(*newest)
        except ValueError as e:
            self.stats["bad_snapshots"] += 1
            self.log(f"actor: snapshot v{newest[0]} does not fit the model: {e}")
            return False
        self.stats["param_swaps"] += 1
        return True

    def act(self, runner: PolicyRunner, features: dict[str, np.ndarray]) -> ChosenRows:
        return runner.act(features)

    def close(self, runner: PolicyRunner) -> None:
        """Nothing to close: the runner holds no socket."""
