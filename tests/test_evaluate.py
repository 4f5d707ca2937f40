"""`python -m learner eval`: greedy evaluation of a checkpoint on SimPhone tasks."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from common import model
from common.config import ModelConfig
from learner.checkpoint import Checkpointer, TrainState, rng_state
from learner.evaluate import EvalConfig, evaluate
from learner.train_step import make_optimizer
from tests.conftest import ROOT

CFG = ModelConfig(vocab_size=512, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)


def _checkpoint(directory):
    _, params = model.create(CFG, 0)
    opt_state = make_optimizer(1e-3, 1.0).init(params)
    ckpt = Checkpointer(directory)
    config = {"model": CFG.to_dict(), "learning_rate": 1e-3, "max_grad_norm": 1.0, "max_steps": 6}
    ckpt.save(TrainState(params, opt_state, 7, 3, rng_state(np.random.default_rng())), config)
    ckpt.close()


def test_eval_reports_every_episode_per_template(tmp_path):
    _checkpoint(tmp_path / "run" / "checkpoints")
    out = tmp_path / "eval.json"
    report = evaluate(
        EvalConfig(checkpoint=tmp_path / "run", tasks="webshop", episodes=24, num_envs=5, json=out)
    )
    assert report["episodes"] == 24 == sum(report["episodes_per_template"].values())
    assert report["update"] == 7 and report["policy_version"] == 3 and report["split"] == "test"
    assert all(name.startswith("shop.") for name in report["per_template"])
    assert 0.0 <= report["success"] <= 1.0
    assert json.loads(out.read_text()) == report
    # Greedy evaluation is deterministic: the same seed gives the same outcomes.
    again = evaluate(EvalConfig(checkpoint=tmp_path / "run", tasks="webshop", episodes=24, num_envs=5))
    assert again["per_template"] == report["per_template"]


def test_eval_without_a_checkpoint_says_so(tmp_path):
    cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(tmp_path / "nothing")]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no such checkpoint directory" in result.stderr
