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
Only tokenizer work: seconds, no model.
"""

from __future__ import annotations

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
        grammar = self._plain_ids(
            lm_prompt.GRAMMAR_LINE.removeprefix("You operate an Android phone. ") + "\n"
        )
        return lm_prompt._frozen([*self.tokenizer.encode(before), *grammar]), self._plain_ids(after)


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


def run(quick: bool, budgets: tuple[int, ...] = (352, 256)) -> list[dict]:
    episodes = 60 if quick else 300
    rows = []
    for split in ("validation", "dev"):
        for budget in budgets:
            for layout in (BeforeBuilder, lm_prompt.PromptBuilder):
                rows.append(measure(layout, split, episodes, budget))
    return rows
