"""Rooms people can live in: no function in learner/, common/ or actors/ longer than 80 lines, and no class
in learner/ or actors/ (outside the environments, actors/envs/) with more than 16 methods (issues 29 and
45). Checked on the source, like the import rule."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

MAX_FUNCTION_LINES = 80
MAX_METHODS = 16


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name (N lines)` for each function or method longer than `limit` lines, docstring included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def crowded_classes(path: Path, limit: int = MAX_METHODS) -> list[str]:
    """`file:line name (N methods)` for each class defining more than `limit` methods itself."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef) for c in node.body)
            if methods > limit:
                out.append(f"{path.name}:{node.lineno} {node.name} ({methods} methods)")
    return out


def test_no_function_is_longer_than_a_screen():
    files = [f for package in ("learner", "common", "actors") for f in sorted((ROOT / package).rglob("*.py"))]
    assert files
    assert [line for f in files for line in long_functions(f)] == []


def test_no_learner_or_actor_class_is_crowded():
    files = [*sorted((ROOT / "learner").rglob("*.py")), *sorted((ROOT / "actors").rglob("*.py"))]
    files = [f for f in files if "envs" not in f.relative_to(ROOT).parts]
    assert [line for f in files for line in crowded_classes(f)] == []


def test_the_checks_see_what_they_count(tmp_path):
    module = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(17))
    module.write_text(f"def long():\n{body}\n\ndef short():\n    pass\n\n\nclass C:\n{methods}")
    assert long_functions(module) == ["m.py:1 long (81 lines)"]
    assert crowded_classes(module) == ["m.py:88 C (17 methods)"]
    assert crowded_classes(module, limit=17) == [] and long_functions(module, limit=81) == []
