"""--model.train-text-encoder: the encoder inside the policy, trained by the step, and carried to actors.

On the tiny random checkpoint of tests/test_text_encoder.py: the in-graph (fine-tuned) encoding equals
the cached frozen one for the same weights; the step trains the encoder at its own learning-rate scale
without NaNs from empty label slots; and an actor's PolicyRunner re-encodes with each snapshot's encoder.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from actors.policy_runner import PolicyRunner
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import PointerPolicy
from common.policies.pointer import featurize, text_encoder
from common.policies.pointer import network as model
from learner.batch import example_batch
from learner.config import LearnerConfig, MeshConfig
from learner.losses import LOSSES, LossParams
from learner.training.mesh import make_mesh
from learner.training.train_step import make_optimizer, make_train_step, path_names
from learner.training.trainer import Trainer
from tests.test_bert_encoder import random_tensors, write_checkpoint
from tests.test_text_encoder import TINY, model_config, observation, write_tokenizer

OBS = [
    observation("Turn on the Wi-Fi", ["Wi-Fi", "Notes", ""]),
    observation("Make a note saying buy milk", ["Notes", "Clock"]),
]


@pytest.fixture
def tiny(tmp_path):
    """The tiny random encoder checkpoint and tokenizer of tests/test_text_encoder.py."""
    folder = write_checkpoint(tmp_path / "enc", TINY, random_tensors(TINY))
    write_tokenizer(folder)
    return folder


def features(cfg: ModelConfig) -> dict[str, np.ndarray]:
    return featurize.stack([featurize.featurize(o, cfg) for o in OBS])


def encoder_leaves(params) -> dict[str, np.ndarray]:
    return {k: v for k, v in params_to_flat(params).items() if k.startswith("text/encoder/")}


def test_the_policy_encodes_in_the_graph_exactly_as_the_cache_does(tiny):
    cfg = model_config(tiny, train_text_encoder=True)
    graphdef, params = model.create(cfg, 0)
    leaves = encoder_leaves(params)
    want = random_tensors(TINY)["embeddings.word_embeddings.weight"]
    np.testing.assert_array_equal(leaves["text/encoder/word_embeddings/embedding"], want)  # loaded
    x = features(cfg)
    in_graph, _ = model.apply(graphdef, params, x)
    cached, _ = model.apply(graphdef, params, text_encoder.TextEmbedder(cfg).add(x))
    for head in in_graph:
        np.testing.assert_allclose(in_graph[head], cached[head], rtol=1e-5, atol=1e-5)


def _batch(cfg: ModelConfig):
    spec = featurize.feature_spec(cfg)
    batch = example_batch(spec, 2, 2, choices=PointerPolicy(cfg).episode_spec().choice_arrays())
    x = features(cfg)
    obs = {k: np.broadcast_to(x[k][:, None], v.shape).copy() for k, v in batch.obs.items()}
    return batch._replace(obs=obs, length=np.full(2, 2, np.int32), weights=np.ones(2, np.float32))


def test_the_step_trains_the_encoder_at_its_own_rate(tiny):
    """One imitation step (Adam, so its first update is the same size for any gradient scale): the
    encoder moves by `scale` times what it moves at scale 1, the rest of the policy as at scale 1, for
    scale 0 (a frozen encoder inside the step) and 0.5. Scales 1 and 0 are passed to one step as traced
    arguments (one compile for both); 0.5 is folded into its step's program, as the learner builds it."""
    cfg = model_config(tiny, train_text_encoder=True)
    graphdef, params = model.create(cfg, 0)
    before = params_to_flat(params)
    optimizer = make_optimizer(1e-2, 1.0)
    imitation, policy = LOSSES["a2c"].imitation, PointerPolicy(cfg)

    def make_step(encoder_update_scale: float = 1.0):
        return make_train_step(
            graphdef,
            optimizer,
            imitation,
            LossParams(),
            policy.evaluate,
            encoder_update_scale=encoder_update_scale,
            scaled_param=policy.scaled_param,
        )

    def moved_by(step, **scales) -> dict[str, np.ndarray]:
        p = jax.tree.map(lambda a: a.copy(), params)
        new, _, metrics, _ = step(p, optimizer.init(p), _batch(cfg), **scales)
        assert int(metrics["skipped_nonfinite"]) == 0  # empty label slots give finite gradients
        return {k: v - before[k] for k, v in params_to_flat(new).items()}

    traced = make_step()
    moved = {s: moved_by(traced, scales=(1.0, s)) for s in (1.0, 0.0)}
    moved[0.5] = moved_by(make_step(0.5))  # the scale folded into the program, as the learner builds it
    encoder = [k for k in before if k.startswith("text/encoder/")]
    assert encoder and np.abs(moved[1.0]["text/encoder/layers/0/query/kernel"]).max() > 0
    for scale in (0.0, 0.5):
        for k in before:
            factor = scale if k in encoder else 1.0
            np.testing.assert_allclose(
                moved[scale][k], factor * moved[1.0][k], rtol=1e-4, atol=1e-7, err_msg=f"scale {scale}: {k}"
            )


def test_an_actor_encodes_with_each_snapshots_encoder(tiny):
    cfg = model_config(tiny, train_text_encoder=True)
    _, params = model.create(cfg, 0)
    flat = params_to_flat(params)
    runner = PolicyRunner(cfg, seed=0)
    runner.load(1, flat)
    x = features(cfg)
    first = runner.policy.inputs(x)["elem_text"]
    assert runner.policy.encoder.resets == 1
    changed = {**flat}
    name = "text/encoder/word_embeddings/embedding"
    changed[name] = flat[name] * -1.0
    runner.load(2, changed)
    assert runner.policy.encoder.resets == 2
    second = runner.policy.inputs(x)["elem_text"]
    assert not np.allclose(first, second)  # not the stale cache
    runner.act(x)  # the policy itself runs on the cached states


def test_frozen_encoders_stay_out_of_the_parameters(tiny):
    _, params = model.create(model_config(tiny), 0)
    assert not encoder_leaves(params) and model.text_encoder_state(params) is None
    key, scaled = jax.tree_util.DictKey, PointerPolicy(model_config(tiny)).scaled_param
    assert scaled(path_names((key("text"), key("encoder"), key("layers"))))
    assert not scaled(path_names((key("text"), key("words"), key("kernel"))))
    with pytest.raises(ValueError, match=r"--model\.train-text-encoder needs a text encoder"):
        ModelConfig(train_text_encoder=True)
    with pytest.raises(ValueError, match="must be true or false"):
        ModelConfig.from_dict({"train_text_encoder": 1})


def test_acted_observations_are_encoded_from_their_own_word_pieces(tiny):
    """With renamed words the step makes a second pass on the acted observations, and the fine-tuned
    encoder encodes their own WordPiece ids (renaming may have given the trained ones new pieces:
    common/policies/pointer/augment.py): at equal inputs the ratios are exactly 1, and with other pieces in the trained
    observations log pi is still the acted observations' own."""
    cfg = model_config(tiny, train_text_encoder=True)
    graphdef, params = model.create(cfg, 0)
    batch = _batch(cfg)
    policy = PointerPolicy(cfg)
    run = jax.jit(lambda p, b: policy.evaluate(graphdef, p, b.obs, b.choice, b.acted_obs))
    logp, _, _, ratio_logp = run(
        params, batch._replace(acted_obs={k: v.copy() for k, v in batch.obs.items()})
    )
    np.testing.assert_allclose(ratio_logp, logp, rtol=1e-6, atol=1e-6)
    renamed = {**batch.obs, "elem_wp": batch.obs["elem_wp"][::-1].copy()}  # the episodes' labels swapped
    trained_logp, _, _, acted_logp = run(params, batch._replace(obs=renamed, acted_obs=batch.obs))
    np.testing.assert_allclose(acted_logp, logp, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(trained_logp) - np.asarray(logp)).max() > 1e-4


def test_the_frozen_learner_encodes_renamed_and_acted_observations_apart(tiny):
    """Trainer.with_inputs (the frozen, cached path): when renaming gave the trained observations other
    WordPiece ids, the acted ones get the states of their own pieces; when it did not, they share the
    trained observations' states (imitation updates carry no acted observations at all)."""
    cfg = model_config(tiny)
    trainer = Trainer(
        dataclasses.replace(LearnerConfig(), model=cfg, batch_size=2), make_mesh(MeshConfig()), 0
    )
    batch = _batch(cfg)
    alone = trainer.with_inputs(batch).obs["elem_text"]
    shared = trainer.with_inputs(batch._replace(acted_obs=dict(batch.obs)))
    assert shared.acted_obs["elem_text"] is shared.obs["elem_text"]
    renamed = batch._replace(
        obs={**batch.obs, "elem_wp": batch.obs["elem_wp"][::-1].copy()}, acted_obs=batch.obs
    )
    apart = trainer.with_inputs(renamed)
    np.testing.assert_array_equal(apart.acted_obs["elem_text"], alone)  # the pieces the actor saw
    assert not np.allclose(apart.obs["elem_text"], alone)  # the renamed ones
