"""Which connections speak the previous protocol version, so that every reply to them is in that version.

The ingest parses a message of any of `compat.PEER_VERSIONS` and tells `heard` its version before anything
else: a version 3 peer the run cannot serve (`compat.refusal`) is refused `bad_version` then, and one it
can serve is remembered by its routing id, so the transport stamps its replies `v` = 3 (`reply`,
`params`) and every published snapshot also goes to it on the ROUTER (a version 3 actor refuses the
PUB's version 4 PARAMS). Connections that speak this side's version are not recorded at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from common.config import ModelConfig
from common.protocol import PROTOCOL_VERSION, EpisodeSpec, ProtocolError, compat


class PeerVersions:
    """Routing id -> protocol version, for the connections whose last message was of an older version."""

    def __init__(self, spec: EpisodeSpec | None = None, model: ModelConfig | dict | None = None):
        """Without a run (`spec` and `model`, a ModelConfig or its dict), every older version is refused."""
        if isinstance(model, dict):
            model = ModelConfig.from_dict(model)
        self._refusals = {
            version: compat.refusal(version, spec, model)
            if spec is not None and model is not None
            else f"protocol version {version}, this side speaks {PROTOCOL_VERSION}"
            for version in compat.PEER_VERSIONS
            if version != PROTOCOL_VERSION
        }
        self._older: dict[bytes, int] = {}

    def heard(self, identity: bytes, version: int) -> None:
        """A message of `version` (one of PEER_VERSIONS) came from `identity`: remember it for the replies,
        and refuse it (`bad_version`, answered in that version) when this run cannot serve that version."""
        if version == PROTOCOL_VERSION:
            self._older.pop(identity, None)
            return
        self._older[identity] = version
        if self._refusals[version]:
            raise ProtocolError("bad_version", self._refusals[version])

    def version_of(self, identity: bytes) -> int:
        return self._older.get(identity, PROTOCOL_VERSION)

    def reply(self, identity: bytes, msg: dict[str, Any]) -> dict[str, Any]:
        """`msg` in the version `identity` speaks."""
        return compat.in_version(msg, self.version_of(identity))

    def params(self, identity: bytes, frames: list[Any]) -> list[Any]:
        """PARAMS frames in the version `identity` speaks."""
        return compat.params_in_version(frames, self.version_of(identity))

    def older(self, live: Iterable[bytes]) -> list[bytes]:
        """The connections of `live` that speak an older version; the others recorded are forgotten."""
        live = set(live)
        self._older = {identity: v for identity, v in self._older.items() if identity in live}
        return list(self._older)
