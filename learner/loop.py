"""The learner's whole training loop, readable in one sitting.

bind sockets -> publish version 0 -> (start local actors) -> repeat:
    take in messages (trajectories go into the prioritized replay, ACKed once stored)
    when a batch is ready: collate -> jitted train step -> every K updates publish a new version
    every few seconds: a metrics.jsonl line and a progress print
until the time limit, the update limit, or Ctrl-C / SIGTERM; then stop actors and close sockets.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from rich.console import Console

from common import featurize, model
from common.protocol import Episode
from common.trajectory_file import load_episodes
from learner.algorithm import LossConfig, step_mask
from learner.aride import ARideConfig
from learner.batch import collate, example_batch
from learner.checkpoint import Checkpointer, TrainState, rng_state, set_rng_state
from learner.config import LearnerConfig
from learner.ingest import IngestServer
from learner.local_actors import LocalActors
from learner.metrics import MetricsWriter
from learner.replay import PrioritizedReplay, oldest_version
from learner.train_step import make_optimizer, make_train_step


class _Stop:
    def __init__(self):
        self.requested = False
        self.reason = ""

    def __call__(self, signum, _frame):
        self.requested, self.reason = True, signal.Signals(signum).name


def run(cfg: LearnerConfig, console: Console | None = None) -> dict:
    """Train until a stop condition; returns the last metrics record."""
    console = console or Console(stderr=True, soft_wrap=True)
    start = time.monotonic()
    stop = _Stop()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}

    graphdef, params = model.create(cfg.model, cfg.seed)
    optimizer = make_optimizer(cfg.learning_rate, cfg.max_grad_norm)
    opt_state = optimizer.init(params)
    if cfg.algorithm == "aride":
        loss_cfg = ARideConfig(
            gamma=cfg.gamma,
            lambda_=cfg.lambda_,
            rho_clip=cfg.rho_clip,
            c_clip=cfg.rho_clip,
            pg_rho_clip=cfg.rho_clip,
            entropy_coef=cfg.entropy_coef,
            value_coef=cfg.value_coef,
        )
    else:  # "a2c" (tyro refuses anything else)
        loss_cfg = LossConfig(cfg.gamma, cfg.value_coef, cfg.entropy_coef, cfg.rho_clip)
    train_step = make_train_step(graphdef, optimizer, loss_cfg)
    warmup_step = make_train_step(graphdef, optimizer, loss_cfg, warmup=True)
    demo_rng = np.random.default_rng(cfg.seed)
    checkpointer = Checkpointer(cfg.run_dir / "checkpoints") if cfg.checkpoint_every else None
    resumed = None
    if checkpointer is not None and checkpointer.latest_update() is not None:
        template = TrainState(params, opt_state, 0, 0, rng_state(demo_rng))
        try:
            resumed = checkpointer.restore(template, cfg.model.to_dict())
        except ValueError as e:
            raise SystemExit(str(e)) from e
        params, opt_state = resumed.params, resumed.opt_state
        set_rng_state(demo_rng, resumed.rng)
        console.print(
            f"learner: resuming from the checkpoint at update {resumed.update} (policy v{resumed.policy_version})"
        )
    # A run resumed past its warm-up needs no demonstrations (nor their start-up cost).
    demos = load_warmup_demos(cfg, console) if not resumed or resumed.update < cfg.warmup_updates else []

    replay: PrioritizedReplay[Episode] = PrioritizedReplay(
        cfg.replay_capacity,
        alpha=cfg.alpha,
        beta_start=cfg.beta_start,
        beta_steps=cfg.beta_steps,
        priority_weights=cfg.priority_weights,
        max_policy_lag=cfg.max_policy_lag,
        uniform=cfg.replay == "uniform",
        seed=cfg.seed,
    )
    recent_success: deque[bool] = deque(maxlen=100)
    recent_by_task: dict[str, deque[bool]] = {}
    totals = Counter()

    def on_episodes(episodes: list[Episode]) -> None:
        for ep in episodes:
            replay.add(ep, oldest_version(ep))
            recent_success.append(ep.success)
            recent_by_task.setdefault(ep.task, deque(maxlen=100)).append(ep.success)
            totals["episodes"] += 1
            totals["env_steps"] += ep.length
            totals["behavior_version_max"] = max(
                totals["behavior_version_max"], int(ep.steps["policy_version"].max())
            )

    server = IngestServer(
        cfg.bind,
        cfg.ingest_port,
        cfg.params_port,
        welcome_fields={"model": cfg.model.to_dict(), "max_steps": cfg.max_steps},
        feature_spec=featurize.feature_spec(cfg.model),
        vocab_size=cfg.model.vocab_size,
        max_steps=cfg.max_steps,
        on_episodes=on_episodes,
        actor_timeout=cfg.actor_timeout,
    )
    writer = MetricsWriter(cfg.run_dir)
    endpoints = {"ingest_port": server.ingest_port, "params_port": server.params_port, "bind": cfg.bind}
    tmp = cfg.run_dir / "endpoints.json.tmp"
    tmp.write_text(json.dumps(endpoints))
    tmp.replace(cfg.run_dir / "endpoints.json")  # atomic: readers never see half a file
    version = resumed.policy_version if resumed else 0
    server.publish(version, model.params_to_flat(params))
    console.print(
        f"learner: ingest tcp://{cfg.bind}:{server.ingest_port}, params tcp://{cfg.bind}:{server.params_port}, "
        f"run dir {cfg.run_dir}"
    )
    actors = None
    if cfg.local_actors:
        actors = LocalActors(
            cfg.local_actors,
            server.ingest_port,
            server.params_port,
            cfg.envs_per_actor,
            cfg.seed,
            cfg.run_dir,
            extra_args=("--env", cfg.env, "--tasks", cfg.tasks, "--split", cfg.split),
        )
        console.print(
            f"learner: started {cfg.local_actors} local actor(s), logs in {cfg.run_dir}/actor-*.log"
        )

    update = resumed.update if resumed else 0
    saved_update = update
    rl_updates = 0
    last_log = time.monotonic()
    train_metrics: dict = {}
    lag_mean, lag_max = 0.0, 0
    timing = Counter()

    def record() -> dict:
        by_task = {k: float(np.mean(v)) for k, v in sorted(recent_by_task.items()) if v}
        return {
            "run_id": server.run_id,
            "wall": round(time.monotonic() - start, 3),
            "update": update,
            "phase": "warmup" if demos and update < cfg.warmup_updates else "rl",
            "env_steps": totals["env_steps"],
            "episodes": totals["episodes"],
            "success_rate": float(np.mean(recent_success)) if recent_success else 0.0,
            "success_by_task": by_task,
            "policy_version": version,
            "policy_lag_mean": lag_mean,
            "policy_lag_max": lag_max,
            "skipped_nonfinite": totals["skipped_nonfinite"],
            "behavior_version_max": totals["behavior_version_max"],
            "actors": server.connected_actors(),
            "replay_size": len(replay),
            "rejected": sum(server.rejected.values()),
            "rejected_by_reason": dict(server.rejected),
            "dropped_episodes": replay.counts["evicted_fifo"] + replay.counts["dropped_stale"],
            **{f"replay/{k}": v for k, v in replay.stats().items()},
            **{f"train/{k}": float(v) for k, v in train_metrics.items()},
            **{f"time/{k}": round(v, 3) for k, v in timing.items()},
        }

    def log_if_due() -> None:
        nonlocal last_log
        if time.monotonic() - last_log >= cfg.log_every:
            last_log = time.monotonic()
            line = record()
            writer.write(line)
            _print_progress(console, line)

    try:
        # Compile the train steps on a helper thread while this one keeps serving handshakes and data
        # (the warm-up step only when there is a warm-up).
        t0 = time.monotonic()
        example = example_batch(featurize.feature_spec(cfg.model), cfg.batch_size, cfg.max_steps)

        def compile_ahead():
            rl = train_step.lower(params, opt_state, example).compile()
            return rl, warmup_step.lower(params, opt_state, example).compile() if demos else None

        with ThreadPoolExecutor(1, thread_name_prefix="compile") as pool:
            compiling = pool.submit(compile_ahead)
            while not compiling.done():
                server.poll(50)
                log_if_due()
            train_step, warmup_step = compiling.result()
        timing["compile_s"] = time.monotonic() - t0
        console.print(f"learner: train step compiled in {timing['compile_s']:.1f}s")

        while True:
            if stop.requested:
                break
            elapsed = time.monotonic() - start
            if cfg.time_limit and elapsed >= cfg.time_limit:
                stop.reason = "time limit"
                break
            if cfg.max_updates and update >= cfg.max_updates:
                stop.reason = "update limit"
                break
            warming = bool(demos) and update < cfg.warmup_updates
            ready = warming or (
                len(replay) >= cfg.batch_size
                and (rl_updates + 1) * cfg.batch_size <= cfg.samples_per_insert * replay.counts["added"]
            )
            t0 = time.monotonic()
            server.poll(0 if ready else 50)
            timing["ingest_s"] += time.monotonic() - t0
            if ready:
                t0 = time.monotonic()
                if warming:  # behavior cloning on demonstrations; actors keep acting meanwhile
                    picks = demo_rng.integers(len(demos), size=cfg.batch_size)
                    batch = collate([demos[i] for i in picks], cfg.max_steps)
                    params, opt_state, metrics = warmup_step(params, opt_state, batch)
                else:
                    sample = replay.sample(cfg.batch_size, policy_version=version)
                    batch = collate(sample.items, cfg.max_steps, sample.weights)
                    mask = np.asarray(step_mask(batch["length"], cfg.max_steps))
                    lags = (version - batch["policy_version"])[mask]
                    lag_mean, lag_max = float(np.mean(lags)), int(np.max(lags))
                    params, opt_state, metrics = train_step(params, opt_state, batch)
                    rl_updates += 1
                train_metrics = jax.device_get(metrics)
                priorities = {
                    k: train_metrics.pop(k) for k in list(train_metrics) if k.startswith("priority_")
                }
                if train_metrics.pop("skipped_nonfinite"):
                    totals["skipped_nonfinite"] += 1
                    console.print(f"learner: update {update + 1} had a non-finite loss or gradient; skipped")
                elif priorities and not warming:  # DPER: refresh the sampled trajectories' priorities
                    replay.update_priorities(
                        sample.indices,
                        sample.generations,
                        priorities["priority_delta"],
                        priorities["priority_rho_clipped"],
                        priorities["priority_nll"],
                    )
                update += 1
                timing["train_s"] += time.monotonic() - t0
                if update % cfg.publish_every == 0:
                    t0 = time.monotonic()
                    version += 1
                    server.publish(version, model.params_to_flat(params))
                    timing["publish_s"] += time.monotonic() - t0
                if checkpointer is not None and update % cfg.checkpoint_every == 0:
                    t0 = time.monotonic()
                    checkpointer.save(
                        TrainState(params, opt_state, update, version, rng_state(demo_rng)), _jsonable(cfg)
                    )
                    saved_update = update
                    timing["checkpoint_s"] += time.monotonic() - t0
            log_if_due()
    finally:
        if checkpointer is not None:
            if update > saved_update:
                checkpointer.save(
                    TrainState(params, opt_state, update, version, rng_state(demo_rng)), _jsonable(cfg)
                )
            checkpointer.close()
        last = record()
        last["stopped"] = stop.reason or "error"
        writer.write(last)
        writer.close()
        if actors is not None:
            actors.stop()
        server.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        console.print(
            f"learner: stopped ({last['stopped']}) after {update} updates, {totals['episodes']} episodes"
        )
    return last


def _print_progress(console: Console, m: dict) -> None:
    by_task = m["success_by_task"]
    if len(by_task) > 6:  # many templates (SimPhone): show the mean per app family instead
        families: dict[str, list[float]] = {}
        for name, rate in by_task.items():
            families.setdefault(name.split(".")[0], []).append(rate)
        by_task = {k: sum(v) / len(v) for k, v in families.items()}
    tasks = " ".join(f"{k} {v:.2f}" for k, v in by_task.items())
    console.print(
        f"{m['wall']:6.1f}s upd {m['update']:5d} v{m['policy_version']:<4d} eps {m['episodes']:6d} "
        f"success {m['success_rate']:.2f} lag {m['policy_lag_mean']:.1f} actors {m['actors']} "
        f"replay {m['replay_size']} rej {m['rejected']} | {tasks}",
        highlight=False,
        soft_wrap=True,
    )


def load_warmup_demos(cfg: LearnerConfig, console: Console) -> list[Episode]:
    """Demonstrations to warm up on: `--demos FILE`, or `--warmup-demos N` generated by the SimPhone oracle
    in a `python -m actors demos` subprocess (the learner never imports actor code)."""
    if not cfg.warmup_updates:
        return []
    if cfg.demos is None and cfg.env != "simphone":
        console.print("learner: no warm-up (demonstrations come from the SimPhone oracle; pass --demos FILE)")
        return []
    path = cfg.demos
    if path is None and cfg.warmup_demos:
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        path = cfg.run_dir / "demos.msgpack"
        model_args = [
            a
            for f in dataclasses.fields(cfg.model)
            for a in (f"--model.{f.name.replace('_', '-')}", str(getattr(cfg.model, f.name)))
        ]
        cmd = [
            sys.executable, "-m", "actors", "demos", "--out", str(path), "--tasks", cfg.tasks, "--split", cfg.split,
            "--episodes", str(cfg.warmup_demos), "--noise", str(cfg.warmup_noise), "--max-steps", str(cfg.max_steps),
            "--seed", str(cfg.seed), *model_args,
        ]  # fmt: skip
        console.print(f"learner: writing {cfg.warmup_demos} oracle demonstrations to {path}")
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if done.returncode != 0:
            raise SystemExit(f"generating demonstrations failed:\n{done.stdout}{done.stderr}")
    if path is None:
        raise SystemExit("--warmup-updates needs demonstrations: --demos FILE or --warmup-demos N")
    try:
        episodes = load_episodes(path, cfg.model)
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot use demonstrations {path}: {e}") from e
    if not episodes:
        raise SystemExit(f"{path} holds no episodes")
    success = np.mean([ep.success for ep in episodes])
    console.print(
        f"learner: warming up for {cfg.warmup_updates} updates on {len(episodes)} demonstrations (success {success:.2f})"
    )
    return episodes


def _jsonable(cfg: LearnerConfig) -> dict:
    """The config as plain JSON values (paths as strings), stored with every checkpoint."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
