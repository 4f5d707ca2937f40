"""The learner's ingest, composed: the bound sockets (CURVE when configured), the actor registry, the
delivery ledger, the batch settler with its write-ahead log (--durability) and the rate limit's gate,
the snapshot publisher, handed to the IngestServer built; and the inference service beside it, which is
the session's (it shares the sockets' ZeroMQ context and asks the registry who is an actor)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from rich.console import Console

from common import protocol
from common.config import ModelConfig
from common.net.curve import CurveError, CurveServer
from common.policies import make_policy
from common.policies.family import welcome_fields as family_welcome_fields
from learner.config import LearnerConfig
from learner.ingest.audit import FILE_NAME as AUDIT_FILE
from learner.ingest.audit import AuditLog
from learner.ingest.delivery import DeliveryLedger
from learner.ingest.peer_versions import PeerVersions
from learner.ingest.publisher import ParamPublisher
from learner.ingest.registry import ActorRegistry
from learner.ingest.server import EpisodeCheck, IngestServer, RunWelcome
from learner.ingest.settler import BatchSettler, Store
from learner.ingest.transport import Transport
from learner.ingest.wal import WriteAheadLog
from learner.inserter import ReplayInserter
from learner.serving.inference import InferenceConfig, InferenceService


def curve_server(cfg: LearnerConfig) -> CurveServer | None:
    """The CURVE keys of both sockets (LearnerConfig has checked the flags), or None; SystemExit naming
    the key file that cannot be used (read first, so a bad key stops the run before anything is built)."""
    net = cfg.transport
    if net.curve_secret_key is None:
        return None
    try:
        return CurveServer(net.curve_secret_key, net.curve_authorized)
    except CurveError as e:
        raise SystemExit(f"CURVE: {e}") from e


def ingest_server(
    transport: Transport,
    registry: ActorRegistry,
    *,
    welcome_fields: dict[str, Any],
    episode_spec: protocol.EpisodeSpec,
    max_steps: int,
    on_episodes: Store,
    credit: int = 8,
    heartbeat_every: float = 1.0,
    inference_port: int = 0,
    wal: WriteAheadLog | None = None,
    gate: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
    audit: AuditLog | None = None,
) -> IngestServer:
    """The IngestServer on a bound `transport`, its parts built here: `welcome_fields` are the run-wide
    WELCOME fields (`model` as a dict, `max_steps`, optionally `mode` and the family's own, such as
    `text_vocab_size`; a key WELCOME lacks is a TypeError);
    settled episodes go to `on_episodes`, each new batch through `wal` first when given; `gate` is the
    learner's rate limit on the grants (None: always open); `log` takes the storage errors' lines
    (None: stderr); `audit` gets a line per logged batch (--audit-log, learner/ingest/audit.py)."""
    model = ModelConfig.from_dict(welcome_fields["model"])
    fields = {**welcome_fields, "model": model}
    welcome = RunWelcome(uuid.uuid4().hex[:12], heartbeat_every, {**fields, "inference_port": inference_port})
    ledger = DeliveryLedger(credit)
    settler = BatchSettler(
        ledger, wal, on_episodes, transport, gate or (lambda: True), log or _to_stderr, audit
    )
    check = EpisodeCheck(episode_spec, max_steps)
    return IngestServer(transport, registry, ledger, settler, ParamPublisher(transport), check, welcome)


def open_ingest(
    cfg: LearnerConfig,
    run_dir: Path,
    inserter: ReplayInserter,
    graphdef: Any,
    curve: CurveServer | None,
    console: Console,
) -> tuple[IngestServer, InferenceService | None]:
    """Bind the ingest and params sockets (ports in use raise here), then the inference service
    (`open_inference`); settled batches go to `inserter`, and with --insert-slack its `accepts` gates
    the actors' credit. On a failure what was bound is closed again."""
    net = cfg.transport
    durability = cfg.durability()
    segment_bytes = net.wal_segment_mb * 2**20
    wal = WriteAheadLog(run_dir / "wal", durability, segment_bytes) if durability != "none" else None
    policy = make_policy(cfg.model)
    spec = policy.episode_spec()
    peers = PeerVersions(spec, cfg.model)  # which older actors this run can serve
    transport = Transport(net.bind, net.ingest_port, net.params_port, curve, peers)
    registry = ActorRegistry(net.actor_timeout)
    inference = audit = None
    try:
        if wal is not None and net.audit_log:
            audit = AuditLog(run_dir / AUDIT_FILE, durability == "fsync")
        inference = open_inference(cfg, transport.ctx, registry, graphdef, curve)
        server = ingest_server(
            transport,
            registry,
            welcome_fields={
                "model": cfg.model.to_dict(),
                "max_steps": cfg.max_steps,
                "mode": cfg.mode,
                **family_welcome_fields(policy),
            },
            episode_spec=spec,
            max_steps=cfg.max_steps,
            on_episodes=inserter,
            credit=net.actor_credit,
            inference_port=inference.port if inference is not None else 0,
            wal=wal,
            gate=inserter.accepts if cfg.insert_slack() else None,
            log=lambda line: console.print(line, markup=False, highlight=False),
            audit=audit,
        )
    except BaseException:
        if inference is not None:
            inference.close()
        if wal is not None:
            wal.close()
        if audit is not None:
            audit.close()
        transport.close()
        raise
    return server, inference


def open_inference(
    cfg: LearnerConfig, ctx: zmq.Context, registry: ActorRegistry, graphdef: Any, curve: CurveServer | None
) -> InferenceService | None:
    """Bind and start the inference service on the ingest's context `ctx` (its CURVE authenticator
    included), unless --inference-port -1 or the learner has several processes (its parameters are
    sharded across them): None then. The service gets a policy family object of its own: host-side state
    such as the pointer family's text-encoder cache is then never shared with the trainer's thread."""
    net = cfg.transport
    if net.inference_port < 0 or cfg.multihost.num_processes > 1:
        return None
    port = "*" if net.inference_port == 0 else str(net.inference_port)
    batching = InferenceConfig(net.inference_max_rows, net.inference_deadline_ms, cfg.seed)
    try:
        service = InferenceService(
            make_policy(cfg.model), graphdef, ctx, f"tcp://{net.bind}:{port}", registry.actors.__contains__,
            batching, curve,
        )  # fmt: skip
    except zmq.ZMQError as e:
        raise SystemExit(
            f"cannot bind the inference service to tcp://{net.bind}:{port}: {e}. Pick another port with "
            "--inference-port (0 picks a free one, -1 turns the service off)."
        ) from e
    return service.start()


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
