"""`python -m actors check-args [demos] FLAGS...`: check an actor's (or the demo writer's) flags and start
nothing, so the learner can refuse a bad `--tasks`, `--split`, `--env` or `--emulator.*` with one line
before it starts any process (it may not import actor code: it runs this in a subprocess).

Parses the flags with the actor's own config (tyro's error box condensed to one line) and loads the task
suite the environments would load (actors/envs/task_check.py). Prints nothing and exits 0 when the flags are good; prints one line
to stderr and exits 2 otherwise. Hidden: `python -m actors --help` does not list it.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from typing import TypeVar

import tyro

from actors.envs.task_check import task_problem

T = TypeVar("T")

RULE = re.compile(r"[─━-]{3,}")
"""A rule of tyro's error box (in a terminal the top one carries the box's title)."""
BORDER = " │╭╮╰╯|"


class BadFlags(Exception):
    """A flag the actor would refuse: the one line the user sees."""


def one_line_error(box: str) -> str:
    """tyro's error box (a title, a rule, the message, a rule, hints) as its message on one line, with
    the flag it suggests for a misspelt one."""
    blocks: list[list[str]] = [[]]
    title = ""
    for raw in box.splitlines():
        line = raw.strip(BORDER)
        if RULE.search(line) or not line.strip():
            # In a terminal the box's title is in its top rule.
            title = title or RULE.sub("", line).strip(" ─━-")
            if blocks[-1]:
                blocks.append([])
        else:
            blocks[-1].append(line.strip())
    blocks = [b for b in blocks if b and b != [title]]
    if not title and len(blocks) > 1:  # no terminal: the title is a line of its own, above a rule
        blocks = blocks[1:]
    message = " ".join(blocks[0]) if blocks else "bad flags"
    hints = [b for b in blocks[1:] if b[0].startswith("Perhaps you meant") and len(b) > 1]
    if hints:
        message += f" (perhaps {hints[0][1]})"
    return re.sub(r"\s+", " ", message).strip()


def parse(cls: type[T], args: list[str], prog: str) -> T:
    """`cls` from `args` as the real command would parse it; BadFlags with tyro's message otherwise."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            return tyro.cli(cls, args=args, prog=prog)
    except SystemExit as e:
        if e.code in (0, None):  # --help: nothing to refuse
            sys.stdout.write(out.getvalue())
            raise
        raise BadFlags(one_line_error(out.getvalue())) from None


def check(argv: list[str]) -> str | None:
    """The one line that refuses `python -m actors [demos] ARGV`, or None when its flags are good."""
    try:
        if argv[:1] == ["demos"]:
            from actors.tools.demos import DemosConfig

            demos = parse(DemosConfig, argv[1:], "python -m actors demos")
            return task_problem("simphone", demos.tasks, demos.split)
        from actors.config import ActorConfig

        cfg = parse(ActorConfig, argv, "python -m actors")
        return task_problem(cfg.env, cfg.tasks, cfg.split)
    except BadFlags as e:
        return str(e)


def main(argv: list[str]) -> int:
    """The exit status of `python -m actors check-args ARGV` (its one line on stderr when it is 2)."""
    problem = check(argv)
    if problem is None:
        return 0
    prog = "python -m actors demos" if argv[:1] == ["demos"] else "python -m actors"
    print(f"{prog}: {problem}", file=sys.stderr, flush=True)
    return 2
