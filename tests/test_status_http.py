"""The learner's operator endpoint (learner/observe/status_http.py): a Prometheus scrape returns the metrics
record, and the health probes mean what the Kubernetes recipe relies on."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from learner.observe.status_http import COUNTERS, StatusServer, metric_name
from tests.conftest import START_S

RECORD = {
    "run_id": "abc", "mode": "async", "phase": "rl", "durability": "fsync", "storage_error": "",
    "update": 12, "env_steps": 3400, "accepting": True, "replay/size": 17, "policy_lag_mean": 1.5,
    "rejected_by_reason": {"auth_failed": 2, "bad_batch": 1}, "success_by_task": {"clock": 0.25},
    "policy_lag_trained": {}, "note": "words other than INFO_KEYS are not numbers",
}  # fmt: skip


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, parsed by prometheus_client's own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def expected_samples(record: dict) -> dict[tuple[str, tuple], float]:
    """The mapping the module documents, written out plainly: numbers as themselves (`_total` for running
    totals), dicts one sample per entry labelled `key`, the words as distrl_info's labels."""
    out = {("distrl_info", tuple(sorted((k, str(record.get(k, ""))) for k in
            ("run_id", "mode", "phase", "durability", "storage_error")))): 1.0}  # fmt: skip
    for key, value in record.items():
        if key in ("run_id", "mode", "phase", "durability", "storage_error") or isinstance(value, str):
            continue
        name = metric_name(key) + ("_total" if key in COUNTERS else "")
        if isinstance(value, dict):
            out.update({(name, (("key", k),)): float(v) for k, v in value.items()})
        else:
            out[(name, ())] = float(value)
    return out


@pytest.fixture
def status():
    server = StatusServer("127.0.0.1", 0, stall_s=30.0)
    yield server
    server.close()


def test_a_scrape_returns_the_newest_record(status):
    assert get(status.port, "/metrics") == (200, "")  # no record yet: nothing made up
    status.show(RECORD)
    code, text = get(status.port, "/metrics")
    assert code == 200
    got = {k: v for k, v in samples(text).items() if not k[0].endswith("_created")}
    assert got == expected_samples(RECORD)
    assert got[("distrl_rejected_by_reason_total", (("key", "auth_failed"),))] == 2.0
    status.show({**RECORD, "update": 13})
    assert samples(get(status.port, "/metrics")[1])[("distrl_update_total", ())] == 13.0


def test_ready_once_compiled_and_only_while_accepting(status):
    assert get(status.port, "/readyz") == (503, "compiling\n")
    status.compiled = True
    assert get(status.port, "/readyz") == (200, "ok\n")
    status.show({**RECORD, "accepting": False})
    code, text = get(status.port, "/readyz")
    assert code == 503 and "storage unavailable" in text
    status.show(RECORD)
    assert get(status.port, "/readyz")[0] == 200


def test_live_until_the_main_thread_stops_turning(status):
    assert get(status.port, "/livez") == (200, "ok\n")
    status.last_turn = time.monotonic() - 31.0  # as if the main thread hung in a collective
    code, text = get(status.port, "/livez")
    assert code == 503 and "stuck" in text
    status.turned()
    assert get(status.port, "/livez")[0] == 200
    assert get(status.port, "/nothing")[0] == 404


def test_a_running_learner_serves_its_metrics_records(learner_process):
    """A real learner: endpoints.json names the port, /readyz turns 200 after the compile, and a scrape
    is exactly one of the records metrics.jsonl holds (the `wall` gauge says which)."""
    learner = learner_process("--metrics-port", "0", "--log-every", "0.3")
    port = json.loads((learner.run_dir / "endpoints.json").read_text())["metrics_port"]
    assert get(port, "/livez")[0] == 200
    deadline = time.monotonic() + START_S
    while get(port, "/readyz")[0] != 200:
        assert time.monotonic() < deadline and learner.proc.poll() is None, learner.log()
        time.sleep(0.2)
    time.sleep(1.0)  # a record after the compile
    scraped = {k: v for k, v in samples(get(port, "/metrics")[1]).items() if not k[0].endswith("_created")}
    wall = scraped[("distrl_wall", ())]
    record = next(m for m in learner.metrics() if m["wall"] == wall)
    assert scraped == expected_samples({k: v for k, v in record.items() if v is not None})
    assert record["phase"] and scraped[("distrl_update_total", ())] == record["update"]
    assert learner.stop() == 0
