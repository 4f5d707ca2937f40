"""The pointer policy, the default family (`--model.kind pointer`): a small transformer over the
instruction's words and the screen's elements that points at what to tap or type (common/policies/pointer/network.py), with
a factorized action distribution (common/policies/pointer/distribution.py) and optional frozen or fine-tuned text encoder.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from common.config import ModelConfig
from common.policies.evaluation import Evaluation
from common.policies.family import Acted, Arrays, Augmentation, DemoOracle, HostStep
from common.policies.pointer import augment, distribution, featurize, text_encoder
from common.policies.pointer import network as model
from common.policies.pointer.demos import PointerDemonstrator
from common.types import Action, ActionType, Observation, SwipeDirection


class PointerPolicy:
    """The default family; see the module docstring (and common.policies.family for the interface)."""

    noisy_demos = True
    """Its demonstrations may mix in uniformly random actions (demos.py)."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self._text: text_encoder.TextEmbedder | None = None

    def resolved_config(self) -> ModelConfig:
        """The text encoder's width and checksum filled in from its folder, after checking it
        (text_encoder.resolve); without an encoder, both cleared."""
        return text_encoder.resolve(self.cfg)

    def episode_spec(self):
        return featurize.episode_spec(self.cfg, text_encoder.vocab_size(self.cfg))

    def welcome_fields(self) -> dict[str, int]:
        """`text_vocab_size`: the encoder's WordPiece vocabulary (0 without one), the bound the learner
        checks the episodes' WordPiece ids against."""
        return {"text_vocab_size": text_encoder.vocab_size(self.cfg)}

    def featurize(self, obs: Observation, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
        return featurize.featurize(obs, self.cfg, history)

    @property
    def text(self) -> text_encoder.TextEmbedder | None:
        """The frozen text encoder and its cache, built on first use (it loads the encoder: seconds);
        None without an encoder and with a fine-tuned one, which runs inside the network."""
        frozen = self.cfg.uses_text_encoder and not self.cfg.train_text_encoder
        return self.encoder if frozen else None

    @property
    def encoder(self) -> text_encoder.TextEmbedder | None:
        """The text encoder's host side (its tokenizer and cache), frozen or fine-tuned; None without one.
        A fine-tuned encoder gets each snapshot's weights (`loaded`)."""
        if self._text is None and self.cfg.uses_text_encoder:
            self._text = text_encoder.TextEmbedder(self.cfg)
        return self._text

    def loaded(self, params) -> None:
        encoder = model.text_encoder_state(params)
        if encoder is not None:  # fine-tuned: encode with the snapshot's encoder (the cache starts over)
            self.encoder.set_encoder(encoder)

    def inputs(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return features if self.encoder is None else self.encoder.add(features)

    def input_spec(self):
        frozen = self.cfg.uses_text_encoder and not self.cfg.train_text_encoder
        return featurize.input_spec(self.cfg) if frozen else featurize.feature_spec(self.cfg)

    def host_inputs(self, graphdef, cache_bytes: int) -> HostStep | None:
        """The frozen text encoder's states, added to each training batch on the learner's host (the
        encoder is loaded now, with its own cache: text_encoder.TextEmbedder); None without an encoder and
        with a fine-tuned one, which runs inside the update."""
        text = self.text
        return None if text is None else functools.partial(_with_states, text)

    def augments(self, augmentation: Augmentation) -> bool:
        return augmentation.word_rate > 0 or augmentation.typed_word_rate > 0

    def augment(self, obs: Arrays, augmentation: Augmentation, seed: int | Sequence[int]) -> Arrays:
        """Word renaming (augment.py): the words' hashed ids, and with a text encoder and
        `augmentation.word_pieces` the renamed values' WordPiece ids too."""
        cfg = self.cfg
        pieces = (
            augment.piece_table(cfg.text_encoder)
            if augmentation.word_pieces and cfg.uses_text_encoder
            else None
        )
        return augment.rename_words(
            obs, augmentation.word_rate, cfg.vocab_size, seed, augmentation.typed_word_rate, pieces
        )

    def scaled_param(self, path: tuple[str, ...]) -> bool:
        """The fine-tuned text encoder's parameters (`text/encoder/...`) take --text-encoder-lr-scale."""
        return any(a == "text" and b == "encoder" for a, b in itertools.pairwise(path))

    def demonstrator(self, oracle: DemoOracle, noise: float, rng: np.random.Generator) -> PointerDemonstrator:
        return PointerDemonstrator(oracle, noise, rng, self.cfg)

    def create(self, seed: int):
        return model.create(self.cfg, seed)

    def abstract(self):
        return model.abstract(self.cfg)

    def act(self, graphdef, params, inputs, key, greedy: bool) -> Acted:
        logits, value = model.apply(graphdef, params, inputs)
        choice, logp = distribution.mode(logits) if greedy else distribution.sample(key, logits)
        return Acted(choice, logp, value, distribution.entropy(logits))

    def evaluate(self, graphdef, params, obs, choice, acted_obs) -> Evaluation:
        """logp / entropy [B, T] on `obs` (what the gradient trains on), values [B, T + 1], and log pi on
        `acted_obs` (a second pass without gradient when the learner renamed words) so that importance
        ratios compare pi and mu on the same input: rho = 1 exactly at zero policy lag."""
        obs = model.encode_text(graphdef, params, obs)  # a fine-tuned text encoder runs once, here
        logits, values = model.apply(graphdef, params, obs)
        step_logits = {k: v[:, :-1] for k, v in logits.items()}
        logp = distribution.log_prob(step_logits, choice)
        entropy = distribution.entropy(step_logits)
        if acted_obs is None:
            return Evaluation(logp, entropy, values, logp)
        # A fine-tuned encoder encodes the acted observations again (apply does, without gradient):
        # renaming may have given the trained ones other WordPiece ids (augment.py).
        acted_logits, _ = model.apply(graphdef, jax.lax.stop_gradient(params), acted_obs)
        ratio_logp = distribution.log_prob({k: v[:, :-1] for k, v in acted_logits.items()}, choice)
        return Evaluation(logp, entropy, values, jax.lax.stop_gradient(ratio_logp))

    def to_action(self, obs: Observation, choice: dict[str, Any]) -> Action:
        """A tap at the chosen element's centre, the chosen instruction word typed, a swipe, or a key; its
        note says what it aimed at (the element's label, the word, the direction), which the policy's
        memory reads (ModelConfig.history)."""
        kind = ActionType(int(choice["action_type"]))
        if kind == ActionType.TAP:
            elements = obs.elements[: self.cfg.max_elements]
            element = int(choice["element"])
            if element >= len(elements):
                return Action.tap(0.5, 0.5)
            tap = Action.tap_element(elements[element], obs.screen_size)
            return dataclasses.replace(tap, note=elements[element].label)
        if kind == ActionType.TYPE:
            words = featurize.instruction_words(obs.instruction, self.cfg)
            first, count = featurize.span_of(choice["word"], self.cfg)
            text = " ".join(words[first : first + count]) if first + count <= len(words) else ""
            return Action(kind, text=text, note=text)
        if kind == ActionType.SWIPE:
            direction = SwipeDirection(int(choice["direction"]))
            return Action(kind, direction=direction, note=direction.name.lower())
        return Action(kind)


def _with_states(
    text: text_encoder.TextEmbedder, obs: Arrays, acted_obs: Arrays | None, choice: Arrays, params
):
    """`obs` and `acted_obs` (of a renamed batch, or None) with the frozen encoder's states added. Word
    renaming may give renamed words new WordPiece ids; where it did not, the acted observations take the
    very same states instead of being looked up again."""
    with_states = text.add(obs)
    if acted_obs is None:
        return with_states, None
    if all(acted_obs[k] is obs[k] for k in text_encoder.TEXT_KEYS):
        return with_states, {**acted_obs, **{k: with_states[k] for k in text_encoder.EMBEDDING_KEYS}}
    return with_states, text.add(acted_obs)
