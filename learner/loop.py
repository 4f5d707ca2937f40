"""The learner's whole training loop, readable in one sitting.

bind sockets -> publish version 0 -> (start local actors) -> repeat:
    take in messages (trajectories go into the prioritized replay, ACKed once stored)
    when a batch is ready: collate -> jitted train step -> every K updates publish a new version
    every few seconds: a metrics.jsonl line and a progress print
until the time limit, the update limit, or Ctrl-C / SIGTERM; then stop actors and close sockets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

from common import featurize, model
from common.config import cli_args
from common.curve import CurveError, CurveServer, is_loopback
from common.protocol import Episode
from common.trajectory_file import load_episodes
from learner import multihost
from learner.algorithm import LossConfig, step_mask
from learner.aride import ARideConfig
from learner.augment import rename_words
from learner.batch import collate, example_batch
from learner.checkpoint import Checkpointer, TrainState, rng_state, set_rng_state
from learner.config import LearnerConfig
from learner.console import Progress
from learner.ingest import IngestServer
from learner.instruction_critic import InstructionCritic
from learner.local_actors import LocalActors
from learner.mesh import (
    batch_sharding,
    init_opt_state,
    large_model_config,
    make_mesh,
    make_sharded_train_step,
    named_shardings,
    param_specs,
)
from learner.metrics import MetricsWriter
from learner.replay import PrioritizedReplay, oldest_version
from learner.tensorboard import Dashboards, require_wandb
from learner.train_step import make_optimizer


class _Stop:
    def __init__(self):
        self.requested = False
        self.reason = ""

    def __call__(self, signum, _frame):
        self.requested, self.reason = True, signal.Signals(signum).name


def run(cfg: LearnerConfig, console: Console | None = None) -> dict:
    """Train until a stop condition; returns the last metrics record."""
    console = console or Console(stderr=True, soft_wrap=True)
    for flag, rate in (
        ("word-rename-rate", cfg.word_rename_rate),
        ("typed-word-rename-rate", cfg.typed_word_rename_rate),
        ("stop-at-success", cfg.stop_at_success),
    ):
        if not 0.0 <= rate <= 1.0:
            raise SystemExit(f"--{flag} must be in [0, 1], got {rate}")
    if cfg.actor_credit < 1:
        raise SystemExit(f"--actor-credit must be at least 1, got {cfg.actor_credit}")
    if cfg.insert_slack < 0:
        raise SystemExit(f"--insert-slack must be >= 0, got {cfg.insert_slack}")
    if cfg.mode == "sync" and cfg.num_processes > 1:
        raise SystemExit(
            "--mode sync runs on one learner process (its rounds are not coordinated across hosts)"
        )
    if not cfg.sync_round_timeout > 0:
        raise SystemExit(f"--sync-round-timeout must be positive, got {cfg.sync_round_timeout}")
    if cfg.demo_update_every < 0:
        raise SystemExit(f"--demo-update-every must be >= 0, got {cfg.demo_update_every}")
    if (
        cfg.instruction_filter is not None
        and not 0.0 <= cfg.instruction_filter[0] <= cfg.instruction_filter[1] <= 1.0
    ):
        raise SystemExit(f"--instruction-filter needs 0 <= LOW <= HIGH <= 1, got {cfg.instruction_filter}")
    require_wandb(cfg.wandb_project)  # a missing wandb stops the run now, not after start-up
    curve = _curve_server(cfg)
    start = time.monotonic()
    stop = _Stop()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    multihost.initialize(cfg.coordinator, cfg.num_processes, cfg.process_id)
    if cfg.model_preset == "large":
        cfg = dataclasses.replace(cfg, model=large_model_config())
    rank = jax.process_index()
    run_dir = cfg.run_dir if rank == 0 else cfg.run_dir / f"process-{rank}"  # checkpoints: cfg.run_dir's

    # The device mesh: the batch is split over 'data', parameters laid out per --mesh.param-sharding.
    try:
        mesh = make_mesh(cfg.mesh)
    except ValueError as e:
        raise SystemExit(f"--mesh: {e}") from e
    data_devices = dict(mesh.shape)["data"]
    if cfg.batch_size % data_devices:
        raise SystemExit(
            f"--batch-size {cfg.batch_size} must be a multiple of the mesh's 'data' axis ({data_devices} devices)"
        )
    rows = multihost.local_rows(batch_sharding(mesh), cfg.batch_size)  # this process's share of a batch
    local_batch = rows.stop - rows.start
    graphdef, host_params = model.create(cfg.model, cfg.seed)
    specs = param_specs(host_params, mesh, cfg.mesh.param_sharding)
    params = multihost.place(host_params, named_shardings(specs, mesh))
    del host_params
    optimizer = make_optimizer(
        cfg.learning_rate,
        cfg.max_grad_norm,
        decay_updates=cfg.lr_decay_updates,
        final_fraction=cfg.lr_final_fraction,
    )
    opt_state = init_opt_state(optimizer, params, mesh, specs)
    # Process I's demonstration draws: process 0's stream jumped I times (so a restored state stays right).
    demo_rng = _jumped(np.random.default_rng(cfg.seed), rank)
    replay: PrioritizedReplay[Episode] = PrioritizedReplay(
        cfg.replay_capacity,
        alpha=cfg.alpha,
        beta_start=cfg.beta_start,
        beta_steps=cfg.beta_steps,
        priority_weights=cfg.priority_weights,
        max_policy_lag=cfg.max_policy_lag,
        uniform=cfg.replay == "uniform",
        seed=cfg.seed + rank,
    )
    checkpointer = Checkpointer(cfg.run_dir / "checkpoints") if cfg.checkpoint_every else None
    resumed, kept = None, None
    if checkpointer is not None and checkpointer.latest_update() is not None:
        template = TrainState(params, opt_state, 0, 0, rng_state(demo_rng))
        try:
            resumed = checkpointer.restore(template, cfg.model.to_dict())
        except ValueError as e:
            raise SystemExit(str(e)) from e
        params, opt_state = resumed.params, resumed.opt_state
        set_rng_state(demo_rng, resumed.rng)
        demo_rng = _jumped(demo_rng, rank)
        try:
            kept = checkpointer.restore_replay(
                resumed.update, replay, cfg.model, rank, max_steps=cfg.max_steps
            )
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot resume the replay: {e}") from e
        console.print(
            f"learner: resuming from the checkpoint at update {resumed.update} (policy v{resumed.policy_version}), "
            + (f"{kept} episodes in the replay" if kept is not None else "no saved replay: it starts empty")
        )
    # A run resumed past its warm-up needs no demonstrations (nor their start-up cost), unless it keeps
    # imitating them (--demo-update-every); its replay already holds any prefilled ones.
    past_warmup = resumed is not None and resumed.update >= cfg.warmup_updates
    demos = load_warmup_demos(cfg, run_dir, console) if not past_warmup or cfg.demo_update_every else []
    entropy_coef = cfg.entropy()
    if cfg.algorithm == "aride":
        loss_cfg = ARideConfig(
            gamma=cfg.gamma,
            lambda_=cfg.lambda_,
            rho_clip=cfg.rho_clip,
            c_clip=cfg.rho_clip,
            pg_rho_clip=cfg.rho_clip,
            entropy_coef=entropy_coef,
            value_coef=cfg.value_coef,
            advantage_threshold=cfg.advantage_threshold,
            binarize_advantage=cfg.binarize_advantage,
        )
    else:  # "a2c" (tyro refuses anything else)
        loss_cfg = LossConfig(cfg.gamma, cfg.value_coef, entropy_coef, cfg.rho_clip)
    train_step = make_sharded_train_step(graphdef, optimizer, loss_cfg, mesh, specs)
    warmup_step = make_sharded_train_step(graphdef, optimizer, loss_cfg, mesh, specs, warmup=True)

    recent_success: deque[bool] = deque(maxlen=100)
    task_critic = InstructionCritic(window=100)  # recent success per task: metrics and the filter
    totals = Counter()
    sync = cfg.mode == "sync"
    sync_round = {"episodes": 0, "first_at": 0.0}
    """--mode sync: episodes received in the current round, and when its first one came."""

    def on_episodes(episodes: list[Episode]) -> None:
        if sync and episodes:
            sync_round["episodes"] += len(episodes)
            sync_round["first_at"] = sync_round["first_at"] or time.monotonic()
        for ep in episodes:
            replay.add(ep, oldest_version(ep))
            recent_success.append(ep.success)
            task_critic.observe(ep.task, ep.success)
            totals["episodes"] += 1
            totals["env_steps"] += ep.length
            totals["behavior_version_max"] = max(
                totals["behavior_version_max"], int(ep.steps["policy_version"].max())
            )

    def tap_open() -> bool:
        """The insert side of the rate limit (--insert-slack): False while stored episodes run more than
        the slack ahead of what reinforcement learning has used, as long as it could train right now
        (otherwise closing would wedge it: it needs data to catch up)."""
        used = rl_updates * local_batch / cfg.samples_per_insert
        can_train = (
            len(replay) >= local_batch
            and (rl_updates + 1) * local_batch <= cfg.samples_per_insert * replay.counts["added"]
        )
        return totals["episodes"] - used <= cfg.insert_slack or not can_train

    server = IngestServer(
        cfg.bind,
        cfg.ingest_port,
        cfg.params_port,
        welcome_fields={"model": cfg.model.to_dict(), "max_steps": cfg.max_steps, "mode": cfg.mode},
        feature_spec=featurize.feature_spec(cfg.model),
        vocab_size=cfg.model.vocab_size,
        max_steps=cfg.max_steps,
        on_episodes=on_episodes,
        actor_timeout=cfg.actor_timeout,
        credit=cfg.actor_credit,
        curve=curve,
    )
    if cfg.insert_slack:
        server.gate = tap_open
    if resumed is not None and kept is not None:  # the ledger describes the saved replay: only with it
        try:
            ledger = checkpointer.restore_delivery(resumed.update, rank)
            if ledger is not None:
                server.ledger.load_state(ledger)
        except ValueError as e:
            server.close()
            raise SystemExit(f"cannot resume the delivery ledger: {e}") from e
    writer = MetricsWriter(run_dir)
    progress = Progress(console, cfg.console, cfg.checkpoint_every)  # the live panel or progress lines
    wandb_project = cfg.wandb_project if rank == 0 else ""  # one wandb run, not one per process
    dashboards = Dashboards(run_dir, _jsonable(cfg), cfg.tensorboard, wandb_project)
    (run_dir / "config.json").write_text(json.dumps(_jsonable(cfg), indent=1))  # what report and readers see
    endpoints = {"ingest_port": server.ingest_port, "params_port": server.params_port, "bind": cfg.bind}
    tmp = run_dir / "endpoints.json.tmp"
    tmp.write_text(json.dumps(endpoints))
    tmp.replace(run_dir / "endpoints.json")  # atomic: readers never see half a file
    version = resumed.policy_version if resumed else 0
    server.publish(version, snapshot(params))
    console.print(
        f"learner: ingest tcp://{cfg.bind}:{server.ingest_port}, params tcp://{cfg.bind}:{server.params_port}, "
        f"run dir {run_dir}, mesh {dict(mesh.shape)} ({cfg.mesh.param_sharding} parameters)"
        + (f", process {rank} of {jax.process_count()}" if jax.process_count() > 1 else "")
    )
    actors = None
    if cfg.local_actors:
        actors = LocalActors(
            cfg.local_actors,
            server.ingest_port,
            server.params_port,
            cfg.envs_per_actor,
            cfg.seed + 1000 * rank,
            run_dir,
            extra_args=(
                "--env",
                cfg.env,
                "--tasks",
                cfg.tasks,
                "--split",
                cfg.split,
                *cli_args(cfg.emulator, "--emulator"),
            ),
        )
        console.print(f"learner: started {cfg.local_actors} local actor(s), logs in {run_dir}/actor-*.log")

    update = resumed.update if resumed else 0
    saved_update = update
    rl_updates = 0
    last_log = time.monotonic()
    train_metrics: dict = {}
    lag_mean, lag_max = 0.0, 0
    timing = Counter()

    def record() -> dict:
        by_task = task_critic.values()
        return {
            "run_id": server.run_id,
            "wall": round(time.monotonic() - start, 3),
            "update": update,
            "mode": cfg.mode,
            "sync_rounds": totals["sync_rounds"],
            "sync_rounds_timed_out": totals["sync_rounds_timed_out"],
            "phase": "warmup" if demos and update < cfg.warmup_updates else "rl",
            "env_steps": totals["env_steps"],
            "episodes": totals["episodes"],
            "success_rate": float(np.mean(recent_success)) if recent_success else 0.0,
            "success_by_task": by_task,
            "policy_version": version,
            "policy_lag_mean": lag_mean,
            "policy_lag_max": lag_max,
            "skipped_nonfinite": totals["skipped_nonfinite"],
            "instruction_filtered": totals["instruction_filtered"],
            "imitation_updates": totals["imitation_updates"],
            "behavior_version_max": totals["behavior_version_max"],
            "actors": server.connected_actors(),
            "replay_size": len(replay),
            "rejected": sum(server.rejected.values()),
            "rejected_by_reason": dict(server.rejected),
            "duplicates": server.duplicates,
            "dropped_replies": dict(server.drops),
            "batches_lost_in_restart": server.ledger.lost_in_restart,
            "accepting": server.accepting,
            "dropped_episodes": replay.counts["evicted_fifo"] + replay.counts["dropped_stale"],
            **{f"replay/{k}": v for k, v in replay.stats().items()},
            **{f"train/{k}": float(v) for k, v in train_metrics.items()},
            **{f"time/{k}": round(v, 3) for k, v in timing.items()},
        }

    def success_reached() -> bool:
        """--stop-at-success: the last 100 episodes all came after the warm-up and succeed often enough."""
        recent = totals["episodes"] - totals["episodes_at_rl_start"]
        return recent >= 100 and float(np.mean(recent_success)) >= cfg.stop_at_success

    def round_complete() -> bool:
        """--mode sync: every connected environment has delivered its episode of this round (or the
        round has waited --sync-round-timeout seconds since its first episode)."""
        if not sync_round["episodes"]:
            return False
        if sync_round["episodes"] >= server.connected_envs():
            return True
        if time.monotonic() - sync_round["first_at"] >= cfg.sync_round_timeout:
            totals["sync_rounds_timed_out"] += sync_round["episodes"] > 0 and not sync_round.get("late")
            sync_round["late"] = True
            return True
        return False

    def log_if_due() -> None:
        nonlocal last_log
        if time.monotonic() - last_log >= cfg.log_every:
            last_log = time.monotonic()
            line = record()
            writer.write(line)
            dashboards.write(line)
            progress.show(line)

    prefill = cfg.prefill_demos and bool(demos) and not past_warmup

    def save_checkpoint() -> None:
        nonlocal saved_update
        t0 = time.monotonic()
        state = TrainState(params, opt_state, update, version, rng_state(demo_rng))
        checkpointer.save(state, _jsonable(cfg))
        checkpointer.save_replay(update, replay, cfg.model, cfg.max_steps, rank)
        # After the replay: a ledger file always describes a replay file (the resume relies on it).
        checkpointer.save_delivery(update, server.ledger.state(), rank)
        saved_update = update
        timing["checkpoint_s"] += time.monotonic() - t0

    try:
        # Compile the train steps on a helper thread while this one keeps serving handshakes and data
        # (the warm-up step only when there is a warm-up).
        t0 = time.monotonic()
        example = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding(mesh)),
            example_batch(featurize.feature_spec(cfg.model), cfg.batch_size, cfg.max_steps),
        )

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
            wanted = stop.reason if stop.requested else ""
            if cfg.time_limit and time.monotonic() - start >= cfg.time_limit:
                wanted = "time limit"
            if cfg.max_updates and update >= cfg.max_updates:
                wanted = "update limit"
            if cfg.stop_at_success and success_reached():
                wanted = "success target"
            in_warmup = bool(demos) and update < cfg.warmup_updates
            if not in_warmup and "episodes_at_rl_start" not in totals:
                totals["episodes_at_rl_start"] = totals["episodes"]
            every = cfg.demo_update_every
            warming = in_warmup or bool(
                demos and every and (update - cfg.warmup_updates) % every == every - 1
            )
            if prefill and not in_warmup:  # offline data joins the replay as reinforcement learning starts
                prefill = False
                for ep in demos:
                    replay.add(_as_version(ep, version), version)
                console.print(f"learner: {len(demos)} demonstrations added to the replay")
            can_train = (
                len(replay) >= local_batch
                and (rl_updates + 1) * local_batch <= cfg.samples_per_insert * replay.counts["added"]
            )
            round_done = sync and round_complete()
            if round_done and not in_warmup and not can_train:
                # The round's data is used up (as much as --samples-per-insert allows): the next round
                # starts on a new version. Warm-up imitation happens before the first round ends.
                t0 = time.monotonic()
                version += 1
                server.publish(version, snapshot(params))
                timing["publish_s"] += time.monotonic() - t0
                totals["sync_rounds"] += 1
                sync_round.update(episodes=0, first_at=0.0, late=False)
                round_done = False
            ready = warming or (can_train and (round_done or not sync))
            t0 = time.monotonic()
            server.poll(0 if ready else 50)
            timing["ingest_s"] += time.monotonic() - t0
            ready, stopping = multihost.agree(ready, bool(wanted))  # every process steps together
            if stopping:
                stop.reason = wanted or "another learner process stopped"
                break
            if ready:
                t0 = time.monotonic()
                if warming:  # behavior cloning on demonstrations; actors keep acting meanwhile
                    picks = demo_rng.integers(len(demos), size=local_batch)
                    batch = collate([demos[i] for i in picks], cfg.max_steps)
                    step_fn = warmup_step
                    totals["imitation_updates"] += 1
                else:
                    sample = replay.sample(local_batch, policy_version=version)
                    batch = collate(sample.items, cfg.max_steps, sample.weights)
                    if cfg.instruction_filter is not None:
                        batch["keep"] = task_critic.keep(
                            [ep.task for ep in sample.items], *cfg.instruction_filter
                        )
                        totals["instruction_filtered"] += int((~batch["keep"]).sum())
                    mask = np.asarray(step_mask(batch["length"], cfg.max_steps))
                    lags = (version - batch["policy_version"])[mask]
                    lag_mean, lag_max = float(np.mean(lags)), int(np.max(lags))
                    step_fn = train_step
                    rl_updates += 1
                # A seed per (update, process): a resumed run renames exactly as an uninterrupted one.
                batch["obs"] = rename_words(
                    batch["obs"],
                    cfg.word_rename_rate,
                    cfg.model.vocab_size,
                    seed=[cfg.seed, update, rank],
                    typed_rate=cfg.typed_word_rename_rate,
                )
                batch = multihost.global_batch(batch, batch_sharding(mesh), cfg.batch_size)
                params, opt_state, metrics = step_fn(params, opt_state, batch)
                train_metrics = jax.device_get(multihost.host_copy(metrics))
                priorities = {
                    k: train_metrics.pop(k)[rows] for k in list(train_metrics) if k.startswith("priority_")
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
                if not sync and update % cfg.publish_every == 0:
                    t0 = time.monotonic()
                    version += 1
                    server.publish(version, snapshot(params))
                    timing["publish_s"] += time.monotonic() - t0
                if checkpointer is not None and update % cfg.checkpoint_every == 0:
                    save_checkpoint()
            log_if_due()
    finally:
        if checkpointer is not None:
            if update > saved_update:
                save_checkpoint()
            checkpointer.close()
        last = record()
        last["stopped"] = stop.reason or "error"
        if stop.reason:  # a clean stop (after an error the donated parameters may be gone)
            last["params_digest"] = _digest(snapshot(params))
        writer.write(last)
        writer.close()
        try:
            dashboards.close(last)
        finally:
            progress.close(last)  # the panel's last frame stays; later messages print below it
        if actors is not None:
            actors.stop()
        server.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        console.print(
            f"learner: stopped ({last['stopped']}) after {update} updates, {totals['episodes']} episodes"
        )
    return last


def _curve_server(cfg: LearnerConfig) -> CurveServer | None:
    """The CURVE settings, checked; refuses to expose unauthenticated sockets beyond this machine."""
    if (cfg.curve_secret_key is None) != (cfg.curve_authorized is None):
        raise SystemExit("--curve-secret-key and --curve-authorized go together")
    if cfg.curve_secret_key is None:
        if not is_loopback(cfg.bind) and not cfg.insecure:
            raise SystemExit(
                f"--bind {cfg.bind} exposes the learner beyond this machine without authentication: anyone who "
                "reaches its ports could feed it trajectories and read its parameters. Create keys with "
                "`python -m learner keys DIR` and pass --curve-secret-key DIR/learner.key_secret "
                "--curve-authorized DIR/authorized (BUILD.md, 'Security'), or accept the risk with --insecure."
            )
        return None
    try:
        return CurveServer(cfg.curve_secret_key, cfg.curve_authorized)
    except CurveError as e:
        raise SystemExit(f"CURVE: {e}") from e


def load_warmup_demos(cfg: LearnerConfig, run_dir: Path, console: Console) -> list[Episode]:
    """Demonstrations to warm up on and prefill the replay with: `--demos FILE`, or `--warmup-demos N`
    generated by the SimPhone oracle in a `python -m actors demos` subprocess (the learner never imports
    actor code)."""
    if not cfg.uses_demonstrations():
        if cfg.warmup_updates:
            console.print(
                "learner: no warm-up: no demonstrations (pass --demos FILE, or --warmup-demos N with SimPhone)"
            )
        return []
    path = cfg.demos
    if path is None:  # SimPhone oracle demonstrations, written now
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "demos.msgpack"
        model_args = [
            a
            for f in dataclasses.fields(cfg.model)
            for a in (f"--model.{f.name.replace('_', '-')}", str(getattr(cfg.model, f.name)))
        ]
        cmd = [
            sys.executable, "-m", "actors", "demos", "--out", str(path), "--tasks", cfg.tasks, "--split", cfg.split,
            "--episodes", str(cfg.warmup_demos), "--noise", str(cfg.warmup_noise), "--max-steps", str(cfg.max_steps),
            "--seed", str(cfg.seed + 1000 * jax.process_index()), *model_args,
        ]  # fmt: skip
        console.print(f"learner: writing {cfg.warmup_demos} oracle demonstrations to {path}")
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if done.returncode != 0:
            raise SystemExit(f"generating demonstrations failed:\n{done.stdout}{done.stderr}")
    try:
        episodes = load_episodes(path, cfg.model)
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot use demonstrations {path}: {e}") from e
    if not episodes:
        raise SystemExit(f"{path} holds no episodes")
    longest = max(ep.length for ep in episodes)
    if longest > cfg.max_steps:
        raise SystemExit(
            f"{path}: episodes of up to {longest} steps, longer than --max-steps {cfg.max_steps}"
        )
    success = np.mean([ep.success for ep in episodes])
    uses = [f"warm-up for {cfg.warmup_updates} updates"] if cfg.warmup_updates else []
    uses += ["the replay when reinforcement learning starts"] if cfg.prefill_demos else []
    uses += [f"one in {cfg.demo_update_every} updates after the warm-up"] if cfg.demo_update_every else []
    console.print(f"learner: {len(episodes)} demonstrations (success {success:.2f}) for {' and '.join(uses)}")
    return episodes


def snapshot(params) -> dict[str, np.ndarray]:
    """The parameters as the host copy actors receive (gathered from every device and process)."""
    return model.params_to_flat(multihost.host_copy(params))


def _digest(flat: dict[str, np.ndarray]) -> str:
    """A short hash of a snapshot: equal digests mean bit-identical parameters (across processes, runs)."""
    h = hashlib.sha256()
    for name in sorted(flat):
        h.update(name.encode())
        h.update(np.ascontiguousarray(flat[name]).tobytes())
    return h.hexdigest()[:16]


def _as_version(ep: Episode, version: int) -> Episode:
    """A demonstration stamped with the current policy version: it enters the replay as fresh data (its
    exact behavior log-probs still drive the off-policy correction) and ages out by max_policy_lag."""
    stamped = np.full_like(ep.steps["policy_version"], version)
    return dataclasses.replace(ep, steps={**ep.steps, "policy_version": stamped})


def _jumped(rng: np.random.Generator, times: int) -> np.random.Generator:
    """`rng`'s stream advanced by `times` x 2^127 draws (PCG64 jumps): disjoint streams per process."""
    return np.random.Generator(rng.bit_generator.jumped(times)) if times else rng


def _jsonable(cfg: LearnerConfig) -> dict:
    """The config as plain JSON values (paths as strings), stored with every checkpoint."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
