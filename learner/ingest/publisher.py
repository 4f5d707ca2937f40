"""Parameter snapshots out: every published version goes to all subscribers on the PUB, and the newest
is kept to answer PARAM_REQ on the ROUTER (a SUB only sees what is published after it joined)."""

from __future__ import annotations

import numpy as np

from common import protocol
from learner.ingest.transport import Transport


class ParamPublisher:
    """The newest published snapshot (`version`, -1 before the first) and its PARAMS frames."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.version = -1
        """The newest published version: steps labelled above it are refused (`future_version`)."""
        self._frames: list = []

    def publish(self, version: int, flat: dict[str, np.ndarray]) -> None:
        """Publish a snapshot to all subscribers and keep it to answer PARAM_REQ."""
        self.version = version
        self._frames = protocol.params_frames(version, flat)
        self.transport.pub.send_multipart(self._frames, copy=False)

    def answer(self, identity: bytes) -> None:
        """The newest snapshot as the reply to one actor's PARAM_REQ (or pushed to a version 3 actor, which
        refuses the PUB's), in the protocol version it speaks."""
        self.transport.send_frames([identity, *self.transport.peers.params(identity, self._frames)])
