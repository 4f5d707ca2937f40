"""CURVE on both learner sockets: authorized actors are served, everyone else gets nothing at all."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from common import protocol, wire
from common.net import curve
from tests.conftest import ACTOR_ENV, ROOT, START_S, one_line, run_in_one_process
from tests.test_fake_actor import make_episode

pytestmark = pytest.mark.timeout(600)
REPLY_S = 120
"""Seconds to wait for the learner's reply: it answers within milliseconds, but a busy machine can hold
up the CURVE handshake and the learner's process for many seconds."""


@pytest.fixture
def keys(tmp_path) -> Path:
    curve.generate(tmp_path / "keys", actors=1)
    curve.generate(tmp_path / "stranger", actors=1)  # a valid key pair the learner never authorized
    return tmp_path


class Client:
    """A DEALER and a SUB to the learner, with CURVE client keys or none."""

    def __init__(self, learner, keys: curve.CurveClient | None):
        self.ctx = zmq.Context()
        self.dealer, self.sub = self.ctx.socket(zmq.DEALER), self.ctx.socket(zmq.SUB)
        for sock in (self.dealer, self.sub):
            sock.setsockopt(zmq.LINGER, 0)
            if keys is not None:
                keys.apply(sock)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.dealer.connect(learner.ingest)
        self.sub.connect(learner.params)

    def request(self, msg: dict, timeout: float) -> list[bytes] | None:
        """Send, then the first reply that is not a HEARTBEAT, or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:  # a DEALER accepts a message only once a connection completed its handshake
            try:
                self.dealer.send(wire.encode(msg), flags=zmq.NOBLOCK)
                break
            except zmq.Again:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        while self.dealer.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            frames = self.dealer.recv_multipart()
            if len(frames) > 1 or protocol.parse(frames[0])["kind"] != protocol.HEARTBEAT:
                return frames
            if time.monotonic() > deadline:
                break
        return None

    def close(self) -> None:
        self.dealer.close(0)
        self.sub.close(0)
        self.ctx.term()


def _refused_handshakes(by_reason: dict) -> int:
    return by_reason.get("auth_failed", 0) + by_reason.get("handshake_failed", 0)


def _hello() -> dict:
    return protocol.message(protocol.HELLO, actor="t", num_envs=1, instance="curve-test", first_unacked=1)


def test_only_authorized_actors_can_send_or_receive_and_relays_and_real_actors_use_their_keys(
    learner_process, keys
):
    """Authorized, plain and stranger clients of a CURVE learner; a relay holding an actor's keys, which
    forwards the learner's snapshots to a plain local subscriber; and a real actor process that trains
    through CURVE. The relay and the real actor were tests of their own, each with a learner of its own
    with the same keys (a start-up and a compile more each)."""
    from actors.tools.relay import Relay, RelayConfig

    k = keys / "keys"
    learner = learner_process(
        "--curve-secret-key", str(k / "learner.key_secret"), "--curve-authorized", str(k / "authorized"),
        "--batch-size", "2", "--publish-every", "1", "--log-every", "0.3",
    )  # fmt: skip
    params_port = int(learner.params.rsplit(":", 1)[1])
    cfg = RelayConfig(params_port=params_port, port=0, status_every=0,
                      curve_secret_key=str(k / "actor-0.key_secret"), curve_server_key=str(k / "learner.key"))  # fmt: skip
    relay = Relay(cfg, log=lambda _line: None)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    local = zmq.Context()
    relayed = local.socket(zmq.SUB)  # a plain subscriber on the relay's local side
    relayed.setsockopt(zmq.LINGER, 0)
    relayed.setsockopt(zmq.SUBSCRIBE, b"")
    relayed.connect(relay.endpoint)
    good = Client(learner, curve.CurveClient(k / "actor-0.key_secret", k / "learner.key"))
    plain = Client(learner, None)
    stranger = Client(learner, curve.CurveClient(keys / "stranger" / "actor-0.key_secret", k / "learner.key"))
    try:
        welcome = protocol.parse(good.request(_hello(), timeout=REPLY_S)[0])
        assert welcome["kind"] == protocol.WELCOME
        assert plain.request(_hello(), timeout=2) is None
        assert stranger.request(_hello(), timeout=2) is None

        # Parameters: the authorized actor gets them, by request and on the PUB; the others never do.
        frames = good.request(
            protocol.message(protocol.PARAM_REQ, actor_id=welcome["actor_id"]), timeout=REPLY_S
        )
        assert protocol.parse_params(frames)[0] == 0
        model = welcome["model"]
        rng = np.random.default_rng(0)
        traj = protocol.Traj(welcome["actor_id"], 1, [make_episode(model, 3, rng) for _ in range(2)]).to_msg()
        ack = protocol.parse(good.request(traj, timeout=REPLY_S)[0])
        assert (ack["kind"], ack["accepted"]) == (protocol.ACK, 2)
        # A trained snapshot reaches the authorized subscriber, and through the relay (a CURVE client of
        # the learner with the actor's keys) a plain subscriber on its local side. Version 0, published as
        # the learner starts serving, may come first to a subscriber that joined in time: skipped.
        for sub, what in ((good.sub, "the authorized subscriber"), (relayed, "the relay's subscriber")):
            version, deadline = 0, time.monotonic() + START_S
            while version < 1:
                assert sub.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), (
                    f"no snapshot reached {what}"
                )
                version, _ = protocol.parse_params(sub.recv_multipart())
        assert not plain.sub.poll(500) and not stranger.sub.poll(500)

        deadline = time.monotonic() + REPLY_S
        while time.monotonic() < deadline:
            lines = learner.metrics()
            if lines and _refused_handshakes(lines[-1]["rejected_by_reason"]) >= 2:
                break
            time.sleep(0.2)
        by_reason = lines[-1]["rejected_by_reason"]
        # Both refused handshakes are counted: the stranger's as auth_failed (CURVE refused its key), the
        # plain client's as auth_failed, or as handshake_failed when it saw the mechanism mismatch first
        # and hung up before the learner read its greeting (a timing race seen once in a suite run).
        assert by_reason.get("auth_failed", 0) >= 1 and _refused_handshakes(by_reason) >= 2, by_reason
        assert lines[-1]["episodes"] == 2  # and only the authorized actor's episodes were stored

        # A real actor with its keys trains through CURVE (this was a test of its own, with a learner
        # of its own: the same keys, the default batch size and publishing, which it does not depend on).
        out = subprocess.run(
            [sys.executable, "-m", "actors", "--ingest-port", str(learner.ingest.rsplit(":", 1)[1]),
             "--params-port", str(params_port), "--env", "standin", "--num-envs", "2", "--max-episodes", "6",
             "--curve-secret-key", str(k / "actor-0.key_secret"), "--curve-server-key", str(k / "learner.key")],
            cwd=ROOT, env=ACTOR_ENV, capture_output=True, text=True, timeout=START_S,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        stats = ast.literal_eval(re.search(r"stopped \(episode limit\); (\{.*\})", out.stdout)[1])
        assert stats["episodes_acked"] == stats["episodes_finished"] >= 6
        assert stats["episodes_unacked_at_exit"] == 0
    finally:
        relay.request_stop()
        thread.join(10)
        for client in (good, plain, stranger):
            client.close()
        relayed.close(0)
        local.term()


def test_binding_beyond_loopback_without_keys_is_refused(refusals):
    out, run_dir = refusals["bind"]
    assert out.returncode != 0
    assert "without authentication" in one_line(out.stderr) and "--insecure" in out.stderr
    assert not (run_dir / "endpoints.json").exists()  # nothing was bound


def test_bad_key_files_are_named(tmp_path, keys, refusals):
    out, missing = refusals["missing key"]  # an actor given a secret key file that is not there
    assert out.returncode != 0 and str(missing) in out.stderr
    with pytest.raises(curve.CurveError, match="no secret key"):
        curve.load_keypair(keys / "keys" / "learner.key")  # the public half only
    with pytest.raises(curve.CurveError, match=r"no \.key files"):
        (tmp_path / "empty").mkdir()
        curve.CurveServer(keys / "keys" / "learner.key_secret", tmp_path / "empty")
    with pytest.raises(curve.CurveError, match="not overwriting"):
        curve.generate(keys / "keys", actors=1)


def test_loopback_detection():
    assert curve.is_loopback("127.0.0.1") and curve.is_loopback("::1") and curve.is_loopback("localhost")
    assert not curve.is_loopback("0.0.0.0") and not curve.is_loopback("10.0.0.5")


def test_a_relay_beyond_loopback_needs_keys():
    """A relay bound beyond loopback without keys is refused (it says --insecure). A relay with keys
    forwarding a CURVE learner's snapshots: test_only_authorized_actors_can_send_or_receive_and_relays..."""
    from actors.tools.relay import Relay, RelayConfig

    with pytest.raises(SystemExit, match="--insecure"):
        Relay(RelayConfig(bind="0.0.0.0", port=0), log=lambda _line: None)


def test_an_actor_with_keys_takes_snapshots_from_a_plain_local_relay(keys):
    """The actor's SUB speaks CURVE only to the learner: a relay's local side (--params-endpoint) is plain,
    and a CURVE handshake with it would never complete, so the actor would get no snapshot at all."""
    from actors.connection import LearnerConnection

    k = keys / "keys"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)  # stands in for the relay's loopback side
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    client = curve.CurveClient(k / "actor-0.key_secret", k / "learner.key")
    conn = LearnerConnection("127.0.0.1", 1, 1, lambda _line: None, f"tcp://127.0.0.1:{port}", client)
    try:
        deadline = time.monotonic() + START_S
        while not conn.sub.poll(50):  # a SUB gets only what is published after it has joined
            pub.send(b"snapshot")
            assert time.monotonic() < deadline, "the actor's SUB never joined the plain relay"
        assert conn.sub.recv() == b"snapshot"
    finally:
        conn.close()
        pub.close(0)
        ctx.term()


def test_secret_keys_are_written_for_their_owner_only(tmp_path):
    for path in curve.generate(tmp_path / "keys", actors=2):
        mode = path.stat().st_mode & 0o777
        if path.name.endswith(".key_secret"):
            assert mode == 0o600, (path, oct(mode))


def _answered(endpoint: str, keys: curve.CurveClient, timeout: float) -> bool:
    """Whether a fresh CURVE DEALER with `keys` gets an echo back within `timeout` seconds."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    keys.apply(sock)
    sock.connect(endpoint)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                sock.send(b"ping", flags=zmq.NOBLOCK)  # accepted only once the handshake succeeded
            except zmq.Again:
                time.sleep(0.05)
                continue
            return bool(sock.poll(max(1, int((deadline - time.monotonic()) * 1000))))
        return False
    finally:
        sock.close(0)
        ctx.term()


def test_keys_added_or_deleted_take_effect_at_the_next_handshake_without_a_restart(tmp_path):
    folder = tmp_path / "keys"
    curve.generate(folder, actors=1)
    server = curve.CurveServer(folder / "learner.key_secret", folder / "authorized")
    ctx = zmq.Context()
    auth = server.start(ctx)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    server.apply(router)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if router.poll(50):
                router.send_multipart(router.recv_multipart())

    thread = threading.Thread(target=echo)
    thread.start()
    endpoint = f"tcp://127.0.0.1:{port}"

    def client(name: str) -> curve.CurveClient:
        return curve.CurveClient(folder / f"{name}.key_secret", folder / "learner.key")

    try:
        assert _answered(endpoint, client("actor-0"), REPLY_S)
        out = subprocess.run([sys.executable, "-m", "learner", "keys", str(folder), "--add", "late-host"],
                             cwd=ROOT, env=ACTOR_ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0 and "late-host: --curve-secret-key" in out.stdout, out.stdout + out.stderr
        assert (folder / "late-host.key_secret").stat().st_mode & 0o777 == 0o600
        assert _answered(endpoint, client("late-host"), REPLY_S)  # added: served, the learner still running
        (folder / "authorized" / "actor-0.key").unlink()  # revoked
        assert not _answered(endpoint, client("actor-0"), 3.0)
        assert _answered(endpoint, client("late-host"), REPLY_S)  # the others are unaffected
    finally:
        stop.set()
        thread.join()
        router.close(0)
        auth.stop()
        ctx.term()


KEY_REFUSALS = [
    (False, ("a",), "no learner.key here"),
    (True, ("learner",), "--add takes key names"),
    (True, ("../x",), "--add takes key names"),
    (True, ("actor-0",), "exists already"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """What the CLI refusals of this module finished with, all run in one Python process (a process each
    cost more than the checks): (setup, names) -> `python -m learner keys DIR --add NAMES` for every
    case of KEY_REFUSALS (DIR empty, or with keys for one actor when `setup`); "bind" -> (a learner
    bound beyond loopback without keys, its run dir); "missing key" -> (an actor given a secret key file
    that does not exist, that file)."""
    cases, commands = [], []
    for setup, names, _ in KEY_REFUSALS:
        folder = tmp_path_factory.mktemp("refused") / "keys"
        if setup:
            curve.generate(folder, actors=1)
        cases.append(((setup, names), None))
        commands.append(["learner", "keys", str(folder), "--add", *names])
    run_dir = tmp_path_factory.mktemp("refused") / "run"
    cases.append(("bind", run_dir))
    commands.append(["learner", "--bind", "0.0.0.0", "--run-dir", str(run_dir)])
    keys = tmp_path_factory.mktemp("refused")
    curve.generate(keys / "keys", actors=1)
    missing = keys / "nope.key_secret"
    cases.append(("missing key", missing))
    commands.append(
        [
            "actors",
            "--curve-secret-key",
            str(missing),
            "--curve-server-key",
            str(keys / "keys" / "learner.key"),
        ]
    )
    done = run_in_one_process(commands)
    return {key: (out, extra) for (key, extra), out in zip(cases, done, strict=True)}


@pytest.mark.parametrize(("setup", "names", "says"), KEY_REFUSALS)
def test_adding_keys_refuses_what_it_cannot_do_in_one_line(refusals, setup, names, says):
    out, _ = refusals[setup, names]
    assert out.returncode != 0 and says in one_line(out.stderr), out.stderr


def test_bare_tcp_probes_are_counted_apart_from_refused_keys(keys):
    """A health check or port scan that only opens a TCP connection is `handshake_failed`; a ZeroMQ peer
    with a key the learner never authorized, or with no CURVE at all, is `auth_failed`."""
    import socket

    from learner.ingest.transport import Transport

    k = keys / "keys"
    transport = Transport("127.0.0.1", 0, 0, curve.CurveServer(k / "learner.key_secret", k / "authorized"))
    try:
        for _ in range(3):
            socket.create_connection(("127.0.0.1", transport.ingest_port), timeout=5).close()
        deadline = time.monotonic() + REPLY_S
        while transport.rejected["handshake_failed"] < 3 and time.monotonic() < deadline:
            transport.count_auth_failures()
            time.sleep(0.05)
        assert transport.rejected == {"handshake_failed": 3}  # no auth_failed from probes
        stranger = curve.CurveClient(keys / "stranger" / "actor-0.key_secret", k / "learner.key")
        assert not _answered(f"tcp://127.0.0.1:{transport.ingest_port}", stranger, 2.0)
        transport.count_auth_failures()
        assert transport.rejected["auth_failed"] >= 1 and transport.rejected["handshake_failed"] == 3
    finally:
        transport.close()
