"""Per-family defaults: the flags whose pointer-policy defaults do not suit another family.

A 135M-parameter decoder on a 2-core CPU trains about a hundred times slower per episode than the pointer
policy, so `--model.kind lm` starts from its own recipe (LM_RECIPE) for every flag the command line does
not set; a flag that is given always wins. `python -m learner --help` shows the pointer defaults; the
recipe is printed when it applies."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

LM_RECIPE: dict[str, Any] = {
    "batch_size": 2,
    "max_steps": 10,
    "local.envs_per_actor": 4,
    "imitation.warmup_demos": 200,
    "imitation.warmup_noise": 0.0,
    "imitation.warmup_updates": 10,
    "optimizer.learning_rate": 5e-4,
    "checkpoint_every": 10,
    "transport.actor_timeout": 120.0,
    "buffer.samples_per_insert": 1.0,
    "buffer.insert_slack": 2,
    "local.local_actor_args": "--max-pending-episodes 2",
    "loss.actor_weighting": "binary_ratio",
}
"""The `lm` family's defaults, by field path in LearnerConfig, chosen for 2 CPU cores (BENCHMARKS.md
"LM agent"): an update of 2 episodes of up to 10 steps over 352-token prompts (the default
--model.lm-prompt-tokens) took 30-60 s padded (about half since the packed update, issue 46; not retuned
for it yet), so there are about 14 updates in 15 minutes, not thousands; 4
environments per actor keep a batched act near 3 s when the actor has the cores; the
oracle's demonstrations are noiseless (its random actions are the pointer policy's), and 10 warm-up updates
on them and 5e-4 with LoRA on the top blocks leave the budget to reinforcement learning. An actor does not
heartbeat during its batched act, which takes 15-30 s while two actors and the learner share 2 cores: with
the default 15 s the learner forgot actors in the middle of an act (refused as `not_welcomed`, rejoined),
hence 120 s. And the actors must not take the learner's cores: unthrottled, two actors acting all the time
left the learner one update in four minutes (three processes' XLA threads on two cores). An episode costs
an actor about 5 s of CPU and an update about 30 s, so actors collect only what training uses: each
episode is drawn about once (--samples-per-insert 1), at most one batch ahead (--insert-slack 2), and an
actor with 2 finished episodes waiting for credit stops stepping (--max-pending-episodes 2). The actor's
gradient weighs every token of a step by the step's truncated ratio min(1, prod_k rho_k) (--actor-weighting
binary_ratio; the pointer default, binary, has no ratio at all): measured on a 15-minute run's replay, the
step-level weight keeps an effective sample size of 0.99 at a lag of one version and 0.65 at 4-7, so it
never discards half the data, and it is the weight the critic's traces already use (BENCHMARKS.md, "LM agent:
per-token or step-level importance weights")."""

RECIPES = {"lm": LM_RECIPE}


def flag(path: str) -> str:
    """The command-line flag of a field path ("imitation.warmup_demos" -> "--warmup-demos": the groups'
    prefixes are omitted; "model.lora_rank" keeps its prefix)."""
    group, _, name = path.rpartition(".")
    prefix = "model." if group == "model" else ""
    return f"--{prefix}{name.replace('_', '-')}"


def apply_recipe(cfg, args: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """`cfg` with its family's recipe for every field whose flag is not among `args`, and what it set."""
    recipe = RECIPES.get(cfg.model.kind, {})
    given = {arg.partition("=")[0] for arg in args if arg.startswith("--")}
    chosen = {path: value for path, value in recipe.items() if flag(path) not in given}
    for path, value in chosen.items():
        cfg = _replace(cfg, path.split("."), value)
    return cfg, chosen


def _replace(cfg, path: list[str], value):
    head, *rest = path
    return dataclasses.replace(cfg, **{head: _replace(getattr(cfg, head), rest, value) if rest else value})
