"""Encode/decode throughput of real TRAJ batches and parameter snapshots, against a memcpy of the same bytes.

Rows (GB/s of the encoded message's bytes, and the ratio to copying those bytes with numpy):
- `traj_batch`: encode is `wire.encode` of the TRAJ map `protocol.Traj(...).to_msg()` builds (its episodes
  packed: one array table and one bin, docs/PROTOCOL.md §3.5); decode is what the learner does to get
  the arrays: `protocol.parse`, `Traj.from_msg`, `protocol.unpack_episodes` (every array a read-only view
  of the message: parse alone leaves them unpacked).
- `traj_batch_full`: the whole of each side's work on the same batch: packing the episodes
  (`Traj.to_msg`) plus `wire.encode`; `protocol.parse` plus `Traj.validate` (every check of
  docs/PROTOCOL.md §7 and the per-episode views the replay stores).
- `params_snapshot`: `protocol.params_frames` / `protocol.parse_params` of the default model.
"""

from __future__ import annotations

import numpy as np

from benchmarks import data
from benchmarks.report import best_seconds
from common import protocol, wire
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy

MAX_STEPS = 16


def _episodes(count: int, cfg: ModelConfig) -> list[dict]:
    return [
        protocol.episode_fields(ep.task, ep.success, ep.truncated, ep.obs, ep.steps)
        for ep in data.episodes(cfg, count)
    ]


def run(quick: bool) -> list[dict]:
    cfg = ModelConfig()
    repeats = 5 if quick else 30  # best of: a shared machine disturbs some runs
    rows = []
    episodes = _episodes(16 if quick else 64, cfg)
    msg = protocol.Traj(1, 1, episodes).to_msg()
    encoded = wire.encode(msg)
    buf = np.frombuffer(encoded, np.uint8)
    spec = make_policy(cfg).episode_spec()

    def unpack() -> protocol.PackedEpisodes:
        return protocol.unpack_episodes(protocol.Traj.from_msg(protocol.parse(encoded)).episodes)

    def validate() -> list[protocol.Episode]:
        traj = protocol.Traj.from_msg(protocol.parse(encoded))
        return traj.validate(spec, MAX_STEPS, 0)

    memcpy = best_seconds(lambda: buf.copy(), repeats, inner=20)
    enc = best_seconds(lambda: wire.encode(msg), repeats, inner=5)
    dec = best_seconds(unpack, repeats, inner=5)
    gb = len(encoded) / 1e9
    rows.append(_row("traj_batch", len(encoded), gb / enc, gb / dec, gb / memcpy))
    enc = best_seconds(lambda: wire.encode(protocol.Traj(1, 1, episodes).to_msg()), repeats)
    dec = best_seconds(validate, repeats)
    rows.append(_row("traj_batch_full", len(encoded), gb / enc, gb / dec, gb / memcpy))

    _, params = make_policy(cfg).create(0)
    flat = params_to_flat(params)
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
