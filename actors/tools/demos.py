"""Warm-up demonstrations: the SimPhone oracle plays tasks, optionally with random actions mixed in,
and the episodes are written in the learner's own trajectory format (TRAJ episodes, docs/PROTOCOL.md).

The policy family writes each step (common/policies/family.py:RecordsDemos): its demonstrator turns the
oracle's action into the family's choice with the demonstrator's exact behavior log-prob (the pointer
policy's, optionally with uniformly random actions mixed in: common/policies/pointer/demos.py; the `lm`
family's, in its action grammar: common/policies/lm/demos.py). Episodes the family could not express (a
tap on an element beyond `max_elements`, text that is not made of instruction words) are skipped and
counted.

File layout: records, each a u32 little-endian byte count followed by one wire message (msgpack,
common/wire.py): first a header
    {"v": PROTOCOL_VERSION, "kind": "DEMOS", "model": ModelConfig, "max_steps": int, "tasks": str, "split": str}
then TRAJ messages (`actor_id` 0, `seq` 1, 2, ...) of up to 64 episodes each (common/trajectory_file.py;
files from before protocol version 3 hold version 2 TRAJ records, still read).
`load_demos` reads and validates them exactly as the learner validates an actor's TRAJ.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from actors.envs.task_check import task_problem
from common import protocol, trajectory_file, wire
from common.config import ModelConfig
from common.episode import EpisodeBuilder
from common.policies import make_policy
from common.policies.family import PolicyFamily, demos_problem

EPISODES_PER_MESSAGE = 64


@dataclass
class DemosConfig:
    """Write oracle demonstrations on SimPhone tasks for warm-up."""

    out: Path = Path("demos.msgpack")
    """File to write (overwritten)."""
    tasks: str = "general"
    """A shipped suite ("general", "webshop"), a task .json file, or a folder of them."""
    split: str = "train"
    """A split of actors/envs/simphone/tasks.py SPLITS."""
    episodes: int = 500
    """Episodes to write (skipped ones do not count)."""
    noise: float = 0.0
    """Share of steps where a uniformly random action replaces the oracle's."""
    max_steps: int = 20
    """Step limit per episode (use the learner's --max-steps for data it will accept)."""
    seed: int = 0
    """Seed of tasks, layouts and noise."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Featurizer sizes (must match the learner's model)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"--noise must be in [0, 1], got {self.noise}")
        for name in ("episodes", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


def record_episode(
    env: SimPhoneEnv, seed: int, noise: float, rng: np.random.Generator, policy: PolicyFamily
) -> dict | None:
    """One oracle episode (with `noise`, the family's random actions mixed in) as the family's wire
    fields (`protocol.episode_fields`), each step with the demonstrator's exact log-probability; None
    when the family could not express one of the oracle's actions."""
    obs, info = env.reset(seed=seed)
    demonstrator = policy.demonstrator(Oracle(env.task.plan), noise, rng)
    episode = EpisodeBuilder(info["task"])
    done = terminated = truncated = False
    while not done:
        features = policy.featurize(obs, episode.actions)
        step = demonstrator.choose(obs, features)
        if step is None:
            return None
        choice, logp = step
        action = policy.to_action(obs, choice)  # as the policy itself would perform it
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        episode.add(features, choice, logp, float(reward), 0, action)
    final = policy.featurize(obs, episode.actions)
    return episode.finish(
        final, bool(info["success"]), bool(truncated and not terminated), policy.episode_spec()
    )


def write_demos(cfg: DemosConfig, log=print) -> Counter:
    """Record `cfg.episodes` oracle episodes into `cfg.out` (the file layout of the module docstring).
    Exits with status 2 and one line on stderr when `--tasks` or `--split` names no usable task."""
    problem = task_problem("simphone", cfg.tasks, cfg.split)
    if problem is not None:  # one line for the user, no traceback (the learner runs this command too)
        print(f"python -m actors demos: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    policy = make_policy(cfg.model)
    family_problem = demos_problem(policy, cfg.noise)
    if family_problem is not None:
        raise ValueError(family_problem)
    env = SimPhoneEnv(SimPhoneConfig(tasks=cfg.tasks, split=cfg.split, max_steps=cfg.max_steps))
    rng = np.random.default_rng(cfg.seed)
    stats: Counter = Counter()
    batch: list[dict] = []
    start = last = time.monotonic()
    with cfg.out.open("wb") as f:
        header = protocol.message(
            "DEMOS", model=cfg.model.to_dict(), max_steps=cfg.max_steps, tasks=cfg.tasks, split=cfg.split
        )
        trajectory_file.write_record(f, wire.encode(header))
        seed = cfg.seed * 1_000_003
        while stats["written"] < cfg.episodes:
            seed += 1
            episode = record_episode(env, seed, cfg.noise, rng, policy)
            if episode is None:
                stats["skipped_inexpressible"] += 1
                continue
            batch.append(episode)
            stats["written"] += 1
            stats["successes"] += episode["success"]
            stats["steps"] += len(episode["reward"])
            if len(batch) == EPISODES_PER_MESSAGE or stats["written"] == cfg.episodes:
                stats["messages"] += 1
                msg = protocol.Traj(actor_id=0, seq=stats["messages"], episodes=batch)
                trajectory_file.write_record(f, wire.encode(msg.to_msg()))
                batch = []
            if time.monotonic() - last > 2:
                last = time.monotonic()
                log(
                    f"demos: {stats['written']}/{cfg.episodes} episodes, success {stats['successes'] / stats['written']:.2f}"
                )
    log(f"demos: wrote {stats['written']} episodes ({stats['steps']} steps, success rate "
        f"{stats['successes'] / max(stats['written'], 1):.2f}, skipped {stats['skipped_inexpressible']}) "
        f"to {cfg.out} in {time.monotonic() - start:.1f}s")  # fmt: skip
    return stats


load_demos = trajectory_file.load_episodes
