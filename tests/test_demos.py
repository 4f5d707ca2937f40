"""Oracle demonstrations: written in the learner's format, exact behavior log-probs, replayable."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.tools.demos import DemosConfig, load_demos, write_demos
from common.config import ModelConfig
from common.policies import PointerPolicy
from tests.conftest import ROOT

CFG = ModelConfig()


@pytest.mark.parametrize("tasks", ["general", "webshop"])
def test_noise_free_demos_all_succeed_and_load(tmp_path, tasks):
    out = tmp_path / "d.msgpack"
    stats = write_demos(DemosConfig(out=out, tasks=tasks, episodes=40, seed=1), log=lambda _: None)
    assert stats["written"] == 40 and stats["successes"] == 40 and stats["skipped_inexpressible"] == 0
    episodes = load_demos(out, CFG)
    assert len(episodes) == 40 and all(ep.success for ep in episodes)
    for ep in episodes:
        np.testing.assert_array_equal(ep.steps["behavior_logp"], 0.0)  # the oracle is deterministic
        assert ep.steps["reward"][-1] == 1.0 and ep.steps["reward"][:-1].sum() == 0


def test_noisy_demos_have_exact_mixture_log_probs(tmp_path):
    out = tmp_path / "d.msgpack"
    stats = write_demos(DemosConfig(out=out, episodes=60, noise=0.3, seed=2), log=lambda _: None)
    episodes = load_demos(out, CFG)
    logps = np.concatenate([ep.steps["behavior_logp"] for ep in episodes])
    assert (logps <= 0).all()
    # an oracle step has probability 0.7 + 0.3 * p_random; a random one (not the oracle's) 0.3 * p_random
    assert (logps > math.log(0.7)).sum() > 0 and (logps < math.log(0.3 / 7)).sum() > 0
    assert 0 < stats["successes"] < 60


def test_recorded_choices_replay_to_the_same_outcome(tmp_path):
    out = tmp_path / "d.msgpack"
    write_demos(DemosConfig(out=out, episodes=12, seed=3), log=lambda _: None)
    episodes = load_demos(out, CFG)
    env = SimPhoneEnv(SimPhoneConfig(max_steps=20))
    seed = 3 * 1_000_003
    for ep in episodes:
        seed += 1
        obs, _ = env.reset(seed=seed)
        for t in range(ep.length):
            choice = {k: int(ep.steps[k][t]) for k in ("action_type", "element", "word", "direction")}
            obs, reward, terminated, _, info = env.step(PointerPolicy(CFG).to_action(obs, choice))
        assert info["success"] and reward == 1.0 and terminated


def test_demos_file_checks(tmp_path):
    out = tmp_path / "d.msgpack"
    write_demos(DemosConfig(out=out, episodes=3), log=lambda _: None)
    with pytest.raises(ValueError, match="recorded for model"):
        load_demos(out, ModelConfig(d_model=32))
    cut = tmp_path / "cut.msgpack"
    cut.write_bytes(out.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        load_demos(cut, CFG)
    with pytest.raises(ValueError, match="noise"):
        write_demos(DemosConfig(out=out, noise=1.5), log=lambda _: None)


def test_demos_command(tmp_path):
    out = tmp_path / "cli.msgpack"
    cmd = [
        sys.executable,
        "-m",
        "actors",
        "demos",
        "--tasks",
        "webshop",
        "--episodes",
        "5",
        "--out",
        str(out),
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote 5 episodes" in result.stdout and len(load_demos(out, CFG)) == 5
