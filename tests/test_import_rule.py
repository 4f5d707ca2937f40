"""The import rule of docs/ARCHITECTURE.md: common/ imports neither side, actors/ never imports the
learner, and the learner never imports actor code (it starts actor processes instead, evaluation's
included). Checked on the source, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT


def imported_packages(path: Path) -> set[str]:
    """Top-level packages `path` imports anywhere in its source (module level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("common", {"actors", "learner"}), ("actors", {"learner"}), ("learner", {"actors"})],
)
def test_packages_import_only_what_the_rule_allows(package, forbidden):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    broken = {
        str(f.relative_to(ROOT)): sorted(imported_packages(f) & forbidden)
        for f in files
        if imported_packages(f) & forbidden
    }
    assert not broken, broken


def test_the_rule_sees_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from actors.envs import factory\n    import learner.loop\n")
    assert imported_packages(module) == {"actors", "learner"}
