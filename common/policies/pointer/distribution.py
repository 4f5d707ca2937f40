"""The factorized action distribution of the default policy, with exact log-probs and entropy.

An action is drawn hierarchically: first the type (tap, swipe, type, back, home, enter, complete),
then only the argument that type needs: an element for tap, an instruction word for type (or, with
ModelConfig.span_words > 1, a span of words: one categorical over (first word, length), common/policies/pointer/network.py),
a direction for swipe. So
    log pi(a) = log p(type) + [tap] log p(element) + [type] log p(word) + [swipe] log p(direction)
    H(pi)     = H(type) + p(tap) H(element) + p(type) H(word) + p(swipe) H(direction)
which is the exact entropy of the joint distribution over complete actions (chain rule of entropy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from common.types import ActionType

# Which sub-head each action type uses.
ARGUMENT_OF_TYPE = {ActionType.TAP: "element", ActionType.TYPE: "word", ActionType.SWIPE: "direction"}
CHOICE_KEYS = ("action_type", "element", "word", "direction")


def log_prob(logits: dict[str, jax.Array], choice: dict[str, jax.Array]) -> jax.Array:
    """Log-probability of complete actions; choice holds int arrays with the logits' leading shape."""
    a = choice["action_type"]
    total = _pick(jax.nn.log_softmax(logits["type"]), a)
    for kind, head in ARGUMENT_OF_TYPE.items():
        arg = _pick(jax.nn.log_softmax(logits[head]), choice[head])
        total = total + jnp.where(a == int(kind), arg, 0.0)
    return total


def entropy(logits: dict[str, jax.Array]) -> jax.Array:
    p_type = jax.nn.softmax(logits["type"])
    total = _entropy(logits["type"])
    for kind, head in ARGUMENT_OF_TYPE.items():
        total = total + p_type[..., int(kind)] * _entropy(logits[head])
    return total


def sample(key: jax.Array, logits: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], jax.Array]:
    """Draw complete actions; returns the choice indices and their log-probabilities."""
    keys = jax.random.split(key, 4)
    choice = {
        "action_type": jax.random.categorical(keys[0], logits["type"]),
        "element": jax.random.categorical(keys[1], logits["element"]),
        "word": jax.random.categorical(keys[2], logits["word"]),
        "direction": jax.random.categorical(keys[3], logits["direction"]),
    }
    choice = {k: v.astype(jnp.int32) for k, v in choice.items()}
    return choice, log_prob(logits, choice)


def mode(logits: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], jax.Array]:
    """The greedy action: the most likely type, then the most likely argument (for evaluation)."""
    choice = {
        "action_type": jnp.argmax(logits["type"], axis=-1),
        "element": jnp.argmax(logits["element"], axis=-1),
        "word": jnp.argmax(logits["word"], axis=-1),
        "direction": jnp.argmax(logits["direction"], axis=-1),
    }
    choice = {k: v.astype(jnp.int32) for k, v in choice.items()}
    return choice, log_prob(logits, choice)


def _pick(log_probs: jax.Array, index: jax.Array) -> jax.Array:
    return jnp.take_along_axis(log_probs, index[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _entropy(logits: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.where(logp > -1e8, jnp.exp(logp) * logp, 0.0), axis=-1)
