"""The import rules of docs/ARCHITECTURE.md, checked on the source: a lazy import inside a function and an
import under `if TYPE_CHECKING:` count as imports (tests/import_graph.py).

Between the top-level packages: common/ imports neither side, actors/ never imports the learner, and the
learner never imports actor code (it starts actor processes instead, evaluation's included). Inside them:
no two modules import each other, directly or around a loop; the folders of the learner depend on each
other in one direction (FOLDER_RULES); and a policy family's folder is imported only by the family registry
(common/policies/__init__.py) and by itself, so a new family touches its own folder and the registry
(benchmarks that measure one family's parts, like tests, may import them)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.import_graph import circles, graph, imported_modules, modules

GRAPH = graph(ROOT)

FAMILY_FOLDERS = ("common.policies.pointer", "common.policies.lm")
REGISTRY = "common.policies"

FOLDER_RULES = [
    ("common", ("actors", "learner"), "common/ is what both sides share"),
    ("actors", ("learner",), "actors talk to the learner over sockets only"),
    ("learner", ("actors",), "the learner starts actor processes, it never imports them"),
    (
        "learner.ingest",
        ("learner.training", "learner.replay", "learner.losses", "learner.setup"),
        "the actor link moves and checks messages; it hands settled episodes on and knows no training",
    ),
    (
        "learner.losses",
        (
            "learner.training",
            "learner.replay",
            "learner.ingest",
            "learner.setup",
            "learner.serving",
            "learner.observe",
            "learner.launch",
            "learner.tools",
        ),
        "losses are pure functions of an evaluation and a batch",
    ),
    (
        "learner.replay",
        (
            "learner.training",
            "learner.ingest",
            "learner.setup",
            "learner.serving",
            "learner.launch",
            "learner.tools",
        ),
        "the replay stores and samples; what trains on it is above it",
    ),
    (
        "learner.training",
        (
            "learner.ingest",
            "learner.setup",
            "learner.serving",
            "learner.observe",
            "learner.launch",
            "learner.tools",
        ),
        "the update knows parameters, batches and losses, not where the data came from",
    ),
    (
        "learner.serving",
        ("learner.training", "learner.setup", "learner.launch", "learner.tools"),
        "serving acts with published parameters; it never reaches into the update",
    ),
    (
        "learner.observe",
        ("learner.training", "learner.setup", "learner.launch", "learner.tools"),
        "dashboards read what they are given",
    ),
    (
        "learner.launch",
        ("learner.training", "learner.ingest", "learner.setup", "learner.replay"),
        "launching places processes; it holds none of the learner's state",
    ),
]
"""(importer folder, folders it must not import, why). A folder is a dotted prefix: `learner.ingest`
is every module under learner/ingest/."""


def under(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


def test_no_two_modules_import_each_other():
    assert circles(GRAPH) == []


@pytest.mark.parametrize(("folder", "forbidden", "why"), FOLDER_RULES, ids=[r[0] for r in FOLDER_RULES])
def test_folders_import_only_what_the_rule_allows(folder, forbidden, why):
    importers = [m for m in GRAPH if under(m, folder)]
    assert importers
    broken = {
        m: sorted(t for t in GRAPH[m] if any(under(t, f) for f in forbidden))
        for m in importers
        if any(under(t, f) for t in GRAPH[m] for f in forbidden)
    }
    assert not broken, f"{why}: {broken}"


@pytest.mark.parametrize("family", FAMILY_FOLDERS)
def test_only_the_registry_imports_a_family(family):
    assert any(under(m, family) for m in GRAPH)
    outside = {
        m: sorted(t for t in GRAPH[m] if under(t, family))
        for m in GRAPH
        if m.split(".")[0] != "benchmarks"
        and m != REGISTRY
        and not under(m, family)
        and any(under(t, family) for t in GRAPH[m])
    }
    assert not outside, outside


def test_the_rules_see_lazy_and_type_only_imports(tmp_path):
    (tmp_path / "p").mkdir()
    for name in ("__init__", "a", "b", "c"):
        (tmp_path / "p" / f"{name}.py").write_text("")
    (tmp_path / "p" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import X\n"
    )
    (tmp_path / "p" / "b.py").write_text("def f():\n    from p import c\n")
    (tmp_path / "p" / "c.py").write_text("import p.a\n")
    known = set(modules(tmp_path, ("p",)))
    assert imported_modules(tmp_path / "p" / "a.py", known) == {"p.b"}
    assert imported_modules(tmp_path / "p" / "b.py", known) == {"p.c"}
    assert circles(graph(tmp_path, ("p",))) == [["p.a", "p.b", "p.c"]]
