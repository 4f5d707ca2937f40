"""The `lm` family (common/policies/lm): a decoder that writes its action as text, on a tiny random decoder
with SmolLM2's real tokenizer, chat template and grammar (tests/lm_backbone.py).

What must hold exactly: the actor's per-token behaviour log-probs (KV-cached decoding) and the learner's
(one forward pass over prompt + action, mask rebuilt from the stored tokens) agree, so the on-policy step
ratio is 1; without constraints they equal a float64 numpy reference; every constrained sample is a valid
action; an action that does not parse becomes a counted no-op; demonstrations round-trip; and a LoRA
snapshot carries only the adapters and the value head (and an actor's two-stage act equals the family's
one-call act).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from actors.policy_runner import PolicyRunner
from common.backbones.decoder.lora import split_trained
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy
from common.policies.lm import grammar, network
from common.protocol.episodes import episode_fields, pack_episodes, validate_packed
from common.protocol.messages import ProtocolError
from common.types import Action, ActionType
from tests.decoder_reference import random_hf_tensors, reference_logits
from tests.lm_backbone import tiny_lm_config, tiny_lm_folder


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return str(tiny_lm_folder(tmp_path_factory.mktemp("tiny-lm")))


def _screens(n: int, steps: int = 2) -> list:
    """SimPhone observations of training tasks: start screens and a few oracle steps in."""
    env = SimPhoneEnv(SimPhoneConfig(tasks="general", split="train", max_steps=20))
    out = []
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        oracle = Oracle(env.task.plan)
        out.append(obs)
        for _ in range(seed % (steps + 1)):
            obs, *_ = env.step(oracle.act(obs))
        out.append(obs)
    return out[:n]


def _act(policy, graphdef, params, observations, seed: int, greedy: bool = False):
    features = [policy.featurize(obs) for obs in observations]
    batch = {k: np.stack([f[k] for f in features]) for k in features[0]}
    acted = jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, greedy))(
        params, policy.inputs(batch), jax.random.key(seed)
    )
    return batch, jax.device_get(acted)


def _evaluate(policy, graphdef, params, batch, choice):
    """Each row as an episode of one step (its observation twice: the step's and the final one)."""
    obs = {k: np.stack([v, v], 1) for k, v in batch.items()}
    steps = {k: np.asarray(v)[:, None] for k, v in choice.items()}
    ev = jax.jit(lambda p, o, c: policy.evaluate(graphdef, p, o, c, None))(params, obs, steps)
    return jax.device_get(ev)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_actor_and_learner_log_probs_agree_so_on_policy_ratios_are_one(backbone, temperature):
    cfg = ModelConfig(kind="lm", backbone=backbone, lora_rank=4, lm_temperature=temperature)
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    observations = _screens(6)
    batch, acted = _act(policy, graphdef, params, observations, seed=3)
    ev = _evaluate(policy, graphdef, params, batch, acted.choice)
    np.testing.assert_allclose(np.exp(ev.logp[:, 0] - acted.logp), 1.0, atol=1e-5)
    np.testing.assert_allclose(acted.logp, acted.choice["token_logp"].sum(-1), atol=1e-6)
    np.testing.assert_allclose(ev.entropy[:, 0], acted.entropy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ev.values[:, 0], acted.value, atol=1e-5)
    assert (acted.choice["action_length"] >= 2).all()


@pytest.mark.parametrize("cached", [False, True])
def test_on_policy_ratios_are_one_through_the_learner_s_host_step(backbone, cached):
    """As the learner scores them: packed sequences with the preamble run once (segments.py), and with
    LoRA on the top block only, the bottom block's output from the trunk cache (trunk.py)."""
    cfg = ModelConfig(kind="lm", backbone=backbone, lora_rank=4, lora_layers=1)
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    batch, acted = _act(policy, graphdef, params, _screens(6), seed=5)
    obs = {k: np.stack([v, v], 1) for k, v in batch.items()}
    steps = {k: np.asarray(v)[:, None] for k, v in acted.choice.items()}
    packed, _ = policy.host_inputs(graphdef, 2**30 if cached else 0)(obs, None, steps, params)
    assert "steps_ids" in packed and "prefix_ids" in packed and ("steps_trunk" in packed) == cached
    ev = jax.device_get(
        jax.jit(lambda p, o, c: policy.evaluate(graphdef, p, o, c, None))(params, packed, steps)
    )
    np.testing.assert_allclose(np.exp(ev.logp[:, 0] - acted.logp), 1.0, atol=1e-5)
    np.testing.assert_allclose(ev.values[:, 0], acted.value, atol=1e-5)


def test_without_constraints_log_probs_equal_a_float64_reference(backbone):
    cfg = ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_constrained=False, lm_temperature=0.8)
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    batch, acted = _act(policy, graphdef, params, _screens(3), seed=5)
    ev = _evaluate(policy, graphdef, params, batch, acted.choice)
    config, tensors = tiny_lm_config(), random_hf_tensors(tiny_lm_config(), 0)
    for i in range(3):
        n, length = int(batch["prompt_length"][i]), int(acted.choice["action_length"][i])
        tokens = np.concatenate([batch["prompt_ids"][i, -n:], acted.choice["action_tokens"][i, :length]])
        logits = reference_logits(config, tensors, tokens[None], np.ones((1, len(tokens)), bool))[0]
        scaled = logits[n - 1 : n - 1 + length] / 0.8
        logp = scaled - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1, keepdims=True))
        logp -= scaled.max(-1, keepdims=True)
        want = logp[np.arange(length), tokens[n:]]
        np.testing.assert_allclose(acted.choice["token_logp"][i, :length], want, atol=2e-4)
        np.testing.assert_allclose(ev.logp[i, 0], want.sum(), atol=1e-3)


def test_every_constrained_sample_is_a_valid_action(backbone):
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_action_tokens=16))
    graphdef, params = policy.create(1)
    observations = _screens(16, steps=4)
    for seed in range(8):
        batch, acted = _act(policy, graphdef, params, observations, seed=seed)
        for i, obs in enumerate(observations):
            choice = {k: v[i] for k, v in acted.choice.items()}
            assert choice["action_tokens"][choice["action_length"] - 1] == policy.eos_id
            text = policy.action_text(choice)
            parsed = grammar.parse(text, int(batch["n_elements"][i]), policy.cfg.lm_max_text_chars)
            assert parsed is not None, text
            assert policy.to_action(obs, choice).type != ActionType.NOOP


def test_decoding_feeds_back_neither_a_forced_end_nor_the_token_before_it(backbone):
    """Constrained, every action ends in the grammar's ACCEPT state, whose only token is end-of-turn: it is
    written without a decoder pass (log-prob 0) and the loop stops once every row is done, so the passes
    after the prefill are the longest action's length minus 2 (a pass per token fed back, neither the
    completing token nor the end). Decoding that fed every token back made one pass per token."""
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_action_tokens=16))
    graphdef, params = policy.create(1)
    features = [policy.featurize(obs) for obs in _screens(8)]
    inputs = policy.inputs({k: np.stack([f[k] for f in features]) for k in features[0]})

    def act(p, i, key):
        agent = nnx.merge(graphdef, p)
        pre = network.prefill(agent, i["prompt_ids"], i["prompt_length"], policy.decoding.action_tokens)
        return network.decode(agent, policy.decoding, pre, i["prompt_length"], i["n_elements"], key, False)

    for seed in range(3):
        s = jax.device_get(jax.jit(act)(params, inputs, jax.random.key(seed)))
        assert int(s.forwards) == int(s.length.max()) - 2, (s.forwards, s.length)
        last = s.length - 1
        rows = np.arange(len(last))
        assert np.all(s.tokens[rows, last] == policy.eos_id)
        assert np.all(s.token_logp[rows, last] == 0.0)


def test_the_learner_refuses_stored_actions_of_another_token_budget(backbone):
    """The token budget has one source (Decoding.action_tokens, from --model.lm-action-tokens): the learner
    rebuilds the grammar's mask counting down from it, so actions stored at another width are refused
    rather than scored under a mask the actor never sampled from."""
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_action_tokens=16))
    graphdef, params = policy.create(1)
    batch, acted = _act(policy, graphdef, params, _screens(2), seed=0)
    narrow = {k: np.asarray(v)[:, :8] if np.ndim(v) == 2 else v for k, v in acted.choice.items()}
    with pytest.raises(ValueError, match=r"8 tokens wide.*budget.*is 16"):
        _evaluate(policy, graphdef, params, batch, narrow)


def test_an_action_that_does_not_parse_is_a_noop(backbone):
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_constrained=False))
    graphdef, params = policy.create(2)
    observations = _screens(8)
    _, acted = _act(policy, graphdef, params, observations, seed=0)
    actions = [
        policy.to_action(obs, {k: v[i] for k, v in acted.choice.items()})
        for i, obs in enumerate(observations)
    ]
    assert any(a.type == ActionType.NOOP for a in actions)  # a random decoder writes garbage unconstrained
    for action in actions:
        assert (action.type == ActionType.NOOP) == (action.note == "invalid")


def test_demonstrated_actions_round_trip_through_the_grammar(backbone):
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0))
    env = SimPhoneEnv(SimPhoneConfig(tasks="general", split="train", max_steps=20))
    check, kinds = policy.episode_spec().step_check, set()
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        oracle = Oracle(env.task.plan)
        for _ in range(12):
            action = oracle.act(obs)
            if action.type == ActionType.TYPE:
                action = dataclasses.replace(action, text=oracle.phrase)
            n = int(policy.featurize(obs)["n_elements"])
            choice = policy.demo_choice(obs, n, action)
            if choice is None:  # a tap on an element the prompt does not show
                assert action.type == ActionType.TAP
                break
            stored = {k: np.asarray(v)[None] for k, v in choice.items()}
            assert check(stored, {"n_elements": np.array([n])}).all()  # the learner takes demonstrations
            taken = policy.to_action(obs, choice)
            assert (taken.type, taken.text, taken.direction) == (action.type, action.text, action.direction)
            assert abs(taken.x - action.x) < 1e-9 and abs(taken.y - action.y) < 1e-9
            kinds.add(action.type)
            obs, _, terminated, truncated, _ = env.step(taken)
            if terminated or truncated:
                break
    assert {ActionType.TAP, ActionType.TYPE} <= kinds


def test_a_lora_snapshot_carries_only_adapters_and_the_value_head(backbone):
    cfg = ModelConfig(kind="lm", backbone=backbone, lora_rank=4)
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    params = jax.tree.map(lambda x: x + 0.01, params)  # trained adapters and head, B no longer zero
    trained, frozen = split_trained(params)
    flat = params_to_flat(trained)
    assert flat and all("lora" in name or name.startswith("value/") for name in flat), sorted(flat)[:5]
    assert {"value/kernel", "value/bias"} <= set(flat)
    assert sum(v.size for v in flat.values()) < 0.1 * sum(v.size for v in params_to_flat(params).values())
    runner = PolicyRunner(cfg, seed=0, greedy=True)
    runner.load(1, flat)
    observations = _screens(2)
    features = [runner.featurize(obs) for obs in observations]
    mine = runner.act({k: np.stack([f[k] for f in features]) for k in features[0]})
    # The runner acts in two jitted stages, timed apart for the actor's status line; `want` below is the
    # family's one-call act, so this also checks that the stages compose to it.
    assert set(runner.stage_seconds) == {"prefill", "decode"}
    assert all(s > 0 for s in runner.stage_seconds.values())
    # The runner's own base (from the checkpoint) + the snapshot's adapters = the learner's parameters,
    # except the +0.01 of the base above, which the snapshot must not and does not carry.
    want_params = nnx.merge_state(trained, split_trained(policy.create(0)[1])[1])
    _, want = _act(policy, graphdef, want_params, observations, seed=0, greedy=True)
    np.testing.assert_allclose(mine.logp, want.logp, atol=1e-5)
    assert not np.allclose(frozen_leaf(frozen), frozen_leaf(split_trained(policy.create(0)[1])[1]))


def _center(obs, index: int) -> tuple[float, float]:
    """Element `index`'s center on obs, as a tap's (x, y) fractions of the screen."""
    cx, cy = obs.elements[index].center
    return cx / obs.screen_size[0], cy / obs.screen_size[1]


def frozen_leaf(state) -> np.ndarray:
    return np.asarray(jax.tree.leaves(state)[0])


def test_the_learner_refuses_actions_outside_the_grammar(backbone):
    """Sampled and demonstrated actions pass the ingest check (EpisodeSpec.step_check); the same actions
    with one in-range token changed, the end-of-turn dropped, or a tap past the prompt's elements are
    refused with `bad_choice` (scoring them would give a log-prob of -inf)."""
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_action_tokens=16))
    graphdef, params = policy.create(3)
    observations = _screens(12, steps=3)
    batch, acted = _act(policy, graphdef, params, observations, seed=5)
    check = policy.episode_spec().step_check
    steps = {k: np.array(v) for k, v in acted.choice.items()}
    assert check(steps, batch).all()
    tokens, length = steps["action_tokens"], steps["action_length"]
    comma = policy.tokenizer.tokenizer.encode(",", add_special_tokens=False).ids[0]
    broken = tokens.copy()
    broken[:, 0] = comma  # no action starts with ","
    no_eos = length - 1
    assert not check({**steps, "action_tokens": broken}, batch).any()
    assert not check({**steps, "action_length": no_eos}, batch).any()
    tap = policy.demo_choice(observations[0], 2, Action(ActionType.TAP, *_center(observations[0], 1)))
    taps = {k: np.stack([np.asarray(v)] * 3) for k, v in tap.items()}
    # tap(1) needs two elements shown
    assert check(taps, {"n_elements": np.array([2, 1, 0])}).tolist() == [True, False, False]
    # Through the protocol: one TRAJ of these steps as two-step episodes, one token broken.
    episode = lambda i, toks: episode_fields(  # noqa: E731
        "t", False, True,
        {k: np.stack([batch[k][i]] * 3) for k in batch},
        {**{k: np.stack([v[i]] * 2) for k, v in steps.items()}, "action_tokens": toks,
         "behavior_logp": [-1.0, -1.0], "reward": [0.0, 0.0], "policy_version": [0, 0]},
        spec=policy.episode_spec(),
    )  # fmt: skip
    good = [episode(i, np.stack([tokens[i]] * 2)) for i in range(3)]
    spec = policy.episode_spec()
    assert len(validate_packed(pack_episodes(good), spec, 16, 0)) == 3
    bad = [*good[:2], episode(2, np.stack([tokens[2], broken[2]]))]
    with pytest.raises(ProtocolError) as refused:
        validate_packed(pack_episodes(bad), spec, 16, 0)
    assert refused.value.code == "bad_choice" and "episode 2" in str(refused.value)
    unconstrained = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=0, lm_constrained=False))
    assert unconstrained.episode_spec().step_check is None  # without a grammar every in-range token goes
