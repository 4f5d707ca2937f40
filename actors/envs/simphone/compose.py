"""Composed training tasks (issue 34): "A and B", "A, then B" from two training templates whose success
predicates are independent, so that a policy learns to carry on after a subgoal holds (no single-template
task ever continues once its predicate holds).

The generator is general: it reads only the templates of the split it composes (train or dev, never a
held-out template), joins their instructions with a connective from a fixed, generic set, merges their
set-ups, requires both predicates at once, concatenates the oracle's plans and adds their step limits.
Two predicates are independent when neither reads the screen or the open app (a final-screen condition
cannot hold together with another app's) and the state keys they read (`settings.wifi`, `clock.alarms`:
the first two parts of each path) are disjoint, and neither set-up writes a key the other reads.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from actors.envs.simphone import tasks as task_lib
from actors.envs.simphone.expr import compile_predicate

CONNECTIVES = ("{a} and {b}", "{a}, then {b}", "{a} and then {b}", "{a}. Then {b}", "First {a}, then {b}")
"""How two instructions are joined; {a} and {b} are the instructions (lower-cased first letter where the
sentence goes on)."""
SPLITS = ("train", "dev")
"""The splits that compose: training templates only."""
ATTEMPTS = 32
"""Draws of a second template before a composition gives up for this episode (and a plain task is used)."""
SCREEN_ROOTS = frozenset({"app", "screen"})


def _keys(paths) -> set[str]:
    """State keys of paths: their first two dotted parts, list indexing dropped (`clock.alarms[0].time`
    -> `clock.alarms`)."""
    return {".".join(re.sub(r"\[.*?\]", "", p).split(".")[:2]) for p in paths}


def independent(a: task_lib.Task, b: task_lib.Task) -> bool:
    """Whether both tasks' success predicates can be reached one after the other (module docstring)."""
    if a.template.id == b.template.id:
        return False
    read_a, read_b = _keys(a.predicate.paths), _keys(b.predicate.paths)
    roots = {k.split(".")[0] for k in read_a | read_b}
    if roots & SCREEN_ROOTS or read_a & read_b:
        return False
    wrote_a, wrote_b = _keys(p for _, p, _ in a.setup), _keys(p for _, p, _ in b.setup)
    return not (wrote_a & read_b or wrote_b & read_a)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def compose(a: task_lib.Task, b: task_lib.Task, connective: str) -> task_lib.Task:
    """One task asking for `a` and then `b` (call only for `independent` tasks)."""
    first = a.instruction if connective.startswith("{a}") else _lower_first(a.instruction)
    instruction = connective.format(a=first, b=_lower_first(b.instruction))
    predicate = compile_predicate(f"({a.predicate.source}) and ({b.predicate.source})")
    template = dataclasses.replace(
        a.template, id=f"{a.template.id}+{b.template.id}", instruction=instruction, setup=[], solution=[]
    )
    return task_lib.Task(
        template, instruction, [*a.setup, *b.setup], predicate, [*a.plan, *b.plan], a.max_steps + b.max_steps
    )


def sample_composed(templates: list, split: str, rng: np.random.Generator) -> task_lib.Task:
    """A composition of two tasks of `split` (train or dev) with independent predicates; a plain task of
    the split when no partner turns up in ATTEMPTS draws."""
    if split not in SPLITS:
        raise ValueError(f"only training splits compose ({', '.join(SPLITS)}), got {split!r}")
    a = task_lib.sample(templates, split, rng)
    for _ in range(ATTEMPTS):
        b = task_lib.sample(templates, split, rng)
        if independent(a, b):
            return compose(a, b, CONNECTIVES[int(rng.integers(len(CONNECTIVES)))])
    return a
