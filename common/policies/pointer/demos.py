"""The pointer policy's demonstrations: an oracle's actions as its choices, with the demonstrator's exact
log-probability (actors/tools/demos.py records them through `PointerPolicy.demonstrator`).

Every recorded step is something the policy can do: a tap is the index of the tapped element, a typed
phrase becomes one `type` per instruction word (or per span of up to --model.span-words words), so the
behavior log-prob of each step is exact under the behavior policy "oracle with probability 1 - noise,
else a uniformly random action of the policy's action space". An episode the policy could not express (a
tap on an element beyond `max_elements`, text that is not made of instruction words) is dropped.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from common.config import ModelConfig
from common.policies.family import DemoOracle
from common.policies.pointer import featurize
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS, Action, ActionType, Observation, PolicyChoice


class Inexpressible(Exception):
    """The oracle did something the policy's action space cannot represent."""


def _choices(obs: Observation, action: Action, cfg: ModelConfig, phrase: str = "") -> list[PolicyChoice]:
    """The policy choices that perform `action` (several for a phrase typed word by word). With spans
    (ModelConfig.span_words > 1) and the rest of the oracle's phrase (`phrase`, starting with the word it
    types) found as consecutive instruction words, the phrase in spans of up to span_words words."""
    kind = int(action.type)
    if action.type == ActionType.TAP:
        point = (round(action.x * obs.screen_size[0]), round(action.y * obs.screen_size[1]))
        for i, el in enumerate(obs.elements[: cfg.max_elements]):
            if el.center == point:
                return [PolicyChoice(kind, element=i)]
        raise Inexpressible("tap target beyond max_elements")
    if action.type == ActionType.TYPE:
        words = featurize.instruction_words(obs.instruction, cfg)
        spans = _phrase_spans(words, phrase.split(), action.text, cfg)
        if spans:
            return [PolicyChoice(kind, word=featurize.span_choice(first, n, cfg)) for first, n in spans]
        out = []
        for w in action.text.split():
            if w not in words:
                raise Inexpressible(f"typed word {w!r} is not an instruction word")
            out.append(PolicyChoice(kind, word=featurize.span_choice(words.index(w), 1, cfg)))
        return out
    if action.type == ActionType.SWIPE:
        return [PolicyChoice(kind, direction=int(action.direction))]
    return [PolicyChoice(kind)]


def _phrase_spans(words: list[str], phrase: list[str], typed: str, cfg: ModelConfig) -> list[tuple[int, int]]:
    """(first word, count) spans of at most span_words that type `phrase` (which starts with `typed`),
    where it stands as consecutive instruction words; [] without spans or when it does not."""
    if cfg.span_words == 1 or not phrase or phrase[0] != typed:
        return []
    n = len(phrase)
    first = next((i for i in range(len(words) - n + 1) if words[i : i + n] == phrase), None)
    if first is None:
        return []
    return [(i, min(cfg.span_words, first + n - i)) for i in range(first, first + n, cfg.span_words)]


def _random_choice(rng: np.random.Generator, n_elements: int, n_words: int, cfg: ModelConfig) -> PolicyChoice:
    """A uniformly random action of the policy's action space: type, then its argument (a typed-text
    choice uniform over the spans inside the instruction)."""
    spans = [
        featurize.span_choice(i, k, cfg)
        for i in range(n_words)
        for k in range(1, min(cfg.span_words, n_words - i) + 1)
    ]
    kind, element = int(rng.integers(NUM_ACTION_TYPES)), int(rng.integers(max(n_elements, 1)))
    word = int(rng.integers(max(len(spans), 1)))  # one draw either way: the same stream as word-by-word
    direction = int(rng.integers(NUM_SWIPE_DIRECTIONS))
    return PolicyChoice(kind, element=element, word=spans[word] if spans else 0, direction=direction)


def _random_prob(c: PolicyChoice, n_elements: int, n_words: int, cfg: ModelConfig) -> float:
    """Probability of choice `c` under the uniform random action of the policy's action space."""
    p = 1.0 / NUM_ACTION_TYPES
    if c.action_type == ActionType.TAP:
        p /= max(n_elements, 1)
    elif c.action_type == ActionType.TYPE:
        p /= max(featurize.valid_spans(n_words, cfg), 1)
    elif c.action_type == ActionType.SWIPE:
        p /= NUM_SWIPE_DIRECTIONS
    return p


def _same(a: PolicyChoice, b: PolicyChoice) -> bool:
    """Two choices that are the same complete action (unused arguments do not matter)."""
    if a.action_type != b.action_type:
        return False
    return {
        ActionType.TAP: a.element == b.element,
        ActionType.TYPE: a.word == b.word,
        ActionType.SWIPE: a.direction == b.direction,
    }.get(ActionType(a.action_type), True)


class PointerDemonstrator:
    """One episode's demonstrator: the oracle's choices, a uniformly random one instead with probability
    `noise` (the oracle then re-plans from whatever it did)."""

    def __init__(self, oracle: DemoOracle, noise: float, rng: np.random.Generator, cfg: ModelConfig):
        self.oracle, self.noise, self.rng, self.cfg = oracle, noise, rng, cfg
        self.pending: list[PolicyChoice] = []
        """The rest of the oracle's last action (a phrase typed word by word)."""

    def choose(
        self, obs: Observation, features: dict[str, np.ndarray]
    ) -> tuple[dict[str, Any], float] | None:
        """The next choice's arrays by name and its log-probability under the demonstrator; None when the
        oracle did something the policy cannot express."""
        cfg, noise = self.cfg, self.noise
        n_el = min(len(obs.elements), cfg.max_elements)
        n_words = len(featurize.instruction_words(obs.instruction, cfg))
        if not self.pending:
            try:
                self.pending = _choices(obs, self.oracle.act(obs), cfg, self.oracle.phrase)
            except Inexpressible:
                return None
        expert = self.pending[0]
        if self.rng.random() < noise:
            choice = _random_choice(self.rng, n_el, n_words, cfg)
            if not _same(choice, expert):
                self.oracle.undo()  # its action was not taken: it re-plans from whatever the random one did
            self.pending = []
        else:
            choice = self.pending.pop(0)
        p = (1 - noise) * _same(choice, expert) + noise * _random_prob(choice, n_el, n_words, cfg)
        return dataclasses.asdict(choice), math.log(p)
