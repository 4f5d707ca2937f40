"""The emulator actor host recipe (deploy/emulator/): a Dockerfile, its entrypoint and a compose file.

Nothing here builds the image or boots an emulator. The Dockerfile is parsed into instructions and
checked (stages, ARG/ENV scoping, COPY sources that exist and pass its ignore file, the SDK packages and
the AVD it makes, the project's packages); the compose file is parsed and its healthcheck run against a
stub adb. `entrypoint.sh` runs against stub `adb`, `emulator` and `python` written into tmp_path/bin:
each records its argv (and pid) in one log; the stub adb answers `getprop sys.boot_completed` with 1
once that emulator runs (0 before, and for the serials in FAKE_NOT_BOOTED), the stub emulator sleeps
until stopped (or dies, when told to). Every flag the entrypoint passes to `python -m actors` must be in `python -m actors --help`, and the
whole command must parse with ActorConfig, so the recipe cannot drift from the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import tyro
import yaml

from actors.config import ActorConfig
from tests import dockerfile
from tests.argv_words import value as _value
from tests.argv_words import values as _values
from tests.conftest import ROOT

HOST = ROOT / "deploy" / "emulator"
ENTRYPOINT = HOST / "entrypoint.sh"
DOCKERFILE = HOST / "Dockerfile"
IGNORE_FILE = HOST / "Dockerfile.dockerignore"
COMPOSE = HOST / "compose.yaml"

INHERITED_ENV = {"PATH"}
"""Variables the base image defines, which an instruction may use without declaring them."""
IMAGES = ROOT / "deploy" / "docker" / "Dockerfile"
"""The learner and actor images' Dockerfile: this one builds on its `actor` target."""

LOG_LINE = r"""line=$(printf '%s\x1f' "$(basename "$0")" "$$" "$@"); printf '%s\n' "$line" >> "$STUB_LOG"
"""
STUB_ADB = (
    "#!/bin/bash\n"
    + LOG_LINE
    + r"""serial=
if [ "$1" = -s ]; then serial=$2; shift 2; fi
case "$*" in
  start-server) ;;
  "shell getprop sys.boot_completed")  # booted: its emulator runs, unless FAKE_NOT_BOOTED names it
    if [ ! -e "$STUB_DIR/$serial.pid" ]; then printf '0\r\n'; exit 0; fi
    case " ${FAKE_NOT_BOOTED:-} " in *" $serial "*) printf '0\r\n' ;; *) printf '1\r\n' ;; esac ;;
  "emu avd snapshot save "*)
    mkdir -p "$ANDROID_AVD_HOME/$AVD_NAME.avd/snapshots/$5" && printf 'OK\r\n' ;;
  "emu kill") kill "$(cat "$STUB_DIR/$serial.pid")" && printf 'OK: killing emulator, bye bye\r\n' ;;
esac
"""
)
STUB_EMULATOR = (
    "#!/bin/bash\n"
    + LOG_LINE
    + r"""port= prev=
for a in "$@"; do [ "$prev" = -port ] && port=$a; prev=$a; done
echo "$$" > "$STUB_DIR/emulator-$port.tmp" && mv "$STUB_DIR/emulator-$port.tmp" "$STUB_DIR/emulator-$port.pid"
echo "fake emulator on port $port"
if [ "$port" = "${FAKE_EMULATOR_DIES:-}" ]; then
  sleep "${FAKE_EMULATOR_DIE_AFTER:-0}"
  echo "fake emulator: qemu crashed"
  exit 3
fi
exec sleep 60
"""
)
STUB_PYTHON = (
    "#!/bin/bash\n"
    + LOG_LINE
    + r"""printf 'actor-env\x1f%s\n' "${ADBUTILS_ADB_PATH:-}" >> "$STUB_LOG"
if [ -n "${FAKE_ACTOR_WAITS:-}" ]; then
  sleep 20 & sleeper=$!
  trap 'kill $sleeper; printf "actor-sigterm\n" >> "$STUB_LOG"; exit 0' TERM
  wait $sleeper
  exit 9
fi
"""
)


# ---- running the entrypoint against stubs --------------------------------------------------------------


@dataclass
class Run:
    rc: int
    output: str
    pid: int
    records: list[list[str]]
    emulator_pids: list[int]
    alive_after: list[int]
    """Emulators still running once the entrypoint had exited or exec'd the actor."""

    def calls(self, prog: str) -> list[list[str]]:
        """argv (after the program name and its pid) of every call of a stub."""
        return [r[2:] for r in self.records if r[0] == prog]

    @property
    def actor(self) -> list[str]:
        (argv,) = self.calls("python")
        return argv

    def emulator_ports(self) -> list[str]:
        """The ports the emulators were started on, in order (they start concurrently and log in any)."""
        return sorted((_value(argv, "-port") for argv in self.calls("emulator")), key=int)


def _alive(pid: int) -> bool:
    """Running (a zombie, exited and not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _install_stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("adb", STUB_ADB), ("emulator", STUB_EMULATOR), ("python", STUB_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    avd_home = tmp_path / "avd"
    (avd_home / "phone.avd").mkdir(parents=True, exist_ok=True)
    kvm = tmp_path / "kvm"
    kvm.touch()
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STUB_LOG": str(tmp_path / "stubs.log"),
        "STUB_DIR": str(tmp_path),
        "ANDROID_AVD_HOME": str(avd_home),
        "AVD_NAME": "phone",
        "KVM_DEVICE": str(kvm),
        "EMULATOR_LOG_DIR": str(tmp_path / "emulator-logs"),
        "LEARNER_HOST": "learner.example",
        "BOOT_POLL": "0.05",
        "WATCH_INTERVAL": "0.1",
    }


def run_entrypoint(tmp_path: Path, env: dict[str, str] | None = None, args=(), timeout: float = 20) -> Run:
    """Run entrypoint.sh (its own session) until it exits or execs a stub python that exits; then stop
    whatever is left (the emulator watcher, stub emulators) and read the records."""
    base = _install_stubs(tmp_path)
    full_env = {**base, **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    out_path = tmp_path / "entrypoint.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [str(ENTRYPOINT), *args],
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        emulator_pids = [int(p.read_text()) for p in sorted(tmp_path.glob("emulator-*.pid"))]
        alive_after = [pid for pid in emulator_pids if _alive(pid)]
        for group in [proc.pid, *emulator_pids]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
    log = Path(full_env["STUB_LOG"])
    records = (
        [line.rstrip("\x1f").split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []
    )
    return Run(rc, out_path.read_text(), proc.pid, records, emulator_pids, alive_after)


@pytest.fixture(scope="module")
def actors_help() -> str:
    """`python -m actors --help`, wide enough that no flag name wraps."""
    env = {**os.environ, "COLUMNS": "300", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-m", "actors", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Run:
    """Three emulators booted from a snapshot, CURVE keys, and extra actor flags after the image name."""
    tmp = tmp_path_factory.mktemp("full")
    (tmp / "avd" / "phone.avd" / "snapshots" / "clean").mkdir(parents=True)
    env = {
        "NUM_EMULATORS": "3",
        "SNAPSHOT": "clean",
        "EMULATOR_ARGS": "-memory 3072 -cores 2",
        "INGEST_PORT": "7655",
        "PARAMS_PORT": "7656",
        "TASKS": "/tasks/mine.json",
        "CURVE_SECRET_KEY": "/etc/distrl/actor/actor.key_secret",
        "CURVE_SERVER_KEY": "/etc/distrl/actor/learner.key",
    }
    run = run_entrypoint(tmp, env, args=["--max-episodes", "7", "--adb.screenshot", "216", "480"])
    assert run.rc == 0, run.output
    return run


# ---- the entrypoint --------------------------------------------------------------------------------------


def test_entrypoint_is_an_executable_bash_script_that_parses():
    text = ENTRYPOINT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert os.access(ENTRYPOINT, os.X_OK), "entrypoint.sh must be executable"
    assert "set -euo pipefail" in text
    result = subprocess.run(["bash", "-n", str(ENTRYPOINT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_boots_n_emulators_on_adb_ports_waits_and_execs_the_actor(tmp_path):
    run = run_entrypoint(tmp_path, {"NUM_EMULATORS": "2"})
    assert run.rc == 0, run.output
    assert run.calls("adb")[0] == ["start-server"]
    assert run.emulator_ports() == ["5554", "5556"]
    for argv in run.calls("emulator"):
        assert argv[:2] == ["-avd", "phone"]
        for flag in ("-no-window", "-no-audio", "-no-boot-anim", "-read-only", "-no-snapshot-save"):
            assert flag in argv, (flag, argv)
        assert _value(argv, "-gpu") == "swiftshader_indirect"
        assert "-no-snapshot-load" in argv and "-snapshot" not in argv  # no SNAPSHOT: a cold boot
    asked = [a[1] for a in run.calls("adb") if a[2:] == ["shell", "getprop", "sys.boot_completed"]]
    # each asked until booted (more than once when its stub emulator was slow to start), in order
    assert list(dict.fromkeys(asked)) == ["emulator-5554", "emulator-5556"]
    # the actor comes after every boot check, in place of the entrypoint (exec: same pid)
    order = [r[0] for r in run.records]
    assert order.index("python") > max(i for i, r in enumerate(run.records) if "sys.boot_completed" in r)
    (record,) = [r for r in run.records if r[0] == "python"]
    assert int(record[1]) == run.pid
    argv = run.actor
    assert argv[:2] == ["-m", "actors"]
    assert _values(argv, "--adb.serials") == ["emulator-5554", "emulator-5556"]
    assert _value(argv, "--backend") == "adb"
    assert (_value(argv, "--host"), _value(argv, "--ingest-port"), _value(argv, "--params-port")) == (
        "learner.example",
        "7555",
        "7556",
    )
    for flag in ("--adb.snapshot", "--curve-secret-key", "--curve-server-key"):
        assert flag not in argv
    # adbutils, if it ever starts a server, uses the same adb as the one the entrypoint started
    (env_record,) = [r for r in run.records if r[0] == "actor-env"]
    assert env_record[1] == str(tmp_path / "bin" / "adb")
    # screen on, keyguard off, animations off, on every device, before the actor starts
    prepared = [a for a in run.calls("adb") if a[2:3] == ["shell"] and "stayon" in " ".join(a)]
    assert [a[1] for a in prepared] == ["emulator-5554", "emulator-5556"]
    assert all("animator_duration_scale 0" in a[3] for a in prepared)


def test_snapshot_keys_and_extra_flags_reach_emulators_and_actor(full_run):
    assert full_run.emulator_ports() == ["5554", "5556", "5558"]
    for argv in full_run.calls("emulator"):
        assert _value(argv, "-snapshot") == "clean" and "-no-snapshot-load" not in argv
        assert "-no-snapshot-save" in argv and "-read-only" in argv
        assert argv[-4:] == ["-memory", "3072", "-cores", "2"]  # EMULATOR_ARGS, word-split
    argv = full_run.actor
    assert _values(argv, "--adb.serials") == ["emulator-5554", "emulator-5556", "emulator-5558"]
    assert _value(argv, "--adb.snapshot") == "clean"
    assert _value(argv, "--tasks") == "/tasks/mine.json"
    assert argv[-5:] == ["--max-episodes", "7", "--adb.screenshot", "216", "480"]


def test_every_actor_flag_is_in_the_cli_and_the_command_parses(full_run, actors_help):
    argv = full_run.actor[2:]
    flags = [w for w in argv if w.startswith("--")]
    assert len(flags) >= 10
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", actors_help), f"{flag} is not in --help"
    cfg = tyro.cli(ActorConfig, args=argv)
    assert (cfg.host, cfg.ingest_port, cfg.params_port) == ("learner.example", 7655, 7656)
    assert cfg.env == "adb" and cfg.adb.serials == ("emulator-5554", "emulator-5556", "emulator-5558")
    assert cfg.adb.snapshot == "clean" and cfg.adb.screenshot == (216, 480) and cfg.max_episodes == 7
    assert (cfg.adb.host, cfg.adb.port) == ("127.0.0.1", 5037)  # the server the entrypoint started
    assert cfg.curve_secret_key == "/etc/distrl/actor/actor.key_secret"
    assert cfg.curve_server_key == "/etc/distrl/actor/learner.key"


def test_missing_kvm_is_one_clear_message_and_boots_nothing(tmp_path):
    run = run_entrypoint(tmp_path, {"KVM_DEVICE": str(tmp_path / "no-kvm")})
    assert run.rc == 1, run.output
    lines = run.output.strip().splitlines()
    assert len(lines) == 1, run.output
    assert lines[0].startswith("entrypoint: error: ")
    assert f"{tmp_path / 'no-kvm'} is missing" in lines[0] and "--device /dev/kvm" in lines[0]
    assert run.calls("emulator") == [] and run.calls("python") == []


def test_boot_timeout_names_the_device_shows_its_log_and_stops_the_emulators(tmp_path):
    t0 = time.monotonic()
    run = run_entrypoint(tmp_path, {"BOOT_TIMEOUT": "1", "FAKE_NOT_BOOTED": "emulator-5556"})
    assert time.monotonic() - t0 < 10
    assert run.rc == 1, run.output
    assert "entrypoint: error: emulator-5556: not booted after BOOT_TIMEOUT=1 s" in run.output
    assert "(sys.boot_completed: '0')" in run.output
    assert "fake emulator on port 5556" in run.output  # the end of its log
    assert "emulator-5554: booted" in run.output
    assert run.calls("python") == []
    assert len(run.emulator_pids) == 2 and run.alive_after == [], "the emulators were left running"


def test_an_emulator_that_exits_while_booting_stops_the_start(tmp_path):
    run = run_entrypoint(tmp_path, {"FAKE_EMULATOR_DIES": "5554", "FAKE_NOT_BOOTED": "emulator-5554"})
    assert run.rc == 1, run.output
    assert "entrypoint: error: emulator-5554: the emulator exited while booting" in run.output
    assert "fake emulator: qemu crashed" in run.output
    assert run.calls("python") == [] and run.alive_after == []


def test_an_emulator_that_dies_later_stops_the_actor(tmp_path):
    """The container then exits, and its restart policy boots everything again."""
    env = {"FAKE_EMULATOR_DIES": "5556", "FAKE_EMULATOR_DIE_AFTER": "3", "FAKE_ACTOR_WAITS": "1"}
    run = run_entrypoint(tmp_path, env)
    assert run.rc == 0, run.output
    assert "entrypoint: emulator-5556 exited; stopping the actor" in run.output
    assert [r[0] for r in run.records].count("actor-sigterm") == 1


def test_save_snapshot_cold_boots_one_writable_emulator_saves_and_stops_it(tmp_path):
    run = run_entrypoint(tmp_path, {"LEARNER_HOST": None}, args=["save-snapshot", "clean"])
    assert run.rc == 0, run.output
    (argv,) = run.calls("emulator")
    assert _value(argv, "-port") == "5554" and "-no-snapshot-load" in argv
    assert "-read-only" not in argv and "-snapshot" not in argv
    emu = [a[2:] for a in run.calls("adb") if a[2:3] == ["emu"]]
    assert emu == [["emu", "avd", "snapshot", "save", "clean"], ["emu", "kill"]]
    assert (tmp_path / "avd" / "phone.avd" / "snapshots" / "clean").is_dir()
    assert "saved snapshot clean" in run.output and run.calls("python") == []
    assert run.alive_after == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LEARNER_HOST": None}, "LEARNER_HOST is not set"),
        ({"NUM_EMULATORS": "17"}, "does not fit adb's emulator ports 5554..5584"),
        ({"EMULATOR_PORT": "5555"}, "does not fit adb's emulator ports"),
        ({"BOOT_TIMEOUT": "soon"}, "BOOT_TIMEOUT must be a whole number"),
        ({"SNAPSHOT": "clean"}, "SNAPSHOT=clean: no such snapshot"),
        ({"AVD_NAME": "Pixel_9"}, "no AVD 'Pixel_9'"),
    ],
)
def test_bad_settings_are_one_clear_message(tmp_path, env, message):
    run = run_entrypoint(tmp_path, env)
    assert run.rc == 1, run.output
    assert run.output.count("entrypoint: error: ") == 1 and message in run.output, run.output
    assert run.calls("emulator") == [] and run.calls("python") == []


# ---- the Dockerfile --------------------------------------------------------------------------------------


def test_dockerfile_declares_its_variables_and_builds_on_the_actor_image():
    assert [name for name, _ in dockerfile.stages(DOCKERFILE)] == ["sdk", None]
    dockerfile.check_variables(DOCKERFILE, INHERITED_ENV)
    (_, final) = dockerfile.stages(DOCKERFILE)[-1]
    assert final[0][2] == "${ACTOR_IMAGE}"
    actor_tag = dockerfile.of_kind(dockerfile.prelude(DOCKERFILE), "ARG")["ACTOR_IMAGE"]
    assert f"--target actor -t {actor_tag} ." in IMAGES.read_text(), "the tag the actor image is built with"
    assert f"--target actor -t {actor_tag} ." in DOCKERFILE.read_text()  # its build comment says so too


def test_dockerfile_run_copy_and_entrypoint_are_well_formed():
    copied = dockerfile.check_run_and_copy(DOCKERFILE, IGNORE_FILE, ROOT)
    # the final stage: PID 1 is tini (the actor image's), which runs the entrypoint where COPY put it
    final = dockerfile.stages(DOCKERFILE)[-1][1]
    (entrypoint,) = [json.loads(args) for _, word, args in final if word == "ENTRYPOINT"]
    assert entrypoint == ["/usr/bin/tini", "--", copied["deploy/emulator/entrypoint.sh"]]
    assert any(word == "RUN" and " tini" in args for _, word, args in dockerfile.stages(IMAGES)[0][1])
    (copy_line,) = [args for _, word, args in final if word == "COPY" and "entrypoint.sh" in args]
    assert "--chmod=0755" in copy_line
    assert [args for _, word, args in final if word == "USER"] == ["root"]  # /dev/kvm and the AVD's state


def test_dockerfile_installs_the_sdk_and_an_avd_on_the_actor_image():
    (_, sdk), (_, final) = dockerfile.stages(DOCKERFILE)
    args = dockerfile.of_kind(sdk, "ARG")
    assert {"API_LEVEL", "IMAGE_TAG", "ABI", "AVD_NAME"} <= set(args)
    assert (args["IMAGE_TAG"], args["ABI"]) == ("google_apis", "x86_64")
    runs = " ".join(a for _, w, a in sdk if w == "RUN")
    package = '"system-images;android-${API_LEVEL};${IMAGE_TAG};${ABI}"'
    assert re.search(rf"sdkmanager --install platform-tools emulator {re.escape(package)}", runs)
    assert "sdkmanager --licenses" in runs and "sha256sum -c" in runs
    assert re.search(
        rf'avdmanager create avd --name "\$\{{AVD_NAME\}}" .*--package {re.escape(package)}', runs
    )
    # the AVD the first stage makes is the one the final stage names, and the entrypoint's default
    assert dockerfile.of_kind(final, "ARG")["AVD_NAME"] == args["AVD_NAME"]
    env = dockerfile.of_kind(final, "ENV")
    assert env["AVD_NAME"] == "${AVD_NAME}" and env["ANDROID_AVD_HOME"] == "/opt/android-avd"
    assert re.search(rf"^AVD_NAME=\$\{{AVD_NAME:-{args['AVD_NAME']}\}}$", ENTRYPOINT.read_text(), re.M)
    assert any(w == "COPY" and "--from=sdk /opt/android-avd /opt/android-avd" in a for _, w, a in final)
    assert env["JAX_PLATFORMS"] == "cpu"  # actors infer on the CPU (BUILD.md)
    assert env["PATH"].endswith(":${PATH}"), "the actor image's /opt/venv/bin stays on PATH"
    assert not any(w == "RUN" and "pip install" in a for _, w, a in final), "the project is the actor image's"


# ---- the compose file ------------------------------------------------------------------------------------


def _service() -> dict:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert list(doc["services"]) == ["actor-host"]
    return doc["services"]["actor-host"]


def _entrypoint_defaults() -> dict[str, str]:
    """The variables the entrypoint reads, with their defaults: NAME=${NAME:-DEFAULT} lines."""
    found = re.findall(r"^([A-Z_]+)=\$\{\1:-([^}]*)\}$", ENTRYPOINT.read_text(), re.M)
    return dict(found)


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_service_builds_this_dockerfile_with_kvm_and_a_restart_policy():
    svc = _service()
    build = svc["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE
    declared = set(dockerfile.of_kind(dockerfile.prelude(DOCKERFILE), "ARG")).union(
        *(dockerfile.of_kind(stage, "ARG") for _, stage in dockerfile.stages(DOCKERFILE))
    )
    assert set(build["args"]) <= declared, sorted(set(build["args"]) - declared)
    assert all(isinstance(v, str) for v in build["args"].values())
    assert [d.split(":")[0] for d in svc["devices"]] == ["/dev/kvm"]
    assert "privileged" not in svc
    assert svc["restart"] == "unless-stopped"
    assert _seconds(svc["stop_grace_period"]) > 5  # the actor's --flush-timeout


def test_compose_environment_is_what_the_entrypoint_reads_with_its_defaults():
    svc = _service()
    defaults = _entrypoint_defaults()
    env = svc["environment"]
    assert set(env) <= set(defaults), sorted(set(env) - set(defaults))
    assert {"LEARNER_HOST", "INGEST_PORT", "PARAMS_PORT", "NUM_EMULATORS", "SNAPSHOT"} <= set(env)
    assert env["LEARNER_HOST"].startswith("${LEARNER_HOST:?"), "a missing learner address stops compose"
    for name, value in env.items():
        assert isinstance(value, str), (name, value)
        m = re.fullmatch(rf"\$\{{{name}:-([^}}]*)\}}", value)
        if m:
            assert m.group(1) == defaults[name], (
                f"{name}: compose says {m.group(1)!r}, entrypoint {defaults[name]!r}"
            )
    assert (defaults["INGEST_PORT"], defaults["PARAMS_PORT"]) == ("7555", "7556")  # not adb's 5554..5585


@pytest.mark.parametrize(("not_booted", "status"), [("", 0), ("emulator-5558", 1)])
def test_compose_healthcheck_asks_every_emulator_for_sys_boot_completed(tmp_path, not_booted, status):
    svc = _service()
    check = svc["healthcheck"]
    kind, script = check["test"]
    assert kind == "CMD-SHELL" and "sys.boot_completed" in script
    assert not re.search(r"(?<!\$)\$(?!\$)", script.replace("$$", "")), (
        "a single $ would be compose's to expand"
    )
    assert _seconds(check["start_period"]) >= int(_entrypoint_defaults()["BOOT_TIMEOUT"])
    env = _install_stubs(tmp_path)
    env.update(NUM_EMULATORS="3", FAKE_NOT_BOOTED=not_booted)
    for port in (5554, 5556, 5558):
        (tmp_path / f"emulator-{port}.pid").touch()  # their emulators run (the stub adb's test)
    result = subprocess.run(
        ["sh", "-c", script.replace("$$", "$")], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == status, result.stdout + result.stderr
    log = [line.split("\x1f") for line in (tmp_path / "stubs.log").read_text().splitlines()]
    asked = [r[3] for r in log if r[0] == "adb" and "sys.boot_completed" in r]
    assert asked == ["emulator-5554", "emulator-5556", "emulator-5558"]
