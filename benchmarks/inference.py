"""The inference service (`--inference remote`, learner/inference.py) against acting on the actor.

Two parts, one run:

- **service**: an in-process InferenceService (pointer family, the default model without a text encoder)
  on loopback, driven by C client threads (actors/remote_policy.py's RemotePolicy, as actors use it), each
  asking for R rows in a closed loop for a fixed time. Per (C, R): answered requests/s and rows/s,
  latency p50 / p99 per request, mean rows per batched act. Reference, in the same process: the family's
  jitted act called directly on C x R rows at a time (what the service does per batch, without sockets,
  validation or batching waits); `vs_direct` = rows/s through the service / rows/s direct.
- **run**: the real learner (`python -m learner`, stand-in phone, 2 local actors of 8 environments, no
  warm-up) for a fixed time, once with actor-side inference and once with `--inference remote`: env
  steps/s (least-squares slope over the run), updates/s, mean policy lag, and what the actors received
  in snapshots (PARAMS bytes: the snapshot size times the swaps; 0 in remote mode).

The learner and actors share this machine's cores, so the run measures the whole system's trade-off here,
not a learner with its own accelerator.
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import numpy as np
import zmq

from actors.envs.standin import StandInPhoneEnv
from actors.policy_runner import stack
from actors.remote_policy import RemotePolicy
from benchmarks.collection import run_learner, steps_per_second
from common import model
from common.config import ModelConfig
from common.policies import make_policy
from learner.inference import InferenceConfig, InferenceService

CFG = ModelConfig(text_encoder="none")


def _features(rows: int) -> dict[str, np.ndarray]:
    policy, env = make_policy(CFG), StandInPhoneEnv()
    return stack([policy.featurize(env.reset(seed=i)[0]) for i in range(rows)])


def _direct_rows_per_s(policy, graphdef, params, rows: int, seconds: float) -> float:
    act = jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))
    inputs = policy.inputs(_features(rows))
    jax.block_until_ready(act(params, inputs, jax.random.key(0)))
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        jax.block_until_ready(act(params, inputs, jax.random.key(n)))
        n += 1
    return n * rows / (time.perf_counter() - start)


def _service_row(clients: int, rows: int, seconds: float) -> dict:
    policy = make_policy(CFG)
    graphdef, params = policy.create(0)
    ctx = zmq.Context()
    service = InferenceService(
        policy,
        graphdef,
        ctx,
        "tcp://127.0.0.1:*",
        lambda _: True,
        InferenceConfig(max_rows=64, deadline_ms=2),
    ).start()
    service.publish(0, params)
    features = _features(rows)
    warm = RemotePolicy(CFG, service.endpoint, 1, timeout=120)
    for n in (1, 2, 4, 8, 16, 32, 64):  # compile every padded size before timing
        warm.act(stack([{k: v[0] for k, v in features.items()}] * n))
    warm.close()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        client = RemotePolicy(CFG, service.endpoint, 1, timeout=120)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            client.act(features)
            latencies[i].append(time.perf_counter() - t0)
        client.close()

    before = dict(service.stats)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    batches = service.stats["batches"] - before.get("batches", 0)
    served = service.stats["rows"] - before.get("rows", 0)
    service.close()
    ctx.term()
    lat = np.concatenate([np.asarray(x) for x in latencies]) * 1e3
    direct = _direct_rows_per_s(policy, graphdef, params, min(64, clients * rows), min(seconds, 5.0))
    return {
        "part": "service", "clients": clients, "rows_per_request": rows,
        "requests_per_s": lat.size / wall, "rows_per_s": served / wall,
        "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
        "rows_per_batch": served / max(batches, 1), "direct_rows_per_s": direct,
        "vs_direct": served / wall / direct,
    }  # fmt: skip


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
    snapshot = sum(v.nbytes for v in model.params_to_flat(make_policy(CFG).create(0)[1]).values())
    final = lines[-1]
    return {
        "part": "run", "inference": inference, "env_steps_per_s": steps, "updates_per_s": updates,
        "window_s": window, "policy_lag_mean": final["policy_lag_mean"], "params_bytes_received": swaps * snapshot,
        "inference_rows_per_batch": final.get("inference/rows", 0) / max(final.get("inference/batches", 0), 1),
    }  # fmt: skip


def run(quick: bool) -> list[dict]:
    seconds = 5.0 if quick else 15.0
    grid = [(1, 8), (4, 8), (16, 1)] if quick else [(1, 1), (1, 8), (4, 1), (4, 8), (16, 1), (16, 8)]
    rows = [_service_row(c, r, seconds) for c, r in grid]
    run_s = 60.0 if quick else 120.0
    local, remote = _run_row("local", run_s), _run_row("remote", run_s)
    for row in (local, remote):
        row["steps_vs_local"] = row["env_steps_per_s"] / local["env_steps_per_s"]
        row["updates_vs_local"] = (
            row["updates_per_s"] / local["updates_per_s"] if local["updates_per_s"] else None
        )
    return [*rows, local, remote]
