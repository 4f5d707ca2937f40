"""The learner's ingest: the IngestServer (ROUTER and PUB bound, CURVE when configured), its
write-ahead log (--durability), the ReplayInserter it stores with, the rate limit's gate, and the
inference service beside it."""

from __future__ import annotations

from pathlib import Path

import zmq
from rich.console import Console

from common.net.curve import CurveError, CurveServer
from common.policies import make_policy
from common.policies.pointer import text_encoder
from learner.config import LearnerConfig
from learner.ingest.server import IngestServer
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


def open_ingest(
    cfg: LearnerConfig, run_dir: Path, inserter: ReplayInserter, curve: CurveServer | None, console: Console
) -> IngestServer:
    """Bind the ingest and params sockets (ports in use raise here); settled batches go to `inserter`,
    and with --insert-slack its `accepts` gates the actors' credit."""
    net = cfg.transport
    durability = cfg.durability()
    wal = WriteAheadLog(run_dir / "wal", durability) if durability != "none" else None
    server = IngestServer(
        net.bind,
        net.ingest_port,
        net.params_port,
        welcome_fields={"model": cfg.model.to_dict(), "max_steps": cfg.max_steps, "mode": cfg.mode},
        episode_spec=make_policy(cfg.model).episode_spec(),
        text_vocab_size=text_encoder.vocab_size(cfg.model),
        max_steps=cfg.max_steps,
        on_episodes=inserter,
        actor_timeout=net.actor_timeout,
        credit=net.actor_credit,
        curve=curve,
        wal=wal,
        log=lambda line: console.print(line, markup=False, highlight=False),
    )
    if cfg.insert_slack():
        server.gate = inserter.accepts
    return server


def open_inference(cfg: LearnerConfig, server: IngestServer, graphdef, curve: CurveServer | None) -> None:
    """Bind and start the inference service beside the ingest (`server.inference`), unless
    --inference-port -1 or the learner has several processes (its parameters are sharded across them).
    The service gets a policy family object of its own: host-side state such as the pointer family's
    text-encoder cache is then never shared with the trainer's thread."""
    net = cfg.transport
    if net.inference_port < 0 or cfg.multihost.num_processes > 1:
        return
    port = "*" if net.inference_port == 0 else str(net.inference_port)
    batching = InferenceConfig(net.inference_max_rows, net.inference_deadline_ms, cfg.seed)
    try:
        service = InferenceService(
            make_policy(cfg.model), graphdef, server.transport.ctx, f"tcp://{net.bind}:{port}", server.actors.__contains__,
            batching, curve,
        )  # fmt: skip
    except zmq.ZMQError as e:
        raise SystemExit(
            f"cannot bind the inference service to tcp://{net.bind}:{port}: {e}. Pick another port with "
            "--inference-port (0 picks a free one, -1 turns the service off)."
        ) from e
    server.inference = service.start()
