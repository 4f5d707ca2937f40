"""The episode as the actor builds it: columns appended step by step, packed once when it ends.

From the environment step to the replay an episode has one name and two forms: this builder while it
grows (one list per array, no row objects to transpose), then the wire fields `protocol.episode_fields`
gives it (the arrays a TRAJ carries, which the learner validates into a `protocol.Episode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common import protocol
from common.types import Action


class EpisodeBuilder:
    """One episode in progress: per-step columns, the actions taken (a policy family's history) and, at
    the end, the final observation, the outcome and the wire fields."""

    def __init__(self, task: str):
        self.task = task
        self.observations: dict[str, list[np.ndarray]] = {}
        """Featurized observation arrays by name, one row per step (the final one is added by `finish`)."""
        self.columns: dict[str, list[Any]] = {}
        """The choice arrays and behavior_logp, reward, policy_version: one value per step."""
        self.estimates: dict[str, list[float]] | None = {"value": [], "entropy": []}
        """The behaviour policy's V(s_t) and entropy, kept while every step has them (oracles have none)."""
        self.actions: list[Action] = []
        """The actions taken so far, oldest first: the history a policy family may featurize."""

    @property
    def length(self) -> int:
        return len(self.actions)

    def add(
        self,
        features: Mapping[str, np.ndarray],
        choice: Mapping[str, Any],
        behavior_logp: float,
        reward: float,
        policy_version: int,
        action: Action,
        value: float | None = None,
        entropy: float | None = None,
    ) -> None:
        """Append one step: the features it was chosen on, the choice and its log-prob, what it earned,
        the policy version that chose it, the action taken, and the actor's own estimates when known."""
        for name, row in features.items():
            self.observations.setdefault(name, []).append(row)
        for name, value_ in (*choice.items(), ("behavior_logp", behavior_logp), ("reward", reward)):
            self.columns.setdefault(name, []).append(value_)
        self.columns.setdefault("policy_version", []).append(policy_version)
        self.actions.append(action)
        if value is None or entropy is None:
            self.estimates = None  # one step without them: the episode goes without (max priority)
        elif self.estimates is not None:
            self.estimates["value"].append(value)
            self.estimates["entropy"].append(entropy)

    def cap_versions(self, newest: int) -> int:
        """Lower every step's policy version above `newest` to it (a restarted learner numbers its versions
        again from its checkpoint's and refuses newer ones); how many steps changed."""
        versions = self.columns.get("policy_version", [])
        changed = sum(v > newest for v in versions)
        versions[:] = [min(v, newest) for v in versions]
        return changed

    def finish(
        self, final_features: Mapping[str, np.ndarray], success: bool, truncated: bool, spec: Any = None
    ) -> dict[str, Any]:
        """The finished episode's wire fields (`protocol.episode_fields`), with the observation after its
        last step (the bootstrap of a truncated episode); `spec` (an EpisodeSpec) gives choice dtypes."""
        if not self.length:
            raise ValueError("an episode needs at least one step")
        obs = {k: np.stack([*rows, final_features[k]]) for k, rows in self.observations.items()}
        steps = {k: np.asarray(v) for k, v in self.columns.items()}
        estimates = None if self.estimates is None else {k: np.asarray(v) for k, v in self.estimates.items()}
        return protocol.episode_fields(self.task, success, truncated, obs, steps, estimates, spec)
