"""Every project file a doc or a docstring names exists: a restructuring that moves a module must move the
sentences that point at it (issue 45 found docstrings naming files that had been gone for months)."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT

NAMED = re.compile(r"\b(?:learner|actors|common|benchmarks|tests|deploy)/[A-Za-z0-9_/]+\.py\b")
"""A path to a Python file of the project, as docs and docstrings write it."""


def named_paths(text: str) -> set[str]:
    """The paths `text` names, except a record's mention of a file it says was removed since (the path
    followed by "since removed" within its sentence)."""
    return {m.group(0) for m in NAMED.finditer(text) if "since removed" not in text[m.end() : m.end() + 60]}


def test_every_named_python_file_exists():
    files = subprocess.run(
        ["git", "ls-files", "*.md", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert files
    missing = {
        f"{name} (in {f})"
        for f in files
        if (ROOT / f).exists()
        for name in named_paths((ROOT / f).read_text(errors="replace"))
        if not (ROOT / name).exists()
    }
    assert not missing, sorted(missing)


def test_the_check_reads_paths_as_docs_write_them():
    text = "see learner/ingest/server.py and (`common/policies/pointer/augment.py`), not learner.py or x/y.py"
    assert named_paths(text) == {"learner/ingest/server.py", "common/policies/pointer/augment.py"}
    assert named_paths("shared `benchmarks/final_success.py:compare` (since removed)") == set()
