"""Encode/decode throughput of real TRAJ batches and parameter snapshots, against a memcpy of the same bytes."""

from __future__ import annotations

import numpy as np

from benchmarks import data
from benchmarks.report import best_seconds
from common import model, protocol, wire
from common.config import ModelConfig


def _traj_message(count: int, cfg: ModelConfig) -> dict:
    eps = [
        protocol.episode_fields(ep.task, ep.success, ep.truncated, ep.obs, ep.steps)
        for ep in data.episodes(cfg, count)
    ]
    return protocol.message(protocol.TRAJ, actor_id=1, seq=1, episodes=eps)


def run(quick: bool) -> list[dict]:
    cfg = ModelConfig()
    repeats = 3 if quick else 10
    rows = []
    msg = _traj_message(16 if quick else 64, cfg)
    encoded = wire.encode(msg)
    buf = np.frombuffer(encoded, np.uint8)
    memcpy = best_seconds(lambda: buf.copy(), repeats, inner=20)
    enc = best_seconds(lambda: wire.encode(msg), repeats)
    dec = best_seconds(lambda: protocol.parse(encoded), repeats)
    gb = len(encoded) / 1e9
    rows.append(_row("traj_batch", len(encoded), gb / enc, gb / dec, gb / memcpy))

    _, params = model.create(cfg, 0)
    flat = model.params_to_flat(params)
    size = sum(a.nbytes for a in flat.values())
    blob = np.frombuffer(b"".join(a.tobytes() for a in flat.values()), np.uint8)
    memcpy = best_seconds(lambda: blob.copy(), repeats, inner=20)
    frames = protocol.params_frames(0, flat)
    raw = [bytes(f) for f in frames]
    enc = best_seconds(lambda: protocol.params_frames(0, flat), repeats, inner=5)
    dec = best_seconds(lambda: protocol.parse_params(raw), repeats, inner=5)
    gb = size / 1e9
    rows.append(_row("params_snapshot", size, gb / enc, gb / dec, gb / memcpy))
    return rows


def _row(what: str, nbytes: int, encode_gbps: float, decode_gbps: float, memcpy_gbps: float) -> dict:
    return {
        "payload": what,
        "bytes": nbytes,
        "encode_gbps": encode_gbps,
        "decode_gbps": decode_gbps,
        "memcpy_gbps": memcpy_gbps,
        "encode_vs_memcpy": encode_gbps / memcpy_gbps,
        "decode_vs_memcpy": decode_gbps / memcpy_gbps,
    }
