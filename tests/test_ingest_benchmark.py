"""The ingest benchmark stays runnable and its zero-loss accounting holds: a real IngestServer in a
learner subprocess, 4 DEALER connections in one actor subprocess, about a second per mode. Every process
it starts is stopped before `run` returns (subprocess.run waits for the learner process, which closes
its actor processes in a `finally`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import ingest
from benchmarks.__main__ import BENCHMARKS
from benchmarks.report import emit
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize

pytestmark = pytest.mark.timeout(180)

REQUIRED = (
    "connections",
    "duration_s",
    "episodes_per_s",
    "steps_per_s",
    "acked",
    "sent",
    "stored",
    "lost",
    "duplicates",
    "rejected",
    "rss_start_mb",
    "rss_peak_mb",
    "rss_end_mb",
    "rss_slope_mb_per_min",
    "reference_steps_per_s",
    "ratio",
)


ZERO_LOSS = ("sent", "acked", "stored", "lost", "duplicates", "rejected", "detail")
"""The fields zero_loss is computed from (benchmarks/ingest.py), shown when it is False."""


def test_pre_encoded_traj_is_what_wire_encode_writes_and_validates():
    cfg = ModelConfig()
    rng = np.random.default_rng(0)
    episodes = [ingest.random_episode(rng, cfg, ingest.STEPS) for _ in range(ingest.EPISODES_PER_BATCH)]
    blob = ingest.episode_blobs(cfg)[0]
    assert blob == wire.encode(protocol.pack_episodes(episodes))
    data = ingest.traj_bytes(ingest.traj_head(70_000), 2**33, blob)
    assert data == wire.encode(protocol.Traj(70_000, 2**33, episodes).to_msg())
    stored = protocol.validate_episodes(
        protocol.parse(data), featurize.episode_spec(cfg, text_vocab_size=0), ingest.MAX_STEPS, 0
    )
    assert [ep.length for ep in stored] == [ingest.STEPS] * ingest.EPISODES_PER_BATCH


@pytest.mark.long
def test_ingest_benchmark_smoke(tmp_path):
    assert BENCHMARKS["ingest"] == "benchmarks.ingest"
    rows = ingest.run(True, connections=4, duration_s=1.0, warmup_s=0.2)
    out = tmp_path / "ingest.json"
    emit("ingest", rows, str(out))
    report = json.loads(out.read_text())
    assert report["benchmark"] == "ingest" and report["machine"]["cpus"] >= 1
    rows = {row["mode"]: row for row in report["rows"]}
    assert list(rows) == ["validate only (reference)", "in-process parse+validate+store", *ingest.MODES]
    reference = rows["validate only (reference)"]["steps_per_s"]
    assert reference > 0 and rows["validate only (reference)"]["ratio"] == 1

    for mode in ingest.MODES:
        row = rows[mode]
        for key in REQUIRED:
            assert key in row, (mode, key)
        assert row["connections"] == 4 and row["duration_s"] >= 1.0
        assert row["reference_steps_per_s"] == reference
        assert row["zero_loss"] is True, (row["broken"], {k: row[k] for k in ZERO_LOSS})
        assert row["lost"] == 0 and row["duplicates"] == 0, row
        detail = row["detail"]
        assert detail["unanswered"] == detail["ack_duplicates"] == detail["ack_out_of_order"] == 0, row
        assert detail["actor_processes"] == 1, (
            row
        )  # reply_drops is reported, not a loss (benchmarks/ingest.py)
        assert row["sent"] > 0 and row["msgs_per_s"] > 0, row
        assert 0 < row["rss_start_mb"] <= row["rss_peak_mb"], row

    for mode in ("credit", "credit, log os", "credit, log fsync", "ignore credit"):
        row = rows[mode]
        assert row["acked"] == row["sent"] and row["rejected"] == 0, row
        assert row["stored"] == row["sent"] * ingest.EPISODES_PER_BATCH, row
        assert row["steps_per_s"] > 0 and row["ratio"] > 0, row
        assert row["detail"]["stored_steps"] == row["stored"] * ingest.STEPS
        assert row["detail"]["errors"] == {}, row  # consecutive seqs stay within the moving grant

    for mode in ("credit", "credit, log os", "credit, log fsync"):  # every batch's ACK latency was taken
        assert 0 < rows[mode]["ack_p50_ms"] <= rows[mode]["ack_p99_ms"], rows[mode]
        assert rows[mode]["vs_none"] > 0, rows[mode]
    log = rows["credit, log fsync"]["detail"]["log"]
    assert log["records"] == rows["credit, log fsync"]["sent"] > 0, log  # every batch went into the log, once
    assert 0 < log["syncs"] <= log["records"], log  # grouped: at most one sync per batch
    assert rows["credit, log os"]["detail"]["log"].get("syncs", 0) == 0

    closed = rows["ignore credit, tap closed"]
    assert closed["stored"] == 0 and closed["acked"] == 0, closed
    assert closed["rejected"] == closed["sent"] == closed["detail"]["refused"], closed
    assert closed["detail"]["errors"] == {"no_credit": closed["sent"]}, closed
