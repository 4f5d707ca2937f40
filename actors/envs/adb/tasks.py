"""Device task files: SimPhone's template format, with set-up and success checks run over adb.

A task file is `{"suite": NAME, "templates": [TEMPLATE, ...]}`. A TEMPLATE has
    id           unique name, e.g. "settings.wifi"
    instruction  text with {param} or {param.field} placeholders
    params       {name: {"train": [values], "test": [values]}}; a value is a scalar or an object
    setup        steps run in order at reset:
                 {"shell": CMD} (must exit 0) | {"start": "pkg/.Activity"} | {"app": PKG} (its launcher
                 activity) | {"stop": PKG} | {"clear": PKG} | {"home": true} |
                 {"setting": "NS/KEY", "value": V} | {"snapshot": NAME} (the environment loads it)
    success      a check: {"setting": "NS/KEY", "equals": V} |
                 {"shell": CMD} (exits 0) or {"shell": CMD, "contains"|"equals"|"matches": V} (stdout,
                 stripped; exit 0 too; "matches" is a regex search) | {"activity": "pkg" or "pkg/.Act"} |
                 {"ui_text": V} (an on-screen text or content description, case-insensitive) |
                 {"content": URI, "projection": "a:b", "where": SQL, "contains"|"equals"|"matches": V} |
                 {"all": [...]} | {"any": [...]} | {"not": CHECK}
    max_steps    step limit (default 15)
    split        "both" (train and test parameter values) or "test" (a held-out template)

Parameter values are data, never code: in a `shell` command each placeholder becomes one shell-quoted
word (so it may not sit inside quotes, backticks or after `$` or `\\`); in `where` it becomes an SQL
literal; package names, components, setting keys, URIs and projections must match strict patterns; and
every command argument is shell-quoted. Every parameter value is bound once at load, so a bad one fails
there, with an error naming the file, the template and the field.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.envs.adb.device import AdbDevice
from actors.envs.faults import DeviceCommandFailed, DeviceFault, DeviceHang
from actors.envs.simphone.tasks import (
    VALUE_SETS,
    TaskFileError,
    TemplateFields,
    available,
    load_suite,
)
from common.types import Observation

SUITES_DIR = Path(__file__).parent / "suites"
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)(?:\.([a-z_][a-z0-9_]*))?\}")
_PKG = r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z][A-Za-z0-9_]*)+"
PACKAGE = re.compile(_PKG)
COMPONENT = re.compile(rf"({_PKG})/(\.?[A-Za-z_$][A-Za-z0-9_$]*(?:\.[A-Za-z_$][A-Za-z0-9_$]*)*)")
SETTING_NAMESPACES = ("system", "secure", "global")
SETTING_KEY = re.compile(r"[A-Za-z0-9_.]+")
CONTENT_URI = re.compile(r"content://[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-%~]*)*(?:\?[A-Za-z0-9_.\-%=&]*)?")
PROJECTION = re.compile(r"[A-Za-z0-9_]+(?::[A-Za-z0-9_]+)*")
SNAPSHOT = re.compile(r"[A-Za-z0-9_.\-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Lines of `am`, `pm` and `monkey` output that mean failure even when the exit code is 0 (older Androids).
_FAILED_OUTPUT = re.compile(r"^\s*(Error\b|Failed\b|\*\* No activities found)", re.MULTILINE)
FOCUS_COMMAND = "dumpsys window | grep -E 'mCurrentFocus|mFocusedApp'"
_OPS = ("contains", "equals", "matches")
SETUP_KINDS = ("shell", "start", "app", "stop", "clear", "home", "setting", "snapshot")
CHECK_KINDS = ("setting", "shell", "activity", "ui_text", "content", "all", "any", "not")


@dataclass(frozen=True)
class DeviceTemplate:
    id: str
    suite: str
    instruction: str
    params: dict[str, dict[str, list[Any]]]
    setup: list[dict[str, Any]]
    success: dict[str, Any]
    max_steps: int
    split: str


@dataclass(frozen=True)
class SetupStep:
    """One resolved set-up step: a shell line, or a snapshot for the environment to load."""

    label: str
    """What the step does, for errors: e.g. "start com.android.settings/.Settings"."""
    command: str = ""
    snapshot: str = ""
    strict: bool = False
    """`am`, `pm` and `monkey` may exit 0 after failing: then an "Error..." output line fails the step too."""


@dataclass(frozen=True)
class Check:
    """A compiled success check. `command` checks run `command` and compare its stripped stdout with
    `value` by `op` ("contains", "equals", "matches"; "" means: exits 0); `setting` and `content` checks
    compile to these."""

    kind: str
    """"command", "activity", "ui_text", "all", "any" or "not"."""
    label: str
    command: str = ""
    op: str = ""
    value: str = ""
    children: tuple[Check, ...] = ()


@dataclass(frozen=True)
class DeviceTask:
    """A template with its parameters bound: what one episode asks for."""

    template: DeviceTemplate
    instruction: str
    setup: tuple[SetupStep, ...]
    success: Check
    max_steps: int


# ---- loading ----


def load_device_templates(path: str | Path) -> list[DeviceTemplate]:
    """A suite name ("stock"), a .json file, or a folder of them."""
    return load_suite(path, SUITES_DIR, _load_file)


def _load_file(path: Path) -> list[DeviceTemplate]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskFileError(f"{path}: not readable JSON: {e}") from e
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("templates"), list)
        or set(doc) - {"suite", "templates"}
    ):
        raise TaskFileError(f'{path}: expected {{"suite": NAME, "templates": [...]}} and nothing else')
    suite = doc.get("suite", path.stem)
    if not isinstance(suite, str) or not suite:
        raise TaskFileError(f"{path}: field 'suite' must be a non-empty string")
    return [_template(path, suite, i, raw) for i, raw in enumerate(doc["templates"])]


def _template(path: Path, suite: str, index: int, raw: Any) -> DeviceTemplate:
    head = TemplateFields(path, index, raw, {"setup", "success"})
    tid, where, field = head.id, head.where, head.field
    params, split, max_steps = head.params, head.split, head.max_steps
    template = DeviceTemplate(
        tid,
        suite,
        field("instruction", str),
        params,
        field("setup", list, []),
        field("success", dict),
        max_steps,
        split,
    )
    # Bind every parameter value once (value i of each parameter together), so a value that breaks a
    # placeholder or a pattern fails now, not in the middle of training.
    try:
        for sp in VALUE_SETS:
            if available(template, sp):
                for i in range(max((len(v[sp]) for v in params.values()), default=1)):
                    bind(template, {n: v[sp][i % len(v[sp])] for n, v in params.items()})
    except ValueError as e:
        raise TaskFileError(f"{where}: {e}") from e
    return template


# ---- binding: placeholders, each rendered for where it lands ----


def _check_shell_template(cmd: Any, field: str) -> None:
    """Refuse a placeholder where a quoted word would not stay one word: inside '...', "..." or `...`,
    or right after `$` or a backslash."""
    if not isinstance(cmd, str):
        raise ValueError(f"field {field!r} must be a string, got {cmd!r}")
    quote, escaped, state = "", False, []
    for c in cmd:
        state.append(quote or ("\\" if escaped else ""))
        if escaped:
            escaped = False
        elif c == "\\" and quote != "'":
            escaped = True
        elif quote and c == quote:
            quote = ""
        elif not quote and c in "'\"`":
            quote = c
    for m in _PLACEHOLDER.finditer(cmd):
        at = m.start()
        if state[at] or (at and cmd[at - 1] == "$"):
            where = (
                f"inside {state[at]}...{state[at]}"
                if state[at] not in ("", "\\")
                else f"after {cmd[at - 1]!r}"
            )
            raise ValueError(
                f"field {field!r}: placeholder {m.group(0)} {where} in {cmd!r}; write it bare, it is quoted for you"
            )


class _Binder:
    """Renders placeholders with the bound values; every method raises ValueError naming the field."""

    def __init__(self, values: dict[str, Any]):
        self.values = values

    def word(self, m: re.Match[str], field: str) -> str:
        name, sub = m.group(1), m.group(2)
        if name not in self.values:
            raise ValueError(f"field {field!r}: placeholder {{{name}}} names no parameter")
        value = self.values[name]
        if sub is not None:
            if not isinstance(value, dict) or sub not in value:
                raise ValueError(
                    f"field {field!r}: placeholder {m.group(0)}: parameter {name!r} has no field {sub!r}"
                )
            value = value[sub]
        if isinstance(value, bool):
            value = json.dumps(value)
        if not isinstance(value, str | int | float):
            raise ValueError(
                f"field {field!r}: placeholder {m.group(0)} is {type(value).__name__}, not a scalar"
            )
        text = str(value)
        if _CONTROL.search(text):
            raise ValueError(f"field {field!r}: placeholder {m.group(0)} holds a control character: {text!r}")
        return text

    def text(self, s: Any, field: str, render: Callable[[str], str] = str) -> str:
        """`s` (a string, or a number taken as its text) with each placeholder replaced by render(value)."""
        if isinstance(s, int | float) and not isinstance(s, bool):
            s = str(s)
        if not isinstance(s, str):
            raise ValueError(f"field {field!r} must be a string, got {s!r}")
        return _PLACEHOLDER.sub(lambda m: render(self.word(m, field)), s)

    def match(self, s: Any, field: str, pattern: re.Pattern[str], what: str) -> str:
        text = self.text(s, field)
        if not pattern.fullmatch(text):
            raise ValueError(f"field {field!r}: {text!r} is not a valid {what}")
        return text

    def setting(self, s: Any, field: str) -> tuple[str, str]:
        text = self.text(s, field)
        ns, _, key = text.partition("/")
        if ns not in SETTING_NAMESPACES or not SETTING_KEY.fullmatch(key):
            raise ValueError(
                f"field {field!r}: {text!r} is not NAMESPACE/KEY with NAMESPACE in {SETTING_NAMESPACES}"
            )
        return ns, key


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def bind(template: DeviceTemplate, values: dict[str, Any]) -> DeviceTask:
    """The task for these parameter values; ValueError naming the field when one does not fit."""
    b = _Binder(values)
    setup = tuple(_setup_step(b, raw, f"setup[{i}]") for i, raw in enumerate(template.setup))
    success = _check(b, template.success, "success")
    return DeviceTask(
        template, b.text(template.instruction, "instruction"), setup, success, template.max_steps
    )


def _kind(raw: Any, field: str, kinds: tuple[str, ...], extras: dict[str, set[str]]) -> str:
    """The one kind key of a step or check; refuses unknown keys."""
    if not isinstance(raw, dict):
        raise ValueError(f"field {field!r} must be an object, got {raw!r}")
    found = [k for k in kinds if k in raw]
    if len(found) != 1:
        raise ValueError(f"field {field!r} needs exactly one of {kinds}, got keys {sorted(raw)}")
    kind = found[0]
    unknown = set(raw) - {kind} - extras.get(kind, set())
    if unknown:
        raise ValueError(f"field {field!r}: unknown keys {sorted(unknown)} for {kind!r}")
    return kind


def _setup_step(b: _Binder, raw: Any, field: str) -> SetupStep:
    kind = _kind(raw, field, SETUP_KINDS, {"setting": {"value"}})
    arg, f = raw[kind], f"{field}.{kind}"
    q = shlex.quote
    match kind:
        case "shell":
            _check_shell_template(arg, f)
            cmd = b.text(arg, f, q)
            return SetupStep(f"shell {cmd if len(cmd) <= 80 else cmd[:77] + '...'}", cmd)
        case "start":
            component = b.match(arg, f, COMPONENT, "component (package/.Activity)")
            return SetupStep(f"start {component}", f"am start -W -n {q(component)}", strict=True)
        case "app":
            pkg = b.match(arg, f, PACKAGE, "package name")
            cmd = f"monkey -p {q(pkg)} -c android.intent.category.LAUNCHER 1"
            return SetupStep(f"app {pkg}", cmd, strict=True)
        case "stop" | "clear":
            pkg = b.match(arg, f, PACKAGE, "package name")
            verb = "am force-stop" if kind == "stop" else "pm clear"
            return SetupStep(f"{kind} {pkg}", f"{verb} {q(pkg)}", strict=True)
        case "home":
            if arg is not True:
                raise ValueError(f"field {f!r} must be true")
            return SetupStep("home", "input keyevent 3")
        case "setting":
            ns, key = b.setting(arg, f)
            if "value" not in raw:
                raise ValueError(f"field {field!r}: a setting step needs a 'value'")
            value = b.text(raw["value"], f"{field}.value")
            return SetupStep(f"setting {ns}/{key}={value}", f"settings put {ns} {key} {q(value)}")
    name = b.match(arg, f, SNAPSHOT, "snapshot name")
    return SetupStep(f"snapshot {name}", snapshot=name)


def _op(b: _Binder, raw: dict[str, Any], field: str, required: bool) -> tuple[str, str]:
    ops = [k for k in _OPS if k in raw]
    if len(ops) > 1 or (required and not ops):
        raise ValueError(f"field {field!r} needs {'exactly' if required else 'at most'} one of {_OPS}")
    if not ops:
        return "", ""
    op = ops[0]
    if op != "matches":
        return op, b.text(raw[op], f"{field}.{op}")
    pattern = b.text(raw[op], f"{field}.{op}", re.escape)
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"field '{field}.matches': bad regular expression {pattern!r}: {e}") from e
    return op, pattern


def _check(b: _Binder, raw: Any, field: str) -> Check:
    extras = {
        "setting": {"equals"},
        "shell": set(_OPS),
        "content": {"projection", "where", *_OPS},
    }
    kind = _kind(raw, field, CHECK_KINDS, extras)
    arg, f = raw[kind], f"{field}.{kind}"
    q = shlex.quote
    match kind:
        case "setting":
            ns, key = b.setting(arg, f)
            if "equals" not in raw:
                raise ValueError(f"field {field!r}: a setting check needs 'equals'")
            wanted = b.text(raw["equals"], f"{field}.equals")
            return Check("command", f"setting {ns}/{key}", f"settings get {ns} {key}", "equals", wanted)
        case "shell":
            _check_shell_template(arg, f)
            op, value = _op(b, raw, field, required=False)
            cmd = b.text(arg, f, q)
            return Check("command", f"`{cmd if len(cmd) <= 80 else cmd[:77] + '...'}`", cmd, op, value)
        case "content":
            uri = b.match(arg, f, CONTENT_URI, "content URI")
            if "projection" not in raw:
                raise ValueError(f"field {field!r}: a content check needs 'projection'")
            proj = b.match(raw["projection"], f"{field}.projection", PROJECTION, "projection (col:col)")
            cmd = f"content query --uri {q(uri)} --projection {q(proj)}"
            if "where" in raw:
                cmd += f" --where {q(b.text(raw['where'], f'{field}.where', _sql_literal))}"
            op, value = _op(b, raw, field, required=True)
            return Check("command", f"content {uri}", cmd, op, value)
        case "activity":
            text = b.text(arg, f)
            if not (PACKAGE.fullmatch(text) or COMPONENT.fullmatch(text)):
                raise ValueError(f"field {f!r}: {text!r} is neither a package nor package/.Activity")
            return Check("activity", f"activity {text}", value=text)
        case "ui_text":
            return Check("ui_text", "on-screen text", value=b.text(arg, f))
        case "not":
            return Check("not", "not", children=(_check(b, arg, f),))
    if not isinstance(arg, list) or not arg:
        raise ValueError(f"field {f!r} must be a non-empty list of checks")
    return Check(kind, kind, children=tuple(_check(b, c, f"{f}[{i}]") for i, c in enumerate(arg)))


# ---- running on a device ----


def _left(deadline: float, started: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeviceHang(time.monotonic() - started, f"out of time before {what}")
    return left


def run_setup(
    task: DeviceTask,
    device: AdbDevice,
    *,
    load_snapshot: Callable[[str], None] | None = None,
    timeout: float = 60.0,
) -> None:
    """Run the task's set-up steps in order, all within `timeout` seconds.

    A step that fails raises DeviceCommandFailed naming it; a device fault from a step (DeviceHang, ...)
    passes through with a note naming the step. A snapshot step without `load_snapshot` is a
    configuration error (ValueError): the environment has no way to load snapshots.
    """
    started = time.monotonic()
    deadline = started + timeout
    for i, step in enumerate(task.setup):
        what = f"{task.template.id}: setup step #{i} ({step.label})"
        left = _left(deadline, started, what)
        if step.snapshot:
            if load_snapshot is None:
                raise ValueError(f"{what} loads a snapshot, but this environment cannot load snapshots")
            load_snapshot(step.snapshot)
            continue
        try:
            result = device.shell(step.command, timeout=left)
        except DeviceFault as e:
            e.add_note(f"during {what}")
            raise
        output = (result.stdout + b"\n" + result.stderr).decode("utf-8", "replace")
        if result.code != 0 or (step.strict and _FAILED_OUTPUT.search(output)):
            raise DeviceCommandFailed(
                time.monotonic() - started, f"{what} failed (exit {result.code}): {output.strip()[:200]}"
            )


def evaluate_check(
    check: Check, device: AdbDevice, observation: Observation | None, timeout: float
) -> tuple[bool, str]:
    """Whether `check` holds now, and why (or why not). Device faults (DeviceHang past `timeout` in all,
    DeviceDisconnected, ...) pass through: they say nothing about the task."""
    started = time.monotonic()
    return _evaluate(check, device, observation, started + timeout, started)


def _evaluate(
    check: Check, device: AdbDevice, observation: Observation | None, deadline: float, started: float
) -> tuple[bool, str]:
    match check.kind:
        case "all" | "any":
            reasons = []
            for child in check.children:
                holds, reason = _evaluate(child, device, observation, deadline, started)
                if holds == (check.kind == "any"):
                    return holds, reason
                reasons.append(reason)
            return check.kind == "all", "; ".join(reasons)
        case "not":
            holds, reason = _evaluate(check.children[0], device, observation, deadline, started)
            return not holds, f"not ({reason})"
        case "ui_text":
            return _ui_text(check.value, observation)
        case "activity":
            result = device.shell(FOCUS_COMMAND, timeout=_left(deadline, started, check.label))
            return _activity(check.value, result.stdout.decode("utf-8", "replace"))
    result = device.shell(check.command, timeout=_left(deadline, started, check.label))
    out = result.text
    if result.code != 0:
        err = (result.stderr.decode("utf-8", "replace").strip() or out)[:120]
        return False, f"{check.label} exited {result.code}: {err}"
    shown = repr(out if len(out) <= 120 else out[:117] + "...")
    match check.op:
        case "":
            return True, f"{check.label} exited 0"
        case "equals":
            holds = out == check.value
        case "contains":
            holds = check.value in out
        case _:
            holds = re.search(check.value, out) is not None
    return holds, f"{check.label} {'' if holds else 'not '}{check.op} {check.value!r}: {shown}"


def _ui_text(wanted: str, observation: Observation | None) -> tuple[bool, str]:
    if observation is None:
        return False, "no observation to look for on-screen text in"
    key = wanted.strip().casefold()
    for e in observation.elements:
        if key in (e.text.strip().casefold(), e.content_desc.strip().casefold()):
            return True, f"{wanted!r} is on screen"
    return False, f"{wanted!r} is not on screen"


def _normalize(pkg: str, cls: str | None) -> tuple[str, str | None]:
    return pkg, (pkg + cls if cls and cls.startswith(".") else cls)


def focused_components(dumpsys: str) -> list[tuple[str, str]]:
    """(package, full class) from `dumpsys window`'s mCurrentFocus= and mFocusedApp= lines."""
    found = []
    for line in dumpsys.splitlines():
        key, sep, rest = line.strip().partition("=")
        if sep and key in ("mCurrentFocus", "mFocusedApp"):
            for m in COMPONENT.finditer(rest):
                pkg, cls = _normalize(m.group(1), m.group(2).rstrip("."))
                found.append((pkg, cls or ""))
    return found


def _activity(wanted: str, dumpsys: str) -> tuple[bool, str]:
    m = COMPONENT.fullmatch(wanted)
    pkg, cls = _normalize(m.group(1), m.group(2)) if m else (wanted, None)
    found = focused_components(dumpsys)
    for f_pkg, f_cls in found:
        if f_pkg == pkg and cls in (None, f_cls):
            return True, f"{f_pkg}/{f_cls} is in front"
    shown = ", ".join(f"{p}/{c}" for p, c in found) or "no activity"
    return False, f"{shown} in front, not {wanted}"
