"""The project's module import graph, read from the source: every import counts, at module level, inside a
function, or under `if TYPE_CHECKING:` (a circle kept alive by a lazy import is still a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("common", "learner", "actors", "benchmarks")


def module_name(root: Path, path: Path) -> str:
    """`learner/ingest/server.py` -> `learner.ingest.server`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name."""
    return {module_name(root, f): f for package in packages for f in sorted((root / package).rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in its source. `from a.b import c` is an import of
    `a.b.c` where that is a module, else of `a.b`; importing `a.b.c` also runs `a` and `a.b`, but only the
    module named is counted (a package's `__init__` is an edge of its own only when it is named)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    out.add(full)
                elif node.module in known:
                    out.add(node.module)
    return out


def graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (itself excluded)."""
    mods = modules(root, packages)
    known = set(mods)
    return {name: imported_modules(path, known) - {name} for name, path in mods.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), each sorted:
    modules that import each other, directly or around a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)
