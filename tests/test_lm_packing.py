"""The lm family's packed update (common/policies/lm/packing.py): scoring only the rows that matter gives
the losses the same values as the padded layout, and the update the same loss, gradients and priorities.

Three episodes of real SimPhone screens on a tiny random decoder with SmolLM2's tokenizer and grammar
(tests/lm_backbone.py), actions sampled by the family's own constrained act: lengths 4, 2 and 1 of
--max-steps 4, the middle one terminal (its final row's value is never read), the others truncated (their
final rows are bootstrap targets, computed forward only). The packed layout is the learner's host step
without a trunk cache: the rows' real tokens end to end (segments.py), the preamble cut and run once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from common.backbones.decoder.lora import split_trained
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy
from common.policies.lm import packing
from common.protocol.episodes import episode_fields, pack_episodes, validate_packed
from learner.batch import collate
from learner.losses import LOSSES, LossParams
from learner.training.train_step import make_optimizer, make_train_step
from tests.lm_backbone import tiny_lm_folder

LENGTHS, TERMINAL, MAX_STEPS = (4, 2, 1), (False, True, False), 4
TOL = 2e-5


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    backbone = str(tiny_lm_folder(tmp_path_factory.mktemp("tiny-lm")))
    policy = make_policy(ModelConfig(kind="lm", backbone=backbone, lora_rank=4, lm_prompt_tokens=512))
    agent = nnx.merge(*policy.create(0))
    # The value head starts at zero; a random one makes the values' comparison mean something.
    kernel = agent.value.kernel
    kernel[...] = jnp.asarray(np.random.default_rng(1).standard_normal(kernel[...].shape) * 0.1, jnp.float32)
    graphdef, params = nnx.split(agent)
    return policy, graphdef, params


def _episode_screens(seed: int, n: int) -> list:
    """n + 1 consecutive screens of an oracle episode (the oracle's actions, not the sampled ones: the
    test needs real prompts, not a consistent story)."""
    env = SimPhoneEnv(SimPhoneConfig(tasks="general", split="train", max_steps=20))
    obs, _ = env.reset(seed=seed)
    oracle, screens = Oracle(env.task.plan), [obs]
    while len(screens) < n + 1:
        obs, _, done, cut, _ = env.step(oracle.act(obs))
        screens.append(obs)
        if done or cut:
            obs, _ = env.reset(seed=seed + 100)
            oracle = Oracle(env.task.plan)
    return screens


def _off_policy(logp: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """log mu 0.2-1 away from log pi, either side where it can be (log mu <= 0): no ratio sits at a
    clipping threshold, where float noise would flip it, and ratios fall on both sides of 1."""
    shift = rng.uniform(0.2, 1.0, logp.shape) * rng.choice([-1.0, 1.0], logp.shape)
    up = logp + shift
    return np.where(up <= -0.01, up, logp - np.abs(shift)).astype(np.float32)


@pytest.fixture(scope="module")
def batch(lm):
    return collated_batch(lm, LENGTHS, TERMINAL)


def collated_batch(lm, lengths, terminal):
    """Episodes of these lengths (terminal or truncated) as the learner collates them, each step's action
    sampled by the family's act on real screens, behaviour log-probs moved off-policy."""
    policy, graphdef, params = lm
    act = jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))
    rng, fields = np.random.default_rng(0), []
    for i, (n, done) in enumerate(zip(lengths, terminal, strict=True)):
        features = [policy.featurize(obs) for obs in _episode_screens(i, n)]
        stacked = {k: np.stack([f[k] for f in features]) for k in features[0]}
        acted = jax.device_get(act(params, policy.inputs(stacked), jax.random.key(i)))
        steps = {k: np.asarray(v)[:n] for k, v in acted.choice.items()}
        base = {
            "behavior_logp": _off_policy(np.asarray(acted.logp)[:n], rng),
            "reward": rng.standard_normal(n).astype(np.float32),
            "policy_version": np.zeros(n, np.int32),
        }
        spec = policy.episode_spec()
        fields.append(episode_fields(f"t{i}", False, not done, stacked, {**steps, **base}, spec=spec))
    episodes = validate_packed(pack_episodes(fields), policy.episode_spec(), MAX_STEPS, 0)
    return collate(episodes, MAX_STEPS)


def assert_same_update(lm, batch, imitation: bool, want_obs: dict, got_obs: dict) -> None:
    """One update (A-RIDE's, or its imitation update) from the same parameters on two layouts of `batch`:
    every metric (the loss parts and the gradient's norm), the replay priority terms and the updated
    parameters agree, and the update moved them."""
    policy, graphdef, params = lm
    loss = LOSSES["aride"].imitation if imitation else LOSSES["aride"].rl
    optimizer = make_optimizer(1e-2, 1.0)
    step = make_train_step(graphdef, optimizer, loss, LossParams(), policy.evaluate)
    results = []
    for obs in (want_obs, got_obs):
        p = jax.tree.map(lambda x: x.copy(), params)
        opt_state = optimizer.init(split_trained(p)[0])  # the adapters and the value head
        results.append(jax.device_get(step(p, opt_state, batch._replace(obs=obs))))
    (p_want, _, m_want, t_want), (p_got, _, m_got, t_got) = results
    assert set(m_want) == set(m_got) and int(m_want["skipped_nonfinite"]) == 0
    for k in m_want:
        np.testing.assert_allclose(m_got[k], m_want[k], rtol=1e-4, atol=TOL, err_msg=k)
    assert float(m_want["grad_norm"]) > 0
    if not imitation:  # ratios on both sides of the clip: both branches of the truncation compared
        assert 0 < float(m_want["rho_clipped_fraction"]) < 1
        for got, want in zip(t_got, t_want, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=TOL)
    flat_want, flat_got, before = params_to_flat(p_want), params_to_flat(p_got), params_to_flat(params)
    assert any(not np.array_equal(flat_want[k], before[k]) for k in before)
    for k in flat_want:
        np.testing.assert_allclose(flat_got[k], flat_want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def packed(lm, batch) -> dict:
    """The batch's observations as the learner's host step gives them without a trunk cache: the rows that
    matter (packing.pack), their real tokens end to end, the preamble cut (segments.packed_sequences)."""
    policy, graphdef, params = lm
    return policy.host_inputs(graphdef, 0)(batch.obs, None, batch.choice, params)[0]


def test_the_packed_rows_are_the_steps_and_the_final_observations(batch):
    packed = packing.pack(batch.obs)
    rows = MAX_STEPS + 1
    # 7 step rows over 3 episodes: T = 4 slots each (one shape whatever the lengths), 5 unused.
    want = [0, 1, 2, 3, rows, rows + 1, 2 * rows] + [-1] * 5
    np.testing.assert_array_equal(packed["train_rows"], np.reshape(want, (3, MAX_STEPS)))
    np.testing.assert_array_equal(packed["final_rows"], [4, rows + 2, 2 * rows + 1])


def test_scores_match_the_padded_layout_on_every_row_a_loss_reads(lm, batch):
    policy, graphdef, params = lm
    evaluate = jax.jit(lambda p, o, c: policy.evaluate(graphdef, p, o, c, None))
    padded = jax.device_get(evaluate(params, batch.obs, batch.choice))
    packed_obs = packed(lm, batch)
    assert "steps_ids" in packed_obs and "prefix_ids" in packed_obs
    packed_ = jax.device_get(evaluate(params, packed_obs, batch.choice))
    for b, (n, terminal) in enumerate(zip(LENGTHS, TERMINAL, strict=True)):
        for name in ("logp", "entropy", "ratio_logp"):
            np.testing.assert_allclose(getattr(packed_, name)[b, :n], getattr(padded, name)[b, :n], atol=TOL)
            assert not np.any(getattr(packed_, name)[b, n:])  # not computed: 0
        read = n if terminal else n + 1  # a terminal episode's final value is never read
        np.testing.assert_allclose(packed_.values[b, :read], padded.values[b, :read], atol=TOL)
    assert np.all(np.isfinite(padded.logp)) and np.abs(padded.values).max() > 0


@pytest.mark.parametrize("imitation", [False, True])
def test_the_update_has_the_same_loss_gradients_and_priorities(lm, batch, imitation):
    """One A-RIDE update (and one imitation update) from the same parameters on both layouts."""
    assert_same_update(lm, batch, imitation, batch.obs, packed(lm, batch))
