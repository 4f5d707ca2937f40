"""The LM agent's network: a pretrained decoder plus a value head, and its two passes.

The actor's act (`prefill` over the prompts, then `decode`: KV-cached decoding of the action inside one
jitted while-loop) and `score_actions` (the learner's evaluate: one forward pass over prompt + action
tokens) read the same positions, masks and grammar state, so the log-probability the actor records for a
token and the one the learner computes for it differ only by float rounding: the ratio is 1 on-policy.

Per position the distribution is the model's logits, masked by the action grammar (when constrained), over
the temperature. A step's log-probability is the sum over its action tokens (the step is the unit of credit)
and its entropy the sum of each position's exact entropy along the taken path, an unbiased one-sample
estimate of the entropy of the whole action (the chain rule of entropy).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from common.backbones.decoder.llama import Decoder, KVCache, SharedPrefix, init_cache
from common.policies.lm import grammar


class ValueHead(nnx.Module):
    """V(s) from the decoder's final state at the prompt's last token; zero at the start."""

    def __init__(self, dim: int, param_type: type[nnx.Variable]):
        self.kernel = param_type(jnp.zeros((dim, 1), jnp.float32))
        self.bias = param_type(jnp.zeros((1,), jnp.float32))

    def __call__(self, state: jax.Array) -> jax.Array:
        return (state.astype(jnp.float32) @ self.kernel[...] + self.bias[...])[..., 0]


class LMAgent(nnx.Module):
    """The decoder and its value head (`param_type`: lora.HeadParam when the decoder has adapters, so the
    head trains and is published with them; nnx.Param for full fine-tuning)."""

    def __init__(self, decoder: Decoder, param_type: type[nnx.Variable]):
        self.decoder = decoder
        self.value = ValueHead(decoder.cfg.hidden_size, param_type)


class Decoding(NamedTuple):
    """How actions are decoded, the same on the actor and the learner."""

    tables: Any
    """The grammar's tables as jnp arrays (grammar.GrammarTables.to_jax()); used when `constrained`."""
    eos_id: int
    """The end-of-turn token that ends every action."""
    temperature: float
    constrained: bool
    action_tokens: int
    """The action's token budget (--model.lm-action-tokens): how many tokens the actor may write, the width
    it stores them in, and the budget the learner's rebuilt mask counts down from. The one source for both
    sides: `score_actions` refuses stored actions of another width."""


class Sampled(NamedTuple):
    tokens: jax.Array
    """[N, A] int32 action tokens, 0 after the action's end."""
    length: jax.Array
    """[N] int32 tokens generated (end-of-turn included)."""
    token_logp: jax.Array
    """[N, A] float32 log-prob of each token under the distribution it was drawn from, 0 after the end."""
    value: jax.Array
    """[N] float32 V(s)."""
    entropy: jax.Array
    """[N] float32 the sum of the per-position exact entropies along the sampled action."""
    forwards: jax.Array
    """[] int32 decoder passes after the prefill (one per token fed back): what decoding cost."""


def prompt_layout(length: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """(mask, positions) [..., width] of prompts left-padded to `width` with `length` real tokens."""
    mask = jnp.arange(width) >= (width - length)[..., None]
    return mask, jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0).astype(jnp.int32)


def _allowed(decoding: Decoding, state, n_elements, remaining, vocab: int) -> jax.Array:
    if not decoding.constrained:
        return jnp.ones((*state.shape, vocab), bool)
    return grammar.allowed(decoding.tables, state, n_elements, remaining)


def _distribution(logits: jax.Array, allowed: jax.Array, temperature: float):
    """(log-probs, per-position entropy) of the masked, tempered distribution (masked tokens: -inf)."""
    scaled = jnp.where(allowed, logits.astype(jnp.float32) / temperature, -jnp.inf)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    # exp(-inf) * -inf is NaN, and so would be its gradient through a where: masked entries read 0 instead.
    safe = jnp.where(allowed, logp, 0.0)
    entropy = -jnp.sum(jnp.where(allowed, jnp.exp(safe) * safe, 0.0), axis=-1)
    return logp, entropy


class Prefilled(NamedTuple):
    """The prompts read (`prefill`): what decoding the action starts from."""

    cache: Any
    """The decoder's KV cache over the prompts, with room for the action's tokens."""
    logits: jax.Array
    """[N, V] the logits at each prompt's last token (the first action token's distribution)."""
    value: jax.Array
    """[N] float32 V(s)."""


def prefill(
    agent: LMAgent, prompt: jax.Array, prompt_length: jax.Array, action_tokens: int, prefix=None
) -> Prefilled:
    """One pass of the decoder over prompts [N, W] (left-padded; `prompt_length` real tokens each): the KV
    cache, the first action token's logits and the value. The actor times it apart from `decode`.

    `prefix` [P]: ids every prompt starts with, cut from them (the family's `inputs`): computed once, as one
    row whose keys and values every row's cache then starts with, and the prompts' positions after it."""
    n, width = prompt.shape
    decoder = agent.decoder
    mask, positions = prompt_layout(prompt_length, width)
    dtype = decoder.embed_tokens.embedding[...].dtype
    p = 0 if prefix is None else prefix.shape[-1]
    cache = init_cache(decoder.cfg, 1 if p else n, p + width + action_tokens, dtype)
    if p:
        ones = jnp.ones((1, p), bool)
        _, cache = decoder.states(prefix[None], jnp.arange(p, dtype=jnp.int32)[None], ones, cache)
        cache = KVCache(
            *(jnp.broadcast_to(t, (t.shape[0], n, *t.shape[2:])) for t in (cache.keys, cache.values)),
            jnp.broadcast_to(cache.valid, (n, cache.valid.shape[1])),
            cache.end,
        )
    states, cache = decoder.states(prompt, positions + p, mask, cache)
    return Prefilled(cache, decoder.logits(states[:, -1:])[:, 0], agent.value(states[:, -1]))


def decode(
    agent: LMAgent,
    decoding: Decoding,
    prefilled: Prefilled,
    prompt_length: jax.Array,
    n_elements: jax.Array,
    key: jax.Array,
    greedy: bool,
) -> Sampled:
    """One action per prefilled prompt, sampled (or the mode when `greedy`) token by token with the KV
    cache until end-of-turn or the token budget, inside one jitted while-loop.

    The decoder runs only for tokens whose successor is sampled: a constrained action that reaches the
    grammar's ACCEPT state (only end-of-turn allowed) gets its end-of-turn written at once, with
    log-prob 0 and entropy 0 (what the learner's mask gives it), and the loop stops when every row is
    done, so neither the token before a forced end nor the end itself is fed back."""
    n, budget = prompt_length.shape[0], decoding.action_tokens
    decoder = agent.decoder
    zeros = jnp.zeros((n, budget))
    sampled = _Decoded(
        jnp.full((n,), grammar.START, jnp.int32), jnp.zeros(n, bool), zeros.astype(jnp.int32),
        zeros.astype(jnp.float32), jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32),
    )  # fmt: skip
    choose = functools.partial(_choose, decoding, n_elements, greedy, decoder.cfg.vocab_size)
    key, sub = jax.random.split(key)
    first = choose(0, prefilled.logits, sub, sampled)

    def step(carry):
        t, cache, key, sampled = carry
        last = sampled.tokens[:, t - 1]
        states, cache = decoder.states(
            last[:, None], (prompt_length + t - 1)[:, None], jnp.ones((n, 1), bool), cache
        )
        key, sub = jax.random.split(key)
        return t + 1, cache, key, choose(t, decoder.logits(states)[:, 0], sub, sampled)

    def more(carry):
        t, _, _, sampled = carry
        return (t < budget) & ~jnp.all(sampled.done)

    t, _, _, out = jax.lax.while_loop(more, step, (1, prefilled.cache, key, first))
    return Sampled(out.tokens, out.length, out.logps, prefilled.value, out.entropy, jnp.int32(t - 1))


class _Decoded(NamedTuple):
    """`decode`'s loop state per row besides the cache: the grammar state, whether the action ended, and
    what was written so far."""

    state: jax.Array
    done: jax.Array
    tokens: jax.Array
    logps: jax.Array
    entropy: jax.Array
    length: jax.Array


def _choose(
    decoding: Decoding, n_elements, greedy: bool, vocab: int, t, logits, key, d: _Decoded
) -> _Decoded:
    """Column `t` of every row not yet done, drawn from `logits` [N, V]; a row whose token completes the
    action (ACCEPT) also gets its forced end-of-turn at column t + 1 and is done. Rows done before keep
    what they wrote."""
    allowed = _allowed(decoding, d.state, n_elements, decoding.action_tokens - t, vocab)
    logp, ent = _distribution(logits, allowed, decoding.temperature)
    if greedy:
        token = jnp.argmax(logp, axis=-1).astype(jnp.int32)
    else:
        token = jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
    live = ~d.done
    tokens = d.tokens.at[:, t].set(jnp.where(live, token, d.tokens[:, t]))
    logps = d.logps.at[:, t].set(jnp.where(live, token_logp, d.logps[:, t]))
    entropy = d.entropy + jnp.where(live, ent, 0.0)
    length = d.length + live.astype(jnp.int32)
    done = d.done | (token == decoding.eos_id)
    state = d.state
    if decoding.constrained:
        state = jnp.where(live, grammar.advance(decoding.tables, state, token), state)
        forced = live & (state == grammar.ACCEPT)  # the grammar left room for the end (`allowed`'s budget)
        column = jnp.minimum(t + 1, decoding.action_tokens - 1)
        tokens = tokens.at[:, column].set(jnp.where(forced, decoding.eos_id, tokens[:, column]))
        length = length + forced.astype(jnp.int32)
        state = jnp.where(forced, grammar.END, state)
        done = done | forced
    return _Decoded(state, done, tokens, logps, entropy, length)


class Scored(NamedTuple):
    logp: jax.Array
    """[B, T] the sum of the action tokens' log-probs."""
    entropy: jax.Array
    """[B, T] the sum of the per-position exact entropies along the taken action."""
    values: jax.Array
    """[B, T + 1] V(s) of every observation."""
    token_logp: jax.Array
    """[B, T, A] each action token's log-prob (0 past the action's length)."""


def grammar_states(tables: Any, tokens: jax.Array) -> jax.Array:
    """[..., A] the grammar's state before each token of actions [..., A]."""
    start = jnp.full(tokens.shape[:-1], grammar.START, jnp.int32)

    def walk(state, token):
        return grammar.advance(tables, state, token), state

    _, before = jax.lax.scan(walk, start, jnp.moveaxis(tokens, -1, 0))
    return jnp.moveaxis(before, 0, -1)


@jax.jit
def actions_in_grammar(tables: Any, tokens: jax.Array, length: jax.Array, n_elements: jax.Array) -> jax.Array:
    """bool [N]: whether each stored action [N, A] of `length` tokens is one the constrained sampler can
    write on a prompt showing `n_elements`: every token allowed where it stands (grammar state, element
    count, token budget) and the last one ending the action (eos). The learner refuses any other at
    ingest: scoring it under the rebuilt mask would give a log-prob of -inf."""
    a = tokens.shape[-1]
    states = grammar_states(tables, tokens)
    ok = grammar.token_allowed(tables, states, n_elements[:, None], a - jnp.arange(a), tokens)
    valid = jnp.arange(a) < length[:, None]
    last = jnp.clip(length - 1, 0, a - 1)[:, None]
    before_last = jnp.take_along_axis(states, last, axis=-1)[:, 0]
    ends = (
        grammar.advance(tables, before_last, jnp.take_along_axis(tokens, last, axis=-1)[:, 0]) == grammar.END
    )
    return jnp.all(ok | ~valid, axis=-1) & (length >= 1) & ends


def score_actions(
    agent: LMAgent, decoding: Decoding, obs: dict[str, jax.Array], choice: dict[str, jax.Array]
) -> Scored:
    """The taken actions [B, T, A] scored on their prompts [B, T + 1, P] in one forward pass over prompt +
    action tokens, with the positions, masks and grammar states the actor used (`prefill`, `decode`).

    With the learner's packed rows (obs "train_rows" and "final_rows", common/policies/lm/packing.py) only
    the rows that matter are computed: each step row once, with its gradient, and each episode's final
    observation forward only (its value is a bootstrap target, read under stop_gradient by every loss);
    rows past an episode's end are not computed and read 0. Their real tokens come packed end to end
    (obs "steps_*" and "finals_*", common/policies/lm/segments.py), the preamble every prompt shares cut
    from them and run once (obs "prefix_ids"), and with the learner's cached trunk (obs "steps_trunk",
    "finals_trunk", "trunk_prefix": common/policies/lm/trunk.py) only the decoder's adapted blocks run.
    Without them every row is computed whole (the padded layout)."""
    tokens = choice["action_tokens"]
    if tokens.shape[-1] != decoding.action_tokens:
        raise ValueError(
            f"stored actions are {tokens.shape[-1]} tokens wide, but this model's budget "
            f"(--model.lm-action-tokens) is {decoding.action_tokens}: the rebuilt mask would not be the one "
            "the actor sampled from"
        )
    if "train_rows" in obs:
        return _score_packed(agent, decoding, obs, choice)
    return _score_padded(agent, decoding, obs, choice)


def _score_padded(agent: LMAgent, decoding: Decoding, obs, choice) -> Scored:
    """Every observation row: the steps' with their actions, the final one's with an empty action."""
    prompt = obs["prompt_ids"]
    b, rows = prompt.shape[:2]
    steps, a = rows - 1, decoding.action_tokens
    tokens, length = choice["action_tokens"], choice["action_length"]
    # The final observation takes no action: it gets an empty one, and only its value is read.
    all_tokens = jnp.concatenate([tokens, jnp.zeros((b, 1, a), tokens.dtype)], axis=1)
    all_length = jnp.concatenate([length, jnp.zeros((b, 1), length.dtype)], axis=1)
    n_elements = obs["n_elements"]
    flat = lambda x: x.reshape((b * rows, *x.shape[2:]))  # noqa: E731
    token_logp, entropy, values = _score_rows(
        agent, decoding, flat(prompt), flat(obs["prompt_length"]), flat(all_tokens), flat(all_length),
        flat(n_elements),
    )  # fmt: skip
    token_logp = token_logp.reshape(b, rows, a)[:, :steps]
    entropy = entropy.reshape(b, rows)[:, :steps]
    return Scored(token_logp.sum(-1), entropy, values.reshape(b, rows), token_logp)


def _score_packed(agent: LMAgent, decoding: Decoding, obs, choice) -> Scored:
    """The step rows named by obs["train_rows"] (flat b * (T + 1) + t indices, -1 for a bucket's unused
    slot), and the final rows of obs["final_rows"] forward only, as the sequences packed end to end that
    segments.packed_sequences laid out; scattered back to [B, T (+ 1)]."""
    if "steps_ids" not in obs:
        raise ValueError(
            "packed rows (train_rows) come with their packed sequences (segments.packed_sequences)"
        )
    tokens, length = jnp.asarray(choice["action_tokens"]), jnp.asarray(choice["action_length"])
    b, rows = obs["prompt_length"].shape
    steps, a = rows - 1, decoding.action_tokens
    train = jnp.asarray(obs["train_rows"]).reshape(-1)
    used = train >= 0
    at = jnp.where(used, train, 0)
    bi, ti = at // rows, jnp.minimum(at % rows, steps - 1)
    token_logp, entropy, values = _score_sequences(
        agent,
        decoding,
        obs,
        tokens[bi, ti],
        jnp.where(used, length[bi, ti], 0),
        jnp.asarray(obs["n_elements"])[bi, ti],
    )
    final = jnp.asarray(obs["final_rows"]).reshape(-1)
    final_values = jax.lax.stop_gradient(_sequence_values(agent, obs, "finals"))
    step_at = jnp.where(used, bi * steps + ti, b * steps)  # an unused slot scatters nowhere
    row_at = jnp.where(used, at, b * rows)

    def scatter(x, at_, size):
        return jnp.zeros((size, *x.shape[1:]), x.dtype).at[at_].set(x, mode="drop")

    token_logp = scatter(token_logp, step_at, b * steps).reshape(b, steps, a)
    all_values = scatter(values, row_at, b * rows).at[final].set(final_values)
    return Scored(
        token_logp.sum(-1),
        scatter(entropy, step_at, b * steps).reshape(b, steps),
        all_values.reshape(b, rows),
        token_logp,
    )


def _sequence_states(agent: LMAgent, obs, name: str) -> jax.Array:
    """[rows * width, hidden] the decoder's final states over obs's packed sequences `name` ("steps" or
    "finals": `{name}_ids`, `_positions`, `_segments` [B, r, width], and `_trunk` when cached), the shared
    prefix run once for all.

    The whole decoder runs with rematerialised blocks (the activations of every block of every row would
    not fit: 24 GB were not enough for the recipe before packing). On the cached trunk only the adapted
    blocks run, and they keep their activations: for the recipe's update (8 of 30 blocks, 2 episodes)
    that cost 0.17 GB more peak memory and made it 16% faster (benchmarks/lm_agent.py, BENCHMARKS.md)."""
    flat = lambda x: _flat_rows(obs[f"{name}_{x}"])  # noqa: E731
    numbered = flat("segments")
    trunk = flat("trunk") if f"{name}_trunk" in obs else None
    states, _ = agent.decoder.states(
        flat("ids"), flat("positions"), numbered > 0, remat=trunk is None, trunk=trunk,
        prefix=_shared_prefix(obs), segments=numbered,
    )  # fmt: skip
    return states.reshape(-1, states.shape[-1])


def _sequence_values(agent: LMAgent, obs, name: str) -> jax.Array:
    """V(s) at the last prompt token of each of obs's packed sequences `name` (`{name}_at`)."""
    return agent.value(_sequence_states(agent, obs, name)[jnp.asarray(obs[f"{name}_at"]).reshape(-1)])


def _score_sequences(agent: LMAgent, decoding: Decoding, obs, tokens, length, n_elements):
    """`_score_rows` on the step rows packed as sequences (obs "steps_*"): each slot's action token j is
    scored at the state before it, `steps_at` + j (the prompt's last token, then the action's)."""
    states = _sequence_states(agent, obs, "steps")
    last = jnp.asarray(obs["steps_at"]).reshape(-1)
    before = jnp.minimum(last[:, None] + jnp.arange(tokens.shape[-1]), states.shape[0] - 1)
    token_logp, entropy = _action_scores(agent, decoding, states[before], tokens, length, n_elements)
    return token_logp, entropy, agent.value(states[last])


def _shared_prefix(obs) -> SharedPrefix | None:
    """The preamble every packed prompt starts with and was cut from (segments.packed_sequences), or None.
    Stored once per episode ([B, P]: the batch axis keeps it shardable like every observation)."""
    if "prefix_ids" not in obs:
        return None
    trunk = obs.get("trunk_prefix")
    return SharedPrefix(jnp.asarray(obs["prefix_ids"])[0], None if trunk is None else jnp.asarray(trunk)[0])


def _flat_rows(x) -> jax.Array:
    """[B, slots, ...] -> [B * slots, ...]."""
    x = jnp.asarray(x)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _row_layout(prompt, prompt_length, tokens, length) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(token ids, positions, mask) [R, W + A] of rows of left-padded prompts [R, W] followed by actions
    [R, A] of `length` tokens: what `_score_rows` runs the decoder on."""
    a = tokens.shape[-1]
    # A row without a prompt (padding) gets one pad token: a row attending to nothing is NaN, and NaN * 0
    # is NaN in the masked losses.
    prompt_mask, _ = prompt_layout(jnp.maximum(prompt_length, 1), prompt.shape[-1])
    mask = jnp.concatenate([prompt_mask, jnp.arange(a) < length[..., None]], axis=-1)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0).astype(jnp.int32)
    return jnp.concatenate([prompt, tokens], axis=-1), positions, mask


def _score_rows(agent: LMAgent, decoding: Decoding, prompt, prompt_length, tokens, length, n_elements):
    """Rows of prompts [R, W] and actions [R, A] in one forward pass, the decoder's blocks rematerialised
    (the padded layout: every row of every episode): (token log-probs [R, A], 0 past each action's length;
    entropy [R], summed along the action; V(s) [R] at the prompt's last token)."""
    width, a = prompt.shape[-1], tokens.shape[-1]
    seq, positions, mask = _row_layout(prompt, prompt_length, tokens, length)
    states, _ = agent.decoder.states(seq, positions, mask, remat=True)
    token_logp, entropy = _action_scores(
        agent, decoding, states[:, width - 1 : width - 1 + a], tokens, length, n_elements
    )
    return token_logp, entropy, agent.value(states[:, width - 1])


def _action_scores(agent: LMAgent, decoding: Decoding, states, tokens, length, n_elements):
    """(token log-probs [R, A], 0 past each action's length; entropy [R], summed along the action) of
    actions [R, A] from `states` [R, A, hidden], the decoder's final state before each action token, with
    the grammar mask the actor sampled under."""
    a = tokens.shape[-1]
    logits = agent.decoder.logits(states)  # [R, A, V]
    valid = jnp.arange(a) < length[..., None]
    remaining = a - jnp.arange(a)
    if decoding.constrained:
        allowed = grammar.allowed(
            decoding.tables, grammar_states(decoding.tables, tokens), n_elements[..., None], remaining
        )
    else:
        allowed = jnp.ones((*tokens.shape, logits.shape[-1]), bool)
    allowed = allowed | ~valid[..., None]  # past the end: anything, so nothing is -inf there
    logp, entropy = _distribution(logits, allowed, decoding.temperature)
    token_logp = jnp.where(valid, jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0], 0.0)
    return token_logp, jnp.where(valid, entropy, 0.0).sum(-1)
