"""An actor's Trajectory becomes a TRAJ episode the learner accepts, with every value in its place."""

from __future__ import annotations

import numpy as np
import pytest

from actors.envs.standin import StandInPhoneEnv
from actors.envs.standin_oracle import oracle_action
from common import featurize, protocol, wire
from common.config import ModelConfig
from common.types import PolicyChoice, Step, Trajectory

CFG = ModelConfig()


def _played(seed: int) -> Trajectory:
    """Play one stand-in episode with the oracle and record it the way the actor does."""
    env = StandInPhoneEnv()
    obs, _ = env.reset(seed=seed)
    traj = Trajectory(env.task.family)
    done = False
    while not done:
        action = oracle_action(env, obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        choice = PolicyChoice(int(action.type), element=len(traj.steps), word=1, direction=2)
        traj.steps.append(
            Step(featurize.featurize(obs, CFG), choice, -0.5 * len(traj.steps), reward, done, 3)
        )
        obs = next_obs
    traj.final_features = featurize.featurize(obs, CFG)
    traj.success, traj.truncated = bool(info["success"]), bool(truncated and not terminated)
    return traj


def test_trajectory_round_trips_through_traj_validation():
    trajs = [_played(seed) for seed in range(6)]
    msg = protocol.Traj(1, 1, [protocol.trajectory_fields(t) for t in trajs]).to_msg()
    got = protocol.validate_episodes(
        protocol.parse(wire.encode(msg)),
        featurize.episode_spec(CFG, text_vocab_size=0),
        8,
        newest_version=3,
    )
    for traj, ep in zip(trajs, got, strict=True):
        n = len(traj.steps)
        assert ep.task == traj.task and ep.success and not ep.truncated and ep.length == n
        np.testing.assert_array_equal(ep.steps["action_type"], [s.choice.action_type for s in traj.steps])
        np.testing.assert_array_equal(ep.steps["element"], np.arange(n))
        np.testing.assert_array_equal(ep.steps["behavior_logp"], -0.5 * np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(ep.steps["reward"], [0.0] * (n - 1) + [1.0])
        assert (ep.steps["policy_version"] == 3).all()
        for name in featurize.feature_spec(CFG):
            np.testing.assert_array_equal(ep.obs[name][:n], np.stack([s.features[name] for s in traj.steps]))
            np.testing.assert_array_equal(ep.obs[name][n], traj.final_features[name])


def test_unfinished_trajectory_is_refused():
    with pytest.raises(ValueError, match="final observation"):
        protocol.trajectory_fields(Trajectory("open_app"))
