"""An actor's policy in `--inference remote` mode: featurize here, act on the learner's inference service
(learner/serving/inference.py), so this host holds no parameters and needs no accelerator.

`RemotePolicy` answers what the actor loop asks of actors/policy_runner.PolicyRunner (featurize, act,
to_action, version), so the loop does not know which one it drives. Each `act` is one ACT request with the
ready environments' observations; the answer names the parameters' version that produced it, which
becomes `version` (the steps are labelled with it). A refused request raises `InferenceRefused` with the
service's code, and so does a lost service (`no_answer` after `timeout`; the next request goes out on a
new connection); the time spent waiting is counted (`stats`). While it waits it calls `while_waiting`
every WAIT_SLICE_S (the actor heartbeats there: a first batch of a new size compiles on the service for
seconds, longer than the learner waits before it forgets a silent actor), and gives the request up
(`stopping`) as soon as the actor is asked to stop: a learner stopping its local actors answers no more
requests and kills what has not stopped within seconds, so an actor waiting out its whole timeout would
die without delivering what it holds.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq

from actors.policy_runner import ChosenRows
from common import protocol, wire
from common.config import ModelConfig
from common.net.curve import CurveClient
from common.policies import make_policy
from common.protocol.inference import Act, ActedReply
from common.types import Action, Observation

WAIT_SLICE_S = 0.25
"""How often `while_waiting` runs (and `stopping` is asked) while an answer is awaited."""
STOPPING = object()
"""`_answer`'s result when the actor was asked to stop while it waited."""


class InferenceRefused(RuntimeError):
    """The service answered an ACT with an ERROR (`code`: docs/PROTOCOL.md §7)."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code = code


class RemotePolicy:
    """See the module docstring. `address` is the service's tcp://host:port; `actor_id` this actor's id in
    the run (the service refuses actors the learner has not welcomed); `while_waiting` is called every
    WAIT_SLICE_S while an answer is awaited."""

    def __init__(
        self,
        cfg: ModelConfig,
        address: str,
        actor_id: int,
        timeout: float = 30.0,
        curve: CurveClient | None = None,
        ctx: zmq.Context | None = None,
        while_waiting: Callable[[], None] = lambda: None,
        stopping: Callable[[], bool] = lambda: False,
    ):
        self.cfg, self.address, self.actor_id, self.timeout = cfg, address, actor_id, timeout
        self.curve, self.while_waiting, self.stopping = curve, while_waiting, stopping
        self.policy = make_policy(cfg)
        self.spec = self.policy.episode_spec()
        self.version = -1
        """The version of the parameters that answered the last request."""
        self.stage_seconds: dict[str, float] = {}
        """Kept empty: the stages run on the service."""
        self.stats: Counter[str] = Counter()
        """requests, reconnects, late_answers; `wait_s` the seconds spent without an answer."""
        self._ctx = ctx or zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._request = 0

    def featurize(self, obs: Observation, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
        return self.policy.featurize(obs, history)

    def to_action(self, obs: Observation, choice: dict[str, Any]) -> Action:
        return self.policy.to_action(obs, choice)

    def act(self, features: dict[str, np.ndarray]) -> ChosenRows:
        """The service's choices for a batch of features [N, ...]. No answer within `timeout` raises
        InferenceRefused("no_answer") after dropping the connection (the next request opens a new one), so
        the actor's loop keeps heartbeating and finds out whether the learner is gone; the actor keeps its
        environments and episodes meanwhile."""
        rows = len(next(iter(features.values())))
        self._request += 1
        self.stats["requests"] += 1
        sock = self._socket()
        sock.send(wire.encode(Act(self.actor_id, self._request, features).to_msg()), copy=False)
        answer = self._answer(sock, self._request, rows)
        if answer is STOPPING:
            self.stats["given_up_stopping"] += 1
            self._drop_socket()  # its answer, should it come, is nobody's
            raise InferenceRefused("stopping", "the actor is stopping")
        if answer is None:
            self.stats["reconnects"] += 1
            self._drop_socket()
            raise InferenceRefused("no_answer", f"no answer from {self.address} in {self.timeout:g}s")
        return self._acted(answer)

    def reconnect(self, address: str, actor_id: int, while_waiting: Callable[[], None]) -> None:
        """A new session (the actor joined again, perhaps a restarted learner on another port)."""
        self._drop_socket()
        self.address, self.actor_id, self.while_waiting = address, actor_id, while_waiting

    def close(self) -> None:
        self._drop_socket()

    def _answer(self, sock: zmq.Socket, request: int, rows: int) -> ActedReply | object | None:
        """The ACTED for `request`, or None after `timeout` s without one, or STOPPING once `stopping()`;
        ERROR raises InferenceRefused."""
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(min(left, WAIT_SLICE_S) * 1e3):
                self.while_waiting()
                if self.stopping():
                    return STOPPING
                continue
            msg = protocol.parse(sock.recv(copy=False).buffer)
            if msg["kind"] == protocol.ERROR:
                error = protocol.Error.from_msg(msg)
                if error.seq in (None, request):
                    raise InferenceRefused(error.code, error.reason)
                continue
            if msg["kind"] != protocol.ACTED or msg.get("id") != request:
                self.stats["late_answers"] += 1  # an answer to a request given up on
                continue
            return ActedReply.from_msg(msg, self.spec, rows)
        self.stats["wait_s"] += self.timeout
        return None

    def _acted(self, answer: ActedReply) -> ChosenRows:
        self.version = answer.version
        arrays = answer.arrays
        names = list(self.spec.choice_arrays())
        columns = {name: arrays[name].tolist() for name in names}
        choices = [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
        f32 = np.float32
        return ChosenRows(
            choices,
            np.asarray(arrays["logp"], f32),
            np.asarray(arrays["value"], f32),
            np.asarray(arrays["entropy"], f32),
        )

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
            if self.curve is not None:
                self.curve.apply(sock)
            sock.connect(self.address)
            self._sock = sock
        return self._sock

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
