"""A fault proxy between actors and the learner's ingest (for `python -m benchmarks chaos`): actors connect
to its ROUTER, and each actor connection gets its own DEALER to the learner, so the learner still sees one
peer per actor. Every message, in either direction, is at the stated rates dropped, duplicated, delayed
(held for up to `max_delay_s`) or reordered (held until the next message on the same path has gone, or
`max_delay_s`), drawn from a seeded generator and counted by kind. ZeroMQ reconnects the DEALERs by itself
when the learner restarts on the same port.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import zmq

IDLE_CLOSE_S = 120.0
"""A DEALER whose actor has sent nothing for this long is closed (a killed actor's connection)."""


@dataclass(frozen=True)
class FaultRates:
    """Per message, the chance of each fault (at most one per message)."""

    drop: float = 0.01
    duplicate: float = 0.01
    delay: float = 0.02
    reorder: float = 0.01
    max_delay_s: float = 0.5


class FaultProxy:
    """Runs on its own thread (`start`, `stop`); `port` is where actors connect; `counts` the faults."""

    def __init__(self, learner_port: int, rates: FaultRates, seed: int):
        self.rates, self.learner_port = rates, learner_port
        self.rng = np.random.default_rng(seed)
        self.counts: Counter[str] = Counter()
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.port = self.front.bind_to_random_port("tcp://127.0.0.1")
        self._backs: dict[bytes, zmq.Socket] = {}
        self._owner: dict[zmq.Socket, bytes] = {}
        self._heard: dict[bytes, float] = {}
        self._held: list[tuple[float, int, zmq.Socket, list[bytes]]] = []  # a heap by release time
        self._overtaken: dict[
            zmq.Socket, list[tuple[float, list[bytes]]]
        ] = {}  # waiting for the next message
        self._order = itertools.count()
        self._poller = zmq.Poller()
        self._poller.register(self.front, zmq.POLLIN)
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fault-proxy", daemon=True)

    def start(self) -> None:
        self._running.set()
        self._thread.start()

    def stop(self) -> None:
        self._running.clear()
        if self._thread.ident is not None:  # started
            self._thread.join(10)
        for sock in [self.front, *self._backs.values()]:
            sock.close(0)
        self.ctx.term()

    def _loop(self) -> None:
        while self._running.is_set():
            events = dict(self._poller.poll(20))
            if self.front in events:
                self._from_actor()
            for sock in [s for s in events if s is not self.front]:
                frames = sock.recv_multipart(copy=True)
                self._route(self.front, [self._owner[sock], *frames])
            self._release(time.monotonic())
            self._close_idle()

    def _from_actor(self) -> None:
        identity, *frames = self.front.recv_multipart(copy=True)
        self._heard[identity] = time.monotonic()
        back = self._backs.get(identity)
        if back is None:
            back = self._backs[identity] = self.ctx.socket(zmq.DEALER)
            back.setsockopt(zmq.LINGER, 0)
            back.connect(f"tcp://127.0.0.1:{self.learner_port}")
            self._owner[back] = identity
            self._poller.register(back, zmq.POLLIN)
        self._route(back, frames)

    def _route(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        r, rates, now = self.rng.random(), self.rates, time.monotonic()
        edges = np.cumsum([rates.drop, rates.duplicate, rates.delay, rates.reorder])
        kind = ("drop", "duplicate", "delay", "reorder", "pass")[int(np.searchsorted(edges, r, side="right"))]
        self.counts[kind] += 1
        if kind == "drop":
            return
        if kind == "delay":
            release = now + self.rng.uniform(0.0, rates.max_delay_s)
            heapq.heappush(self._held, (release, next(self._order), sock, frames))
            return
        if kind == "reorder":
            self._overtaken.setdefault(sock, []).append((now + rates.max_delay_s, frames))
            return
        self._send(sock, frames)
        if kind == "duplicate":
            self._send(sock, frames)
        for _deadline, held in self._overtaken.pop(sock, []):  # overtaken by this message
            self._send(sock, held)

    def _release(self, now: float) -> None:
        while self._held and self._held[0][0] <= now:
            _, _, sock, frames = heapq.heappop(self._held)
            self._send(sock, frames)
        for sock, held in list(self._overtaken.items()):
            due = [f for deadline, f in held if deadline <= now]
            if due:
                self._overtaken[sock] = [(d, f) for d, f in held if d > now]
                for frames in due:
                    self._send(sock, frames)

    def _send(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        if sock.closed:
            return
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.counts["queue_full"] += 1  # as a full link would: the protocol re-sends

    def _close_idle(self) -> None:
        now = time.monotonic()
        for identity in [i for i, t in self._heard.items() if now - t > IDLE_CLOSE_S]:
            back = self._backs.pop(identity)
            self._poller.unregister(back)
            del self._owner[back], self._heard[identity]
            back.close(0)
