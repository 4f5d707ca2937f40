"""gymnasium spaces for the phone's object observations and actions, so generic tooling
(`gymnasium.utils.env_checker.check_env`, wrappers) can validate and sample them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from common.types import NUM_ACTION_TYPES, Action, ActionType, Observation, SwipeDirection


class ObservationSpace(gym.Space):
    """Observations are `common.types.Observation` objects (instruction, UI elements, screenshot)."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x) -> bool:
        return isinstance(x, Observation)

    def sample(self, mask=None, probability=None) -> Observation:
        return Observation("", ())

    @property
    def is_np_flattenable(self) -> bool:
        return False


class ActionSpace(gym.Space):
    """Actions are `common.types.Action` objects; `sample` draws a uniformly random one."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x) -> bool:
        return isinstance(x, Action) and isinstance(x.type, int) and 0 <= int(x.type) < len(ActionType)

    def sample(self, mask=None, probability=None) -> Action:
        rng: np.random.Generator = self.np_random
        kind = ActionType(int(rng.integers(NUM_ACTION_TYPES)))
        return Action(
            kind,
            x=float(rng.random()),
            y=float(rng.random()),
            direction=SwipeDirection(int(rng.integers(len(SwipeDirection)))),
            text="hello" if kind == ActionType.TYPE else "",
        )

    @property
    def is_np_flattenable(self) -> bool:
        return False
