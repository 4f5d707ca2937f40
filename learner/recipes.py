"""Per-family defaults: the flags whose pointer-policy defaults do not suit another family.

A 135M-parameter decoder on a 2-core CPU trains about a hundred times slower per episode than the pointer
policy, so `--model.kind lm` starts from its own recipe (LM_RECIPE) for every flag the command line does
not set; a flag that is given always wins. `python -m learner --help` shows the pointer defaults; the
recipe is printed when it applies."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

SECONDS_PER_DEMO = 7.5
"""A demonstration's cost in three epochs of the lm warm-up on this 2-core machine: about 4 s in its first
(7-9 s per update of 2 while every row's frozen trunk is computed) and 1.75 s in each later one (3.5 s per
update read from the trunk cache), BENCHMARKS.md "LM warm-up: the recipe's learning rate"."""


def warmup_demos(time_limit: float) -> int:
    """The lm recipe's --warmup-demos for a run of `time_limit` seconds (0: none): as many demonstrations
    as three epochs over them fit in the warm-up's 70% of the run, in twenties, at least 100, plus the 20
    held back for validation. 15 minutes: 100 + 20 (two epochs and a half were measured); 60 minutes:
    340 + 20. More distinct demonstrations rather than more epochs over the same 100, because the
    validation loss over 100 rose in their third epoch (1.920 -> 2.114, BENCHMARKS.md "LM agent: the
    recipe's warm-up"). Measured at 60 minutes (BENCHMARKS.md "LM agent: 60 minutes"): 5.785 -> 1.249 ->
    0.909 -> 0.882 after epochs 1-3 of the 340, 0.817 at the warm-up's end (3.26 epochs); at 15 minutes
    the first-epoch batches of that run (each demonstration unseen) were at 1.89-1.94 nats per action
    after 81-123 updates, no better than two epochs and a half over 100, so 15 minutes keep 100."""
    fitting = 0.7 * time_limit / SECONDS_PER_DEMO
    return max(100, 20 * round(fitting / 20)) + 20


LM_RECIPE: dict[str, Any] = {
    "batch_size": 2,
    "max_steps": 10,
    "local.envs_per_actor": 4,
    "local.actors_after_warmup": True,
    "imitation.warmup_demos": lambda cfg: warmup_demos(cfg.time_limit),
    "imitation.validation_demos": 20,
    "imitation.warmup_noise": 0.0,
    "imitation.warmup_updates": 100_000,
    "imitation.warmup_share": 0.7,
    "imitation.warmup_patience": 2,
    "imitation.prefill_demos": False,
    "optimizer.learning_rate": 2e-3,
    "checkpoint_every": 10,
    "transport.actor_timeout": 120.0,
    "buffer.samples_per_insert": 1.0,
    "buffer.insert_slack": 2,
    "buffer.replay_capacity": 16,
    "local.local_actor_args": "--max-pending-episodes 2",
    "loss.actor_weighting": "binary_ratio",
}
"""The `lm` family's defaults, by field path in LearnerConfig, chosen for 2 CPU cores (BENCHMARKS.md
"LM agent" and "LM warm-up in epochs"). An update of 2 episodes of up to 10 steps over 352-token prompts
(the default --model.lm-prompt-tokens) takes about 7-9 s while its rows' frozen trunk is computed (a
demonstration's first epoch) and about 3.5 s once it is cached (issue 46), so a 15-minute run makes about
100 updates, not thousands.

The warm-up (issue 47): imitation is what a 15-minute run can teach, so it gets 70% of the time limit
(--warmup-share 0.7; --warmup-updates only bounds it; 0.5 at 60 minutes gave greedy train 0.220 against
0.7's 0.385, BENCHMARKS.md "LM agent: the insert side after the warm-up", and with the 16-episode replay
below 0.255 against 0.375, A-RIDE adding 0.020 in 81 updates where 0.7's added 0.155 in 30), in epochs over 100 demonstrations (more in longer
runs: warmup_demos above) with 20 more of
the same training templates held back (--validation-demos 20: their loss, rho and the critic's value gap
are printed before the warm-up, after each epoch and after it), ending early after 2 epochs without a new
lowest loss (--warmup-patience 2). 100, not the 200 of before: the first epoch pays every row's trunk,
later ones read it from the cache at half the cost, so 100 demonstrations give a 15-minute run two epochs
where 200 gave one; the loss fell 2.62 -> 2.13 nats per action from the first epoch to the second at 200.
Learning rate 2e-3 with LoRA on the top 8 blocks, chosen on this validation loss after one epoch of the
100 (50 updates): 2.32 nats per action at 2e-3, 2.67 at 6e-3, 5.60 before (the recipe's 5e-4 before it
reached 2.62 after one epoch of 200, 100 updates); on the top 4 blocks, 2.67 after one epoch and 2.44
after two (1.92 with 8), more than their faster updates make up. The oracle's demonstrations are
noiseless (its random actions are the pointer policy's). The local actors start when the warm-up ends (--actors-after-warmup): what they would act
before comes from the policy the warm-up replaces, and their processes took the warm-up's CPU.

Demonstrations stay out of the replay (--no-prefill-demos); after the warm-up they enter only imitation
updates (every 4th, --demo-update-every). Measured in the 15-minute run with them prefilled (BENCHMARKS.md
"LM agent: the recipe's warm-up"): when reinforcement learning started, the replay held the 100
demonstrations and no actor episode, 124 items after the run's 24 actor episodes, so about 80% of the rows
of its RL batches were demonstrations, at an actor weight of min(1, rho) with rho on held-back
demonstration steps 0.34: a third of the imitation gradient they already get at full weight, at the full
compute of a row, in place of the actors' episodes, the only data of the policy being trained.

An actor does not heartbeat during its batched act, which takes 15-30 s while two actors and the learner
share 2 cores: with the default 15 s the learner forgot actors in the middle of an act (refused as
`not_welcomed`, rejoined), hence 120 s. And the actors must not take the learner's cores: unthrottled, two
actors acting all the time left the learner one update in four minutes (three processes' XLA threads on
two cores). An episode costs an actor about 5 s of CPU and an update several, so actors collect only what
training uses: each episode is drawn about once (--samples-per-insert 1), at most one batch ahead
(--insert-slack 2; since 477fd1e also after the warm-up, whose imitation updates had kept it open), and an actor with 2 finished episodes waiting for credit stops stepping
(--max-pending-episodes 2). The actor's gradient weighs every token of a step by the step's truncated
ratio min(1, prod_k rho_k) (--actor-weighting binary_ratio; the pointer default, binary, has no ratio at
all): measured on a 15-minute run's replay, the step-level weight keeps an effective sample size of 0.99
at a lag of one version and 0.65 at 4-7, so it never discards half the data, and it is the weight the
critic's traces already use (BENCHMARKS.md, "LM agent: per-token or step-level importance weights").

The replay keeps the newest 16 episodes (--replay-capacity 16, about 8 updates of data), not the
default 2,048 (every episode): with every episode kept, a 60-minute run's reinforcement learning trained
on steps a median of 12 versions old, its actors' sampled success fell from 0.26 to 0.11, and it added
nothing over its warm-up (greedy train 0.215 -> 0.220). From the same supervised parameters, 30 minutes
of A-RIDE alone with 16 reached greedy train 0.145 against 0.090 (trained steps 5 versions old, not 12);
the recipe's 60-minute run with 16 went from 0.220 at its warm-up's end to 0.375 (BENCHMARKS.md "LM
agent: a recency bound")."""

RECIPES = {"lm": LM_RECIPE}


def flag(path: str) -> str:
    """The command-line flag of a field path ("imitation.warmup_demos" -> "--warmup-demos": the groups'
    prefixes are omitted; "model.lora_rank" keeps its prefix)."""
    group, _, name = path.rpartition(".")
    prefix = "model." if group == "model" else ""
    return f"--{prefix}{name.replace('_', '-')}"


def setting(path: str, value: Any) -> str:
    """How a recipe value reads as flags: "--batch-size 2", "--actors-after-warmup" (a boolean alone)."""
    name = flag(path)
    if isinstance(value, bool):
        return name if value else "--no-" + name.removeprefix("--")
    return f"{name} {value}"


def apply_recipe(cfg, args: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """`cfg` with its family's recipe for every field whose flag is not among `args`, and what it set. A
    recipe value that the given flags make invalid is left out (given --validation-demos 0, the recipe's
    --warmup-patience, which needs them): a flag that is given wins over what depends on it too."""
    recipe = RECIPES.get(cfg.model.kind, {})  # a callable value is a function of the config
    given = {arg.partition("=")[0] for arg in args if arg.startswith("--")}
    given |= {"--" + arg.removeprefix("--no-") for arg in given if arg.startswith("--no-")}  # booleans
    chosen = {}
    for path, value in recipe.items():
        if flag(path) in given:
            continue
        if callable(value):
            value = value(cfg)
        try:
            cfg = _replace(cfg, path.split("."), value)
        except ValueError:
            continue
        chosen[path] = value
    return cfg, chosen


def _replace(cfg, path: list[str], value):
    head, *rest = path
    return dataclasses.replace(cfg, **{head: _replace(getattr(cfg, head), rest, value) if rest else value})
