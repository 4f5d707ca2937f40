"""The learner's HTTP endpoint for operators (--metrics-port): Prometheus metrics and health probes.

- `/metrics`: the newest metrics record (the one metrics.jsonl got last) in Prometheus' text format.
  Each number becomes `distrl_<key>` (`/` and other signs become `_`): running totals (COUNTERS) as
  counters (`_total`), the rest as gauges; a dict of numbers becomes one series per entry, labelled
  `key`; the record's words (run_id, mode, phase, durability, storage_error) become the labels of
  `distrl_info`, always 1.
- `/livez`: 200 while the main thread turns (it answers actors at least every few hundred ms, also
  during a compile, an update or a publish); 503 once it has been stuck for `stall_s` (a collective
  waiting for a dead peer process, a deadlock), so an orchestrator restarts the process.
- `/readyz`: 200 once the update is compiled and the learner accepts data (storage is writable);
  503 before, and while storage is unavailable.

It runs on its own daemon thread and reads only what the main thread hands it (a record, two flags),
so a scrape never touches the sockets, the replay or the parameters.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "distrl_"
COUNTERS = frozenset({
    "update", "env_steps", "episodes", "rejected", "rejected_by_reason", "duplicates", "dropped_replies",
    "dropped_episodes", "batches_lost_in_restart", "skipped_nonfinite", "instruction_filtered",
    "imitation_updates", "sync_rounds", "sync_rounds_timed_out", "replay/added", "replay/sampled",
    "replay/evicted_fifo", "replay/dropped_stale", "replay/dropped_stale_at_add",
    "inference/rejected_by_reason", "inference/dropped_replies", "inference/idle_publishes",
})  # fmt: skip
"""Record keys that only grow during a run (exported as counters; a restarted learner starts them again
from its checkpoint's values or 0, which Prometheus' rate() treats as a reset)."""
INFO_KEYS = ("run_id", "mode", "phase", "durability", "storage_error")
"""The record's words: labels of `distrl_info`."""


def metric_name(key: str) -> str:
    """`replay/size` -> `distrl_replay_size`: Prometheus allows letters, digits and `_` only."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def record_metrics(record: dict[str, Any]) -> Iterator[Metric]:
    """The Prometheus families of one metrics record (see the module docstring for the mapping)."""
    info = GaugeMetricFamily(PREFIX + "info", "The run's words", labels=[k for k in INFO_KEYS])
    info.add_metric([str(record.get(k, "")) for k in INFO_KEYS], 1.0)
    yield info
    for key, value in sorted(record.items()):
        if key in INFO_KEYS:
            continue
        family = CounterMetricFamily if key in COUNTERS else GaugeMetricFamily
        help_text = f"metrics.jsonl `{key}`"
        if isinstance(value, dict):
            entries = {str(k): _number(v) for k, v in value.items()}
            metric = family(metric_name(key), help_text, labels=["key"])
            for label, number in sorted(entries.items()):
                if number is not None:
                    metric.add_metric([label], number)
            yield metric
        elif (number := _number(value)) is not None:
            yield family(metric_name(key), help_text, value=number)


class _RecordCollector:
    """prometheus_client asks `collect` at each scrape: the newest record, converted then."""

    def __init__(self, status: StatusServer):
        self.status = status

    def collect(self) -> Iterator[Metric]:
        record = self.status.record
        if record is not None:
            yield from record_metrics(record)


class StatusServer:
    """The endpoint of the module docstring on `bind:port` (0 picks a free port: `port` after start)."""

    def __init__(self, bind: str, port: int, stall_s: float):
        self.stall_s = stall_s
        self.record: dict[str, Any] | None = None
        """The newest metrics record (replaced whole by the main thread, read whole by scrapes)."""
        self.compiled = False
        self.accepting = True
        self.last_turn = time.monotonic()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_RecordCollector(self))
        self._http = ThreadingHTTPServer((bind, port), _handler(self))
        self._http.daemon_threads = True
        self.port: int = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="status-http", daemon=True)
        self._thread.start()

    def turned(self) -> None:
        """The main thread is turning (called at every poll)."""
        self.last_turn = time.monotonic()

    def show(self, record: dict[str, Any]) -> None:
        """A new metrics record: the next scrape returns it."""
        self.record = record
        self.accepting = bool(record.get("accepting", True))

    def live(self) -> tuple[bool, str]:
        stuck = time.monotonic() - self.last_turn
        if stuck > self.stall_s:
            return False, f"main thread stuck for {stuck:.0f}s (limit {self.stall_s:g}s)"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self.compiled:
            return False, "compiling"
        if not self.accepting:
            return False, "storage unavailable: not accepting data"
        return True, "ok"

    def metrics_text(self) -> bytes:
        return generate_latest(self._registry)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)


def _handler(status: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls it by this name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, status.metrics_text(), CONTENT_TYPE_LATEST)
            elif path in ("/livez", "/readyz"):
                ok, why = status.live() if path == "/livez" else status.ready()
                self._reply(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._reply(404, b"not found: /metrics, /livez or /readyz\n", "text/plain; charset=utf-8")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:  # scrapes every few seconds would flood stderr
            pass

    return Handler
