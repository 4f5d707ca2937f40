"""Warm-up demonstrations for the `lm` family: the SimPhone oracle's actions written in the action
grammar (a phrase typed at once, as `type("...")`), as token ids with the end-of-turn token, on the prompts
the family builds. The demonstrator is deterministic (--noise 0), so every step's behaviour log-prob is 0
(log 1); the learner imitates the tokens (their log-likelihood) and replays them like any episode."""

from __future__ import annotations

from actors.envs.simphone.env import SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from common.episode import EpisodeBuilder
from common.types import Action, ActionType


def record_lm_episode(env: SimPhoneEnv, seed: int, policy) -> dict | None:
    """One oracle episode as the `lm` family's wire fields (`policy`: an LMPolicy); None when the grammar
    cannot write one of its actions (a tap on an element the prompt does not show, text too long)."""
    obs, info = env.reset(seed=seed)
    oracle = Oracle(env.task.plan)
    episode = EpisodeBuilder(info["task"])
    done = terminated = truncated = False
    while not done:
        action = oracle.act(obs)
        if action.type == ActionType.TYPE:
            action = Action(ActionType.TYPE, text=oracle.phrase)
        features = policy.featurize(obs, episode.actions)
        choice = policy.demo_choice(obs, int(features["n_elements"]), action)
        if choice is None:
            return None
        taken = policy.to_action(obs, choice)  # as the policy itself would perform it
        obs, reward, terminated, truncated, info = env.step(taken)
        done = terminated or truncated
        episode.add(features, choice, 0.0, float(reward), 0, taken)
    final = policy.featurize(obs, episode.actions)
    return episode.finish(
        final, bool(info["success"]), bool(truncated and not terminated), policy.episode_spec()
    )
