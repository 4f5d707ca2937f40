"""`python -m learner launch` on a local two-node Ray cluster: seconds from the command to the first
acknowledged episode, and from SIGKILL of an actor process to Ray's restart of it and to the restarted
actor's first acknowledged episode.

Reference, in the same run: the same learner and actors started by hand as plain subprocesses (no Ray),
timed the same way; and for the restart, a new actor process started by hand right after the kill. The
ratios say what Ray's placement and supervision add. Both nodes are on this machine at 127.0.0.1 (the
head with a `learner` resource, the other with `{"emulator": 2}`), the stand-in phone, a small model.
Times come from the processes' output lines; an actor prints its status every second, so the
acknowledgment times are late by up to a second (alike in both columns). Needs Ray (`.[test]` or `.[ray]`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # node address 127.0.0.1 (tests/test_cluster_ray.py)

ROOT = Path(__file__).resolve().parents[1]
LEARNER_ARGS = (
    "--env standin --warmup-updates 0 --max-steps 8 --samples-per-insert 1 --model.text-encoder none "
    "--ingest-port 0 --params-port 0 --log-every 1 --console lines --no-tensorboard"
)
ACTOR_ARGS = "--env standin --num-envs 2 --status-every 1"
ENV = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
WAIT_S = 300.0
EPISODES = re.compile(r"\beps\s+([1-9]\d*)")
ACKED = re.compile(r"actor \S+: policy v\d+, .* acked ([1-9]\d*),")


class Lines:
    """A subprocess whose output lines are collected, each with the time it arrived."""

    def __init__(self, argv: list[str]):
        self.t0 = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern: str | re.Pattern, since: float = 0.0) -> tuple[float, re.Match]:
        """(arrival time, match) of the first line after `since` matching `pattern`."""
        deadline, exited = time.monotonic() + WAIT_S, None
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if t >= since and (m := re.search(pattern, line)):
                    return t, m
            if self.proc.poll() is not None:
                if exited is None:
                    exited = time.monotonic()
                elif time.monotonic() - exited > 1.0:  # its last lines are in
                    break
            time.sleep(0.05)
        tail = "\n".join(line for _, line in self.lines[-30:])
        raise RuntimeError(f"no line matching {pattern!r}:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ray_trial(address: str, run_dir: Path) -> dict:
    launcher = Lines(
        [
            "-m", "learner", "launch", "--address", address, "--actors", "2", "--learner-resources", "learner=1",
            "--run-dir", str(run_dir), "--max-restarts", "2", "--stop-grace", "20",
            f"--learner-args={LEARNER_ARGS}", f"--actor-args={ACTOR_ARGS}",
        ]
    )  # fmt: skip
    try:
        t_first, _ = launcher.first(r"^\[learner\] .*" + EPISODES.pattern)
        _, m = launcher.first(r"launch: actor-0: pid (\d+)")
        launcher.first(r"^\[actor-0\] " + ACKED.pattern)
        killed = time.monotonic()
        os.kill(int(m[1]), signal.SIGKILL)
        t_back, _ = launcher.first(r"launch: actor-0: pid \d+ .*\(restart 1 of", since=killed)
        t_acked, _ = launcher.first(r"^\[actor-0\] " + ACKED.pattern, since=t_back)
    finally:
        launcher.stop()
    return {
        "to_first_ack_s": t_first - launcher.t0,
        "kill_to_restart_s": t_back - killed,
        "kill_to_first_ack_s": t_acked - killed,
    }


def _direct_trial(run_dir: Path) -> dict:
    learner = Lines(["-m", "learner", "--run-dir", str(run_dir), *LEARNER_ARGS.split()])
    actors: list[Lines] = []
    try:
        ports = _ports(run_dir)

        def actor(i: int) -> Lines:
            return Lines(
                ["-m", "actors", "--host", "127.0.0.1", "--ingest-port", str(ports[0]), "--params-port",
                 str(ports[1]), "--seed", str(i), *ACTOR_ARGS.split()]
            )  # fmt: skip

        actors += [actor(0), actor(1)]
        t_first, _ = learner.first(EPISODES)
        actors[0].first(ACKED)
        killed = time.monotonic()
        actors[0].proc.kill()
        actors.append(actor(2))  # what a supervisor would do at once
        t_acked, _ = actors[-1].first(ACKED)
    finally:
        for a in actors:
            a.stop()
        learner.stop()
    return {
        "to_first_ack_s": t_first - learner.t0,
        "kill_to_restart_s": 0.0,
        "kill_to_first_ack_s": t_acked - killed,
    }


def _ports(run_dir: Path) -> tuple[int, int]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            e = json.loads((run_dir / "endpoints.json").read_text())
            return int(e["ingest_port"]), int(e["params_port"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise RuntimeError(f"{run_dir}/endpoints.json never appeared")


def run(quick: bool, repeats: int | None = None) -> tuple[list[dict], dict]:
    import ray.cluster_utils

    repeats = repeats or (1 if quick else 3)
    cluster = ray.cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"learner": 1}, "include_dashboard": False},
    )
    rows = []
    try:
        cluster.add_node(num_cpus=1, resources={"emulator": 2})
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory(prefix="distrl-bench-launch-") as tmp:
            for trial in range(repeats):
                direct = _direct_trial(Path(tmp) / f"direct-{trial}")
                on_ray = _ray_trial(cluster.address, Path(tmp) / f"ray-{trial}")
                rows.append({"trial": trial, "path": "by hand (reference)", **direct})
                rows.append({"trial": trial, "path": "learner launch (Ray)", **on_ray})
    finally:
        cluster.shutdown()
    summary = {}
    for key in ("to_first_ack_s", "kill_to_restart_s", "kill_to_first_ack_s"):
        ray_values = [r[key] for r in rows if "Ray" in r["path"]]
        summary[f"ray_{key}_median"] = statistics.median(ray_values)
        summary[f"ray_{key}_range"] = [min(ray_values), max(ray_values)]
    for key in ("to_first_ack_s", "kill_to_first_ack_s"):
        ref = statistics.median(r[key] for r in rows if "hand" in r["path"])
        summary[f"{key}_vs_by_hand"] = summary[f"ray_{key}_median"] / ref
    return rows, summary
