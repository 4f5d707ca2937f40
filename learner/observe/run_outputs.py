"""What a learner run shows and leaves for readers: metrics.jsonl, the dashboards (TensorBoard, W&B), the
console's live panel, config.json (the run's settings, for `report` and readers) and endpoints.json (the
bound ports, for launchers and actors started after the learner)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from rich.console import Console

from learner.config import LearnerConfig, flat_dict
from learner.ingest.server import IngestServer
from learner.observe.console import Progress
from learner.observe.metrics import MetricsWriter
from learner.observe.status_http import StatusServer
from learner.observe.tensorboard import Dashboards


class RunOutputs:
    """Every place a metrics record goes: one `write` for each record, one `close` with the last."""

    def __init__(self, cfg: LearnerConfig, run_dir: Path, rank: int, console: Console):
        """Also writes run_dir/config.json. W&B logs from process 0 only."""
        config = flat_dict(cfg)
        dash = cfg.dashboards
        self.writer = MetricsWriter(run_dir, console.print)
        self.progress = Progress(console, dash.console, cfg.checkpoint_every)  # the live panel or lines
        self.dashboards = Dashboards(
            run_dir, config, dash.tensorboard, dash.wandb_project if rank == 0 else ""
        )
        (run_dir / "config.json").write_text(json.dumps(config, indent=1))  # what report and readers see
        self.status = _status_server(cfg, rank)

    def turned(self) -> None:
        """The main thread answered actors (for /livez)."""
        if self.status is not None:
            self.status.turned()

    def compiled(self) -> None:
        """The update is compiled (for /readyz)."""
        if self.status is not None:
            self.status.compiled = True

    def write(self, line: dict) -> None:
        self.writer.write(line)
        if self.status is not None:
            self.status.show(line)
        self.dashboards.write(line)
        self.progress.show(line)

    def close(self, last: dict) -> None:
        """The last record to metrics.jsonl and the dashboards; the console panel's last frame stays."""
        self.writer.write(last)
        self.writer.close()
        try:
            self.dashboards.close(last)
        finally:
            self.progress.close(last)  # the panel's last frame stays; later messages print below it
            if self.status is not None:
                self.status.close()


def _status_server(cfg: LearnerConfig, rank: int) -> StatusServer | None:
    """--metrics-port: this process's HTTP endpoint (port + rank, so processes on one host differ)."""
    port = cfg.dashboards.metrics_port
    if port < 0:
        return None
    return StatusServer(cfg.transport.bind, port + rank if port else 0, cfg.dashboards.live_stall_s)


ALL_INTERFACES = frozenset({"0.0.0.0", "*", "::", ""})


def reachable_host(bind: str) -> str:
    """An address actors can give as --host: the bound address, or this machine's host name when the
    learner listens on every interface (0.0.0.0 itself is not an address anyone can reach)."""
    return socket.gethostname() if bind in ALL_INTERFACES else bind


def write_endpoints(
    run_dir: Path, server: IngestServer, bind: str, status: StatusServer | None, inference_port: int = 0
) -> None:
    """run_dir/endpoints.json: the ports the ingest (and the inference service, `inference_port` 0 without
    one, and the HTTP status endpoint) bound (0 picks free ones) and `host`, where actors reach them
    (`reachable_host`), written atomically so a reader never sees half a file."""
    endpoints = {
        "ingest_port": server.ingest_port, "params_port": server.params_port, "bind": bind,
        "host": reachable_host(bind),
    }  # fmt: skip
    if inference_port:
        endpoints["inference_port"] = inference_port
    if status is not None:
        endpoints["metrics_port"] = status.port
    tmp = run_dir / "endpoints.json.tmp"
    tmp.write_text(json.dumps(endpoints))
    tmp.replace(run_dir / "endpoints.json")
