"""The policy interface: everything the actors and the learner need from a policy family, and no more.

A family turns observations into arrays (`featurize`), acts on a batch of them (`act`, jitted on the
actor), evaluates the choices taken in a training batch (`evaluate`, jitted inside the learner's update),
turns a choice into an `Action`, builds its parameters, and declares the arrays its episodes carry
(`episode_spec`), so the wire protocol validates them without knowing the family. The learner's losses
see only the `Evaluation`; the actor's loop sees only choices as dicts of small integer arrays.

Families are picked by `--model.kind` (common/policies/__init__.py): a built-in name, or `module:Class`
for a family that lives in the user's own code (docs/POLICIES.md walks through one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from common.config import ModelConfig
from common.policies.evaluation import Evaluation
from common.types import Action, Observation

Spec = dict[str, tuple[tuple[int, ...], str]]
"""Array name -> (shape of one row, dtype string), e.g. {"elem_mask": ((24,), "|b1")}."""


class Acted(NamedTuple):
    """One batched `act`: per row, the choice and what the replay and the learner need of it."""

    choice: dict[str, Any]
    """Choice arrays by name (the family's `episode_spec().choices`), [N] each."""
    logp: Any
    """[N] log mu of each choice under the exact distribution it was sampled from."""
    value: Any
    """[N] the critic's V(s) on the same pass (the replay's initial priority)."""
    entropy: Any
    """[N] the exact entropy of the policy at s."""


class PolicyFamily(Protocol):
    """One policy family, built from the run's ModelConfig (which the learner sends every actor)."""

    cfg: ModelConfig

    def episode_spec(self) -> Any:
        """The arrays an episode carries: featurized observations, per-step choice arrays with their
        bounds, and integer observation ranges (a common.protocol EpisodeSpec)."""

    def featurize(self, obs: Observation, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
        """One observation as arrays of `episode_spec().observations`; `history` is the episode's actions
        so far (a family may ignore it)."""

    def inputs(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What `act` reads on an actor, from a batch of featurized observations (for example a text
        encoder's cached states, computed on the host); the features themselves when there is nothing to
        add."""

    def input_spec(self) -> Spec:
        """Names, shapes and dtypes per row of the observations the learner's update reads (`evaluate`'s
        `obs`): the learner compiles its update on them."""

    def create(self, seed: int) -> tuple[Any, Any]:
        """(graphdef, params): a fresh network, parameters named by their tree path."""

    def abstract(self) -> tuple[Any, Any]:
        """(graphdef, params as shapes only): the template a snapshot is loaded into, nothing computed."""

    def act(self, graphdef: Any, params: Any, inputs: dict[str, Any], key: Any, greedy: bool) -> Acted:
        """Choose for a batch of inputs [N, ...] (jittable; `greedy` is static): a sample, or the mode."""

    def evaluate(
        self, graphdef: Any, params: Any, obs: dict[str, Any], choice: dict[str, Any], acted_obs: Any
    ) -> Evaluation:
        """The choices taken [B, T] on observations [B, T + 1, ...] (jittable, differentiable in params):
        log-probs, exact entropies, values and the log-probs on `acted_obs` (or `obs` when None)."""

    def loaded(self, params: Any) -> None:
        """An actor loaded a new snapshot: refresh host-side state derived from the parameters (the
        pointer policy's fine-tuned text encoder and its cache); most families do nothing."""

    def to_action(self, obs: Observation, choice: dict[str, int]) -> Action:
        """The concrete action of one row's choice on the observation it was chosen on."""


@runtime_checkable
class StagedAct(Protocol):
    """What a family may add so an actor can time the two parts of its act apart (the lm family: the
    prompts' prefill, then the action's decoding), reported in the actor's status line. It must hold that
    act(g, p, x, key, greedy) == decode(g, p, x, prefill(g, p, x), key, greedy); both are jitted apart."""

    def prefill(self, graphdef: Any, params: Any, inputs: dict[str, Any]) -> Any:
        """The first stage on a batch of inputs [N, ...] (jittable): whatever `decode` starts from."""

    def decode(
        self, graphdef: Any, params: Any, inputs: dict[str, Any], prefilled: Any, key: Any, greedy: bool
    ) -> Acted:
        """The second stage: the choices, as `act` gives them."""
