"""The actors the learner has welcomed: who may send (an `actor_id` bound to its connection), who is
alive (heard from within `--actor-timeout`) and how many environments a sync round waits for."""

from __future__ import annotations

import time
from dataclasses import dataclass

from common import protocol
from common.protocol import ProtocolError


@dataclass
class ActorInfo:
    """What the learner knows of one welcomed actor connection, from its HELLO to its expiry.

    Held in `ActorRegistry.actors` under the `actor_id` its WELCOME gave it; every later message must
    carry that id and come from the same ROUTER `identity` (a WELCOME is bound to its connection).
    `last_seen` drives the expiry after `actor_timeout`; `instance` keys its batches in the delivery
    ledger; `num_envs` sizes a sync round (`connected_envs`)."""

    actor_id: int
    identity: bytes
    """The ROUTER routing id of the DEALER that sent HELLO: replies go there."""
    name: str
    """Display name from HELLO (cut to protocol.MAX_TEXT characters)."""
    instance: str
    """The actor process's random id: its TRAJ seqs are numbered per instance, across reconnects."""
    num_envs: int
    last_seen: float
    """time.monotonic() of its last message."""
    episodes: int = 0
    """Episodes stored from this connection."""
    active: bool = False
    """Sent something after WELCOME; an abandoned handshake (the actor retried on a new socket) never is."""


class ActorRegistry:
    """The welcomed actors by `actor_id`: registered by HELLO, looked up (and marked alive) by every
    later message, forgotten after `actor_timeout` seconds of silence."""

    def __init__(self, actor_timeout: float = 15.0):
        self.actor_timeout = actor_timeout
        self.actors: dict[int, ActorInfo] = {}
        """By actor_id (changed in place only: the IngestServer shares this dict)."""
        self._next_id = 1

    def register(self, identity: bytes, hello: protocol.Hello) -> ActorInfo:
        """A new `actor_id` for this connection; an older one of the same instance becomes void."""
        for old_id in [i for i, a in self.actors.items() if a.instance == hello.instance]:
            del self.actors[old_id]  # the same process on a new connection: its old id is void
        actor = ActorInfo(
            self._next_id, identity, hello.actor, hello.instance, hello.num_envs, time.monotonic()
        )
        self.actors[actor.actor_id] = actor
        self._next_id += 1
        return actor

    def known(self, identity: bytes, actor_id: int) -> ActorInfo:
        """The actor `actor_id` if this connection was welcomed with it (now seen alive), else `not_welcomed`."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.identity != identity:
            raise ProtocolError(
                "not_welcomed", f"actor_id {actor_id} has not completed the handshake on this socket"
            )
        actor.last_seen = time.monotonic()
        actor.active = True
        return actor

    def live(self) -> list[ActorInfo]:
        """The actors that sent something after their WELCOME (an abandoned handshake's socket is gone)."""
        return [a for a in self.actors.values() if a.active]

    def forget_silent(self) -> None:
        """Forget the actors silent for actor_timeout (they must HELLO again). Call only after reading
        every waiting message: while the learner is busy (compiling, a long step) an actor's heartbeats
        wait in the socket, and that wait must not count as the actor's silence."""
        now = time.monotonic()
        for actor_id in [i for i, a in self.actors.items() if now - a.last_seen >= self.actor_timeout]:
            del self.actors[actor_id]

    def connected_envs(self) -> int:
        """Environments of the actors connected now (from their HELLO): a sync round waits for this many."""
        return sum(a.num_envs for a in self.live())

    def connected_actors(self) -> int:
        """Actors not forgotten and heard from since their WELCOME."""
        return len(self.live())
