"""What serving costs training when the inference service and the train step share the learner's devices
(interleaved: the service's thread queues its jitted act on the same devices as the update).

The learner's A-RIDE train step (32 episodes x 8 steps) is timed in three windows of equal length: alone,
while an inference service in the same process answers clients at full load, and alone again (the two
alone windows bracket the serving one, so drift on a shared machine shows). The clients run in another
process (spawned): 4 closed-loop RemotePolicy threads of 8 rows each, as remote actors would ask, so
their own socket and Python work does not take the learner's interpreter lock.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable

import jax
import numpy as np
import zmq

from benchmarks import data
from benchmarks.serving import features, warm_service
from common.config import ModelConfig
from common.policies import make_policy
from learner.batch import collate
from learner.losses import LOSSES, LossParams
from learner.training.train_step import make_optimizer, make_train_step

CLIENTS, ROWS = 4, 8


def _clients(endpoint: str, cfg: ModelConfig, ready, stop, answered) -> None:
    """The other process: CLIENTS threads asking for ROWS rows each until `stop`; `answered` counts."""
    from actors.remote_policy import RemotePolicy

    feats = features(make_policy(cfg), cfg, ROWS)

    def loop() -> None:
        client = RemotePolicy(cfg, endpoint, 1, timeout=600)
        client.act(feats)
        ready.release()
        while not stop.is_set():
            client.act(feats)
            with answered.get_lock():
                answered.value += 1
        client.close()

    threads = [threading.Thread(target=loop) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _updates_per_s(step: Callable[[], None], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    return n / (time.perf_counter() - start)


def run(cfg: ModelConfig, seconds: float, log: Callable[[str], None]) -> list[dict]:
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    optimizer = make_optimizer(1e-3, 1.0)
    train_step = make_train_step(graphdef, optimizer, LOSSES["aride"].rl, LossParams(), policy.evaluate)
    batch = collate(data.episodes(cfg, 32, 8), 8)
    ctx = zmq.Context()
    service = warm_service(cfg, graphdef, jax.tree.map(lambda x: x.copy(), params), CLIENTS * ROWS, ctx, log)
    state = [params, optimizer.init(params)]

    def one_update() -> None:
        state[0], state[1], metrics, _ = train_step(state[0], state[1], batch)
        jax.block_until_ready(metrics)

    one_update()  # compiled
    spawn = mp.get_context("spawn")
    ready, stop, answered = spawn.Semaphore(0), spawn.Event(), spawn.Value("q", 0)
    clients = spawn.Process(target=_clients, args=(service.endpoint, cfg, ready, stop, answered))
    try:
        log("serving cost: training alone")
        alone_before = _updates_per_s(one_update, seconds)
        clients.start()
        for _ in range(CLIENTS):  # every client started and answered once
            ready.acquire()
        log("serving cost: training while serving")
        rows_before, t0 = service.stats["rows"], time.perf_counter()
        serving = _updates_per_s(one_update, seconds)
        served = (service.stats["rows"] - rows_before) / (time.perf_counter() - t0)
        stop.set()
        clients.join(60)
        log("serving cost: training alone again")
        alone_after = _updates_per_s(one_update, seconds)
    finally:
        stop.set()
        if clients.is_alive():
            clients.kill()
        service.close()
        ctx.term()
    alone = float(np.mean([alone_before, alone_after]))
    return [{
        "part": "serving cost", "family": cfg.kind, "clients": CLIENTS, "rows_per_request": ROWS,
        "updates_per_s_alone": alone, "alone_before": alone_before, "alone_after": alone_after,
        "updates_per_s_serving": serving, "vs_alone": serving / alone, "served_rows_per_s": served,
    }]  # fmt: skip
