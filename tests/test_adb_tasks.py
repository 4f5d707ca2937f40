"""Device task files: loading and validation, injection-proof binding, set-up and checks on the fake phone."""

from __future__ import annotations

import json
import re
import shlex
import time

import numpy as np
import pytest

from actors.envs.adb.device import AdbDevice
from actors.envs.adb.tasks import (
    SUITES_DIR,
    TaskFileError,
    bind,
    evaluate_check,
    focused_components,
    load_device_templates,
    run_setup,
)
from actors.envs.faults import DeviceCommandFailed, DeviceHang
from actors.envs.simphone.tasks import sample
from common.types import Observation, UIElement
from tests.fake_adb import FakeAdbServer, FakePhone, Screen, make_png

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    phone = FakePhone(screens={"home": Screen(b"<hierarchy/>", make_png(2, 2, (0, 0, 0)))}, current="home")
    with FakeAdbServer(phone) as s:
        yield s


@pytest.fixture
def phone(server):
    return server.phone


@pytest.fixture
def device(server):
    return AdbDevice(server.phone.serial, port=server.port, timeout=2)


def write(tmp_path, *templates, name="t.json", suite="test"):
    path = tmp_path / name
    path.write_text(json.dumps({"suite": suite, "templates": list(templates)}))
    return path


def template(**fields):
    return {"id": "t", "instruction": "do it", "success": {"ui_text": "Done"}, **fields}


def task_of(tmp_path, **fields):
    """The one template's task, bound with the first train value of each parameter."""
    (t,) = load_device_templates(write(tmp_path, template(**fields)))
    return bind(t, {n: v["train"][0] for n, v in t.params.items()})


def reply(stdout: str = "", code: int = 0, stderr: str = ""):
    return lambda phone, argv: (stdout.encode(), stderr.encode(), code)


# ---- the shipped suite ----


def test_stock_suite_loads_and_samples():
    templates = load_device_templates("stock")
    assert 6 <= len(templates) <= 10
    assert {t.suite for t in templates} == {"stock"}
    assert load_device_templates(SUITES_DIR / "stock.json") == templates
    assert load_device_templates(SUITES_DIR) == templates
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        tasks = [sample(templates, split, rng, bind) for _ in range(60)]
        assert all("{" not in t.instruction and t.setup and t.max_steps > 0 for t in tasks)
    assert "clock.open_alarms" not in {sample(templates, "train", rng, bind).template.id for _ in range(200)}


def test_sampling_is_deterministic_and_uses_split_values(tmp_path):
    path = write(
        tmp_path,
        template(
            id="a",
            instruction="say {w}",
            params={"w": {"train": ["x", "y"], "test": ["z"]}},
            success={"ui_text": "{w}"},
        ),
        template(id="b", split="test"),
    )
    templates = load_device_templates(path)
    draw = [sample(templates, "train", np.random.default_rng(7), bind).instruction for _ in range(3)]
    assert len(set(draw)) == 1
    train = {sample(templates, "train", np.random.default_rng(i), bind).instruction for i in range(40)}
    assert train == {"say x", "say y"}
    test = {sample(templates, "test", np.random.default_rng(i), bind).template.id for i in range(40)}
    assert test == {"a", "b"}
    with pytest.raises(ValueError, match="split"):
        sample(templates, "nope", np.random.default_rng(0), bind)


def test_unknown_suite_lists_the_shipped_ones():
    with pytest.raises(TaskFileError, match="stock"):
        load_device_templates("no_such_suite")


def test_duplicate_ids_across_files(tmp_path):
    write(tmp_path, template(), name="a.json")
    write(tmp_path, template(), name="b.json")
    with pytest.raises(TaskFileError, match=r"b\.json.*'t'.*a\.json"):
        load_device_templates(tmp_path)


# ---- validation: errors name the file, the template and the field ----

BAD = [
    ({"extra": 1}, "unknown fields"),
    ({"setup": [{"shell": "true", "why": 1}]}, r"setup\[0\].*unknown keys"),
    ({"setup": [{"reboot": True}]}, r"setup\[0\].*exactly one of"),
    ({"setup": [{"home": 1}]}, r"setup\[0\]\.home.*true"),
    ({"setup": [{"start": "com.android.settings"}]}, r"setup\[0\]\.start.*component"),
    ({"setup": [{"app": "settings"}]}, r"setup\[0\]\.app.*package"),
    ({"setup": [{"stop": "com.x;reboot"}]}, r"setup\[0\]\.stop.*package"),
    ({"setup": [{"setting": "global/airplane_mode_on"}]}, r"setup\[0\].*'value'"),
    ({"setup": [{"setting": "vendor/x", "value": "1"}]}, r"setup\[0\]\.setting.*NAMESPACE"),
    ({"setup": [{"setting": "global/a b", "value": "1"}]}, r"setup\[0\]\.setting.*NAMESPACE"),
    ({"setup": [{"snapshot": "../x"}]}, r"setup\[0\]\.snapshot.*snapshot name"),
    ({"success": {"setting": "global/wifi_on"}}, r"success.*'equals'"),
    ({"success": {"setting": "global/wifi_on", "equals": True}}, r"success\.equals.*string"),
    ({"success": {"shell": "x", "equals": "a", "contains": "b"}}, "at most one"),
    ({"success": {"shell": "x", "matches": "("}}, "bad regular expression"),
    ({"success": {"content": "content://a.b/c", "contains": "x"}}, "'projection'"),
    ({"success": {"content": "content://a.b/c", "projection": "x"}}, "exactly one of"),
    ({"success": {"content": "http://a.b/c", "projection": "x", "contains": "x"}}, "content URI"),
    ({"success": {"content": "content://a.b/c", "projection": "x;y", "contains": "x"}}, "projection"),
    ({"success": {"activity": "Settings"}}, "neither a package"),
    ({"success": {"all": []}}, r"success\.all.*non-empty list"),
    ({"success": {"any": [{"ui_text": "a"}, {"bogus": 1}]}}, r"success\.any\[1\].*exactly one of"),
    ({"success": {"not": {"ui_text": "a", "x": 1}}}, r"success\.not.*unknown keys"),
    ({"success": "settings.wifi == true"}, "'success' must be dict"),
    ({"instruction": "open {app}"}, r"instruction.*\{app\} names no parameter"),
    (
        {"instruction": "open {app.name}", "params": {"app": {"train": ["x"], "test": ["y"]}}},
        "no field 'name'",
    ),
    ({"instruction": "{a}", "params": {"a": {"train": [{"k": 1}], "test": [{"k": 1}]}}}, "not a scalar"),
    ({"instruction": "{a}", "params": {"a": {"train": ["x\ny"], "test": ["x"]}}}, "control character"),
    ({"params": {"a": {"train": ["x"]}}}, r"params\.a"),
    ({"max_steps": 0}, "max_steps"),
    ({"split": "train"}, "split"),
]


@pytest.mark.parametrize(("fields", "message"), BAD)
def test_bad_templates_are_refused_at_load(tmp_path, fields, message):
    path = write(tmp_path, template(**fields))
    with pytest.raises(TaskFileError, match=message) as e:
        load_device_templates(path)
    assert str(path) in str(e.value) and "template 't'" in str(e.value)


def test_bad_file_shape(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TaskFileError, match="not readable JSON"):
        load_device_templates(tmp_path / "x.json")
    (tmp_path / "x.json").write_text(json.dumps({"templates": [], "tasks": []}))
    with pytest.raises(TaskFileError, match="nothing else"):
        load_device_templates(tmp_path / "x.json")


def test_every_parameter_value_is_validated_at_load(tmp_path):
    """The bad value is the last of the test values: binding only the first one would miss it."""
    params = {"pkg": {"train": ["com.a.b"], "test": ["com.c.d", "com.e.f", "com.x; reboot"]}}
    with pytest.raises(TaskFileError, match=r"setup\[0\]\.app.*'com\.x; reboot'"):
        load_device_templates(write(tmp_path, template(params=params, setup=[{"app": "{pkg}"}])))


@pytest.mark.parametrize(
    ("cmd", "where"),
    [
        ("echo '{v}'", "inside '...'"),
        ('echo "x {v}"', 'inside "..."'),
        ("echo `cat {v}`", "inside `...`"),
        ("echo ${v}", "after '$'"),
        ("echo \\{v}", "after"),
    ],
)
def test_placeholders_must_stand_bare_in_shell(tmp_path, cmd, where):
    params = {"v": {"train": ["a"], "test": ["a"]}}
    with pytest.raises(TaskFileError, match=rf"setup\[0\]\.shell.*placeholder \{{v\}} {re.escape(where)}"):
        load_device_templates(write(tmp_path, template(params=params, setup=[{"shell": cmd}])))
    with pytest.raises(TaskFileError, match=r"success\.shell"):
        load_device_templates(write(tmp_path, template(params=params, success={"shell": cmd})))


# ---- injection: parameter values stay data ----

EVIL = 'x\'; reboot; echo "$(id)" `id` #'


def test_shell_placeholders_are_quoted(device, phone, tmp_path):
    params = {"v": {"train": [EVIL], "test": ["a"]}}
    task = task_of(
        tmp_path,
        params=params,
        setup=[{"shell": "echo {v}"}],
        success={"shell": "echo pre-{v}", "equals": "pre-{v}"},
    )
    run_setup(task, device)
    assert phone.commands == [f"echo {shlex.quote(EVIL)}"]
    assert evaluate_check(task.success, device, None, 2.0)[0]
    assert not any(c.startswith(("reboot", "id")) for c in phone.commands)


def test_setting_values_and_sql_literals_are_data(device, phone, tmp_path):
    seen = []
    phone.handlers["content"] = lambda p, argv: (
        seen.append(argv) or b"Row: 0 display_name=Dana O'Neil\n",
        b"",
        0,
    )
    task = task_of(
        tmp_path,
        params={"v": {"train": [EVIL], "test": ["a"]}, "name": {"train": ["Dana O'Neil"], "test": ["a"]}},
        setup=[{"setting": "global/note", "value": "{v}"}],
        success={
            "content": "content://com.android.contacts/data",
            "projection": "display_name",
            "where": "display_name={name} AND x={v}",
            "contains": "display_name={name}",
        },
    )
    run_setup(task, device)
    assert phone.settings["global/note"] == EVIL and len(phone.commands) == 1
    holds, reason = evaluate_check(task.success, device, None, 2.0)
    assert holds, reason
    evil_sql = "'" + EVIL.replace("'", "''") + "'"
    assert seen == [
        [
            "content",
            "query",
            "--uri",
            "content://com.android.contacts/data",
            "--projection",
            "display_name",
            "--where",
            f"display_name='Dana O''Neil' AND x={evil_sql}",
        ]
    ]


def test_setting_keys_and_packages_from_params_are_validated(tmp_path):
    bad_key = {"k": {"train": ["airplane_mode_on reboot"], "test": ["a"]}}
    with pytest.raises(TaskFileError, match="NAMESPACE/KEY"):
        load_device_templates(
            write(tmp_path, template(params=bad_key, success={"setting": "global/{k}", "equals": "1"}))
        )
    bad_component = {"c": {"train": ["com.a/.B -a x"], "test": ["com.a/.B"]}}
    with pytest.raises(TaskFileError, match="component"):
        load_device_templates(write(tmp_path, template(params=bad_component, setup=[{"start": "{c}"}])))


# ---- set-up on the fake phone ----


def test_every_setup_step(device, phone, tmp_path):
    for name in ("am", "monkey", "pm"):
        phone.handlers[name] = reply("Status: ok\nSuccess\n")
    loaded = []
    task = task_of(
        tmp_path,
        params={"p": {"train": ["com.android.settings"], "test": ["com.a.b"]}},
        setup=[
            {"stop": "{p}"},
            {"clear": "com.android.providers.contacts"},
            {"snapshot": "clean_boot"},
            {"home": True},
            {"setting": "global/airplane_mode_on", "value": 1},
            {"start": "{p}/.Settings"},
            {"app": "com.android.chrome"},
            {"shell": "echo ready"},
        ],
    )
    run_setup(task, device, load_snapshot=loaded.append)
    assert loaded == ["clean_boot"]
    assert phone.commands == [
        "am force-stop com.android.settings",
        "pm clear com.android.providers.contacts",
        "input keyevent 3",
        "settings put global airplane_mode_on 1",
        "am start -W -n com.android.settings/.Settings",
        "monkey -p com.android.chrome -c android.intent.category.LAUNCHER 1",
        "echo ready",
    ]
    assert phone.settings["global/airplane_mode_on"] == "1" and phone.keys == ["3"]


def test_snapshot_without_a_loader_is_a_clear_error(device, tmp_path):
    task = task_of(tmp_path, setup=[{"snapshot": "s"}])
    with pytest.raises(ValueError, match="cannot load snapshots"):
        run_setup(task, device)


def test_failing_step_names_it(device, phone, tmp_path):
    phone.handlers["am"] = reply("Starting: Intent\n")
    phone.faults.failing["am start"] = (1, b"Error: Activity class does not exist.\n")
    task = task_of(tmp_path, setup=[{"home": True}, {"start": "com.a.b/.Main"}, {"home": True}])
    with pytest.raises(
        DeviceCommandFailed, match=r"setup step #1 \(start com\.a\.b/\.Main\).*exit 1.*does not exist"
    ):
        run_setup(task, device)
    assert phone.keys == ["3"]  # stopped at the failure


def test_error_output_with_exit_zero_fails_am_pm_monkey_only(device, phone, tmp_path):
    phone.handlers["monkey"] = reply("** No activities found to run, monkey aborted.\n")
    with pytest.raises(DeviceCommandFailed, match="No activities found"):
        run_setup(task_of(tmp_path, setup=[{"app": "com.a.b"}]), device)
    phone.handlers["pm"] = reply(stderr="Failed\n")
    with pytest.raises(DeviceCommandFailed, match=r"clear com\.a\.b"):
        run_setup(task_of(tmp_path, setup=[{"clear": "com.a.b"}]), device)
    run_setup(task_of(tmp_path, setup=[{"shell": "echo Error: is just text here"}]), device)
    with pytest.raises(DeviceCommandFailed, match="exit 127"):
        run_setup(task_of(tmp_path, setup=[{"shell": "no-such-tool"}]), device)


def test_setup_deadline_covers_all_steps(device, phone, tmp_path):
    phone.faults.delay_s = 0.5
    task = task_of(tmp_path, setup=[{"home": True}] * 5)
    started = time.monotonic()
    with pytest.raises(DeviceHang) as e:
        run_setup(task, device, timeout=1.2)
    # One deadline for all five steps (2.5 s in all), not one per step; with a second's slack for a busy
    # machine.
    assert time.monotonic() - started < 2.4
    assert 1 <= len(phone.keys) < 5
    assert "setup step #" in " ".join([str(e.value), *getattr(e.value, "__notes__", [])])


# ---- checks ----


def test_setting_and_shell_checks(device, phone, tmp_path):
    phone.handlers["cmd"] = reply("Night mode: yes\n")
    check = task_of(tmp_path, success={"setting": "global/airplane_mode_on", "equals": "1"}).success
    assert evaluate_check(check, device, None, 2.0) == (
        False,
        "setting global/airplane_mode_on not equals '1': '0'",
    )
    phone.settings["global/airplane_mode_on"] = "1"
    assert evaluate_check(check, device, None, 2.0)[0]
    for op, value, holds in [
        ("equals", "Night mode: yes", True),
        ("equals", "Night mode", False),
        ("contains", "mode: y", True),
        ("matches", r"mode: (yes|no)$", True),
        ("matches", r"^mode", False),
    ]:
        check = task_of(tmp_path, success={"shell": "cmd uimode night", op: value}).success
        assert evaluate_check(check, device, None, 2.0)[0] is holds, (op, value)


def test_shell_check_exit_code(device, phone, tmp_path):
    phone.handlers["grep"] = reply(code=1)
    holds, reason = evaluate_check(
        task_of(tmp_path, success={"shell": "grep -q x /f"}).success, device, None, 2.0
    )
    assert not holds and "exited 1" in reason
    phone.handlers["grep"] = reply("x\n")
    assert evaluate_check(task_of(tmp_path, success={"shell": "grep -q x /f"}).success, device, None, 2.0)[0]
    check = task_of(tmp_path, success={"shell": "grep x /f", "equals": "x"}).success
    phone.handlers["grep"] = reply("x\n", code=2)
    assert not evaluate_check(check, device, None, 2.0)[0]  # output matches, but the command failed


FOCUS_SETTINGS = """\
  mCurrentFocus=Window{8d6e1a5 u0 com.android.settings/com.android.settings.Settings}
  mFocusedApp=ActivityRecord{4f1a2b3 u0 com.android.settings/.Settings t12}
"""
FOCUS_OLD = """\
  mCurrentFocus=Window{41b4 u0 StatusBar}
  mFocusedApp=AppWindowToken{42c8 token=Token{41f ActivityRecord{41e u0 com.android.chrome/com.google.android.apps.chrome.Main t3}}}
"""
FOCUS_NONE = "  mCurrentFocus=null\n  mFocusedApp=null\n"


def test_focused_components_parses_dumpsys_variants():
    assert focused_components(FOCUS_SETTINGS) == [
        ("com.android.settings", "com.android.settings.Settings"),
        ("com.android.settings", "com.android.settings.Settings"),
    ]
    assert focused_components(FOCUS_OLD) == [("com.android.chrome", "com.google.android.apps.chrome.Main")]
    assert focused_components(FOCUS_NONE) == []
    assert focused_components("garbage\nmCurrentFocus\n=x/y\n" + "A" * 10000) == []


@pytest.mark.parametrize(
    ("dumpsys", "wanted", "holds"),
    [
        (FOCUS_SETTINGS, "com.android.settings", True),
        (FOCUS_SETTINGS, "com.android.settings/.Settings", True),
        (FOCUS_SETTINGS, "com.android.settings/com.android.settings.Settings", True),
        (FOCUS_SETTINGS, "com.android.settings/.SubSettings", False),
        (FOCUS_SETTINGS, "com.android", False),
        (FOCUS_OLD, "com.android.chrome", True),
        (FOCUS_NONE, "com.android.settings", False),
    ],
)
def test_activity_check(device, phone, tmp_path, dumpsys, wanted, holds):
    seen = []
    phone.handlers["dumpsys"] = lambda p, argv: (seen.append(argv) or dumpsys.encode(), b"", 0)
    result, reason = evaluate_check(
        task_of(tmp_path, success={"activity": wanted}).success, device, None, 2.0
    )
    assert result is holds, reason
    assert seen[0][:2] == ["dumpsys", "window"]


def test_ui_text_needs_no_device(tmp_path):
    obs = Observation(
        "x",
        (
            UIElement("android.widget.TextView", text=" Wi-Fi "),
            UIElement("android.widget.ImageView", content_desc="Back"),
        ),
    )
    for wanted, holds in [("wi-fi", True), ("BACK", True), ("Wi", False)]:
        check = task_of(tmp_path, success={"ui_text": wanted}).success
        assert evaluate_check(check, None, obs, 1.0)[0] is holds
    assert evaluate_check(check, None, None, 1.0) == (False, "no observation to look for on-screen text in")


def test_combinators(device, phone, tmp_path):
    obs = Observation("x", (UIElement("t", text="A"),))
    on, off = {"ui_text": "A"}, {"ui_text": "B"}
    cases = [
        ({"all": [on, on]}, True),
        ({"all": [on, off]}, False),
        ({"any": [off, on]}, True),
        ({"any": [off, off]}, False),
        ({"not": off}, True),
        ({"not": {"any": [on, off]}}, False),
        ({"all": [{"not": off}, {"setting": "global/airplane_mode_on", "equals": "0"}]}, True),
    ]
    for tree, holds in cases:
        result, reason = evaluate_check(task_of(tmp_path, success=tree).success, device, obs, 2.0)
        assert result is holds, (tree, reason)
    # short-circuit: a failing first child of `all` runs no command
    evaluate_check(task_of(tmp_path, success={"all": [off, {"shell": "echo x"}]}).success, device, obs, 2.0)
    assert "echo x" not in phone.commands


def test_check_timeout_is_a_device_hang(device, phone, tmp_path):
    phone.faults.delay_s = 2
    check = task_of(tmp_path, success={"setting": "global/airplane_mode_on", "equals": "0"}).success
    started = time.monotonic()
    with pytest.raises(DeviceHang):
        evaluate_check(check, device, None, 0.3)
    assert time.monotonic() - started < 1.5
