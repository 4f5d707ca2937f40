"""What `python -m learner launch` decides before placing anything (learner/launch/plan.py) and how a
process's key files land on its node (learner/launch/process_host.py), without Ray."""

from __future__ import annotations

import stat
from collections import Counter

import numpy as np
import pytest
import zmq

from common.net import curve
from learner.launch.config import LaunchConfig
from learner.launch.plan import (
    ActorHost,
    actor_hosts,
    assign,
    client_curve_flags,
    curve_files,
    learner_curve_flags,
)
from learner.launch.process_host import write_private
from tests.conftest import START_S


def node(node_id: str, emulators: float, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "NodeManagerAddress": f"10.0.0.{len(node_id)}",
        "Alive": alive,
        "Resources": {"CPU": 8.0, **({"emulator": emulators} if emulators else {})},
    }


def test_actor_hosts_are_the_live_nodes_with_room_for_one():
    nodes = [node("a", 4), node("bb", 0), node("ccc", 3, alive=False), node("dddd", 1.5), node("e", 0.5)]
    hosts = actor_hosts(nodes, "emulator", 1.0)
    assert hosts == [ActorHost("a", "10.0.0.1", 4), ActorHost("dddd", "10.0.0.4", 1)]
    assert [h.capacity for h in actor_hosts(nodes, "emulator", 0.5)] == [8, 3, 1]
    assert actor_hosts(nodes, "phone", 1.0) == []


@pytest.mark.parametrize("seed", range(20))
def test_assign_spreads_within_capacity(seed):
    rng = np.random.default_rng(seed)
    hosts = [
        ActorHost(f"n{i}", f"10.0.0.{i}", int(c))
        for i, c in enumerate(rng.integers(1, 5, rng.integers(1, 5)))
    ]
    total = sum(h.capacity for h in hosts)
    actors = int(rng.integers(0, total + 1))
    placed = Counter(h.node_id for h in assign(hosts, actors))
    assert sum(placed.values()) == actors
    for h in hosts:
        assert placed[h.node_id] <= h.capacity
        # spread: a host short of actors got one fewer than the fullest at most, unless it is full
        if placed[h.node_id] < h.capacity:
            assert placed[h.node_id] >= max(placed.values(), default=0) - 1
    with pytest.raises(ValueError, match=f"--actors {total + 1}: the actor hosts take {total} in all"):
        assign(hosts, total + 1)


def test_curve_files_give_each_process_only_its_own_secret(tmp_path):
    learner, clients = curve_files(["actor-0", "actor-1", "relay-0"])
    assert set(learner) == {"learner.key_secret", *(f"authorized/{n}.key" for n in clients)}
    secrets = [learner["learner.key_secret"]] + [c["client.key_secret"] for c in clients.values()]
    assert len(set(secrets)) == 4  # fresh pairs, none shared
    assert all(b"secret-key" not in v for k, v in learner.items() if k.startswith("authorized/"))
    for files in clients.values():
        assert set(files) == {"client.key_secret", "learner.key"}
        assert b"secret-key" not in files["learner.key"]
    # The files work as written: the learner's authorized folder admits every client's key pair.
    write_private(tmp_path / "learner", learner)
    write_private(tmp_path / "actor-1", clients["actor-1"])
    flags = {f: v.replace("{files}", str(tmp_path / "learner")) for f, v in pairs(learner_curve_flags())}
    server = curve.CurveServer(
        tmp_path / "learner" / "learner.key_secret", tmp_path / "learner" / "authorized"
    )
    assert flags == {
        "--curve-secret-key": str(tmp_path / "learner/learner.key_secret"),
        "--curve-authorized": str(tmp_path / "learner/authorized"),
    }
    client_flags = dict(pairs(client_curve_flags()))
    client = curve.CurveClient(
        tmp_path / "actor-1" / client_flags["--curve-secret-key"].removeprefix("{files}/"),
        tmp_path / "actor-1" / client_flags["--curve-server-key"].removeprefix("{files}/"),
    )
    assert handshake(server, client), "an actor's launcher-made keys were not admitted"


def pairs(flags: list[str]) -> list[tuple[str, str]]:
    return list(zip(flags[::2], flags[1::2], strict=True))


def handshake(server: curve.CurveServer, client: curve.CurveClient) -> bool:
    """True when `client` completes a CURVE handshake with `server` (ZAP on) and a message gets through."""
    ctx = zmq.Context()
    authenticator = server.start(ctx)
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        for sock in (router, dealer):
            sock.setsockopt(zmq.LINGER, 0)
        server.apply(router)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        client.apply(dealer)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hello")
        return bool(router.poll(int(START_S * 1000)))
    finally:
        router.close(0)
        dealer.close(0)
        authenticator.stop()
        ctx.term()


def test_private_files_are_this_users_alone_and_replaced_on_restart(tmp_path):
    d = tmp_path / "launch-x" / "actor-0"
    write_private(d, {"client.key_secret": b"one", "sub/learner.key": b"pub"})
    write_private(d, {"client.key_secret": b"two"})  # a restart writes over the same folder
    assert (d / "client.key_secret").read_bytes() == b"two" and not (d / "sub").exists()
    for path in (d.parent, d):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "client.key_secret").stat().st_mode) == 0o600


def test_launch_config_refuses_contradictions():
    with pytest.raises(ValueError, match="--secure and --insecure"):
        LaunchConfig(secure=True, insecure=True)
    with pytest.raises(ValueError, match="--relay-port"):
        LaunchConfig(relay_port=0)
    with pytest.raises(ValueError, match="--learner-resources takes NAME=AMOUNT"):
        LaunchConfig(learner_resources=("GPU",))
