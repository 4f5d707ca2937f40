"""The policy interface: everything the actors and the learner need from a policy family, and no more.

A family turns observations into arrays (`featurize`), acts on a batch of them (`act`, jitted on the
actor), evaluates the choices taken in a training batch (`evaluate`, jitted inside the learner's update),
turns a choice into an `Action`, builds its parameters, and declares the arrays its episodes carry
(`episode_spec`), so the wire protocol validates them without knowing the family. The learner's losses
see only the `Evaluation`; the actor's loop sees only choices as dicts of small integer arrays.

Families are picked by `--model.kind` (common/policies/__init__.py): a built-in name, or `module:Class`
for a family that lives in the user's own code (docs/POLICIES.md walks through one).

Optional hooks let a family add to what the framework does around it without the framework knowing the
family: its config completed from its files (`ResolvesConfig`), host-side inputs of the learner's update
(`HostInputs`), augmentation of training batches (`Augments`), parameters at their own learning rate
(`ScaledParams`), demonstrations from an oracle (`RecordsDemos`), fields of its own in WELCOME
(`WelcomeFields`). The functions at the end of this module
(and `resolved_config` in the registry) apply them, and do nothing for a family without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from common.config import ModelConfig
from common.policies.evaluation import Evaluation
from common.types import Action, Observation

Spec = dict[str, tuple[tuple[int, ...], str]]
"""Array name -> (shape of one row, dtype string), e.g. {"elem_mask": ((24,), "|b1")}."""
Arrays = dict[str, Any]
"""Arrays by name with leading batch axes (a batch's observations: [B, T + 1, ...] each)."""
HostStep = Callable[[Arrays, Arrays | None, Arrays, Any], tuple[Arrays, Arrays | None]]
"""(observations, acted observations or None, choices, the learner's parameters as they are now) -> the
observations and acted ones with what the update reads added. A step with a `stats()` method (-> dict of
floats) reports it in every update's metrics (the lm family's cached trunk)."""


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


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """What the learner's flags ask of a family's augmentation of training observations after acting
    (--word-rename-rate, --typed-word-rename-rate, --rename-word-pieces); a family that augments nothing
    (no `Augments` hook) ignores it."""

    word_rate: float = 0.0
    """Share of each episode's distinct words renamed."""
    typed_word_rate: float = 0.0
    """The same for the words an episode types (its values)."""
    word_pieces: bool = True
    """A renamed value also gets new pieces of the family's text encoder (when it has one)."""


@runtime_checkable
class ResolvesConfig(Protocol):
    """A family whose config is completed from files it reads, and checked against them, before an actor
    or the learner builds anything (the pointer policy: its text encoder's width and checksum)."""

    def resolved_config(self) -> ModelConfig:
        """This family's config with what its files say filled in (common.backbones.CheckpointError when
        they are missing, damaged, or not the ones the config names)."""


@runtime_checkable
class HostInputs(Protocol):
    """A family whose update reads inputs computed on the learner's host before each step (the pointer
    policy's frozen text encoder: its cached states; the lm family's packed rows and cached trunk)."""

    def host_inputs(self, graphdef: Any, cache_bytes: int) -> HostStep | None:
        """The host-side step, built now (it may load what it needs: the learner calls this once, when
        it builds its training state, with its parameters' graphdef and the memory a cache of computed
        inputs may keep, --trunk-cache-mb); None when this run has nothing to add."""


@runtime_checkable
class ShapedUpdates(Protocol):
    """A family whose host step gives batches of a few shapes (the lm family packs the rows that matter):
    the learner compiles the update for each shape as a batch first has it, not ahead for one."""

    def update_shapes(self, max_steps: int) -> int:
        """The most shapes its host step gives for --max-steps `max_steps`."""


@runtime_checkable
class Augments(Protocol):
    """A family whose learner augments training observations after acting (the pointer policy renames
    words). The update then also reads the observations as acted on (Batch.acted_obs): `evaluate`'s
    `acted_obs`, for the importance ratios."""

    def augments(self, augmentation: Augmentation) -> bool:
        """Whether `augment` changes observations under these settings (the learner compiles its update
        with acted observations when it does)."""

    def augment(self, obs: Arrays, augmentation: Augmentation, seed: int | Sequence[int]) -> Arrays:
        """A copy of a batch's observations (leading episode axis), augmented; the same `seed` gives the
        same result (a resumed run augments exactly as an uninterrupted one)."""


@runtime_checkable
class ScaledParams(Protocol):
    """A family with parameters trained at their own, smaller learning rate (--text-encoder-lr-scale: the
    pointer policy's fine-tuned text encoder)."""

    def scaled_param(self, path: tuple[str, ...]) -> bool:
        """Whether the parameter at this tree path (names, e.g. ("text", "encoder", "layers", ...)) takes
        the scaled learning rate."""


class DemoOracle(Protocol):
    """What a family's demonstrator sees of an environment's oracle (actors/envs/simphone/oracle.py)."""

    phrase: str
    """The rest of the phrase the oracle is typing (a family that types whole phrases types this)."""

    def act(self, obs: Observation) -> Action:
        """The oracle's next action (it assumes it is taken)."""

    def undo(self) -> None:
        """Forget the last `act`: another action was taken instead."""


class Demonstrator(Protocol):
    """One episode's demonstrator (`RecordsDemos.demonstrator`)."""

    def choose(
        self, obs: Observation, features: dict[str, np.ndarray]
    ) -> tuple[dict[str, Any], float] | None:
        """The next step's choice (arrays by name, as `to_action` and the episode take it) and its exact
        log-probability under the demonstrator, on `obs` (featurized: `features`); None when the family
        cannot express what the oracle did (the episode is dropped and counted)."""


@runtime_checkable
class RecordsDemos(Protocol):
    """A family that records an oracle's demonstrations as its own episodes (`python -m actors demos`,
    the learner's warm-up)."""

    noisy_demos: bool
    """Whether its demonstrator mixes in random actions (--noise above 0)."""

    def demonstrator(self, oracle: DemoOracle, noise: float, rng: np.random.Generator) -> Demonstrator:
        """A demonstrator for one episode of `oracle`'s, drawing its noise from `rng`."""


@runtime_checkable
class WelcomeFields(Protocol):
    """A family whose actors (or other-language peers) need facts of its files in WELCOME, beside the
    model config: the pointer policy's `text_vocab_size`, the bound of its WordPiece ids."""

    def welcome_fields(self) -> dict[str, Any]:
        """WELCOME fields by name (docs/PROTOCOL.md lists the ones the protocol knows)."""


def welcome_fields(policy: PolicyFamily) -> dict[str, Any]:
    """The family's own WELCOME fields (`WelcomeFields`), or none."""
    return policy.welcome_fields() if isinstance(policy, WelcomeFields) else {}


def host_inputs(policy: PolicyFamily, graphdef: Any, cache_bytes: int) -> HostStep | None:
    """The family's host-side step before each update (`HostInputs`), or None."""
    return policy.host_inputs(graphdef, cache_bytes) if isinstance(policy, HostInputs) else None


def update_shapes(policy: PolicyFamily, max_steps: int) -> int | None:
    """The most batch shapes the family's host step gives (`ShapedUpdates`); None: one, compiled ahead."""
    return policy.update_shapes(max_steps) if isinstance(policy, ShapedUpdates) else None


def augments(policy: PolicyFamily, augmentation: Augmentation) -> bool:
    """Whether the family augments training observations under these settings (`Augments`)."""
    return isinstance(policy, Augments) and policy.augments(augmentation)


def scaled_param(policy: PolicyFamily) -> Callable[[tuple[str, ...]], bool] | None:
    """Which parameter paths take the scaled learning rate (`ScaledParams`); None: no parameter does."""
    return policy.scaled_param if isinstance(policy, ScaledParams) else None


def demos_problem(policy: PolicyFamily, noise: float) -> str | None:
    """Why this family cannot record demonstrations with this --noise (one line), or None."""
    kind = policy.cfg.kind
    if not isinstance(policy, RecordsDemos):
        return f"--model.kind {kind} records no oracle demonstrations (use --warmup-demos 0 or --demos FILE)"
    if noise and not policy.noisy_demos:
        return f"--noise needs a family whose demonstrator mixes in random actions (the pointer policy); got {kind}"
    return None
