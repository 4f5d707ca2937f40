"""A deliberately small second policy family, living only here: it proves the policy seam.

`--model.kind tests.tiny_policy:TinyPolicy` plugs it into a real learner and real actors (the learner
sends the kind in WELCOME; each actor imports this module by name), without any change outside this file.
It reads each screen element's box and flags plus how many steps the episode has taken (its history),
and picks one "button": an element to tap, or the back key, or "done". A linear score per button, a
softmax over the valid ones, and a critic on the mean of the element rows: small enough to read in one
sitting, real enough to train (exact log-probs and entropies, masked choices).
docs/POLICIES.md walks through it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.config import ModelConfig
from common.policies import Acted, Evaluation
from common.protocol import EpisodeSpec
from common.types import Action, ActionType, Observation

FEATURES = 6
"""Per element: left, top, right, bottom (over the screen size), clickable, checked."""
KEYS = ("back", "done")
"""The buttons after the elements: press back, declare the task complete."""


class Scorer(nnx.Module):
    """Scores each element row and the two keys; V(s) from the mean element row and the step count."""

    def __init__(self, rngs: nnx.Rngs):
        self.element = nnx.Linear(FEATURES + 1, 1, rngs=rngs)
        self.keys = nnx.Linear(FEATURES + 1, len(KEYS), rngs=rngs)
        self.value = nnx.Linear(FEATURES + 1, 1, rngs=rngs)

    def __call__(self, elements: jax.Array, mask: jax.Array, steps: jax.Array):
        """elements [..., E, F], mask [..., E], steps [..., 1] -> (logits [..., E + 2], value [...])."""
        rows = jnp.concatenate(
            [elements, jnp.broadcast_to(steps[..., None, :], (*elements.shape[:-1], 1))], -1
        )
        valid = mask[..., None].astype(rows.dtype)
        pooled = (rows * valid).sum(-2) / jnp.maximum(valid.sum(-2), 1.0)
        logits = jnp.concatenate([self.element(rows)[..., 0], self.keys(pooled)], -1)
        allowed = jnp.concatenate([mask, jnp.ones((*mask.shape[:-1], len(KEYS)), bool)], -1)
        return jnp.where(allowed, logits, -1e9), self.value(pooled)[..., 0]


class TinyPolicy:
    """The family (common/policies/family.py's interface), built from the run's ModelConfig."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.elements = cfg.max_elements

    def episode_spec(self) -> EpisodeSpec:
        e = self.elements
        observations = {"elements": ((e, FEATURES), "<f4"), "mask": ((e,), "|b1"), "steps": ((1,), "<f4")}
        return EpisodeSpec(observations, choices={"button": ("<i4", e + len(KEYS))})

    def featurize(self, obs: Observation, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
        width, height = obs.screen_size
        rows = np.zeros((self.elements, FEATURES), np.float32)
        mask = np.zeros(self.elements, bool)
        for i, el in enumerate(obs.elements[: self.elements]):
            left, top, right, bottom = el.bounds
            rows[i] = (left / width, top / height, right / width, bottom / height, el.clickable, el.checked)
            mask[i] = True
        return {"elements": rows, "mask": mask, "steps": np.array([len(history) / 10], np.float32)}

    def inputs(self, features):
        return features

    def input_spec(self):
        return self.episode_spec().observations

    def create(self, seed: int):
        return nnx.split(Scorer(nnx.Rngs(seed)))

    def abstract(self):
        return nnx.split(nnx.eval_shape(lambda: Scorer(nnx.Rngs(0))))

    def _apply(self, graphdef, params, obs):
        return nnx.merge(graphdef, params)(obs["elements"], obs["mask"], obs["steps"])

    def act(self, graphdef, params, inputs, key, greedy: bool) -> Acted:
        logits, value = self._apply(graphdef, params, inputs)
        button = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)
        logp = jax.nn.log_softmax(logits)
        picked = jnp.take_along_axis(logp, button[..., None], -1)[..., 0]
        return Acted({"button": button.astype(jnp.int32)}, picked, value, _entropy(logp))

    def evaluate(self, graphdef, params, obs, choice, acted_obs) -> Evaluation:
        logits, values = self._apply(graphdef, params, obs)
        logp = jax.nn.log_softmax(logits[:, :-1])  # the final observation takes no step
        picked = jnp.take_along_axis(logp, choice["button"][..., None], -1)[..., 0]
        return Evaluation(picked, _entropy(logp), values, jax.lax.stop_gradient(picked))

    def loaded(self, params) -> None:
        pass

    def to_action(self, obs: Observation, choice) -> Action:
        button = int(choice["button"])
        elements = obs.elements[: self.elements]
        if button < len(elements):
            return Action.tap_element(elements[button], obs.screen_size)
        if button == self.elements:
            return Action(ActionType.PRESS_BACK)
        if button == self.elements + 1:
            return Action(ActionType.STATUS_COMPLETE)
        return Action.tap(0.5, 0.5)  # an element slot this screen does not fill (masked: never sampled)


def _entropy(logp: jax.Array) -> jax.Array:
    """Exact entropy of a categorical from its log-probs; masked buttons (probability ~0) add nothing."""
    return -jnp.sum(jnp.where(logp > -1e8, jnp.exp(logp) * logp, 0.0), -1)
