"""An episode built by the actor's EpisodeBuilder becomes a TRAJ episode the learner accepts, with every
value in its place."""

from __future__ import annotations

import numpy as np
import pytest

from actors.envs.standin import StandInPhoneEnv
from actors.envs.standin_oracle import oracle_action
from common import protocol, wire
from common.config import ModelConfig
from common.episode import EpisodeBuilder
from common.policies import PointerPolicy
from common.policies.pointer import featurize
from common.types import PolicyChoice

CFG = ModelConfig()
SPEC = PointerPolicy(CFG).episode_spec()


def _played(seed: int) -> tuple[dict, list[dict], dict]:
    """Play one stand-in episode with the oracle and record it the way the actor does; returns its wire
    fields, the features of each step, and the final features."""
    env = StandInPhoneEnv()
    obs, _ = env.reset(seed=seed)
    episode = EpisodeBuilder(env.task.family)
    seen = []
    done = False
    while not done:
        action = oracle_action(env, obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        choice = PolicyChoice(int(action.type), element=episode.length, word=1, direction=2).as_dict()
        seen.append(featurize.featurize(obs, CFG))
        episode.add(seen[-1], choice, -0.5 * episode.length, reward, 3, action)
        obs = next_obs
    final = featurize.featurize(obs, CFG)
    return episode.finish(final, bool(info["success"]), bool(truncated and not terminated), SPEC), seen, final


def test_episode_round_trips_through_traj_validation():
    played = [_played(seed) for seed in range(6)]
    msg = protocol.Traj(1, 1, [fields for fields, _, _ in played]).to_msg()
    got = protocol.validate_episodes(protocol.parse(wire.encode(msg)), SPEC, 8, newest_version=3)
    for (fields, seen, final), ep in zip(played, got, strict=True):
        n = len(seen)
        assert ep.task == fields["task"] and ep.success and not ep.truncated and ep.length == n
        np.testing.assert_array_equal(ep.steps["action_type"], fields["action_type"])
        np.testing.assert_array_equal(ep.steps["element"], np.arange(n))
        np.testing.assert_array_equal(ep.steps["behavior_logp"], -0.5 * np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(ep.steps["reward"], [0.0] * (n - 1) + [1.0])
        assert (ep.steps["policy_version"] == 3).all()
        assert ep.estimates == {}  # an oracle has no value or entropy estimates
        for name in featurize.feature_spec(CFG):
            np.testing.assert_array_equal(ep.obs[name][:n], np.stack([f[name] for f in seen]))
            np.testing.assert_array_equal(ep.obs[name][n], final[name])


def test_estimates_travel_only_when_every_step_has_them():
    obs = featurize.featurize(StandInPhoneEnv().reset(seed=0)[0], CFG)
    choice = PolicyChoice(0).as_dict()
    full, partial = EpisodeBuilder("t"), EpisodeBuilder("t")
    for t in range(3):
        full.add(obs, choice, -1.0, 0.0, 0, None, value=0.5 * t, entropy=1.0)
        partial.add(obs, choice, -1.0, 0.0, 0, None, value=None if t == 1 else 0.5, entropy=1.0)
    np.testing.assert_array_equal(full.finish(obs, False, True, SPEC)["value"], [0.0, 0.5, 1.0])
    assert "value" not in partial.finish(obs, False, True, SPEC)
    assert full.actions == [None, None, None] and full.length == 3


def test_an_episode_without_steps_is_refused():
    with pytest.raises(ValueError, match="at least one step"):
        EpisodeBuilder("open_app").finish({}, False, False)


def test_versions_are_capped_for_a_restarted_learner():
    obs = featurize.featurize(StandInPhoneEnv().reset(seed=0)[0], CFG)
    episode = EpisodeBuilder("t")
    for version in (3, 7, 9):
        episode.add(obs, PolicyChoice(0).as_dict(), -1.0, 0.0, version, None)
    assert episode.cap_versions(5) == 2
    np.testing.assert_array_equal(episode.finish(obs, False, True, SPEC)["policy_version"], [3, 5, 5])
