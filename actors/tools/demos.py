"""Warm-up demonstrations: the SimPhone oracle plays tasks, optionally with random actions mixed in,
and the episodes are written in the learner's own trajectory format (TRAJ episodes, docs/PROTOCOL.md).

Every recorded step is something the default policy can do: a tap is the index of the tapped element,
a typed phrase becomes one `type` per instruction word (SimPhone spaces them), so the behavior
log-prob of each step is exact under the behavior policy "oracle with probability 1 - noise, else a
uniformly random action of the policy's action space". Episodes the policy could not express (a tap
on an element beyond `max_elements`, text that is not made of instruction words) are skipped and
counted. For the `lm` family (`--model.kind lm`) the oracle's actions are written in its grammar instead
(actors/tools/lm_demos.py).

File layout: records, each a u32 little-endian byte count followed by one wire message (msgpack,
common/wire.py): first a header
    {"v": PROTOCOL_VERSION, "kind": "DEMOS", "model": ModelConfig, "max_steps": int, "tasks": str, "split": str}
then TRAJ messages (`actor_id` 0, `seq` 1, 2, ...) of up to 64 episodes each (common/trajectory_file.py;
files from before protocol version 3 hold version 2 TRAJ records, still read).
`load_demos` reads and validates them exactly as the learner validates an actor's TRAJ.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from actors.tools.check_args import task_problem
from actors.tools.lm_demos import record_lm_episode
from common import protocol, trajectory_file, wire
from common.config import ModelConfig
from common.episode import EpisodeBuilder
from common.policies import PointerPolicy, make_policy
from common.policies.pointer import featurize
from common.types import (
    NUM_ACTION_TYPES,
    NUM_SWIPE_DIRECTIONS,
    Action,
    ActionType,
    Observation,
    PolicyChoice,
)

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
        if self.noise and self.model.kind != "pointer":
            raise ValueError(f"--noise needs the pointer family (its random actions); got {self.model.kind}")
        for name in ("episodes", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


class Inexpressible(Exception):
    """The oracle did something the policy's action space cannot represent."""


def _choices(obs: Observation, action: Action, cfg: ModelConfig, phrase: str = "") -> list[PolicyChoice]:
    """The policy choices that perform `action` (several for a phrase typed word by word). With spans
    (ModelConfig.span_words > 1) and the rest of the oracle's phrase (`phrase`, starting with the word it
    types) found as consecutive instruction words, the phrase in spans of up to span_words words."""
    kind = int(action.type)
    if action.type == ActionType.TAP:
        point = (round(action.x * obs.screen_size[0]), round(action.y * obs.screen_size[1]))
        for i, el in enumerate(obs.elements[: cfg.max_elements]):
            if el.center == point:
                return [PolicyChoice(kind, element=i)]
        raise Inexpressible("tap target beyond max_elements")
    if action.type == ActionType.TYPE:
        words = featurize.instruction_words(obs.instruction, cfg)
        spans = _phrase_spans(words, phrase.split(), action.text, cfg)
        if spans:
            return [PolicyChoice(kind, word=featurize.span_choice(first, n, cfg)) for first, n in spans]
        out = []
        for w in action.text.split():
            if w not in words:
                raise Inexpressible(f"typed word {w!r} is not an instruction word")
            out.append(PolicyChoice(kind, word=featurize.span_choice(words.index(w), 1, cfg)))
        return out
    if action.type == ActionType.SWIPE:
        return [PolicyChoice(kind, direction=int(action.direction))]
    return [PolicyChoice(kind)]


def _phrase_spans(words: list[str], phrase: list[str], typed: str, cfg: ModelConfig) -> list[tuple[int, int]]:
    """(first word, count) spans of at most span_words that type `phrase` (which starts with `typed`),
    where it stands as consecutive instruction words; [] without spans or when it does not."""
    if cfg.span_words == 1 or not phrase or phrase[0] != typed:
        return []
    n = len(phrase)
    first = next((i for i in range(len(words) - n + 1) if words[i : i + n] == phrase), None)
    if first is None:
        return []
    return [(i, min(cfg.span_words, first + n - i)) for i in range(first, first + n, cfg.span_words)]


def _random_choice(rng: np.random.Generator, n_elements: int, n_words: int, cfg: ModelConfig) -> PolicyChoice:
    """A uniformly random action of the policy's action space: type, then its argument (a typed-text
    choice uniform over the spans inside the instruction)."""
    spans = [
        featurize.span_choice(i, k, cfg)
        for i in range(n_words)
        for k in range(1, min(cfg.span_words, n_words - i) + 1)
    ]
    kind, element = int(rng.integers(NUM_ACTION_TYPES)), int(rng.integers(max(n_elements, 1)))
    word = int(rng.integers(max(len(spans), 1)))  # one draw either way: the same stream as word-by-word
    direction = int(rng.integers(NUM_SWIPE_DIRECTIONS))
    return PolicyChoice(kind, element=element, word=spans[word] if spans else 0, direction=direction)


def _random_prob(c: PolicyChoice, n_elements: int, n_words: int, cfg: ModelConfig) -> float:
    """Probability of choice `c` under the uniform random action of the policy's action space."""
    p = 1.0 / NUM_ACTION_TYPES
    if c.action_type == ActionType.TAP:
        p /= max(n_elements, 1)
    elif c.action_type == ActionType.TYPE:
        p /= max(featurize.valid_spans(n_words, cfg), 1)
    elif c.action_type == ActionType.SWIPE:
        p /= NUM_SWIPE_DIRECTIONS
    return p


def _same(a: PolicyChoice, b: PolicyChoice) -> bool:
    """Two choices that are the same complete action (unused arguments do not matter)."""
    if a.action_type != b.action_type:
        return False
    return {
        ActionType.TAP: a.element == b.element,
        ActionType.TYPE: a.word == b.word,
        ActionType.SWIPE: a.direction == b.direction,
    }.get(ActionType(a.action_type), True)


def record_episode(
    env: SimPhoneEnv, seed: int, noise: float, rng: np.random.Generator, cfg: ModelConfig
) -> dict:
    """One oracle episode (with `noise`, its random actions mixed in) as the pointer policy's wire
    fields (`protocol.episode_fields`), each step with the demonstrator's exact log-probability."""
    obs, info = env.reset(seed=seed)
    oracle = Oracle(env.task.plan)
    policy = PointerPolicy(cfg)
    episode = EpisodeBuilder(info["task"])
    pending: list[PolicyChoice] = []
    done = False
    while not done:
        n_el = min(len(obs.elements), cfg.max_elements)
        n_words = len(featurize.instruction_words(obs.instruction, cfg))
        if not pending:
            pending = _choices(obs, oracle.act(obs), cfg, oracle.phrase)
        expert = pending[0]
        if rng.random() < noise:
            choice = _random_choice(rng, n_el, n_words, cfg)
            if not _same(choice, expert):
                oracle.undo()  # its action was not taken: it re-plans from whatever the random one did
            pending = []
        else:
            choice = pending.pop(0)
        p = (1 - noise) * _same(choice, expert) + noise * _random_prob(choice, n_el, n_words, cfg)
        features = policy.featurize(obs, episode.actions)
        action = policy.to_action(obs, dataclasses.asdict(choice))
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        episode.add(features, dataclasses.asdict(choice), math.log(p), float(reward), 0, action)
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
    env = SimPhoneEnv(SimPhoneConfig(tasks=cfg.tasks, split=cfg.split, max_steps=cfg.max_steps))
    rng = np.random.default_rng(cfg.seed)
    lm = make_policy(cfg.model) if cfg.model.kind == "lm" else None
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
            try:
                episode = (
                    record_episode(env, seed, cfg.noise, rng, cfg.model)
                    if lm is None
                    else record_lm_episode(env, seed, lm)
                )
            except Inexpressible:
                episode = None
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
