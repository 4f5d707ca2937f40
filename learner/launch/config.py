"""The launch's configuration (`python -m learner launch --help`): what learner/launch/cluster.py places and
learner/launch/supervisor.py enforces (restarts, timeouts). Its own module so that both read it without
importing each other."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from common.net.ports import RELAY_PORT


@dataclass(frozen=True)
class LaunchConfig:
    """Place the learner and N actors on a running Ray cluster, stream their output, restart dead actors."""

    address: str = "auto"
    """The Ray cluster: "auto" (the one `ray start` runs on this machine, or RAY_ADDRESS) or HOST:PORT of
    its head node's GCS (`ray start --head` prints it)."""
    actors: int = 2
    """Actor processes to start."""
    learner_resources: tuple[str, ...] = ()
    """Resources of the learner's node, as NAME=AMOUNT: "GPU=1", "CPU=8", "TPU=4" or a custom resource
    (`ray start --resources`). None: any node."""
    actor_resource: str = "emulator"
    """Custom resource that marks a node as an actor host (`ray start --resources '{"emulator": 4}'`)."""
    actor_resource_per_actor: float = 1.0
    """Units of --actor-resource each actor takes: a node advertising K units takes K / this many actors."""
    learner_args: str = ""
    """Further `python -m learner` flags, in one quoted string (e.g. "--time-limit 600 --env standin").
    The launcher sets --run-dir and --bind (the learner node's IP)."""
    actor_args: str = ""
    """Further `python -m actors` flags, in one quoted string (e.g. "--num-envs 16"), given to every actor.
    The launcher sets --host, --ingest-port, --params-port, --name, --seed and --parent-pid before them."""
    run_dir: Path = Path("runs/ray")
    """The learner's run directory on the learner's node (relative paths: to this directory's absolute
    path, which must make sense on that node)."""
    secure: bool = False
    """Encrypt and authenticate all traffic with CURVE: the launcher makes a fresh key pair for the
    learner and for every actor and relay, and each process gets its own files on its node (BUILD.md,
    "Running on a cluster: Ray", says where the secret keys travel)."""
    insecure: bool = False
    """Pass --insecure to the learner: it then binds its node's LAN address without CURVE keys (anyone who
    reaches its ports can send episodes). Use --secure instead unless the network is yours alone."""
    relays: bool = False
    """Start one parameter relay (`python -m actors relay`) on each actor host, so the host's actors share
    one network copy of each snapshot. Actors are then pinned to their host (a dead node's actors stay
    down) and spread over the hosts by --actor-resource."""
    relay_port: int = RELAY_PORT
    """Loopback port each relay serves its host's actors on (outside adb's 5037 and 5554-5682)."""
    max_restarts: int = 3
    """Times Ray restarts each actor process after it exits (or its node dies); then it stays down."""
    start_timeout: float = 600.0
    """Seconds for the learner to bind its ports (endpoints.json) before the launch gives up."""
    stop_grace: float = 30.0
    """On stop, seconds each process has to exit after SIGTERM before SIGKILL."""
    connect_timeout: float = 10.0
    """Seconds to wait for a HOST:PORT --address to accept a connection before saying there is no cluster."""

    def __post_init__(self) -> None:
        if self.actors < 0:
            raise ValueError(f"--actors must be >= 0, got {self.actors}")
        if not self.actor_resource_per_actor > 0:
            raise ValueError(
                f"--actor-resource-per-actor must be positive, got {self.actor_resource_per_actor}"
            )
        if self.secure and self.insecure:
            raise ValueError("--secure and --insecure contradict each other: pick one")
        if not 1 <= self.relay_port <= 65535:
            raise ValueError(f"--relay-port must be in [1, 65535], got {self.relay_port}")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        for name in ("start_timeout", "stop_grace", "connect_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        parse_resources(self.learner_resources)
        for flags, name in ((self.learner_args, "--learner-args"), (self.actor_args, "--actor-args")):
            try:
                shlex.split(flags)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None


def parse_resources(items: tuple[str, ...]) -> dict[str, float]:
    """{"GPU": 1.0, ...} from ("GPU=1", ...); ValueError naming --learner-resources otherwise."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not sep or not name or not value > 0:
            raise ValueError(f"--learner-resources takes NAME=AMOUNT with a positive amount, got {item!r}")
        out[name] = value
    return out
