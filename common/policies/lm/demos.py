"""The `lm` family's demonstrations: an oracle's actions written in the action grammar (a phrase typed at
once, as `type("...")`), as token ids with the end-of-turn token, on the prompts the family builds
(actors/tools/demos.py records them through `LMPolicy.demonstrator`). The demonstrator is deterministic
(--noise 0), so every step's behaviour log-prob is 0 (log 1); the learner imitates the tokens (their
log-likelihood) and replays them like any episode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from common.policies.family import DemoOracle
from common.types import Action, ActionType, Observation

DemoChoice = Callable[[Observation, int, Action], "dict[str, Any] | None"]
"""LMPolicy.demo_choice: (observation, elements its prompt shows, action) -> the choice, or None."""


class LMDemonstrator:
    """One episode's demonstrator: the oracle's actions, each as the grammar writes it."""

    def __init__(self, oracle: DemoOracle, demo_choice: DemoChoice):
        self.oracle, self.demo_choice = oracle, demo_choice

    def choose(
        self, obs: Observation, features: dict[str, np.ndarray]
    ) -> tuple[dict[str, Any], float] | None:
        """The choice that writes the oracle's next action, log-prob 0; None when the grammar cannot write
        it (a tap on an element the prompt does not show, text too long): the episode is dropped."""
        action = self.oracle.act(obs)
        if action.type == ActionType.TYPE:
            action = Action(ActionType.TYPE, text=self.oracle.phrase)
        choice = self.demo_choice(obs, int(features["n_elements"]), action)
        return None if choice is None else (choice, 0.0)
