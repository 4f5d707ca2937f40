"""`python -m learner launch` on a real local Ray cluster: two nodes on this machine, the head with a
`learner` resource, the other with `{"emulator": 2}`. The learner and two actors are placed on the right
nodes and train; an actor process killed with SIGKILL is restarted by Ray and trains again, and no
acknowledged episode is lost (the learner stored every episode every actor process was told was
acknowledged, once); with --secure and --relays the traffic is CURVE-only, snapshots reach the actors
through their host's relay, and each process's keys exist only while it runs; a missing resource or no
cluster gets one clear message. Skipped where Ray is not installed (`pip install -e '.[ray]'`, which
`.ci/run` does)."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from common import protocol, wire
from tests.conftest import ACTOR_ENV, ROOT, START_S
from tests.test_faults import assert_all_delivered, free_ports

# Every Ray process of these tests (this one's, the cluster's nodes, the launcher it starts) takes
# 127.0.0.1 as its node address instead of this machine's LAN address: Ray reads this variable when it is
# imported, and the nodes and the launcher inherit it. So the learner binds loopback, and no traffic
# leaves the machine.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[test]' (or '.[ray]') installs it"
)
cluster_utils = pytest.importorskip("ray.cluster_utils", reason="this Ray has no ray.cluster_utils")

LEARNER_ARGS = (
    "--env standin --warmup-updates 0 --max-steps 8 --samples-per-insert 1 --model.text-encoder none "
    "--ingest-port 0 --params-port 0 --log-every 1 --console lines --no-tensorboard"
)
ACTOR_ARGS = "--env standin --num-envs 2 --status-every 1"
STOPPED = re.compile(r"^\[(actor-\d)\] actor: stopped \((.+?)\); (\{.*\})$")
ACKED = re.compile(r"^\[(actor-\d)\] actor \S+: policy v\d+, .* acked (\d+),")


@pytest.fixture(scope="module")
def cluster():
    """Head node (learner=1, 1 CPU) and an actor host (emulator=2, 1 CPU), both on this machine at
    127.0.0.1 (see the environment variable above)."""
    c = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"learner": 1},
            "include_dashboard": False,
        },
    )
    worker = c.add_node(num_cpus=1, resources={"emulator": 2})
    c.wait_for_nodes()
    yield c, c.head_node.node_id, worker.node_id
    c.shutdown()


class Launcher:
    """`python -m learner launch ...` in a subprocess; its output lines collected by a thread."""

    def __init__(self, *args: str):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "learner", "launch", *args],
            cwd=ROOT,
            env={**ACTOR_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = START_S, start: int = 0) -> re.Match:
        """The first output line from index `start` on that matches `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[start:]:
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None:
                time.sleep(0.5)  # the reader thread's last lines
                for line in self.lines[start:]:
                    if m := re.search(pattern, line):
                        return m
                break
            time.sleep(0.2)
        ours = [line for line in self.lines if line.startswith("launch:")]
        raise AssertionError(
            f"no line matching {pattern!r}; the launcher's lines:\n"
            + "\n".join(ours)
            + "\nthe last lines:\n"
            + "\n".join(self.lines[-40:])
        )

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.long
@pytest.mark.timeout(900)  # a Ray cluster, a learner and actors on a busy 2-core machine
def test_learner_and_actors_train_on_their_nodes_and_a_killed_actor_restarts(cluster, tmp_path):
    c, head_id, worker_id = cluster
    t0 = time.monotonic()
    launcher = Launcher(
        *("--address", c.address, "--actors", "2", "--learner-resources", "learner=1"),
        *("--run-dir", str(tmp_path / "run"), "--max-restarts", "2", "--stop-grace", "60"),
        f"--learner-args={LEARNER_ARGS}",
        f"--actor-args={ACTOR_ARGS}",
    )
    pids = []
    try:
        learner = launcher.wait_for(r"launch: learner: pid (\d+) on \S+ \(node (\w+)\)")
        assert head_id.startswith(learner.group(2)), launcher.output()
        pids.append(int(learner.group(1)))
        actor_pids = {}
        for i in range(2):
            m = launcher.wait_for(rf"launch: actor-{i}: pid (\d+) on \S+ \(node (\w+)\)")
            assert worker_id.startswith(m.group(2)), launcher.output()
            actor_pids[i] = int(m.group(1))
        pids += actor_pids.values()
        launcher.wait_for(r"launch: first episodes acknowledged ([\d.]+) s after launch")
        first_s = time.monotonic() - t0
        assert any(line.startswith("[actor-1] ") for line in launcher.lines), launcher.output()

        launcher.wait_for(r"^\[actor-0\] actor \S+: policy v\d+, .* acked [1-9]")  # it has something to lose
        mark = len(launcher.lines)
        os.kill(actor_pids[0], signal.SIGKILL)
        launcher.wait_for(
            r"launch: actor-0: exited with status -9; Ray restarts it \(restart 1 of 2\)", start=mark
        )
        m = launcher.wait_for(
            r"launch: actor-0: pid (\d+) on \S+ \(node (\w+)\) \(restart 1 of 2\)", start=mark
        )
        assert worker_id.startswith(m.group(2)) and int(m.group(1)) != actor_pids[0]
        pids.append(int(m.group(1)))
        # What the killed process was told was acknowledged, as far as its last status line says.
        killed_acked = max(
            (int(a[2]) for line in launcher.lines[:mark] if (a := ACKED.match(line)) and a[1] == "actor-0"),
            default=0,
        )
        restarted = time.monotonic()
        # The restarted process trains: its own status line counts acknowledged episodes. Its lines come
        # after the restart's (the killed process's last status lines may follow `mark` too: a CI run
        # took one of those for the new process's and stopped it before it had set up its handlers).
        since_restart = next(i for i, line in enumerate(launcher.lines) if m.group(0) in line)
        launcher.wait_for(r"^\[actor-0\] .*acked [1-9]", start=since_restart)
        print(f"launch -> first episodes {first_s:.1f} s; kill -> restarted actor's first ack "
              f"{time.monotonic() - restarted:.1f} s (plus its restart)")  # fmt: skip
    finally:
        rc = launcher.stop()
    assert rc == 0, launcher.output()
    assert "launch: learner: stopped (status 0)" in launcher.output()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in pids if alive(p)], launcher.output()

    # Zero acknowledged episodes lost: the two processes that ran to the end (actor-1, actor-0's restart)
    # delivered everything they finished, and the learner stored at least that plus what the killed one
    # was told, each once.
    finals = {m[1]: ast.literal_eval(m[3]) for line in launcher.lines if (m := STOPPED.match(line))}
    assert set(finals) == {"actor-0", "actor-1"}, launcher.output()
    for stats in finals.values():
        assert_all_delivered(stats)
    assert killed_acked > 0, "the killed actor had nothing acknowledged: the kill tested nothing"
    final = learner_final_metrics(tmp_path / "run")
    assert final["duplicates"] == 0 and final["batches_lost_in_restart"] == 0, final
    acked = killed_acked + sum(s["episodes_acked"] for s in finals.values())
    assert final["episodes"] >= acked, (final["episodes"], killed_acked, finals)


def learner_final_metrics(run_dir: Path) -> dict:
    """The metrics line the learner writes as it stops."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert lines and "stopped" in lines[-1], lines[-1:]
    return lines[-1]


@pytest.mark.long
@pytest.mark.timeout(900)  # a Ray cluster, a learner and actors on a busy 2-core machine
def test_secure_launch_with_relays_keeps_keys_private_feeds_actors_through_the_relay_and_reports_a_dead_learner(
    cluster, tmp_path
):
    c, _, worker_id = cluster
    (relay_port,) = free_ports(1)
    launcher = Launcher(
        *("--address", c.address, "--actors", "2", "--learner-resources", "learner=1"),
        *("--run-dir", str(tmp_path / "run"), "--secure", "--relays", "--relay-port", str(relay_port)),
        f"--learner-args={LEARNER_ARGS}",
        f"--actor-args={ACTOR_ARGS}",
    )
    try:
        keys = Path(launcher.wait_for(r"launch: CURVE: .* written to (\S+)/<name> on its node")[1])
        learner_pid = int(launcher.wait_for(r"launch: learner: pid (\d+) on")[1])
        relay = launcher.wait_for(r"launch: relay-0: pid \d+ on \S+ \(node (\w+)\)")
        assert worker_id.startswith(relay[1]), launcher.output()
        ingest = launcher.wait_for(r"launch: learner ready after .* ingest (\S+):(\d+)")
        launcher.wait_for(r"launch: first episodes acknowledged")
        for i in range(2):  # snapshots came through the relay: the actors moved past the first policy
            launcher.wait_for(rf"^\[actor-{i}\] actor \S+: policy v[1-9]")
        for name, secret in (("learner", "learner.key_secret"), ("actor-0", "client.key_secret")):
            path = keys / name / secret
            assert path.stat().st_mode & 0o077 == 0 and (keys / name).stat().st_mode & 0o077 == 0, path
        assert not plain_peer_is_answered(ingest[1], int(ingest[2])), (
            "the learner answered a peer without keys"
        )
        os.kill(learner_pid, signal.SIGKILL)  # the launcher must say so and stop the rest by itself
        rc = launcher.proc.wait(timeout=START_S)
    finally:
        launcher.stop()
    assert rc == 1, launcher.output()
    out = launcher.output()
    assert "launch: the learner died with status -9 on its node; stopping the actors" in out, out
    forwarded = [int(m[1]) for m in re.finditer(r"^\[relay-0\] relay: (\d+) snapshots forwarded", out, re.M)]
    assert forwarded and forwarded[-1] >= 1, out
    assert "launch: relay-0: stopped (status 0)" in out, out
    assert not keys.exists(), f"{keys} outlived the run: secret keys left on the node"


def plain_peer_is_answered(host: str, port: int) -> bool:
    """True when a HELLO without CURVE keys gets any reply from the learner within a few seconds."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://{host}:{port}")
        sock.send(wire.encode(protocol.Hello("stranger", 1, "stranger", 1).to_msg()), flags=zmq.NOBLOCK)
        return bool(sock.poll(3000))
    except zmq.Again:
        return False  # not even connected: no handshake completed
    finally:
        sock.close(0)
        ctx.term()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--actor-resource", "phone"), "--actor-resource phone: no node advertises it"),
        (("--learner-resources", "GPU=1"), "--learner-resources GPU=1: the cluster has 0 GPU"),
        (("--actors", "3"), "--actors 3 need 3 emulator (1 each); the cluster has 2"),
    ],
)
def test_a_missing_resource_is_one_clear_message(cluster, tmp_path, args, message):
    c, _, _ = cluster
    launcher = Launcher("--address", c.address, "--run-dir", str(tmp_path), *args)
    assert launcher.proc.wait(timeout=120) == 2
    time.sleep(0.2)
    assert f"launch: {message}" in launcher.output(), launcher.output()
    assert not (tmp_path / "endpoints.json").exists()  # nothing was placed


def test_no_cluster_is_one_clear_message(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    launcher = Launcher("--address", f"127.0.0.1:{port}", "--run-dir", str(tmp_path))
    assert launcher.proc.wait(timeout=60) == 2
    time.sleep(0.2)
    assert f"launch: no Ray cluster at --address 127.0.0.1:{port}" in launcher.output(), launcher.output()
