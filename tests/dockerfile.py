"""Reading a Dockerfile without Docker (this machine has no daemon): its instructions and stages, and the
checks every recipe's Dockerfile gets: only ARGs before the first FROM, every variable declared before it
is used (in its stage, or globally for FROM lines), RUN lines that parse as sh, COPY sources that exist in
the build context and pass its ignore file, COPY --from naming an earlier stage."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip
COPY_FLAGS = {"--from", "--chmod", "--chown", "--link"}
VAR_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")

Instruction = tuple[int, str, str]
"""(first line, INSTRUCTION, arguments)."""


def instructions(path: Path) -> list[Instruction]:
    """Continuation lines joined, comments and directives dropped."""
    found: list[Instruction] = []
    buf, start = "", 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # also a comment line inside a continued instruction
            continue
        start = start or n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        word, _, rest = (buf + stripped).partition(" ")
        assert word in INSTRUCTIONS, (
            f"{path.name} line {start}: {word!r} is not an instruction (or not upper case)"
        )
        found.append((start, word, rest.strip()))
        buf, start = "", 0
    assert not buf, f"{path.name} ends inside a continued instruction"
    return found


def prelude(path: Path) -> list[Instruction]:
    """The instructions before the first FROM (ARGs only: the global build arguments)."""
    out = []
    for ins in instructions(path):
        if ins[1] == "FROM":
            return out
        assert ins[1] == "ARG", f"{path.name} line {ins[0]}: only ARG may come before the first FROM"
        out.append(ins)
    raise AssertionError(f"{path.name} has no FROM")


def stages(path: Path) -> list[tuple[str | None, list[Instruction]]]:
    """(stage name, its instructions from FROM on), after the prelude."""
    found: list[tuple[str | None, list[Instruction]]] = []
    for ins in instructions(path)[len(prelude(path)) :]:
        if ins[1] == "FROM":
            words = ins[2].split()
            assert len(words) in (1, 3), f"{path.name} line {ins[0]}: FROM IMAGE [AS NAME], not {ins[2]!r}"
            found.append((words[2] if len(words) == 3 and words[1].upper() == "AS" else None, []))
        found[-1][1].append(ins)
    return found


def declared(kind: str, args: str) -> dict[str, str | None]:
    """Names (and defaults) an ARG or ENV instruction declares."""
    out: dict[str, str | None] = {}
    for word in shlex.split(args):
        name, eq, value = word.partition("=")
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{kind} {word!r}"
        assert eq or kind == "ARG", f"ENV needs NAME=VALUE, not {word!r}"
        out[name] = value if eq else None
    return out


def of_kind(stage: list[Instruction], kind: str) -> dict[str, str | None]:
    """Every ARG (or ENV) a stage declares, with its default (value)."""
    found: dict[str, str | None] = {}
    for _, word, args in stage:
        if word == kind:
            found.update(declared(kind, args))
    return found


def check_variables(path: Path, inherited: set[str]) -> None:
    """FROM lines use global ARGs only; other instructions use what their stage declared before them, or
    `inherited` (what the base image defines, such as PATH)."""
    global_args = of_kind(prelude(path), "ARG")
    for name, stage in stages(path):
        known = set(inherited)
        for line, word, args in stage:
            used = set(VAR_REF.findall(args))
            scope = set(global_args) if word == "FROM" else known
            assert used <= scope, (
                f"{path.name} line {line} ({name or 'final'} stage): {sorted(used - scope)} undeclared"
            )
            if word in ("ARG", "ENV"):
                known |= set(declared(word, args))


def check_run_and_copy(path: Path, ignore_file: Path, context: Path) -> dict[str, str]:
    """RUN lines parse as sh and do not end in a dangling operator; COPY sources exist in `context` and
    pass `ignore_file`, or come from an earlier stage. Returns the context's copied sources -> dest."""
    ignore = ignore_file.read_text().splitlines()
    stage_names: list[str] = []
    copied: dict[str, str] = {}
    for name, stage in stages(path):
        for line, word, args in stage[1:]:
            where = f"{path.name} line {line}"
            if word == "RUN":
                assert args and not re.search(r"(&&|\|\||\|)\s*$", args), f"{where}: {args!r}"
                result = subprocess.run(["sh", "-n", "-c", args], capture_output=True, text=True, timeout=30)
                assert result.returncode == 0, f"{where}: {result.stderr}"
            elif word == "COPY":
                words = args.split()
                flags = [w for w in words if w.startswith("--")]
                paths = [w for w in words if not w.startswith("--")]
                assert {f.split("=")[0] for f in flags} <= COPY_FLAGS, f"{where}: {flags}"
                assert len(paths) >= 2 and paths[-1].startswith("/"), f"{where}: COPY SRC... /DEST"
                source_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
                for src in paths[:-1]:
                    if source_stage is not None:
                        assert source_stage in stage_names, f"{where}: no earlier stage {source_stage}"
                        continue
                    assert (context / src).exists(), f"{where}: {src} is not in the build context"
                    top = src.split("/")[0]
                    assert f"!{src}" in ignore or f"!{top}" in ignore, (
                        f"{src}: excluded by {ignore_file.name}"
                    )
                    copied[src] = paths[-1]
        if name:
            stage_names.append(name)
    return copied
