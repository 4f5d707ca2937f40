"""`python -m learner launch`: place the learner and N actors on a running Ray cluster (`ray start`).

Ray places and supervises processes; ZeroMQ stays the data plane. Each process (`python -m learner`,
`python -m actors`) runs as a subprocess of a small Ray actor, `ProcessHost`, that Ray places on a node
with the requested resources: the learner on a node with `--learner-resources` (e.g. `GPU=1`), the
actors spread over nodes that advertise `--actor-resource` (default `emulator`, one unit per actor, so a
node started with `ray start --resources '{"emulator": 4}'` takes at most four). The launcher (the Ray
driver, this process) reads the learner's ports from RUN_DIR/endpoints.json on the learner's node,
passes every actor `--host <learner node IP> --ingest-port P --params-port Q`, prints every process's
output lines prefixed with its name, and:

- when an actor process exits, kills its ProcessHost so that Ray restarts it (a fresh process on a node
  with the resource), at most `--max-restarts` times per actor, counted on the console; an actor that
  exits with status 2 (bad arguments) is not restarted;
- when the learner exits, says so (with its status and node) and stops the actors;
- on Ctrl-C or SIGTERM, stops the actors (SIGTERM: they flush what the learner has not acknowledged),
  then the learner, then leaves the cluster.

With `--relays`, one `python -m actors relay` per actor host (pinned there, restarted like an actor)
serves that host's actors their snapshots on loopback port `--relay-port`; the actors are then pinned
to hosts by learner/launch_plan.py. With `--secure`, the launcher makes fresh CURVE key pairs (the
learner's, and one per actor and relay) and hands each process only its own files, written 0600 on its
node by learner/process_host.py.

Delivery is unchanged: a restarted actor is a new actor process, which the learner's acks, resends and
rejoin already cover. Needs Ray (`pip install -e '.[ray]'`) on every node, with this package installed
in the same Python as the cluster's workers.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.curve import is_loopback
from common.ports import RELAY_PORT
from learner.launch_plan import (
    ActorHost,
    actor_hosts,
    assign,
    client_curve_flags,
    curve_files,
    learner_curve_flags,
)
from learner.process_host import ProcessHost, files_dir

ACTOR_ENV = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}
"""Environment of the actor processes (as `--local-actors` sets it): CPU inference, one XLA thread."""

EPISODES = re.compile(r"\beps\s+(\d+)")
"""The episode count in the learner's one-line progress report (`--console lines`, its mode in a pipe)."""


class LaunchError(Exception):
    """A launch that cannot go ahead: the one message the user sees, exit status 2."""


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


def _say(message: str) -> None:
    print(f"launch: {message}", flush=True)


def _connect(ray: Any, cfg: LaunchConfig) -> None:
    """ray.init on an existing cluster, or LaunchError with one line on why not."""
    host, sep, port = cfg.address.rpartition(":")
    if (
        cfg.address not in ("auto", "local")
        and sep
        and port.isdigit()
        and not cfg.address.startswith("ray://")
    ):
        try:
            socket.create_connection((host, int(port)), timeout=cfg.connect_timeout).close()
        except OSError as e:
            raise LaunchError(
                f"no Ray cluster at --address {cfg.address} ({e.strerror or e}); start one with `ray start --head`"
            ) from None
    try:
        ray.init(address=cfg.address, log_to_driver=False, logging_level="ERROR", configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LaunchError(
            f"could not connect to a Ray cluster at --address {cfg.address}: {first} "
            "(start one with `ray start --head`, or give --address HOST:PORT)"
        ) from None


def _check_resources(cluster: dict[str, float], cfg: LaunchConfig) -> None:
    """LaunchError when the cluster lacks a requested resource, before anything is placed."""
    have = ", ".join(
        f"{k}={v:g}"
        for k, v in sorted(cluster.items())
        if not k.startswith(("node:", "memory", "object_store"))
    )
    for name, amount in parse_resources(cfg.learner_resources).items():
        if cluster.get(name, 0) < amount:
            raise LaunchError(
                f"--learner-resources {name}={amount:g}: the cluster has {cluster.get(name, 0):g} {name} (it has: {have})"
            )
    if cfg.actors:
        need = cfg.actors * cfg.actor_resource_per_actor
        total = cluster.get(cfg.actor_resource, 0)
        if total == 0:
            raise LaunchError(
                f"--actor-resource {cfg.actor_resource}: no node advertises it (it has: {have}); start actor "
                f"hosts with `ray start --address HEAD --resources '{{\"{cfg.actor_resource}\": N}}'`"
            )
        if total < need:
            raise LaunchError(
                f"--actors {cfg.actors} need {need:g} {cfg.actor_resource} "
                f"({cfg.actor_resource_per_actor:g} each); the cluster has {total:g}"
            )


def _options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray actor options for NAME=AMOUNT resources (CPU and GPU are their own options)."""
    opts: dict[str, Any] = {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0)}
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        opts["resources"] = custom
    return opts


@dataclass(frozen=True)
class _Plan:
    """Decided before anything is placed: where actors go (with relays) and who gets which key files."""

    launch_id: str
    actor_hosts: list[ActorHost | None]
    """Each actor's host when relays pin them; None: wherever Ray's SPREAD puts it."""
    relay_hosts: list[ActorHost]
    learner_files: dict[str, bytes]
    client_files: dict[str, dict[str, bytes]]
    """CURVE files by actor or relay name (empty without --secure)."""


def _plan(ray: Any, cfg: LaunchConfig) -> _Plan:
    hosts: list[ActorHost | None] = [None] * cfg.actors
    relays: list[ActorHost] = []
    if cfg.relays and cfg.actors:
        try:
            pinned = assign(
                actor_hosts(ray.nodes(), cfg.actor_resource, cfg.actor_resource_per_actor), cfg.actors
            )
        except ValueError as e:
            raise LaunchError(f"{e} ({cfg.actor_resource_per_actor:g} {cfg.actor_resource} each)") from None
        hosts = list(pinned)
        relays = list({h.node_id: h for h in pinned}.values())
    learner_files: dict[str, bytes] = {}
    client_files: dict[str, dict[str, bytes]] = {}
    if cfg.secure:
        names = [f"actor-{i}" for i in range(cfg.actors)] + [f"relay-{j}" for j in range(len(relays))]
        learner_files, client_files = curve_files(names)
    return _Plan(uuid.uuid4().hex[:12], hosts, relays, learner_files, client_files)


class _Proc:
    """The launcher's view of one placed process."""

    def __init__(self, name: str, handle: Any):
        self.name = name
        self.handle = handle
        self.ref: Any = None  # the drain() or info() call in flight
        self.waiting_info = True
        self.pid: int | None = None
        self.restarts = 0
        self.done = False
        self.down_since: float | None = None
        self.kill_counted = False  # this restart was asked for (and counted) by _actor_exited


def launch(cfg: LaunchConfig) -> int:
    """Run the topology until the learner exits or a stop signal; the exit status."""
    try:
        import ray
    except ImportError:
        _say("needs Ray: pip install -e '.[ray]' (on every node of the cluster)")
        return 2
    try:
        _connect(ray, cfg)
        _check_resources(ray.cluster_resources(), cfg)
        plan = _plan(ray, cfg)
    except LaunchError as e:
        _say(str(e))
        ray.shutdown()
        return 2
    try:
        return _run(ray, cfg, plan)
    finally:
        ray.shutdown()


def _run(ray: Any, cfg: LaunchConfig, plan: _Plan) -> int:
    started = time.monotonic()
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        _say(f"{signal.Signals(signum).name}: stopping the actors, then the learner")
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    host_cls = ray.remote(ProcessHost)
    run_dir = cfg.run_dir.expanduser().absolute()
    learner_argv = [
        "-m", "learner", "--run-dir", str(run_dir), "--bind", "{node_ip}",
        *(["--insecure"] if cfg.insecure else []), *(learner_curve_flags() if cfg.secure else []),
        *shlex.split(cfg.learner_args),
    ]  # fmt: skip
    if cfg.secure:
        _say(
            f"CURVE: fresh key pairs for the learner and {len(plan.client_files)} actors/relays; each process's "
            f"own keys are written to {files_dir(plan.launch_id, '<name>')} on its node, deleted when it stops"
        )
    learner = _Proc(
        "learner",
        host_cls.options(max_restarts=0, **_options(parse_resources(cfg.learner_resources))).remote(
            "learner", learner_argv, {}, [str(run_dir / "endpoints.json")], plan.learner_files, plan.launch_id
        ),
    )
    procs = [learner]
    first_episodes: float | None = None
    status = 0
    try:
        info = ray.get(learner.handle.info.remote())
        learner.pid = info["pid"]
        _say(
            f"learner: pid {info['pid']} on {info['node_ip']} (node {info['node_id'][:8]}), run dir {run_dir}"
        )
        if not is_loopback(info["node_ip"]) and not (cfg.insecure or cfg.secure):
            _say("the learner's node is not on loopback: without --secure or --insecure it refuses to bind")
        endpoints = None
        deadline = time.monotonic() + cfg.start_timeout
        while endpoints is None and not stop.is_set():
            lines, rc = ray.get(learner.handle.drain.remote(0.5))
            _print("learner", lines)
            if rc is not None:
                _say(f"the learner exited with status {rc} before binding its ports (its output is above)")
                learner.done = True
                return 1
            text = ray.get(learner.handle.read_text.remote(str(run_dir / "endpoints.json")))
            if text:
                endpoints = json.loads(text)
            elif time.monotonic() > deadline:
                _say(
                    f"the learner did not write {run_dir / 'endpoints.json'} within --start-timeout {cfg.start_timeout:g} s"
                )
                return 1
        if stop.is_set():
            return 0
        assert endpoints is not None
        host = info["node_ip"]
        _say(
            f"learner ready after {time.monotonic() - started:.1f} s: ingest {host}:{endpoints['ingest_port']}, "
            f"params {host}:{endpoints['params_port']}"
        )
        relays = _start_relays(host_cls, cfg, plan, host, endpoints["params_port"])
        actors = _start_actors(host_cls, cfg, plan, host, endpoints)
        procs += relays + actors
        learner.waiting_info = False
        while not stop.is_set():
            for p in procs:
                if p.ref is None and not p.done:
                    p.ref = p.handle.info.remote() if p.waiting_info else p.handle.drain.remote(0.5)
            refs = [p.ref for p in procs if p.ref is not None]
            if not refs:
                break
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)
            for p in procs:
                if p.ref is None or p.ref not in ready:
                    continue
                ref, p.ref = p.ref, None
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    if p is learner:
                        _say(
                            f"the learner's Ray actor died ({type(e).__name__}: its node or worker is gone); stopping"
                        )
                        return 1
                    _actor_unavailable(p, cfg)
                    continue
                if p.waiting_info:
                    p.waiting_info, p.down_since = False, None
                    if result["pid"] != p.pid:
                        unasked = p.pid is not None and result["restarted"] and not p.kill_counted
                        if unasked and p.restarts < cfg.max_restarts:
                            p.restarts += 1  # Ray restarted it without our asking (its worker or node died)
                        p.kill_counted = False
                        again = f" (restart {p.restarts} of {cfg.max_restarts})" if p.restarts else ""
                        p.pid = result["pid"]
                        _say(
                            f"{p.name}: pid {p.pid} on {result['node_ip']} (node {result['node_id'][:8]}){again}"
                        )
                    continue
                lines, rc = result
                _print(p.name, lines)
                if p is learner and first_episodes is None:
                    for line in lines:
                        m = EPISODES.search(line)
                        if m and int(m.group(1)) > 0:
                            first_episodes = time.monotonic() - started
                            _say(f"first episodes acknowledged {first_episodes:.1f} s after launch")
                            break
                if rc is None:
                    continue
                if p is learner:
                    if rc == 0:
                        _say("the learner finished (status 0); stopping the actors")
                    else:
                        _say(f"the learner died with status {rc} on its node; stopping the actors")
                        status = 1
                    learner.done = True
                    return status
                _actor_exited(ray, p, rc, cfg)
            if all(p.done for p in actors) and cfg.actors:
                _say("no actor is left running; stopping the learner")
                return 1
        return status
    except KeyboardInterrupt:
        _say("second signal: killing everything")
        for p in procs:
            ray.kill(p.handle, no_restart=True)
        return 130
    finally:
        _stop_all(ray, procs, cfg)
        for s, handler in old.items():
            signal.signal(s, handler)


def _start_relays(host_cls: Any, cfg: LaunchConfig, plan: _Plan, host: str, params_port: int) -> list[_Proc]:
    """One relay per actor host, pinned to it, subscribed to the learner at `host`."""
    out = []
    for j, node in enumerate(plan.relay_hosts):
        name = f"relay-{j}"
        argv = [
            "-m", "actors", "relay", "--host", host, "--params-port", str(params_port),
            "--port", str(cfg.relay_port), "--status-every", "10",
            *(client_curve_flags() if cfg.secure else []),
        ]  # fmt: skip
        handle = host_cls.options(
            num_cpus=0,
            scheduling_strategy=_pinned(node.node_id),
            max_restarts=cfg.max_restarts,
        ).remote(name, argv, {}, [], plan.client_files.get(name), plan.launch_id)
        out.append(_Proc(name, handle))
    return out


def _start_actors(host_cls: Any, cfg: LaunchConfig, plan: _Plan, host: str, endpoints: dict) -> list[_Proc]:
    """N actors on nodes with the actor resource: pinned beside their host's relay, or spread by Ray."""
    out = []
    for i, node in enumerate(plan.actor_hosts):
        name = f"actor-{i}"
        argv = [
            "-m", "actors", "--host", host,
            "--ingest-port", str(endpoints["ingest_port"]), "--params-port", str(endpoints["params_port"]),
            "--name", f"ray-actor-{i}", "--seed", str(i), "--parent-pid", "{pid}",
            *(["--params-endpoint", f"tcp://127.0.0.1:{cfg.relay_port}"] if node is not None else []),
            *(client_curve_flags() if cfg.secure else []),
            *shlex.split(cfg.actor_args),
        ]  # fmt: skip
        handle = host_cls.options(
            num_cpus=0,
            resources={cfg.actor_resource: cfg.actor_resource_per_actor},
            scheduling_strategy="SPREAD" if node is None else _pinned(node.node_id),
            max_restarts=cfg.max_restarts,
        ).remote(name, argv, ACTOR_ENV, [], plan.client_files.get(name), plan.launch_id)
        out.append(_Proc(name, handle))
    return out


def _pinned(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _actor_exited(ray: Any, p: _Proc, rc: int, cfg: LaunchConfig) -> None:
    """An actor process exited: have Ray restart its host, unless it was bad arguments or out of restarts."""
    if rc == 2:
        _say(f"{p.name}: exited with status 2 (bad --actor-args? its output is above); not restarting it")
        p.done = True
    elif p.restarts >= cfg.max_restarts:
        _say(f"{p.name}: exited with status {rc}; all {cfg.max_restarts} restarts used, leaving it down")
        p.done = True
    else:
        p.restarts += 1
        _say(
            f"{p.name}: exited with status {rc}; Ray restarts it (restart {p.restarts} of {cfg.max_restarts})"
        )
        ray.kill(p.handle, no_restart=False)
        p.waiting_info, p.down_since, p.kill_counted = True, time.monotonic(), True


def _actor_unavailable(p: _Proc, cfg: LaunchConfig) -> None:
    """A call to an actor's host failed: it is restarting (ask again) or gone for good."""
    now = time.monotonic()
    if p.down_since is None:
        p.down_since = now
    p.waiting_info = True
    if now - p.down_since > cfg.start_timeout:
        _say(f"{p.name}: its Ray actor has not come back in {cfg.start_timeout:g} s; leaving it down")
        p.done = True
    else:
        time.sleep(0.2)


def _stop_all(ray: Any, procs: list[_Proc], cfg: LaunchConfig) -> None:
    """Actors and relays first (actors flush to the learner), then the learner; then their Ray actors.
    Processes that already exited are asked too, so that their hosts delete their key files."""
    for group in (procs[1:], procs[:1]):
        calls = [(p, p.handle.stop.remote(cfg.stop_grace)) for p in group]
        for p, ref in calls:
            try:
                lines, rc = ray.get(ref, timeout=cfg.stop_grace + 15)
            except Exception as e:  # its Ray actor is gone or stuck: killed below
                if not p.done:
                    _say(f"{p.name}: could not stop it cleanly ({type(e).__name__})")
                continue
            _print(p.name, lines)
            if not p.done:
                _say(f"{p.name}: stopped (status {rc})")
    for p in procs:
        ray.kill(p.handle, no_restart=True)


def _print(name: str, lines: list[str]) -> None:
    for line in lines:
        print(f"[{name}] {line}", flush=True)
