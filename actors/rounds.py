"""When each environment slot starts its next episode: at once, once --max-episode-rate's token bucket
allows it, or, under --mode sync (DigiRL's synchronous rounds), once a newer policy version has come."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from actors.pacing import TokenBucket
from actors.slots import EnvSlots


@dataclass
class Rounds:
    """The slots whose next episode waits, and why. A slot whose episode ended is `parked` under --mode
    sync (until the runner's version is newer than the one its episode began with, `started`) or
    `waiting` for a token under --max-episode-rate (oldest first); otherwise it starts again at once.
    Built with the environments (one per `World`); `pacer` is the actor's, kept across rebuilds."""

    slots: EnvSlots
    pacer: TokenBucket | None = None
    """--max-episode-rate: what lets a slot start its next episode (None: no limit)."""
    sync: bool = False
    """The learner runs DigiRL's synchronous loop: one episode per environment per policy version (set
    at every join, from WELCOME)."""
    started: dict[int, int] = field(default_factory=dict)
    """Policy version each slot's episode began with."""
    parked: set[int] = field(default_factory=set)
    """--mode sync: slots whose episode of this round is done, waiting for a newer version to start again."""
    waiting: deque[int] = field(default_factory=deque)
    """--max-episode-rate: slots whose episode ended, oldest first, waiting for a token to start again."""

    def began(self, i: int, version: int) -> None:
        """Slot i's reset came back: its episode runs under policy `version`."""
        self.started[i] = version

    def ended(self, i: int) -> None:
        """Slot i's episode is over: park the slot (--mode sync) or start its next episode."""
        if self.sync:
            self.parked.add(i)
            self.slots.park(i)
        else:
            self.begin(i)

    def begin(self, i: int) -> None:
        """Start slot i's next episode now, or, under --max-episode-rate, once `release` lets it."""
        if self.pacer is None:
            self.slots.reset(i)
        else:
            self.slots.park(i)
            self.waiting.append(i)

    def release(self) -> bool:
        """--max-episode-rate: start the waiting slots' episodes the token bucket allows, oldest first;
        False when no slot has anything to step (every one waits for a token or, in --mode sync, for a
        newer version)."""
        while self.waiting and self.pacer.take():
            self.slots.reset(self.waiting.popleft())
        return len(self.waiting) + len(self.parked) < len(self.slots)

    def next_round(self, version: int) -> bool:
        """--mode sync: start the next episode of every parked slot whose episode used an older version
        than `version` (the newest); False when every slot is parked (nothing to step until a new version
        comes)."""
        for i in [i for i in self.parked if version > self.started.get(i, -1)]:
            self.parked.discard(i)
            self.begin(i)
        return len(self.parked) < len(self.slots)

    def wait_ms(self) -> int:
        """How long the loop waits when every slot waits: until the next token, at most 50 ms."""
        return min(50, 1 + int(1000 * self.pacer.wait_s())) if self.pacer else 50
