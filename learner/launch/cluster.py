"""`python -m learner launch`: place the learner and N actors on a running Ray cluster (`ray start`).

Ray places and supervises processes; ZeroMQ stays the data plane. Each process (`python -m learner`,
`python -m actors`) runs as a subprocess of a small Ray actor, `ProcessHost`, that Ray places on a node
with the requested resources: the learner on a node with `--learner-resources` (e.g. `GPU=1`), the
actors spread over nodes that advertise `--actor-resource` (default `emulator`, one unit per actor, so a
node started with `ray start --resources '{"emulator": 4}'` takes at most four). The launcher (the Ray
driver, this process) reads the learner's ports from RUN_DIR/endpoints.json on the learner's node,
passes every actor `--host <learner node IP> --ingest-port P --params-port Q` (common/actor_command.py
spells the actor's command line), prints every process's output lines prefixed with its name, says when
the first episodes are in (the `episodes` count of the learner's RUN_DIR/metrics.jsonl records), and:

- when an actor process exits, kills its ProcessHost so that Ray restarts it (a fresh process on a node
  with the resource), at most `--max-restarts` times per actor, counted on the console; an actor that
  exits with status 2 (bad arguments) is not restarted;
- when the learner exits, says so (with its status and node) and stops the actors;
- on Ctrl-C or SIGTERM, stops the actors (SIGTERM: they flush what the learner has not acknowledged),
  then the learner, then leaves the cluster.

With `--relays`, one `python -m actors relay` per actor host (pinned there, restarted like an actor)
serves that host's actors their snapshots on loopback port `--relay-port`; the actors are then pinned
to hosts by learner/launch/plan.py. With `--secure`, the launcher makes fresh CURVE key pairs (the
learner's, and one per actor and relay) and hands each process only its own files, written 0600 on its
node by learner/launch/process_host.py.

The rules above are learner/launch/supervisor.py, a state machine with one handler per event; this
module places the processes and turns what their ProcessHosts answer into those events.

Delivery is unchanged: a restarted actor is a new actor process, which the learner's acks, resends and
rejoin already cover. Needs Ray (`pip install -e '.[ray]'`) on every node, with this package installed
in the same Python as the cluster's workers.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.actor_command import actor_command
from learner.launch.config import LaunchConfig, parse_resources
from learner.launch.plan import (
    ActorHost,
    actor_hosts,
    assign,
    client_curve_flags,
    curve_files,
    learner_curve_flags,
)
from learner.launch.process_host import ProcessHost, files_dir
from learner.launch.supervisor import Actions, Event, Proc, Supervisor

ACTOR_ENV = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}
"""Environment of the actor processes (as `--local-actors` sets it): CPU inference, one XLA thread."""


class LaunchError(Exception):
    """A launch that cannot go ahead: the one message the user sees, exit status 2."""


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


class _Signals:
    """SIGINT and SIGTERM while it is installed: the first becomes a `signal` event, a second raises
    KeyboardInterrupt (the launcher then kills everything at once)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.taken = False
        self.old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def events(self) -> list[Event]:
        if self.received is None or self.taken:
            return []
        self.taken = True
        return [Event("signal", data=self.received)]

    def restore(self) -> None:
        for s, handler in self.old.items():
            signal.signal(s, handler)


class _RayEvents:
    """The supervisor's events from the processes' ProcessHosts: one call in flight per process (where it
    runs after a placement or restart, else its output) and one read of the learner file it wants."""

    def __init__(self, ray: Any, sup: Supervisor, run_dir: Path):
        self.ray, self.sup = ray, sup
        self.paths = {"endpoints": str(run_dir / "endpoints.json"), "metrics": str(run_dir / "metrics.jsonl")}
        self.inflight: dict[Any, tuple[str, Proc]] = {}
        """Each call in flight: its slot (a process's name, or the learner file it reads) and process."""

    def poll(self, timeout: float = 0.5) -> list[Event]:
        self._submit()
        refs = list(self.inflight)
        if not refs:
            time.sleep(timeout)
            return []
        ready = set(self.ray.wait(refs, num_returns=len(refs), timeout=timeout)[0])
        events: list[Event] = []
        for ref in refs:  # in the order asked: a process's placement before the files it writes
            if ref in ready:
                slot, p = self.inflight.pop(ref)
                events += self._events(slot, p, ref)
        return events

    def _submit(self) -> None:
        busy = {slot for slot, _ in self.inflight.values()}
        for p in self.sup.procs:
            if not p.done and p.name not in busy:
                ref = p.handle.info.remote() if p.waiting_info else p.handle.drain.remote(0.5)
                self.inflight[ref] = (p.name, p)
        want = self.sup.reading()
        if want is not None and want not in busy:
            host, path = self.sup.learner.handle, self.paths[want]
            ref = host.read_text.remote(path) if want == "endpoints" else host.new_lines.remote(path)
            self.inflight[ref] = (want, self.sup.learner)

    def _events(self, slot: str, p: Proc, ref: Any) -> list[Event]:
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:
            time.sleep(0.2)  # it is restarting: do not spin on calls that fail at once
            return [Event("unavailable", p, type(e).__name__)]
        if slot == "endpoints":
            return [Event("endpoints", p, json.loads(result))] if result else []
        if slot == "metrics":
            records = [r for r in map(_json_or_none, result) if isinstance(r, dict)]
            return [Event("metrics", p, records)] if records else []
        if isinstance(result, dict):  # info(): where it runs
            return [Event("placed", p, result)]
        lines, rc = result  # drain()
        return [Event("lines", p, lines), *([Event("exited", p, rc)] if rc is not None else [])]


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _run(ray: Any, cfg: LaunchConfig, plan: _Plan) -> int:
    """Place the learner, then hand every event to the supervisor until it says the launch is over;
    then stop everything (a second signal: kill everything)."""
    host_cls = ray.remote(ProcessHost)
    run_dir = cfg.run_dir.expanduser().absolute()
    if cfg.secure:
        _say(
            f"CURVE: fresh key pairs for the learner and {len(plan.client_files)} actors/relays; each process's "
            f"own keys are written to {files_dir(plan.launch_id, '<name>')} on its node, deleted when it stops"
        )
    actions = Actions(
        place=lambda host, endpoints: (
            _start_relays(host_cls, cfg, plan, host, endpoints["params_port"])
            + _start_actors(host_cls, cfg, plan, host, endpoints)
        ),
        restart=lambda p: ray.kill(p.handle, no_restart=False),
        say=_say,
        show=_print,
    )
    sup = Supervisor(cfg, run_dir, _start_learner(host_cls, cfg, plan, run_dir), actions)
    signals = _Signals()
    try:
        status = _supervise(sup, _RayEvents(ray, sup, run_dir), signals)
        _stop_all(ray, sup.procs, cfg)
        return status
    except KeyboardInterrupt:
        _say("second signal: killing everything")
        for p in sup.procs:
            ray.kill(p.handle, no_restart=True)
        return 130
    except BaseException:
        _stop_all(ray, sup.procs, cfg)
        raise
    finally:
        signals.restore()


def _supervise(sup: Supervisor, events: _RayEvents, signals: _Signals) -> int:
    while True:
        for event in (*events.poll(), *signals.events(), Event("tick")):
            status = sup.handle(event)
            if status is not None:
                return status


def _start_learner(host_cls: Any, cfg: LaunchConfig, plan: _Plan, run_dir: Path) -> Proc:
    """The learner's ProcessHost on a node with --learner-resources (never restarted)."""
    argv = [
        "-m", "learner", "--run-dir", str(run_dir), "--bind", "{node_ip}",
        *(["--insecure"] if cfg.insecure else []), *(learner_curve_flags() if cfg.secure else []),
        *shlex.split(cfg.learner_args),
    ]  # fmt: skip
    handle = host_cls.options(max_restarts=0, **_options(parse_resources(cfg.learner_resources))).remote(
        "learner",
        argv,
        {},
        [str(run_dir / "endpoints.json")],
        plan.learner_files,
        plan.launch_id,
        [str(run_dir / "metrics.jsonl")],
    )
    return Proc("learner", handle)


def _start_relays(host_cls: Any, cfg: LaunchConfig, plan: _Plan, host: str, params_port: int) -> list[Proc]:
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
        out.append(Proc(name, handle))
    return out


def _start_actors(host_cls: Any, cfg: LaunchConfig, plan: _Plan, host: str, endpoints: dict) -> list[Proc]:
    """N actors on nodes with the actor resource: pinned beside their host's relay, or spread by Ray."""
    out = []
    for i, node in enumerate(plan.actor_hosts):
        name = f"actor-{i}"
        argv = actor_command(
            host=host,
            ingest_port=endpoints["ingest_port"],
            params_port=endpoints["params_port"],
            params_endpoint=f"tcp://127.0.0.1:{cfg.relay_port}" if node is not None else "",
            name=f"ray-actor-{i}",
            seed=i,
            parent_pid="{pid}",  # its ProcessHost's: it exits when its host is gone
            extra=[*(client_curve_flags() if cfg.secure else []), *shlex.split(cfg.actor_args)],
            python=None,  # the ProcessHost runs it with its node's Python
        )
        handle = host_cls.options(
            num_cpus=0,
            resources={cfg.actor_resource: cfg.actor_resource_per_actor},
            scheduling_strategy="SPREAD" if node is None else _pinned(node.node_id),
            max_restarts=cfg.max_restarts,
        ).remote(name, argv, ACTOR_ENV, [], plan.client_files.get(name), plan.launch_id)
        out.append(Proc(name, handle))
    return out


def _pinned(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _stop_all(ray: Any, procs: list[Proc], cfg: LaunchConfig) -> None:
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
