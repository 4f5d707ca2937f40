"""Shared test helpers: free ports, a learner subprocess, and cleanup of every process a test starts."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# One JAX persistent compilation cache for the whole test session, this process and every learner, actor
# and benchmark it starts (they inherit the environment): dozens of tests compile the same train and
# policy steps, and a cache hit (the same executable) takes a fraction of a compile. Set before anything
# imports JAX; removed at exit, so nothing outlives the session.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # pytest-xdist workers inherit the controller's
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="distrl-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

CHEAP_XLA = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false"
)
"""XLA's cheapest backend pipeline, for the tests' own processes: the same HLO programs, compiled by LLVM
without its optimization passes, and their fusions by XLA:CPU's older LLVM IR emitters instead of the MLIR
fusion emitters. The in-process tests check what programs compute, not how fast, and compiling is most of
their CPU: the first two flags cut the lm policy and text-encoder tests' CPU by a third (161 -> 107 s) and
the in-process share of a suite run from 669 to 559 CPU-s; without the fusion emitters, compiling at this
level takes half the CPU again (the mesh checks 64 -> 32 CPU-s, the trunk and text-encoder fine-tuning
tests 114 -> 74; at XLA's default level it changes nothing measurable). Learners and actors a test
starts keep XLA's defaults (ACTOR_ENV): their learning runs were calibrated with them, and there the
slower updates ate what the faster compiles saved (measured 2026-12-06)."""
if CHEAP_XLA not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts its backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CHEAP_XLA}".strip()

ROOT = Path(__file__).resolve().parents[1]
ACTOR_ENV = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}
START_S = 300.0
"""Deadline for a learner or actor process to get going (import JAX, build its model, compile its
first step): seconds on an idle machine, minutes on 2 cores shared with other CPU-bound work. A
passing test never waits this long; it is only how long a broken one takes to fail."""


def read_jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of a file another process appends to. A reader can see part of an append
    (a regular file's read takes no lock against a write), so the text after the last newline waits for
    the next read."""
    if not path.exists():
        return []
    complete = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _descendants(pid: int) -> list[int]:
    """The PIDs of every living process under `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class LearnerProcess:
    """`python -m learner` in a subprocess on free loopback ports; endpoints come from RUN_DIR/endpoints.json."""

    def __init__(self, run_dir: Path, *args: str, python_args: tuple[str, ...] = ("-m", "learner")):
        self.run_dir = run_dir
        self.log_path = run_dir / "learner.log"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "endpoints.json").unlink(missing_ok=True)  # a reused run dir: wait for the new ports
        self._log = self.log_path.open("wb")
        cmd = [
            sys.executable,
            *python_args,
            "--run-dir",
            str(run_dir),
            "--ingest-port",
            "0",
            "--params-port",
            "0",
            # Tests start from the small stand-in phone without warm-up and with hashed words only (no
            # text encoder to load and compile) unless they say otherwise (a later flag wins).
            *("--env", "standin", "--warmup-updates", "0", "--max-steps", "8", "--samples-per-insert", "1"),
            *("--model.text-encoder", "none"),
        ]
        self.proc = subprocess.Popen(
            [*cmd, *args], cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=ACTOR_ENV
        )
        endpoints = run_dir / "endpoints.json"
        deadline = time.monotonic() + START_S
        while not endpoints.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"learner did not start:\n{self.log()}")
            time.sleep(0.1)
        ports = json.loads(endpoints.read_text())
        self.ingest = f"tcp://127.0.0.1:{ports['ingest_port']}"
        self.params = f"tcp://127.0.0.1:{ports['params_port']}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> list[dict]:
        return read_jsonl(self.run_dir / "metrics.jsonl")

    def kill(self) -> None:
        """SIGKILL the learner and every process under it (its local actors, a demo writer) at once: for
        a learner whose test is over, when nothing is asserted about how it stops. A SIGTERM would wait
        for a train step compile in flight (minutes on a busy machine) and write a checkpoint nobody
        reads, both on the cores the other tests share."""
        if self.proc.poll() is None:
            for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):  # gone meanwhile
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def stop(self, timeout: float = START_S) -> int:
        """SIGTERM, then SIGKILL after `timeout`; the exit code. A learner still compiling its train step
        stops once the compile is done (it is not interruptible), which takes minutes on a busy machine."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc


IN_ONE_PROCESS = """
import contextlib, io, json, runpy, sys, traceback
results = []
for argv in json.loads(sys.argv[1]):
    out, err, rc = io.StringIO(), io.StringIO(), 0
    sys.argv = argv
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        except SystemExit as e:  # as the interpreter ends: a status, or a message on stderr and 1
            rc = e.code if isinstance(e.code, int) else int(e.code is not None)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()  # what the interpreter prints for an uncaught error, exit status 1
            rc = 1
    results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
sys.__stdout__.write(json.dumps(results))
"""


def run_in_one_process(
    commands: list[list[str]], timeout: float = START_S
) -> list[subprocess.CompletedProcess]:
    """`python -m MODULE ARGS...` for each command [MODULE, *ARGS], in turn, in one Python process (with
    ACTOR_ENV, from ROOT), as the interpreter would run it: its exit status, stdout and stderr. For
    commands that end before they do anything (a refused flag): starting a Python process (imports, JAX)
    costs many times what such a check does, and a dozen of them cost the suite minutes on a busy machine."""
    cmd = [sys.executable, "-c", IN_ONE_PROCESS, json.dumps(commands)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ACTOR_ENV, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return [
        subprocess.CompletedProcess(["python", "-m", *argv], r["rc"], r["stdout"], r["stderr"])
        for argv, r in zip(commands, json.loads(done.stdout), strict=True)
    ]


@pytest.fixture
def learner_process(tmp_path):
    """Factory: start a learner with extra CLI args (and optionally a given run dir, e.g. to restart in
    one); every learner started is stopped at teardown."""
    started: list[LearnerProcess] = []

    def start(*args: str, run_dir: Path | None = None, **kw) -> LearnerProcess:
        proc = LearnerProcess(run_dir or tmp_path / f"run{len(started)}", *args, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:  # a test that checks how its learner stops stops it itself (LearnerProcess.stop)
        proc.kill()


@pytest.fixture
def file_size_limit():
    """Set this process's file size limit (RLIMIT_FSIZE): writes past it fail with EFBIG, a real write
    error (what a full disk does to a writer), undone at teardown."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def limit(nbytes: int | None) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft if nbytes is None else nbytes, hard))

    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, old_handler)


def one_line(text: str) -> str:
    """`text` with box-drawing borders and line breaks folded into single spaces: tyro prints a config's
    ValueError in a box wrapped to the terminal width, and tests look for the message in it."""
    return " ".join(text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


def pytest_collection_modifyitems(config, items):
    """Tests marked `long` (learners with actors, minutes of training) run first, the rest in their usual
    order after them. With two xdist workers handing out one test at a time, the short ones then fill in
    around the long ones and both workers finish at about the same time, instead of one worker starting a
    two-minute test near the end while the other idles. The sort is stable, so every worker collects the
    same order (xdist requires it)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


ONE_WORKER_MODULES = tuple(
    f"tests/test_{name}.py"
    for name in (
        "mesh", "fuzz_ingest", "cluster_ray",  # shared state: below
        "lm_packing", "lm_trunk", "lm_policy", "session", "lm_prompt", "lm_grammar", "decoder_tokenizer",
        "learner_lifecycle", "curve", "actor_configs", "recipe_slurm",  # an expensive fixture: below
    )
)  # fmt: skip
"""Modules whose tests share a module-scoped fixture, so all their tests run on one xdist worker: the
mesh checks compile for half a minute, the fuzz world's second test reads what the first did, the Ray
tests share one local cluster; the others' fixtures (a compiled tiny decoder and its collated batch, a
learner session, the packaged tokenizer, refused command lines run in one process, a recipe's fake
cluster) cost 2-15 CPU-s each, paid once per worker that runs one of the module's tests: 45 CPU-s of a
suite run, measured 2026-12-06, when the modules' tests went to both workers."""


@pytest.hookimpl(optionalhook=True)  # an xdist hook: no error where xdist is not installed
def pytest_xdist_make_scheduler(config, log):
    """Hand out one test at a time, except ONE_WORKER_MODULES, one module at a time. xdist's own
    `--dist loadgroup` would do it with `xdist_group` marks, but with pytest 9.2 it silently stops
    grouping (pytest-dev/pytest-xdist#1386), so the grouping lives here, on the test ids alone."""
    from xdist.scheduler import LoadScopeScheduling

    class OneTestOrOneModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return OneTestOrOneModule(config, log)
