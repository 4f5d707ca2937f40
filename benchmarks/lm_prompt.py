"""`python -m benchmarks lm_prompt`: what the lm family's prompt costs and hides, before and after the compact
layout (issue 46, item 3), on oracle demonstrations of SimPhone's `general` suite as the demo writer records
them (`actors/tools/demos.py:record_episode`, --max-steps 10 as the lm recipe).

For each layout and split: prompt tokens per step (mean, max) at the budget and without one, the share of
screens whose prompt drops an element, and demo coverage: the share of oracle episodes the grammar can
write (an episode whose oracle taps an element its prompt does not show cannot be a demonstration). The
choice is made on the `validation` split (training templates set aside for development choices); `dev`
(the other training templates) is the check. The test split and held-out templates decide nothing here.

`before` is the layout this replaced, rebuilt here as the reference: the model's default system message,
the grammar as the user message's first line, `[i] text | desc: .. | hint: .. | id: .. | Class | flags`.
The token figures are tokenizer work (a minute). The full run (not `--quick`) also trains the packaged
SmolLM2 (the recipe's LoRA and learning rate) with the learner's imitation update in each layout on the
same `dev` seeds (the demonstrations each layout can write), and reports the imitation loss (nats per
action) on `validation` demonstrations both layouts can write, before and after: the issue's third criterion,
the same short supervised run for both.
"""

from __future__ import annotations

import time

import numpy as np

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.tools.demos import record_episode
from common.config import ModelConfig
from common.policies import make_policy
from common.policies.lm import prompt as lm_prompt
from common.types import UIElement

MAX_STEPS = 10
"""The lm recipe's --max-steps (learner/recipes.py)."""
WIDE = 4096
"""A budget no SimPhone prompt reaches: the uncut prompt's length."""


BEFORE_GRAMMAR = (
    'Answer with one action: tap(N) taps element [N], type("text") types into the focused field, '
    "swipe(up|down|left|right), back(), home(), enter(), done() when the task is complete."
)
"""The grammar line of the layout before, verbatim."""


class BeforeBuilder(lm_prompt.PromptBuilder):
    """The layout before issue 46's item 3: the model's own system message, the grammar line first in the
    user message, `[i] text | desc: .. | hint: .. | id: .. | Class | flags` element lines."""

    def element_line(self, index: int, el: UIElement) -> str:
        short_class = el.cls.rsplit(".", 1)[-1]
        flags = [*lm_prompt.flags(el), *(["editable"] if "EditText" in short_class else [])]
        labelled = [(k, lm_prompt.one_line(v)) for k, v in (("desc", el.content_desc), ("hint", el.hint))]
        parts = [
            lm_prompt.one_line(el.text),
            *(f"{k}: {v}" for k, v in labelled if v),
            f"id: {el.resource_id.split(':id/', 1)[-1]}" if el.resource_id else "",
            short_class,
            " ".join(flags),
        ]
        return f"[{index}] " + " | ".join(part for part in parts if part)

    def _template_parts(self) -> tuple[np.ndarray, np.ndarray]:
        before, after = self._split(self.tokenizer.chat_prompt(lm_prompt._SENTINEL))
        grammar = self._plain_ids(BEFORE_GRAMMAR + "\n")
        return lm_prompt._frozen([*self.tokenizer.encode(before), *grammar]), self._plain_ids(after)


LAYOUTS = (BeforeBuilder, lm_prompt.PromptBuilder)


class Recorded:
    """A builder that records every prompt it builds (its length, elements cut) and the same prompt's
    length without a budget."""

    def __init__(self, builder: lm_prompt.PromptBuilder, wide: lm_prompt.PromptBuilder):
        self.builder, self.wide = builder, wide
        self.lengths: list[int] = []
        self.wide_lengths: list[int] = []
        self.cut: list[int] = []

    def build(self, obs, history):
        prompt = self.builder.build(obs, history)
        self.lengths.append(len(prompt.ids))
        self.cut.append(prompt.cut_elements)
        self.wide_lengths.append(len(self.wide.build(obs, history).ids))
        return prompt


def measure(layout: type[lm_prompt.PromptBuilder], split: str, episodes: int, budget: int) -> dict:
    policy = make_policy(ModelConfig(kind="lm", lm_prompt_tokens=budget))
    tok, history = policy.tokenizer, policy.cfg.lm_history
    spy = Recorded(layout(tok, budget, history), layout(tok, WIDE, history, max_elements=WIDE))
    policy._prompts = spy  # the family builds every prompt through it
    env = SimPhoneEnv(SimPhoneConfig(tasks="general", split=split, max_steps=MAX_STEPS))
    rng = np.random.default_rng(0)
    written = sum(record_episode(env, seed, 0.0, rng, policy) is not None for seed in range(episodes))
    lengths, wide, cut = (np.asarray(x) for x in (spy.lengths, spy.wide_lengths, spy.cut))
    return {
        "layout": "before" if layout is BeforeBuilder else "compact",
        "split": split,
        "budget": budget,
        "episodes": episodes,
        "screens": len(lengths),
        "prompt_tokens_mean": float(lengths.mean()),
        "prompt_tokens_max": int(lengths.max()),
        "uncut_tokens_mean": float(wide.mean()),
        "uncut_tokens_max": int(wide.max()),
        "screens_cut": float(np.mean(cut > 0)),
        "demo_coverage": written / episodes,
    }


def _policy(layout: type[lm_prompt.PromptBuilder], cfg: ModelConfig):
    policy = make_policy(cfg)
    policy._prompts = layout(policy.tokenizer, cfg.lm_prompt_tokens, cfg.lm_history)
    return policy


def _demos(policy, split: str, seeds: range) -> dict[int, object]:
    """seed -> the validated episode the demo writer records for it, where the layout can write it."""
    from common.protocol.episodes import pack_episodes, validate_packed

    env = SimPhoneEnv(SimPhoneConfig(tasks="general", split=split, max_steps=MAX_STEPS))
    rng, out = np.random.default_rng(0), {}
    for seed in seeds:
        fields = record_episode(env, seed, 0.0, rng, policy)
        if fields is not None:
            out[seed] = validate_packed(pack_episodes([fields]), policy.episode_spec(), MAX_STEPS, 0)[0]
    return out


def imitation(
    layout: type[lm_prompt.PromptBuilder], cfg: ModelConfig, train: range, val_seeds: list[int], updates: int
) -> dict:
    """`updates` imitation updates of 2 demonstrations (the recipe's batch) from the `dev` seeds `train`,
    with the learner's step; the imitation loss on the `validation` seeds before and after."""
    import jax
    import jax.numpy as jnp

    from common.backbones.decoder.lora import split_trained
    from learner.batch import collate
    from learner.losses import LOSSES, LossParams
    from learner.training.train_step import make_optimizer, make_train_step

    policy = _policy(layout, cfg)
    graphdef, params = policy.create(0)
    demos = list(_demos(policy, "dev", train).values())
    val = list(_demos(policy, "validation", range(max(val_seeds) + 1)).items())
    val = [ep for seed, ep in val if seed in val_seeds]

    host = policy.host_inputs(graphdef, 0)  # the learner's host step, without a trunk cache

    def packed(episodes):
        batch = collate(episodes, MAX_STEPS)
        return batch._replace(obs=host(batch.obs, None, batch.choice, params)[0])

    logp = jax.jit(lambda params, obs, choice: policy.evaluate(graphdef, params, obs, choice, None).logp)

    def nll(params) -> float:
        total, steps = 0.0, 0
        for i in range(0, len(val), 2):
            batch = packed(val[i : i + 2])
            mask = np.arange(MAX_STEPS)[None] < batch.length[:, None]
            total -= float(jnp.sum(jnp.where(mask, logp(params, batch.obs, batch.choice), 0.0)))
            steps += int(mask.sum())
        return total / steps

    optimizer = make_optimizer(5e-4, 1.0)  # the lm recipe's learning rate (learner/recipes.py)
    step = make_train_step(graphdef, optimizer, LOSSES["aride"].imitation, LossParams(), policy.evaluate)
    before = nll(params)
    opt_state, rng, t0 = (
        optimizer.init(split_trained(params)[0]),
        np.random.default_rng(1),
        time.perf_counter(),
    )
    for _ in range(updates):
        chosen = rng.choice(len(demos), 2, replace=False)
        params, opt_state, _, _ = step(params, opt_state, packed([demos[i] for i in chosen]))
    jax.block_until_ready(params)
    return {
        "layout": "before" if layout is BeforeBuilder else "compact",
        "train_demos": len(demos),
        "val_demos": len(val),
        "updates": updates,
        "train_s": time.perf_counter() - t0,
        "val_nll_before": before,
        "val_nll_after": nll(params),
    }


def run(quick: bool, budgets: tuple[int, ...] = (352, 256), updates: int = 24) -> list[dict]:
    episodes = 60 if quick else 300
    rows = []
    for split in ("validation", "dev"):
        for budget in budgets:
            for layout in LAYOUTS:
                rows.append(measure(layout, split, episodes, budget))
    if not quick:
        cfg = ModelConfig(kind="lm")
        writable = [set(_demos(_policy(layout, cfg), "validation", range(40))) for layout in LAYOUTS]
        val_seeds = sorted(set.intersection(*writable))[:16]
        rows += [imitation(layout, cfg, range(200), val_seeds, updates) for layout in LAYOUTS]
    return rows
