"""The SLURM recipe (deploy/slurm/distrl.sbatch) against stubbed srun, scontrol and python: no SLURM needed.

The stubs, written into tmp_path/bin, record what they were asked to do as JSON lines in one log:
`srun` runs each task of its step as a local process with the SLURM_* variables a real step would set
(and forwards SIGTERM to them, as srun does); `scontrol show hostnames` expands node lists; the fake
`python` (the recipe's PYTHON) writes real CURVE keys for `-m learner keys`, plays a learner that writes
its endpoints.json after a delay and waits for SIGTERM, and plays actors and relays that wait for SIGTERM.
The tests then check what each process was started with, and in which order things happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, read_jsonl

SCRIPT = ROOT / "deploy" / "slurm" / "distrl.sbatch"

KNOWN_SRUN_OPTIONS = {
    "--distribution",
    "--export",
    "--het-group",
    "--job-name",
    "--kill-on-bad-exit",
    "--nodelist",
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--output",
    "--overlap",
    "--whole",
}
"""srun options (man srun) the recipe may use; a misspelled one would only fail on a real cluster."""

FAKE_SRUN = r"""#!{python}
import json, math, os, signal, subprocess, sys, time

def record(**kw):
    line = json.dumps({"prog": "srun", "time": time.time(), **kw}) + "\n"
    fd = os.open(os.environ["FAKE_SLURM_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())
    os.close(fd)

args = sys.argv[1:]
opts, i = {}, 0
while i < len(args) and args[i].startswith("--"):
    key, _, value = args[i].partition("=")
    opts[key] = value
    i += 1
cmd = args[i:]
record(argv=args, options=opts)
nodes = opts["--nodelist"].split(",")
ntasks = int(opts.get("--ntasks") or len(nodes))
per_node = int(opts.get("--ntasks-per-node") or math.ceil(ntasks / len(nodes)))
extra_env = dict(kv.split("=", 1) for kv in opts.get("--export", "ALL").split(",")[1:])
children = []
for task in range(ntasks):
    env = dict(os.environ, **extra_env, SLURM_PROCID=str(task), SLURM_NTASKS=str(ntasks),
               SLURM_LOCALID=str(task % per_node), SLURM_NODEID=str(task // per_node),
               SLURMD_NODENAME=nodes[task // per_node], SLURM_STEP_NODELIST=opts["--nodelist"])
    out = open(opts["--output"].replace("%t", str(task)), "ab") if "--output" in opts else None
    children.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None))

def forward(signum, frame):
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)

for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, forward)
codes = [child.wait() for child in children]
sys.exit(max(c if c >= 0 else 128 - c for c in codes))
"""

FAKE_SCONTROL = r"""#!{python}
import os, re, sys

def expand(nodelist):
    parts = re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", nodelist)
    for part in parts:
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            yield part
            continue
        prefix, spec, suffix = m.groups()
        for item in spec.split(","):
            lo, _, hi = item.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                yield f"{prefix}{n:0{len(lo)}d}{suffix}"

assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
target = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("SLURM_JOB_NODELIST", "")
for host in expand(target):
    print(host)
"""

FAKE_PYTHON = r"""#!{python}
import json, os, signal, sys, time
from pathlib import Path

argv = sys.argv[1:]
LOG = os.environ["FAKE_SLURM_LOG"]
RUN_DIR = Path(os.environ["RUN_DIR"])

def record(event, **kw):
    env = {k: os.environ.get(k) for k in ("SLURMD_NODENAME", "SLURM_PROCID", "SLURM_LOCALID", "JAX_PLATFORMS")}
    line = json.dumps({"prog": "python", "event": event, "argv": argv, "pid": os.getpid(),
                       "time": time.time(), **env, **kw}) + "\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())
    os.close(fd)

def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default

def events(name):
    text = open(LOG).read().rpartition("\n")[0]  # a stub may be mid-append
    return sum(1 for line in text.splitlines() if json.loads(line).get("event") == name)

stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append("TERM"))

def wait_for_term(what):
    while not stop:
        time.sleep(0.02)
    record(what + "-stop")
    sys.exit(0)

if argv[:3] == ["-m", "learner", "keys"]:  # real keys (fast, no jax), so their files and modes are real
    record("keys", umask=os.umask(0o077))
    os.execv("{python}", ["{python}", *argv])
elif argv[:2] == ["-m", "learner"]:
    record("learner-start")
    if os.environ.get("FAKE_LEARNER") == "fail-early":
        sys.exit(3)
    bound_at = time.time() + float(os.environ.get("FAKE_ENDPOINTS_DELAY", "0.3"))
    while time.time() < bound_at and not stop:
        time.sleep(0.02)
    if stop:
        record("learner-stop")
        sys.exit(0)
    rank = int(opt("--process-id"))
    folder = Path(opt("--run-dir")) / (f"process-{rank}" if rank else "")
    folder.mkdir(parents=True, exist_ok=True)
    ports = {"ingest_port": int(opt("--ingest-port")) or 40000 + 2 * rank,
             "params_port": int(opt("--params-port")) or 40001 + 2 * rank, "bind": opt("--bind")}
    (folder / "endpoints.json.tmp").write_text(json.dumps(ports))
    (folder / "endpoints.json.tmp").replace(folder / "endpoints.json")
    record("endpoints-written", file=str(folder / "endpoints.json"))
    exit_after = int(os.environ.get("FAKE_LEARNER_EXIT_AFTER_ACTORS", "0"))
    while not stop:
        if exit_after and events("actor-start") >= exit_after:
            record("learner-exit")
            sys.exit(int(os.environ.get("FAKE_LEARNER_RC", "0")))
        time.sleep(0.02)
    record("learner-stop")
    sys.exit(0)
elif argv[:3] == ["-m", "actors", "relay"]:
    record("relay-start")
    wait_for_term("relay")
elif argv[:2] == ["-m", "actors"]:
    present = sorted(str(p) for p in [RUN_DIR / "endpoints.json", *RUN_DIR.glob("process-*/endpoints.json")]
                     if p.exists())
    record("actor-start", endpoints_present=present)
    wait_for_term("actor")
else:
    record("unexpected")
    sys.exit(99)
"""


def _write_stubs(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("fake-python", FAKE_PYTHON)):
        path = bin_dir / name
        path.write_text(text.replace("{python}", sys.executable))
        path.chmod(0o755)


class Run:
    """One run of the recipe: exit status, its output, and the stubs' records in the order written."""

    def __init__(self, rc: int, output: str, records: list[dict], run_dir: Path):
        self.rc, self.output, self.records, self.run_dir = rc, output, records, run_dir

    def python(self, event: str) -> list[dict]:
        return [r for r in self.records if r["prog"] == "python" and r["event"] == event]

    def sruns(self, job_name: str) -> list[dict]:
        return [r for r in self.records if r["prog"] == "srun" and r["options"].get("--job-name") == job_name]


def run_recipe(
    tmp_path: Path,
    env: dict[str, str],
    stop_when=None,
    timeout: float = 20.0,
    nodelist: str = "node[1-3]",
) -> Run:
    """Run the recipe as the batch step of job 4242 on `nodelist`; when `stop_when(records)` holds, send
    SIGTERM to the script alone (what `scancel --batch --signal=TERM` does)."""
    bin_dir = tmp_path / "bin"
    _write_stubs(bin_dir)
    log = tmp_path / "slurm.log"
    log.touch()
    run_dir = Path(env.get("RUN_DIR", tmp_path / "run"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    full_env = {
        **base,
        "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '/usr/bin:/bin')}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_SUBMIT_DIR": str(ROOT),
        "RUN_DIR": str(run_dir),
        "PYTHON": str(bin_dir / "fake-python"),
        "POLL_INTERVAL": "0.05",
        "FAKE_SLURM_LOG": str(log),
        **env,
    }
    full_env = {k: v for k, v in full_env.items() if v is not None}
    out_path = tmp_path / "recipe.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)], env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        if stop_when is not None:
            while not stop_when(_records(log)):
                assert proc.poll() is None, f"recipe exited early:\n{out_path.read_text()}"
                assert time.monotonic() < deadline, f"condition not reached:\n{out_path.read_text()}"
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the stubs left behind
    return Run(rc, out_path.read_text(), _records(log), run_dir)


def _records(log: Path) -> list[dict]:
    return read_jsonl(log)


def value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def values(argv: list[str], flag: str) -> list[str]:
    """The words after `flag` up to the next flag (a tuple-valued option such as --adb.avds)."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def count(event: str, n: int):
    return lambda records: sum(r.get("event") == event for r in records) >= n


# ---------------------------------------------------------------- runs shared by several tests


@pytest.fixture(scope="module")
def two_learners(tmp_path_factory) -> Run:
    """A plain allocation gpu01 gpu02 emu01..emu03: two learner processes, three emulator hosts with two
    actors (two emulators each) and a relay, CURVE on, a stale endpoints.json from an earlier run, stopped
    with SIGTERM to the batch script once every actor runs."""
    tmp = tmp_path_factory.mktemp("two_learners")
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "endpoints.json").write_text('{"ingest_port": 1111, "params_port": 1112, "bind": "0.0.0.0"}')
    env = {
        "RUN_DIR": str(run_dir),
        "LEARNER_NODES": "2",
        "AVD": "Pixel_7",
        "ENVS_PER_NODE": "4",
        "ACTORS_PER_NODE": "2",
        "EXTRA_LEARNER_ARGS": "--time-limit 3600 --batch-size 64",
        "EXTRA_ACTOR_ARGS": "--tasks stock --adb.snapshot 'clean state'",
        "FAKE_ENDPOINTS_DELAY": "0.5",
    }
    stop = lambda records: count("actor-start", 6)(records) and count("relay-start", 3)(records)  # noqa: E731
    return run_recipe(tmp, env, stop_when=stop, nodelist="gpu[01-02],emu[01-03]")


@pytest.fixture(scope="module")
def heterogeneous(tmp_path_factory) -> Run:
    """A heterogeneous job (learners gpu1 gpu2, emulator hosts kvm7 kvm8), SimPhone actors, no CURVE; the
    learner ends on its own (status 5) once both actors run."""
    tmp = tmp_path_factory.mktemp("heterogeneous")
    env = {
        "SLURM_HET_SIZE": "2",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu[1-2]",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "kvm[7-8]",
        "BACKEND": "simphone",
        "ENVS_PER_NODE": "16",
        "CURVE": "0",
        "FAKE_LEARNER_EXIT_AFTER_ACTORS": "2",
        "FAKE_LEARNER_RC": "5",
    }
    return run_recipe(tmp, env, nodelist="gpu[1-2],kvm[7-8]")


@pytest.fixture(scope="module")
def cli_help() -> dict[str, str]:
    """--help of every command the recipe runs, wide enough that no flag name wraps."""
    commands = {
        "learner": ["-m", "learner", "--help"],
        "keys": ["-m", "learner", "keys", "--help"],
        "actors": ["-m", "actors", "--help"],
        "relay": ["-m", "actors", "relay", "--help"],
    }
    env = {**os.environ, "COLUMNS": "300", "JAX_PLATFORMS": "cpu"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, args in commands.items()
    }
    helps = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        helps[name] = out
    return helps


# ---------------------------------------------------------------- the script itself


def test_script_parses_and_sbatch_sees_its_directives():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # sbatch reads #SBATCH lines only up to the first command
    lines = SCRIPT.read_text().splitlines()
    first_command = next(
        i for i, line in enumerate(lines[1:], 1) if line.strip() and not line.startswith("#")
    )
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directives and max(directives) < first_command
    assert any("--signal=B:TERM@" in lines[i] for i in directives)


# ---------------------------------------------------------------- two learner processes, CURVE, relays


def test_keys_come_first_and_stay_private(two_learners):
    run = two_learners
    python_records = [r for r in run.records if r["prog"] == "python"]
    assert python_records[0]["event"] == "keys"
    first_srun = next(r["time"] for r in run.records if r["prog"] == "srun")
    assert python_records[0]["time"] < first_srun
    assert value(python_records[0]["argv"], "--actors") == "3"  # one key pair per emulator host
    assert python_records[0]["umask"] == 0o077
    keys = run.run_dir / "keys"
    secrets = sorted(p.name for p in keys.glob("*.key_secret"))
    assert secrets == ["actor-0.key_secret", "actor-1.key_secret", "actor-2.key_secret", "learner.key_secret"]
    for path in keys.glob("*.key_secret"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700


def test_learner_is_one_step_with_multihost_flags(two_learners):
    run = two_learners
    (step,) = run.sruns("learner")
    opts = step["options"]
    assert opts["--nodelist"] == "gpu01,gpu02"
    assert (opts["--nodes"], opts["--ntasks"], opts["--ntasks-per-node"]) == ("2", "2", "1")
    assert opts["--kill-on-bad-exit"] == "1"
    starts = sorted(run.python("learner-start"), key=lambda r: int(r["SLURM_PROCID"]))
    assert [(r["SLURM_PROCID"], r["SLURMD_NODENAME"]) for r in starts] == [("0", "gpu01"), ("1", "gpu02")]
    keys = run.run_dir / "keys"
    for r in starts:
        argv = r["argv"]
        assert value(argv, "--coordinator") == "gpu01:7558"
        assert value(argv, "--num-processes") == "2"
        assert value(argv, "--process-id") == r["SLURM_PROCID"]
        assert value(argv, "--run-dir") == str(run.run_dir)
        assert value(argv, "--bind") == "0.0.0.0"
        assert (value(argv, "--ingest-port"), value(argv, "--params-port")) == ("7555", "7556")
        assert value(argv, "--curve-secret-key") == str(keys / "learner.key_secret")
        assert value(argv, "--curve-authorized") == str(keys / "authorized")
        assert "--insecure" not in argv
        assert (value(argv, "--time-limit"), value(argv, "--batch-size")) == ("3600", "64")


def test_actors_spread_over_learners_after_endpoints(two_learners):
    run = two_learners
    written = run.python("endpoints-written")
    assert sorted(r["file"] for r in written) == [
        str(run.run_dir / "endpoints.json"),
        str(run.run_dir / "process-1" / "endpoints.json"),
    ]
    actors = run.python("actor-start")
    assert len(actors) == 6
    learner_of = {"emu01": "gpu01", "emu02": "gpu02", "emu03": "gpu01"}  # round-robin over learner processes
    keys = run.run_dir / "keys"
    seeds = set()
    for r in actors:
        argv, node, local = r["argv"], r["SLURMD_NODENAME"], int(r["SLURM_LOCALID"])
        assert r["time"] > max(w["time"] for w in written)
        assert len(r["endpoints_present"]) == 2  # both learner processes bound before any actor started
        assert value(argv, "--host") == learner_of[node]
        assert (value(argv, "--ingest-port"), value(argv, "--params-port")) == (
            "7555",
            "7556",
        )  # not the stale 1111
        assert value(argv, "--params-endpoint") == "tcp://127.0.0.1:7557"  # this host's relay
        host_index = int(node[-1]) - 1
        assert value(argv, "--curve-secret-key") == str(keys / f"actor-{host_index}.key_secret")
        assert value(argv, "--curve-server-key") == str(keys / "learner.key")
        assert value(argv, "--backend") == "adb"
        assert values(argv, "--adb.avds") == ["Pixel_7", "Pixel_7"]  # 4 emulators per host, 2 actors
        assert value(argv, "--adb.emulator-port") == str(5554 + 4 * local)  # disjoint console/adb ports
        assert value(argv, "--name") == f"{node}-{local}"
        assert value(argv, "--adb.snapshot") == "clean state"  # EXTRA_ACTOR_ARGS keeps shell quoting
        assert r["JAX_PLATFORMS"] == "cpu"
        seeds.add(value(argv, "--seed"))
    assert len(seeds) == 6
    steps = run.sruns("actors")
    assert sorted(s["options"]["--nodelist"] for s in steps) == ["emu01", "emu02", "emu03"]
    assert all(s["options"]["--ntasks"] == "2" for s in steps)


def test_one_relay_per_emulator_host(two_learners):
    run = two_learners
    relays = run.python("relay-start")
    assert sorted(r["SLURMD_NODENAME"] for r in relays) == ["emu01", "emu02", "emu03"]
    learner_of = {"emu01": "gpu01", "emu02": "gpu02", "emu03": "gpu01"}
    for r in relays:
        argv = r["argv"]
        assert value(argv, "--host") == learner_of[r["SLURMD_NODENAME"]]
        assert (value(argv, "--params-port"), value(argv, "--port")) == ("7556", "7557")
        assert value(argv, "--curve-secret-key").endswith(
            f"actor-{int(r['SLURMD_NODENAME'][-1]) - 1}.key_secret"
        )
    assert all("--overlap" in s["argv"] for s in run.sruns("relay"))


def test_sigterm_stops_actors_then_relays_then_learner(two_learners):
    run = two_learners
    assert run.rc == 0, run.output  # the learner's status: it stopped cleanly on SIGTERM
    actor_stops = run.python("actor-stop")
    relay_stops = run.python("relay-stop")
    learner_stops = run.python("learner-stop")
    assert (len(actor_stops), len(relay_stops), len(learner_stops)) == (6, 3, 2), run.output
    assert max(r["time"] for r in actor_stops) < min(r["time"] for r in relay_stops)
    assert max(r["time"] for r in relay_stops) < min(r["time"] for r in learner_stops)
    assert "got SIGTERM" in run.output


def test_srun_options_are_real(two_learners, heterogeneous):
    for run in (two_learners, heterogeneous):
        for r in run.records:
            if r["prog"] == "srun":
                assert set(r["options"]) <= KNOWN_SRUN_OPTIONS, r["options"]


def test_every_flag_exists_in_the_cli(two_learners, heterogeneous, cli_help):
    """Each --flag the recipe passes is one the command's --help lists, so the recipe cannot drift."""
    checked = set()
    for run in (two_learners, heterogeneous):
        for r in run.records:
            if r["prog"] != "python" or r["event"] not in (
                "keys",
                "learner-start",
                "actor-start",
                "relay-start",
            ):
                continue
            argv = r["argv"]
            command = (
                "keys" if argv[2:3] == ["keys"] else "relay" if argv[2:3] == ["relay"] else argv[1]
            )  # learner / actors
            known = set(re.findall(r"--[a-z0-9][a-z0-9.-]*", cli_help[command]))
            for word in argv:
                if word.startswith("--"):
                    assert word in known, f"{word} is not a flag of {command}: {argv}"
                    checked.add((command, word))
    assert {c for c, _ in checked} == {"keys", "learner", "actors", "relay"}


# ---------------------------------------------------------------- heterogeneous job, learner ends by itself


def test_heterogeneous_job_uses_its_components(heterogeneous):
    run = heterogeneous
    (learner_step,) = run.sruns("learner")
    assert learner_step["options"]["--het-group"] == "0"
    assert learner_step["options"]["--nodelist"] == "gpu1,gpu2"
    actor_steps = run.sruns("actors")
    assert {s["options"]["--het-group"] for s in actor_steps} == {"1"}
    assert sorted(s["options"]["--nodelist"] for s in actor_steps) == ["kvm7", "kvm8"]
    assert not run.sruns("relay")  # one actor per host: no relay by default
    assert not run.python("keys")
    for r in run.python("learner-start"):
        assert "--insecure" in r["argv"] and "--curve-secret-key" not in r["argv"]
        assert value(r["argv"], "--coordinator") == "gpu1:7558"
    hosts = {}
    for r in run.python("actor-start"):
        argv = r["argv"]
        hosts[r["SLURMD_NODENAME"]] = value(argv, "--host")
        assert (value(argv, "--backend"), value(argv, "--num-envs")) == ("simphone", "16")
        assert (
            "--adb.avds" not in argv and "--curve-secret-key" not in argv and "--params-endpoint" not in argv
        )
    assert hosts == {"kvm7": "gpu1", "kvm8": "gpu2"}


def test_learner_exit_stops_actors_and_sets_the_job_status(heterogeneous):
    run = heterogeneous
    assert run.rc == 5, run.output
    exits = run.python("learner-exit")
    stops = run.python("actor-stop")
    assert len(stops) == 2 and min(s["time"] for s in stops) > min(e["time"] for e in exits)
    assert "learner step ended with status 5" in run.output


# ---------------------------------------------------------------- defaults, reuse, failures


def test_single_learner_defaults_and_key_reuse(tmp_path):
    env = {"AVD": "Pixel_7", "RUN_DIR": str(tmp_path / "run")}
    first = run_recipe(tmp_path / "a", env, stop_when=count("actor-start", 2))
    assert first.rc == 0, first.output
    (learner,) = first.python("learner-start")
    assert learner["SLURMD_NODENAME"] == "node1"
    argv = learner["argv"]
    assert (value(argv, "--coordinator"), value(argv, "--num-processes"), value(argv, "--process-id")) == (
        "node1:7558",
        "1",
        "0",
    )
    for r in first.python("actor-start"):
        assert r["SLURMD_NODENAME"] in ("node2", "node3")
        assert value(r["argv"], "--host") == "node1"
        assert (value(r["argv"], "--ingest-port"), value(r["argv"], "--params-port")) == ("7555", "7556")
        assert "--params-endpoint" not in r["argv"]
        assert values(r["argv"], "--adb.avds") == ["Pixel_7"] * 8
    assert not first.sruns("relay")

    again = run_recipe(tmp_path / "b", env, stop_when=count("actor-start", 2))
    assert again.rc == 0, again.output
    assert not again.python("keys") and "reusing the CURVE keys" in again.output


def test_learner_that_dies_before_binding_starts_no_actors(tmp_path):
    run = run_recipe(tmp_path, {"AVD": "Pixel_7", "FAKE_LEARNER": "fail-early"})
    assert run.rc == 1, run.output
    assert "learner step ended (status 3) before process 0 wrote" in run.output
    assert not run.sruns("actors") and not run.python("actor-start")


def test_sigterm_while_the_learner_binds_stops_it_and_starts_no_actors(tmp_path):
    env = {"AVD": "Pixel_7", "FAKE_ENDPOINTS_DELAY": "60"}
    run = run_recipe(tmp_path, env, stop_when=count("learner-start", 1))
    assert run.rc == 0, run.output
    assert len(run.python("learner-stop")) == 1
    assert not run.sruns("actors") and not run.python("actor-start")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RUN_DIR": ""}, "RUN_DIR is required"),
        ({"SLURM_JOB_ID": None}, "submit this script with sbatch"),
        ({"AVD": ""}, "AVD is required with BACKEND=adb"),
        ({"LEARNER_NODES": "2"}, "every learner process needs emulator hosts of its own"),
        ({"ACTORS_PER_NODE": "3"}, "must be a positive multiple of ACTORS_PER_NODE"),
        ({"INGEST_PORT": "seven"}, "INGEST_PORT must be a whole number"),
        ({"RELAY": "1", "RELAY_PORT": "5560"}, "RELAY_PORT 5560 is one of the emulators' ports"),
    ],
)
def test_bad_settings_give_one_clear_message(tmp_path, env, message):
    run = run_recipe(tmp_path, {"AVD": "Pixel_7", **env})
    assert run.rc == 2, run.output
    errors = [line for line in run.output.splitlines() if line.startswith("distrl.sbatch: error:")]
    assert len(errors) == 1 and message in errors[0], run.output
    assert not run.records  # nothing was started, not even the keys
