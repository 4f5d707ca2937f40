"""Checkpoints: a resumed run takes exactly the steps an uninterrupted one takes; bad checkpoints fail loudly."""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest

from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import PointerPolicy
from common.policies.pointer import featurize
from common.policies.pointer import network as model
from learner.batch import example_batch
from learner.losses import LOSSES, LossParams
from learner.replay.prioritized import PrioritizedReplay, oldest_version
from learner.training.checkpoint import Checkpointer, TrainState, rng_state, set_rng_state
from learner.training.train_step import make_optimizer, make_train_step
from tests.test_replay_file import MAX_STEPS, make_episodes

CFG = ModelConfig(vocab_size=256, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)


def _batch(rng: np.random.Generator) -> dict:
    batch = example_batch(
        featurize.feature_spec(CFG), 4, 3, choices=featurize.episode_spec(CFG, 0).choice_arrays()
    )
    batch.obs["instr_tokens"][:] = rng.integers(1, 256, batch.obs["instr_tokens"].shape)
    batch.obs["instr_mask"][:] = True
    batch.obs["elem_mask"][..., :3] = True
    batch.obs["elem_feats"][:] = rng.random(batch.obs["elem_feats"].shape)
    batch.length[:] = rng.integers(1, 4, 4)
    batch.reward[:] = rng.random((4, 3)) < 0.3
    batch.behavior_logp[:] = -rng.random((4, 3))
    batch.choice["action_type"][:] = rng.integers(0, 7, (4, 3))
    return batch


def _fresh():
    graphdef, params = model.create(CFG, 0)
    optimizer = make_optimizer(1e-2, 1.0)
    step = make_train_step(graphdef, optimizer, LOSSES["a2c"].rl, LossParams(), PointerPolicy(CFG).evaluate)
    return step, params, optimizer.init(params)


@pytest.mark.long
@pytest.mark.timeout(900)  # a compile of the train step: seconds idle, a minute on a busy machine
def test_resume_matches_an_uninterrupted_run(tmp_path):
    # One compiled step for all three runs (a pure function of its arguments; a restarted learner
    # compiles the same program): what differs between them is only where params and state come from.
    step, params, opt_state = _fresh()
    rng = np.random.default_rng(5)
    for _ in range(6):
        params, opt_state, *_ = step(params, opt_state, _batch(rng))
    want = params_to_flat(params)

    _, params, opt_state = _fresh()
    rng = np.random.default_rng(5)
    for _ in range(3):
        params, opt_state, *_ = step(params, opt_state, _batch(rng))
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(TrainState(params, opt_state, 3, 1, rng_state(rng)), {"model": CFG.to_dict()})
    ckpt.close()

    _, template_params, template_opt = _fresh()
    restored = Checkpointer(tmp_path / "ckpt").restore(
        TrainState(template_params, template_opt, 0, 0, rng_state(np.random.default_rng())), CFG.to_dict()
    )
    assert (restored.update, restored.policy_version) == (3, 1)
    rng = np.random.default_rng(0)
    set_rng_state(rng, restored.rng)
    params, opt_state = restored.params, restored.opt_state
    for _ in range(3):
        params, opt_state, *_ = step(params, opt_state, _batch(rng))
    got = params_to_flat(params)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_bad_checkpoints_are_refused(tmp_path):
    _, params, opt_state = _fresh()
    template = TrainState(params, opt_state, 0, 0, rng_state(np.random.default_rng()))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Checkpointer(tmp_path / "empty").restore(template, CFG.to_dict())
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(dataclasses.replace(template, update=1), {"model": CFG.to_dict()})
    ckpt.close()
    other = dataclasses.replace(CFG, d_model=32).to_dict()
    says = re.escape(f"written for another model (d_model: [{CFG.d_model}], this run uses [32]")
    with pytest.raises(ValueError, match=says):
        Checkpointer(tmp_path / "ckpt").restore(template, other)
    # Written before a model field existed: the field takes its default, and the checkpoint resumes.
    older = Checkpointer(tmp_path / "older")
    stored = {k: v for k, v in CFG.to_dict().items() if k != "train_text_encoder"}
    older.save(dataclasses.replace(template, update=1), {"model": stored})
    older.close()
    assert Checkpointer(tmp_path / "older").restore(template, CFG.to_dict()).update == 1
    # Same model config, but written when the featurizer made one instruction feature instead of three.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(featurize, "NUM_INSTRUCTION_FEATURES", 1)
        old = Checkpointer(tmp_path / "old_features")
        old.save(dataclasses.replace(template, update=1), {"model": CFG.to_dict()})
        old.close()
    with pytest.raises(
        ValueError, match=r"other observation features \(instr_feats: \[\[\[16, 1\], '<f4'\]\]"
    ):
        Checkpointer(tmp_path / "old_features").restore(template, CFG.to_dict())
    assert jax.tree.leaves(params)  # nothing was consumed or overwritten


def test_replay_files_follow_their_checkpoints(tmp_path):
    """One replay file per kept checkpoint (max_to_keep 3); None where an update has none."""
    model_cfg = ModelConfig()
    episodes = make_episodes(5)
    state = TrainState({"w": np.zeros(2, np.float32)}, {}, 0, 0, rng_state(np.random.default_rng()))
    ckpt = Checkpointer(tmp_path / "ckpt")
    replay = PrioritizedReplay(4, seed=1)
    for update, ep in enumerate(episodes, 1):
        replay.add(ep, oldest_version(ep))
        ckpt.save(dataclasses.replace(state, update=update), {"model": model_cfg.to_dict()})
        assert ckpt.save_replay(update, replay, model_cfg, MAX_STEPS) == ckpt.replay_path(update)
    (ckpt.replay_path(1).parent / "9.p1.replay").write_bytes(b"another process's file stays")
    ckpt.close()
    names = sorted(p.name for p in (tmp_path / "ckpt" / "replay").iterdir())
    assert names == ["3.p0.replay", "4.p0.replay", "5.p0.replay", "9.p1.replay"]

    reopened = Checkpointer(tmp_path / "ckpt")
    assert reopened.latest_update() == 5  # the replay folder does not confuse orbax
    restored = PrioritizedReplay(4, seed=1)
    assert reopened.restore_replay(5, restored, model_cfg) == 4
    assert restored.stats() == replay.stats()
    assert [ep.task for ep in restored.items()] == [ep.task for ep in replay.items()]
    assert reopened.restore_replay(2, PrioritizedReplay(4), model_cfg) is None
    assert reopened.restore_replay(5, PrioritizedReplay(4), model_cfg, process_index=3) is None
    reopened.replay_path(4).write_bytes(reopened.replay_path(4).read_bytes()[:-7])
    empty = PrioritizedReplay(4)
    with pytest.raises(ValueError, match=re.escape(str(reopened.replay_path(4)))):
        reopened.restore_replay(4, empty, model_cfg)
    assert len(empty) == 0
    reopened.close()


def test_a_checkpoint_a_killed_learner_left_without_its_ledger_is_skipped_then_replaced(tmp_path):
    """Save order is checkpoint, replay, ledger: a learner killed before the ledger leaves a checkpoint
    that is never resumed from; the run resumes from the one before and, reaching that update again,
    replaces it instead of failing on a step that already exists."""
    model_cfg = ModelConfig()
    state = TrainState({"w": np.zeros(2, np.float32)}, {}, 0, 0, rng_state(np.random.default_rng()))
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(dataclasses.replace(state, update=3), {"model": model_cfg.to_dict()})
    ckpt.save_replay(3, PrioritizedReplay(4), model_cfg, MAX_STEPS)
    ckpt.save_delivery(3, {"credit": 8, "streams": {}})
    ckpt.save(
        dataclasses.replace(state, update=6, params={"w": np.ones(2, np.float32)}),
        {"model": model_cfg.to_dict()},
    )
    ckpt.close()  # killed here: no replay, no ledger for update 6

    resumed = Checkpointer(tmp_path / "ckpt")
    assert resumed.latest_update() == 3
    assert resumed.restore(state, model_cfg.to_dict()).update == 3
    again = {"w": np.full(2, 7.0, np.float32)}
    resumed.save(dataclasses.replace(state, update=6, params=again), {"model": model_cfg.to_dict()})
    resumed.save_delivery(6, {"credit": 8, "streams": {}})
    resumed.close()
    reopened = Checkpointer(tmp_path / "ckpt")
    assert reopened.latest_update() == 6
    np.testing.assert_array_equal(reopened.restore(state, model_cfg.to_dict()).params["w"], again["w"])
    reopened.close()
    # Two learner processes: a checkpoint is complete once both wrote their ledger. Process 1 was killed
    # before its ledger of update 6: both resume from 3, never one from 6 and the other from 3.
    pair = Checkpointer(tmp_path / "ckpt", processes=2)
    pair.save_delivery(3, {"credit": 8, "streams": {}}, process_index=1)
    assert pair.latest_update() == 3
    pair.save_delivery(6, {"credit": 8, "streams": {}}, process_index=1)
    assert pair.latest_update() == 6
    pair.close()


def test_the_newest_complete_checkpoint_is_kept_past_max_to_keep(tmp_path):
    """Process 1 of two failed to write its files after checkpoint 3 (its disk full): three newer
    checkpoints, none complete, do not push 3 out of the kept three; it stays the one to resume from,
    its ledgers and replay files with it. Once a newer one is complete, 3 goes."""
    model_cfg = ModelConfig()
    state = TrainState({"w": np.zeros(2, np.float32)}, {}, 0, 0, rng_state(np.random.default_rng()))
    pair = Checkpointer(tmp_path / "ckpt", max_to_keep=3, processes=2)

    def save(update: int, ranks: tuple[int, ...]) -> None:
        pair.save(dataclasses.replace(state, update=update), {"model": model_cfg.to_dict()})
        pair.manager.wait_until_finished()
        for rank in ranks:
            pair.save_replay(update, PrioritizedReplay(4), model_cfg, MAX_STEPS, rank)
            pair.save_delivery(update, {"credit": 8, "streams": {}}, rank)

    save(3, (0, 1))
    for update in (6, 9, 12, 15):
        save(update, (0,))
    assert pair.updates() == [3, 9, 12, 15] and pair.latest_update() == 3
    assert pair.restore(state, model_cfg.to_dict()).update == 3
    assert pair.delivery_path(3, 1).is_file() and pair.replay_path(3, 1).is_file()
    save(18, (0, 1))
    save(21, (0, 1))
    assert pair.updates() == [15, 18, 21] and pair.latest_update() == 21
    pair.close()
