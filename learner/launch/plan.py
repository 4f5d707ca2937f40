"""What `python -m learner launch` decides before it places anything: which node each actor goes to
when there are per-host relays, and the CURVE key files each process gets with `--secure`.

Pure functions of the cluster's node table and the config, so they are tested without Ray.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.net.curve import generate


@dataclass(frozen=True)
class ActorHost:
    """A live node that advertises the actor resource, and how many actors it takes."""

    node_id: str
    ip: str
    capacity: int


def actor_hosts(nodes: list[dict[str, Any]], resource: str, per_actor: float) -> list[ActorHost]:
    """The live nodes of `ray.nodes()` that can take at least one actor, in the table's order."""
    hosts = []
    for node in nodes:
        units = node.get("Resources", {}).get(resource, 0.0)
        capacity = math.floor(units / per_actor + 1e-9)
        if node.get("Alive") and capacity > 0:
            hosts.append(ActorHost(node["NodeID"], node["NodeManagerAddress"], capacity))
    return hosts


def assign(hosts: list[ActorHost], actors: int) -> list[ActorHost]:
    """The host of each actor: round-robin over the hosts with room left (spread, as Ray's SPREAD
    would), never more than a host's capacity. ValueError when they cannot take `actors`."""
    room = {h.node_id: h.capacity for h in hosts}
    if sum(room.values()) < actors:
        raise ValueError(f"--actors {actors}: the actor hosts take {sum(room.values())} in all")
    out: list[ActorHost] = []
    while len(out) < actors:
        for h in hosts:
            if len(out) < actors and room[h.node_id] > 0:
                room[h.node_id] -= 1
                out.append(h)
    return out


LEARNER_SECRET = "learner.key_secret"
CLIENT_SECRET = "client.key_secret"
SERVER_PUBLIC = "learner.key"
AUTHORIZED = "authorized"


def curve_files(clients: list[str]) -> tuple[dict[str, bytes], dict[str, dict[str, bytes]]]:
    """Fresh CURVE key pairs: the learner's files (its secret key and every client's public key under
    authorized/) and each client's (its secret key and the learner's public key), by client name.
    The keys are made in a private temporary folder on this machine and deleted with it."""
    with tempfile.TemporaryDirectory(prefix="distrl-keys-") as tmp:
        directory = Path(tmp)
        generate(directory, len(clients))
        server_public = (directory / "learner.key").read_bytes()
        learner = {LEARNER_SECRET: (directory / "learner.key_secret").read_bytes()}
        per_client = {}
        for i, name in enumerate(clients):
            learner[f"{AUTHORIZED}/{name}.key"] = (directory / f"actor-{i}.key").read_bytes()
            per_client[name] = {
                CLIENT_SECRET: (directory / f"actor-{i}.key_secret").read_bytes(),
                SERVER_PUBLIC: server_public,
            }
    return learner, per_client


def learner_curve_flags() -> list[str]:
    """The learner's CURVE flags; `{files}` is its files folder on its node (learner/launch/process_host.py)."""
    return [
        "--curve-secret-key",
        f"{{files}}/{LEARNER_SECRET}",
        "--curve-authorized",
        f"{{files}}/{AUTHORIZED}",
    ]


def client_curve_flags() -> list[str]:
    """An actor's or relay's CURVE flags."""
    return [
        "--curve-secret-key",
        f"{{files}}/{CLIENT_SECRET}",
        "--curve-server-key",
        f"{{files}}/{SERVER_PUBLIC}",
    ]
