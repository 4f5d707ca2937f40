"""Batched, jitted policy inference on the CPU with the newest parameter snapshot."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from common import distribution, featurize, model, text_encoder
from common.config import ModelConfig
from common.types import Action, ActionType, Observation, PolicyChoice, SwipeDirection


class Acted(NamedTuple):
    """One batched policy call: per row, the choice and what the learner's replay can use of it."""

    choices: list[PolicyChoice]
    logp: np.ndarray
    """[N] float32: log mu of each choice (the behaviour log-probability the learner corrects with)."""
    value: np.ndarray
    """[N] float32: the critic's V(s) on the same forward pass."""
    entropy: np.ndarray
    """[N] float32: the exact entropy of the policy at s."""


class PolicyRunner:
    def __init__(self, cfg: ModelConfig, seed: int, greedy: bool = False):
        # The text encoder's folder and checksum are checked now (CheckpointError: not this learner's).
        cfg = text_encoder.resolve(cfg)
        self.cfg = cfg
        self._text: text_encoder.TextEmbedder | None = None
        """Built on first use (it loads the encoder: seconds), by compile on the actor's helper thread."""
        # Shapes only: the parameters always come from a snapshot (load), and building real ones first
        # would block the actor for up to a minute on a busy CPU, before it can heartbeat.
        self.graphdef, self._template = model.abstract(cfg)
        self.params = None
        self.version = -1
        self._key = jax.random.key(seed)

        def act(params, features, key):
            logits, value = model.apply(self.graphdef, params, features)
            choice, logp = distribution.mode(logits) if greedy else distribution.sample(key, logits)
            return choice, logp, value, distribution.entropy(logits)

        self._act = jax.jit(act)

    def load(self, version: int, flat: dict[str, np.ndarray]) -> None:
        """Swap to a snapshot; raises ValueError if it does not fit the model."""
        self.params = model.flat_to_params(self._template, flat)
        self.version = version
        encoder = model.text_encoder_state(self.params)
        if encoder is not None:  # fine-tuned: encode with the snapshot's encoder (the cache starts over)
            self.text.set_encoder(encoder)

    def compile(self, features: dict[str, np.ndarray]) -> None:
        """Compile the sampling step for this batch shape now, with a throwaway key: the actor's own key
        stream (its seeded sampling) is untouched."""
        jax.block_until_ready(self._act(self.params, self._inputs(features), jax.random.key(0)))

    @property
    def text(self) -> text_encoder.TextEmbedder | None:
        """The text encoder and its cache (None without one); a fine-tuned one gets each snapshot's weights."""
        if self._text is None and self.cfg.uses_text_encoder:
            self._text = text_encoder.TextEmbedder(self.cfg)
        return self._text

    def _inputs(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Featurized observations plus the text encoder's states when there is one."""
        return features if self.text is None else self.text.add(features)

    def act(self, features: dict[str, np.ndarray]) -> Acted:
        """Sample one action per row of the batched features (the mode when greedy)."""
        self._key, key = jax.random.split(self._key)
        choice, logp, value, entropy = jax.device_get(self._act(self.params, self._inputs(features), key))
        choices = [
            PolicyChoice(int(a), int(e), int(w), int(d))
            for a, e, w, d in zip(
                choice["action_type"], choice["element"], choice["word"], choice["direction"], strict=True
            )
        ]
        f32 = np.float32
        return Acted(choices, np.asarray(logp, f32), np.asarray(value, f32), np.asarray(entropy, f32))


def to_action(obs: Observation, choice: PolicyChoice, cfg: ModelConfig) -> Action:
    """Turn the policy's indices into a concrete action on this observation."""
    kind = ActionType(choice.action_type)
    if kind == ActionType.TAP:
        elements = obs.elements[: cfg.max_elements]
        if choice.element < len(elements):
            return Action.tap_element(elements[choice.element], obs.screen_size)
        return Action.tap(0.5, 0.5)
    if kind == ActionType.TYPE:
        words = featurize.instruction_words(obs.instruction, cfg)
        return Action(kind, text=words[choice.word] if choice.word < len(words) else "")
    if kind == ActionType.SWIPE:
        return Action(kind, direction=SwipeDirection(choice.direction))
    return Action(kind)
