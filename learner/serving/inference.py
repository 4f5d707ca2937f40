"""The inference service (SEED RL's design, issue 33): actors in `--inference remote` mode send featurized
observations (ACT) and this acts on them with the learner's newest parameters, batched across actors, on
the learner's own devices, so an emulator host needs no model, no accelerator and no parameter copy.

One thread owns one ROUTER socket (ZeroMQ sockets are not thread-safe; the learner's other sockets stay on
its main thread). It gathers requests until `max_rows` observations wait or `deadline_ms` has passed since
the first, runs the family's jitted act once on all of them (rows padded to a power of two, so a handful
of shapes compile), and answers each request with its rows (ACTED, common/protocol/inference.py). The
parameters are a copy on the learner's own devices, handed over at each publish (`publish`,
Trainer.serving_copy: the update donates the trainer's arrays, so they cannot be shared; a frozen LoRA
base is copied once, per version only what trains): no host round trip, no serialisation, and the version
each answer names is the one that produced it. While no actor asks (none in the last IDLE_S seconds) a
publish hands over no copy, only its version (`wants_params`); a request that finds the service behind
is refused `unavailable` and raises `behind`, on which the learner's loop hands over the newest
parameters between two updates (it cannot wait for the next publish: training may be waiting for that
very actor's data).

Every refused request is answered with an ERROR and counted by code (`rejected`): malformed (the codes of
common/protocol), from an actor the learner has not welcomed (`not_welcomed`), or before the first
parameters exist (`unavailable`). Replies that cannot be queued are dropped and counted (`drops`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import zmq

from common import protocol, wire
from common.net.curve import CurveServer
from common.protocol.inference import ACTED_ARRAYS, Act, ActedReply
from learner.ingest.transport import send_or_count

POLL_MS = 50
"""How long the service thread waits for a first request before it looks at its stop flag again."""
QUEUE_MESSAGES = 64
"""Send and receive high-water marks per actor connection (whole messages)."""
IDLE_S = 30.0
"""A service with no request for this long takes no parameter copies at publishes (`wants_params`)."""
STATS = ("requests", "rows", "batches", "padded_rows", "answered", "act_s")
"""The service's counters (`InferenceService.stats`, `inference/<name>` in a metrics record)."""


@dataclass(frozen=True)
class InferenceConfig:
    """How the service batches requests."""

    max_rows: int = 64
    """Most observations in one batched act: requests wait no longer once this many are queued."""
    deadline_ms: float = 5.0
    """How long the first request of a batch waits for others (the latency paid for batching)."""
    seed: int = 0
    """Seed of the sampling keys (one stream for the whole service)."""


class InferenceService:
    """See the module docstring. `known(actor_id)` says whether the learner has welcomed that actor (read
    from this thread: a dict lookup); `policy` is the run's family and `graphdef` its network's."""

    def __init__(
        self,
        policy: Any,
        graphdef: Any,
        ctx: zmq.Context,
        address: str,
        known: Callable[[int], bool],
        cfg: InferenceConfig = InferenceConfig(),
        curve: CurveServer | None = None,
    ):
        self.policy, self.cfg, self.known = policy, cfg, known
        self.spec = policy.episode_spec()
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, QUEUE_MESSAGES)
        self.sock.setsockopt(zmq.SNDHWM, QUEUE_MESSAGES)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if curve is not None:
            curve.apply(self.sock)
        self.sock.bind(address)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(self.endpoint.rsplit(":", 1)[1])
        self._act = jax.jit(lambda params, inputs, key: policy.act(graphdef, params, inputs, key, False))
        self._key = jax.random.key(cfg.seed)
        self._newest: tuple[int, Any] | None = None
        """(version, params or None): the newest publish; None params when it handed over no copy."""
        self._params: tuple[int, Any] | None = None
        self._last_request: float | None = None
        self.idle_publishes = 0
        """Publishes that handed over no copy (nobody asked); written by the main thread only."""
        self._behind_asked = False
        """A request was refused because the newest version came without parameters (`behind`)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)
        self.stats: Counter[str] = Counter(dict.fromkeys(STATS, 0))
        """requests, rows, batches, padded_rows, answered; `act_s` the seconds spent acting. Every key from
        the start, so a metrics record has them all (0) before the first request."""
        self.rejected: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()

    # ---- the main thread's side ------------------------------------------------------------------------
    def wants_params(self) -> bool:
        """Whether the next publish should hand over a copy: until the first one, and while actors ask."""
        last = self._last_request
        return self._newest is None or (last is not None and time.monotonic() - last < IDLE_S)

    def behind(self) -> bool:
        """Whether an actor asked while the service had no parameters for the newest version: the main
        thread should publish them (Session.refresh_inference) without waiting for the next version."""
        return self._behind_asked

    def publish(self, version: int, params: Any | None) -> None:
        """From now on act with `params` (a device copy the service may keep) as `version`; None (see
        `wants_params`): `version` exists, and requests are refused until a publish brings parameters."""
        self.idle_publishes += params is None
        with self._lock:
            self._newest = (version, params)
            if params is not None:
                self._behind_asked = False

    def metrics(self) -> dict[str, Any]:
        """For the learner's metrics record: inference/requests, rows, batches, ..., and what was refused or
        dropped (read from the main thread: counters the service thread only adds to)."""
        stats = dict(self.stats)
        return {
            **{f"inference/{k}": (round(v, 3) if isinstance(v, float) else v) for k, v in stats.items()},
            "inference/idle_publishes": self.idle_publishes,
            "inference/rejected_by_reason": dict(self.rejected),
            "inference/dropped_replies": dict(self.drops),
        }

    def start(self) -> InferenceService:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sock.close(0)

    # ---- the service thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._gather()
            if batch:
                self._serve(batch)

    def _gather(self) -> list[tuple[bytes, Act]]:
        """Valid requests until max_rows rows wait or the deadline after the first has passed."""
        batch: list[tuple[bytes, Act]] = []
        rows, deadline = 0, None
        while rows < self.cfg.max_rows:
            wait = POLL_MS if deadline is None else max(0.0, (deadline - time.monotonic()) * 1e3)
            if not self.sock.poll(wait):
                break
            got = self._receive()
            if got is None:
                continue
            batch.append(got)
            rows += len(next(iter(got[1].obs.values())))
            deadline = deadline or time.monotonic() + self.cfg.deadline_ms / 1e3
        return batch

    def _receive(self) -> tuple[bytes, Act] | None:
        """One request, checked; a refused one is answered and counted, and gives None."""
        frames = self.sock.recv_multipart(copy=False)
        identity = frames[0].bytes
        self.stats["requests"] += 1
        self._last_request = time.monotonic()
        if len(frames) != 2:
            self._refuse(identity, "bad_envelope", f"expected one message frame, got {len(frames) - 1}")
            return None
        request = None
        try:
            msg = protocol.parse(frames[1].buffer)
            if msg["kind"] != protocol.ACT:
                raise protocol.ProtocolError(
                    "unexpected_kind", f"the inference service takes ACT, not {msg['kind']}"
                )
            request = msg.get("id") if type(msg.get("id")) is int else None
            act = Act.from_msg(msg, self.spec)
        except protocol.ProtocolError as e:
            self._refuse(identity, e.code, e.reason, request)
            return None
        if not self.known(act.actor_id):
            self._refuse(identity, "not_welcomed", f"actor {act.actor_id} has not joined this run", act.id)
            return None
        if self._current() is None:
            self._behind_asked = self._newest is not None  # published, but without parameters
            self._refuse(
                identity, "unavailable", "no parameters for the newest version yet; ask again", act.id
            )
            return None
        return identity, act

    def _current(self) -> tuple[int, Any] | None:
        """The parameters to act with: the newest published, taken up here (the family refreshes what it
        derives from them, `loaded`); None while the newest version came without them."""
        with self._lock:
            newest = self._newest
        if newest is None:
            return None
        if newest[1] is not None and (self._params is None or newest[0] != self._params[0]):
            self.policy.loaded(newest[1])
            self._params = newest
        return self._params if self._params is not None and self._params[0] == newest[0] else None

    def _serve(self, batch: list[tuple[bytes, Act]]) -> None:
        version, params = self._current()
        counts = [len(next(iter(act.obs.values()))) for _, act in batch]
        total = sum(counts)
        padded = 1 << (total - 1).bit_length()
        features = {
            name: np.concatenate(
                [act.obs[name] for _, act in batch] + [batch[0][1].obs[name][:1]] * (padded - total)
            )
            for name in self.spec.observations
        }
        self._key, key = jax.random.split(self._key)
        t0 = time.perf_counter()
        out = jax.device_get(self._act(params, self.policy.inputs(features), key))
        self.stats["act_s"] += time.perf_counter() - t0
        columns = {**{k: np.asarray(v) for k, v in out.choice.items()}, "logp": out.logp, "value": out.value,
                   "entropy": out.entropy}  # fmt: skip
        wanted = {**self.spec.choice_arrays(), **{name: ((), "<f4") for name in ACTED_ARRAYS}}
        columns = {name: np.asarray(columns[name], dtype) for name, (_, dtype) in wanted.items()}
        self.stats.update(batches=1, rows=total, padded_rows=padded - total, answered=len(batch))
        start = 0
        for (identity, act), n in zip(batch, counts, strict=True):
            rows = {name: col[start : start + n] for name, col in columns.items()}
            self._send([identity, wire.encode(ActedReply(act.id, version, rows).to_msg())])
            start += n

    def _refuse(self, identity: bytes, code: str, reason: str, request: int | None = None) -> None:
        self.rejected[code] += 1
        self._send([identity, protocol.error(code, reason, request)])

    def _send(self, frames: list) -> None:
        send_or_count(self.sock, frames, self.drops)
