"""What an actor builds on its first WELCOME and keeps across reconnects: the environments and the policy."""

from __future__ import annotations

import dataclasses

from actors.policy_runner import PolicyRunner
from actors.remote_policy import RemotePolicy
from actors.rounds import Rounds
from actors.slots import EnvSlots
from common import protocol
from common.config import ModelConfig
from common.episode import EpisodeBuilder


@dataclasses.dataclass
class World:
    """The environments and the policy: built on the first WELCOME, kept across reconnects, built again
    only when the learner runs another model."""

    model_cfg: ModelConfig
    max_steps: int
    runner: PolicyRunner | RemotePolicy
    slots: EnvSlots
    episodes: list[EpisodeBuilder | None]
    """The episode in progress per slot (None while the slot's reset is due or running)."""
    spec: protocol.EpisodeSpec
    """The arrays the policy family's episodes carry (their choices' dtypes)."""
    rounds: Rounds
    """When each slot starts its next episode (--mode sync, --max-episode-rate)."""
    reload: bool = False
    """Load the next snapshot even at an equal version (after joining a restarted learner)."""
