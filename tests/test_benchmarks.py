"""Benchmarks stay runnable: the quick wire benchmark runs and writes the JSON fields BENCHMARKS.md uses."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_wire_benchmark_writes_json(tmp_path):
    out = tmp_path / "wire.json"
    cmd = [sys.executable, "-m", "benchmarks", "wire", "--quick", "--json", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "wire"
    payloads = {row["payload"]: row for row in report["rows"]}
    assert set(payloads) == {"traj_batch", "params_snapshot"}
    for row in payloads.values():
        assert row["bytes"] > 0
        for key in ("encode_gbps", "decode_gbps", "memcpy_gbps"):
            assert row[key] > 0, (key, row)
