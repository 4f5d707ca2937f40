"""The policy seam: families come from the registry alone, and a second family (tests/tiny_policy.py,
which lives only under tests/) trains through a real learner and real actors over ZeroMQ.

The tiny family's log-probs and entropies are checked against a float64 numpy reference computed from
its parameters; the integration test runs `python -m learner --model.kind tests.tiny_policy:TinyPolicy`
with a local actor and checks what only a working seam gives: the learner validated and stored the
family's own episodes (its `button` choices, nothing refused), trained on them, and the actor acted with
the snapshots it published.
"""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

from actors.envs.standin import StandInPhoneEnv
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import PointerPolicy, make_policy
from tests.tiny_policy import KEYS, TinyPolicy

CFG = ModelConfig(kind="tests.tiny_policy:TinyPolicy", max_elements=6)


def test_families_come_from_the_registry_by_kind():
    assert isinstance(make_policy(ModelConfig()), PointerPolicy)
    assert isinstance(make_policy(CFG), TinyPolicy)
    with pytest.raises(ValueError, match=r"one of \['lm', 'pointer'\] or module:Class"):
        make_policy(ModelConfig(kind="transformer"))
    with pytest.raises(ValueError, match="cannot import"):
        make_policy(ModelConfig(kind="tests.no_such_module:Policy"))


def _reference(params, features: dict[str, np.ndarray], button: np.ndarray):
    """float64 numpy: the tiny family's log pi(button), entropy and value, written out from its definition."""
    flat = {k: np.asarray(v, np.float64) for k, v in params_to_flat(params).items()}
    steps = np.broadcast_to(features["steps"][:, None, :], (*features["mask"].shape, 1))
    rows = np.concatenate([features["elements"], steps], -1)
    mask = features["mask"]
    pooled = (rows * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1)
    element = rows @ flat["element/kernel"][:, 0] + flat["element/bias"][0]
    keys = pooled @ flat["keys/kernel"] + flat["keys/bias"]
    logits = np.concatenate([np.where(mask, element, -np.inf), keys], -1)
    logp = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    p = np.exp(logp)
    entropy = -np.sum(np.where(p > 0, p * logp, 0.0), -1)
    value = pooled @ flat["value/kernel"][:, 0] + flat["value/bias"][0]
    return logp[np.arange(len(button)), button], entropy, value


def test_the_tiny_family_acts_and_evaluates_with_exact_log_probs():
    policy = TinyPolicy(CFG)
    graphdef, params = policy.create(3)
    env = StandInPhoneEnv()
    observations = [env.reset(seed=s)[0] for s in range(5)]
    feats = [policy.featurize(o, history=[None] * s) for s, o in enumerate(observations)]
    batch = {k: np.stack([f[k] for f in feats]) for k in feats[0]}
    acted = jax.jit(policy.act, static_argnums=(0, 4))(graphdef, params, batch, jax.random.key(0), False)
    button = np.asarray(acted.choice["button"])
    assert all(button[i] >= CFG.max_elements or batch["mask"][i, button[i]] for i in range(5))  # valid
    logp, entropy, value = _reference(params, batch, button)
    np.testing.assert_allclose(acted.logp, logp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acted.entropy, entropy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acted.value, value, rtol=1e-5, atol=1e-6)
    # evaluate on [B, T + 1] observations: the same numbers for the steps, values for every observation
    obs = {k: np.stack([v, v], 1) for k, v in batch.items()}
    ev = policy.evaluate(graphdef, params, obs, {"button": button[:, None]}, None)
    np.testing.assert_allclose(np.asarray(ev.logp)[:, 0], logp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ev.values), np.stack([value, value], 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch["steps"][:, 0], np.arange(5) / 10, rtol=1e-6)  # it reads the history
    assert policy.episode_spec().choices == {"button": ("<i4", CFG.max_elements + len(KEYS))}


@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_second_family_trains_through_a_real_learner_and_actor(learner_process):
    learner = learner_process(
        *("--model.kind", "tests.tiny_policy:TinyPolicy", "--model.max-elements", "6"),
        *("--local-actors", "1", "--envs-per-actor", "4", "--max-updates", "12", "--batch-size", "8"),
        *("--publish-every", "2", "--log-every", "1", "--actor-timeout", "60", "--checkpoint-every", "6"),
    )
    assert learner.proc.wait(timeout=500) == 0, learner.log()
    final = learner.metrics()[-1]
    assert final["stopped"] == "update limit" and final["update"] == 12
    assert final["rejected"] == 0, final["rejected_by_reason"]
    assert final["episodes"] >= 8 and final["policy_version"] == 6
    assert np.isfinite(final["train/loss"]) and final["train/entropy"] > 0
    config = json.loads((learner.run_dir / "config.json").read_text())
    assert config["model"]["kind"] == "tests.tiny_policy:TinyPolicy"
    actor_log = (learner.run_dir / "actor-0.log").read_text()
    swaps = [int(n) for n in re.findall(r"'param_swaps': (\d+)", actor_log)]
    assert swaps and max(swaps) >= 2, actor_log
    assert "episodes_refused" not in actor_log
    assert (learner.run_dir / "checkpoints").is_dir()
