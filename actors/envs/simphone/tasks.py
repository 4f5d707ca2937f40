"""Task files: AitW-style task templates as data (JSON), expanded into concrete episodes.

A task file is `{"suite": NAME, "templates": [TEMPLATE, ...]}`. A TEMPLATE has
    id           unique name, e.g. "settings.wifi_on"
    instruction  text with {param} or {param.field} placeholders
    params       {name: {"train": [values], "test": [values]}}; a value is a scalar or an object
    setup        [{"set": PATH, "value": V} | {"append": PATH, "value": V}], applied after the random
                 initial state (PATH may hold placeholders; a V string that is exactly "{p}" takes p's
                 value with its type, other strings are interpolated)
    success      a predicate (actors/envs/simphone/expr.py); placeholders become JSON literals
    solution     the oracle's plan: [{"open": APP} | {"tap": LABEL} | {"tap_nth": N} |
                 {"type": TEXT, "field": FIELD} | {"enter": true} | {"back": true} | {"home": true}
                 | {"swipe": "up"|"down"}]
    max_steps    step limit (default 15)
    split        "both" (train and test parameter values), "validation" (a training template set aside
                 for development choices: not in the "dev" split) or "test" (a held-out template)
Errors name the file, the template and the field. docs/SIMPHONE.md documents the format and the state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from actors.envs.simphone.expr import Predicate, PredicateError, compile_predicate

SUITES_DIR = Path(__file__).parent / "suites"
SPLITS = ("train", "test", "dev", "validation", "heldout")
"""What a task is drawn from. train: every training template (split "both" or "validation") with the
training parameter values; test: every template with the test values; dev: the training templates
without the validation ones; validation: those alone, with training values; heldout: the held-out
templates (split "test") alone, with test values, so their success is measured on as many episodes as
asked rather than on the share the test split draws (9 of 47 in `general`). Development trains on dev
and makes its choices on validation, so the test split and the held-out templates decide nothing."""
VALUE_SETS = ("train", "test")
"""The parameter value lists every template gives (params.NAME.train / .test)."""
TEMPLATE_SPLITS = ("both", "validation", "test")


def values_of(split: str) -> str:
    """Which parameter values a split draws: test and heldout the test ones, every other the training ones."""
    return "test" if split in ("test", "heldout") else "train"


def available(template: Any, split: str) -> bool:
    """Whether `split` draws `template` (a SimPhone or device template: anything with `.split`)."""
    kind = template.split
    return {
        "test": True,
        "train": kind != "test",
        "dev": kind == "both",
        "validation": kind == "validation",
        "heldout": kind == "test",
    }[split]


PLAN_KINDS = ("open", "tap", "tap_nth", "type", "enter", "back", "home", "swipe")
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)(?:\.([a-z_][a-z0-9_]*))?\}")
# Top-level keys of the phone state; predicates and setup may only use these (see docs/SIMPHONE.md).
STATE_ROOTS = frozenset(
    {"app", "screen", "settings", "clock", "contacts", "messages", "browser", "shop", "calendar", "notes"}
    | {"camera", "photos", "maps", "youtube", "gmail"}
)


T = TypeVar("T")


class TaskFileError(ValueError):
    """A task file that cannot be used; the message names the file, the template and the field."""


@dataclass(frozen=True)
class Template:
    id: str
    suite: str
    instruction: str
    params: dict[str, dict[str, list[Any]]]
    setup: list[dict[str, Any]]
    success: str
    solution: list[dict[str, Any]]
    max_steps: int
    split: str


@dataclass(frozen=True)
class Task:
    """A template with its parameters bound: what one episode asks for."""

    template: Template
    instruction: str
    setup: list[tuple[str, str, Any]]
    """(op, path, value) with placeholders resolved."""
    predicate: Predicate
    plan: list[dict[str, Any]]
    max_steps: int


def load_templates(path: str | Path) -> list[Template]:
    """A suite name ("general", "webshop"), a .json file, or a folder of them."""
    return load_suite(path, SUITES_DIR, _load_file)


def load_suite(path: str | Path, suites_dir: Path, load_file: Callable[[Path], list[T]]) -> list[T]:
    """The templates of a suite name (a .json in `suites_dir`), a .json file, or a folder of them, each
    file read by `load_file`; template ids must be unique across the files. Shared by the SimPhone and
    the device task files."""
    p = Path(path)
    if not p.exists() and (suites_dir / f"{path}.json").exists():
        p = suites_dir / f"{path}.json"
    if p.is_dir():
        files = sorted(p.glob("*.json"))
        if not files:
            raise TaskFileError(f"{p}: no .json task files in this folder")
    elif p.is_file():
        files = [p]
    else:
        known = ", ".join(sorted(f.stem for f in suites_dir.glob("*.json")))
        raise TaskFileError(f"{path}: no such task file, folder or suite (shipped suites: {known})")
    templates: list[T] = []
    seen: dict[str, Path] = {}
    for f in files:
        for t in load_file(f):
            if t.id in seen:
                raise TaskFileError(f"{f}: template {t.id!r} is also defined in {seen[t.id]}")
            seen[t.id] = f
            templates.append(t)
    return templates


def _load_file(path: Path) -> list[Template]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskFileError(f"{path}: not readable JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("templates"), list):
        raise TaskFileError(f'{path}: expected {{"suite": NAME, "templates": [...]}}')
    suite = doc.get("suite", path.stem)
    return [_template(path, suite, i, raw) for i, raw in enumerate(doc["templates"])]


class TemplateFields:
    """What every task-file template has, checked with errors that name the file, template and field: its
    id, no unknown fields, params with train and test values, split and max_steps. Shared by the SimPhone
    and the device task files; `field` reads the others."""

    COMMON = frozenset({"id", "instruction", "params", "max_steps", "split"})

    def __init__(self, path: Path, index: int, raw: Any, fields: set[str]):
        where = f"{path}: template #{index}"
        if not isinstance(raw, dict):
            raise TaskFileError(f"{where}: must be an object")
        self.raw = raw
        tid = raw.get("id")
        if not isinstance(tid, str) or not tid:
            raise TaskFileError(f"{where}: field 'id' must be a non-empty string")
        self.id, self.where = tid, f"{path}: template {tid!r}"
        unknown = set(raw) - self.COMMON - fields
        if unknown:
            raise TaskFileError(f"{self.where}: unknown fields {sorted(unknown)}")
        self.params = self.field("params", dict, {})
        for name, values in self.params.items():
            if (
                not isinstance(values, dict)
                or set(values) != set(VALUE_SETS)
                or not all(isinstance(v, list) and v for v in values.values())
            ):
                raise TaskFileError(
                    f'{self.where}: field \'params.{name}\' must be {{"train": [...], "test": [...]}} '
                    "with values in both"
                )
        self.split = self.field("split", str, "both")
        if self.split not in TEMPLATE_SPLITS:
            raise TaskFileError(
                f"{self.where}: field 'split' must be one of {', '.join(TEMPLATE_SPLITS)}, got {self.split!r}"
            )
        self.max_steps = self.field("max_steps", int, 15)
        if not 1 <= self.max_steps <= 100:
            raise TaskFileError(f"{self.where}: field 'max_steps' must be in [1, 100]")

    def field(self, name: str, typ: type, default: Any = None) -> Any:
        value = self.raw.get(name, default)
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise TaskFileError(f"{self.where}: field {name!r} must be {typ.__name__}, got {value!r}")
        return value


def _template(path: Path, suite: str, index: int, raw: Any) -> Template:
    head = TemplateFields(path, index, raw, {"setup", "success", "solution"})
    tid, where, field = head.id, head.where, head.field
    params, split, max_steps = head.params, head.split, head.max_steps
    setup = field("setup", list, [])
    for op in setup:
        if not isinstance(op, dict) or len(set(op) & {"set", "append"}) != 1 or "value" not in op:
            raise TaskFileError(
                f'{where}: field \'setup\' entries are {{"set"|"append": PATH, "value": V}}, got {op!r}'
            )
    solution = field("solution", list, [])
    for step in solution:
        if not isinstance(step, dict) or len(step.keys() & set(PLAN_KINDS)) != 1:
            raise TaskFileError(
                f"{where}: field 'solution' entries need exactly one of {PLAN_KINDS}, got {step!r}"
            )
    template = Template(
        tid,
        suite,
        field("instruction", str),
        params,
        setup,
        field("success", str),
        solution,
        max_steps,
        split,
    )
    # Bind the first value of every parameter once, so a broken predicate or placeholder fails at load.
    for sp in VALUE_SETS:
        if available(template, sp):
            try:
                bind(template, {name: values[sp][0] for name, values in params.items()})
            except (KeyError, PredicateError, ValueError) as e:
                raise TaskFileError(f"{where}: {e}") from e
    return template


def sample(
    templates: list[T],
    split: str,
    rng: np.random.Generator,
    binder: Callable[[T, dict[str, Any]], Any] | None = None,
) -> Any:
    """A uniformly chosen template of the split, with parameter values from that split, bound by `binder`:
    this module's `bind` (a Task) unless given; devices pass actors/envs/adb/tasks.py:bind (a DeviceTask,
    its set-up commands rendered for adb). The one task sampler of both environment kinds."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    pool = [t for t in templates if available(t, split)]
    if not pool:
        raise ValueError(f"no template is available for split {split!r}")
    template = pool[int(rng.integers(len(pool)))]
    drawn = values_of(split)
    values = {name: v[drawn][int(rng.integers(len(v[drawn])))] for name, v in template.params.items()}
    return (bind if binder is None else binder)(template, values)


def bind(template: Template, values: dict[str, Any]) -> Task:
    def lookup(name: str, sub: str | None) -> Any:
        if name not in values:
            raise KeyError(f"placeholder {{{name}}} names no parameter")
        value = values[name]
        if sub is not None:
            if not isinstance(value, dict) or sub not in value:
                raise KeyError(f"placeholder {{{name}.{sub}}}: parameter {name!r} has no field {sub!r}")
            value = value[sub]
        return value

    def text(s: str) -> str:
        return _PLACEHOLDER.sub(lambda m: str(lookup(m.group(1), m.group(2))), s)

    def typed(v: Any) -> Any:
        if isinstance(v, str):
            whole = _PLACEHOLDER.fullmatch(v)
            return lookup(whole.group(1), whole.group(2)) if whole else text(v)
        if isinstance(v, dict):
            return {k: typed(x) for k, x in v.items()}
        if isinstance(v, list):
            return [typed(x) for x in v]
        return v

    predicate_text = _PLACEHOLDER.sub(lambda m: json.dumps(lookup(m.group(1), m.group(2))), template.success)
    try:
        predicate = compile_predicate(predicate_text)
    except PredicateError as e:
        raise ValueError(f"field 'success': {e}") from e
    roots = {p.split(".")[0].split("[")[0] for p in predicate.paths}
    if roots - STATE_ROOTS:
        raise ValueError(f"field 'success' uses unknown state paths {sorted(roots - STATE_ROOTS)}")
    setup = []
    for op in template.setup:
        kind = "set" if "set" in op else "append"
        path = text(op[kind])
        if path.split(".")[0] not in STATE_ROOTS:
            raise ValueError(f"field 'setup' uses unknown state path {path!r}")
        setup.append((kind, path, typed(op["value"])))
    plan = [{k: typed(v) for k, v in step.items()} for step in template.solution]
    return Task(template, text(template.instruction), setup, predicate, plan, template.max_steps)


def apply_setup(state: dict[str, Any], setup: list[tuple[str, str, Any]]) -> None:
    """Write a task's set-up into the phone state (dotted paths into dicts)."""
    for kind, path, value in setup:
        *parents, leaf = path.split(".")
        node = state
        for key in parents:
            node = node[key]
        if kind == "set":
            node[leaf] = json.loads(json.dumps(value))
        else:
            node[leaf].append(json.loads(json.dumps(value)))
