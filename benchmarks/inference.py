"""The inference service (`--inference remote`, learner/serving/inference.py) against acting on the actor.

Three parts, one run:

- **service**, per policy family (pointer: the default model without a text encoder; lm: the packaged
  SmolLM2-135M with the family's default LoRA): one in-process InferenceService on loopback, driven by C client
  threads (actors/remote_policy.py's RemotePolicy, as actors use it), each asking for R rows in a closed
  loop for a fixed time. Per (C, R): answered requests/s and rows/s, latency p50 / p99 per request, mean
  rows per batched act. Reference, in the same process: the family's jitted act called directly on
  C x R rows at a time (what the service does per batch, without sockets, validation or batching waits);
  `vs_direct` = rows/s through the service / rows/s direct. Every padded batch size is compiled before
  any timing.
- **serving cost** (benchmarks/serving_cost.py): the learner's train step alone, and while the service
  answers clients in another process at full load, on the same devices.
- **run**: the real learner (`python -m learner`, stand-in phone, 2 local actors of 8 environments, no
  warm-up) for a fixed time, once with actor-side inference and once with `--inference remote`: env
  steps/s (least-squares slope over the run), updates/s, the policy lag's distribution (of the steps
  trained on, and of the steps when they arrived), and what the actors received in snapshots (PARAMS
  bytes: the snapshot size times the swaps; 0 in remote mode).

The learner and actors share this machine's cores, so the run measures the whole system's trade-off here,
not a learner with its own accelerator.
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import zmq

from actors.remote_policy import RemotePolicy
from benchmarks import serving_cost
from benchmarks.collection import run_learner, steps_per_second
from benchmarks.serving import features, warm_service
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy

POINTER = ModelConfig(text_encoder="none")
LM = ModelConfig(kind="lm")


def _direct_rows_per_s(policy, graphdef, params, feats: dict, seconds: float) -> float:
    act = jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))
    inputs = policy.inputs(feats)
    rows = len(next(iter(feats.values())))
    jax.block_until_ready(act(params, inputs, jax.random.key(0)))
    n, start = 0, time.perf_counter()
    while n < 2 or time.perf_counter() - start < seconds:
        jax.block_until_ready(act(params, inputs, jax.random.key(n)))
        n += 1
    return n * rows / (time.perf_counter() - start)


def _closed_loop(endpoint: str, cfg: ModelConfig, feats: dict, clients: int, seconds: float) -> list[float]:
    """C client threads asking in a closed loop for `seconds`: every request's latency, in seconds."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        client = RemotePolicy(cfg, endpoint, 1, timeout=600)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            client.act(feats)
            latencies[i].append(time.perf_counter() - t0)
        client.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for per_client in latencies for x in per_client]


def service_rows(family: str, cfg: ModelConfig, grid: list[tuple[int, int]], seconds: float,
                 log: Callable[[str], None]) -> list[dict]:  # fmt: skip
    """One service for the family, every padded size compiled first, then each (clients, rows) cell."""
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    max_rows = 1 << (max(c * r for c, r in grid) - 1).bit_length()
    ctx = zmq.Context()
    service = warm_service(cfg, graphdef, params, max_rows, ctx, log)
    out = []
    for clients, rows in grid:
        feats = features(policy, cfg, rows)
        before = dict(service.stats)
        t0 = time.perf_counter()
        lat = np.asarray(_closed_loop(service.endpoint, cfg, feats, clients, seconds)) * 1e3
        wall = time.perf_counter() - t0
        batches = service.stats["batches"] - before.get("batches", 0)
        served = service.stats["rows"] - before.get("rows", 0)
        direct_feats = features(policy, cfg, min(max_rows, clients * rows))
        direct = _direct_rows_per_s(policy, graphdef, params, direct_feats, min(seconds, 10.0))
        out.append({
            "part": "service", "family": family, "clients": clients, "rows_per_request": rows,
            "requests": int(lat.size), "requests_per_s": lat.size / wall, "rows_per_s": served / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "rows_per_batch": served / max(batches, 1), "direct_rows_per_s": direct,
            "vs_direct": served / wall / direct,
        })  # fmt: skip
        log(f"inference: {family} {clients} x {rows}: {out[-1]['rows_per_s']:.1f} rows/s")
    service.close()
    ctx.term()
    return out


def _run_row(inference: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "learner", "--run-dir", str(run_dir), "--ingest-port", "0", "--params-port", "0",
            "--env", "standin", "--warmup-updates", "0", "--max-steps", "8", "--model.text-encoder", "none",
            "--local-actors", "2", "--envs-per-actor", "8", "--time-limit", str(seconds), "--log-every", "1",
            "--console", "lines", "--no-tensorboard",
        ]  # fmt: skip
        if inference == "remote":
            cmd.append("--local-actor-args=--inference remote")
        lines = run_learner(cmd, run_dir, seconds + 300)
        steps, window = steps_per_second(lines)
        trained = any(m["update"] > 0 for m in lines if "stopped" not in m)
        updates = steps_per_second(lines, "update")[0] if trained else 0.0
        swaps = 0
        for log in run_dir.glob("actor-*.log"):
            found = [int(x) for x in re.findall(r"'param_swaps': (\d+)", log.read_text())]
            swaps += max(found, default=0)
    snapshot = sum(v.nbytes for v in params_to_flat(make_policy(POINTER).create(0)[1]).values())
    final = lines[-1]
    return {
        "part": "run", "inference": inference, "env_steps_per_s": steps, "updates_per_s": updates,
        "window_s": window, "policy_lag_mean": final["policy_lag_mean"],
        "lag_trained": final.get("policy_lag_trained", {}), "lag_at_arrival": final.get("policy_lag_at_arrival", {}),
        "params_bytes_received": swaps * snapshot,
        "inference_rows_per_batch": final.get("inference/rows", 0) / max(final.get("inference/batches", 0), 1),
    }  # fmt: skip


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(quick: bool) -> list[dict]:
    seconds = 5.0 if quick else 15.0
    grid = [(1, 8), (4, 8), (16, 1)] if quick else [(1, 1), (1, 8), (4, 1), (4, 8), (16, 1), (16, 8)]
    rows = service_rows("pointer", POINTER, grid, seconds, _log)
    lm_grid = [(1, 1), (4, 1)] if quick else [(1, 1), (4, 1), (1, 4)]
    rows += service_rows("lm", LM, lm_grid, 20.0 if quick else 40.0, _log)
    rows += serving_cost.run(POINTER, 10.0 if quick else 30.0, _log)
    run_s = 60.0 if quick else 120.0
    local, remote = _run_row("local", run_s), _run_row("remote", run_s)
    for row in (local, remote):
        row["steps_vs_local"] = row["env_steps_per_s"] / local["env_steps_per_s"]
        row["updates_vs_local"] = (
            row["updates_per_s"] / local["updates_per_s"] if local["updates_per_s"] else None
        )
    return [*rows, local, remote]
