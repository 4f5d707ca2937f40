"""Everything a learner run is made of, built in order and released in reverse: the Session.

open_session: join the other learner processes -> device mesh -> Trainer (model, optimizer, compiled
updates) -> replay -> restore from the newest checkpoint (state, replay, delivery ledger) ->
demonstrations -> ingest and params sockets -> the write-ahead log's batches after the checkpoint ->
dashboards, config.json, endpoints.json -> publish the current version -> start the local actors. What
only the machine can refuse (the mesh, key files, a checkpoint for another model, ports in use) stops the
run here with one message naming the flag or file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

from common import featurize, text_encoder
from common.backbones import CheckpointError
from common.config import cli_args
from common.curve import CurveError, CurveServer
from common.ports import INGEST_PORT, PARAMS_PORT, adb_clash
from common.protocol import Episode
from common.trajectory_file import load_episodes
from learner import multihost
from learner.checkpoint import Checkpointer
from learner.config import LearnerConfig, flat_dict
from learner.console import Progress
from learner.ingest import IngestServer
from learner.local_actors import LocalActors
from learner.mesh import large_model_config, make_mesh
from learner.metrics import MetricsWriter
from learner.replay import PrioritizedReplay, initial_priority_terms, oldest_version
from learner.run_stats import RunStats
from learner.schedule import Schedule
from learner.tensorboard import Dashboards, require_wandb
from learner.trainer import Trainer, run_while_serving
from learner.wal import WriteAheadLog


@dataclass
class Session:
    """One learner process's run: the Trainer and everything around it (replay, sockets, schedule,
    dashboards, checkpoints, local actors), with the few actions that touch several of them."""

    cfg: LearnerConfig
    console: Console
    run_dir: Path
    """Where this process writes: cfg.run_dir, or cfg.run_dir/process-I for processes other than 0."""
    rank: int
    trainer: Trainer
    replay: PrioritizedReplay[Episode]
    checkpointer: Checkpointer | None
    demos: list[Episode]
    stats: RunStats
    schedule: Schedule
    server: IngestServer
    writer: MetricsWriter
    progress: Progress
    dashboards: Dashboards
    actors: LocalActors | None = None
    prefill_pending: bool = False
    """The demonstrations still have to join the replay (they do as reinforcement learning starts)."""
    saved_update: int = 0
    """The update of the newest checkpoint on disk."""
    saved_lsn: int = 0
    """The write-ahead log position of the newest checkpoint on disk: every record below it is in it."""
    _last_log: float = 0.0

    def publish(self, serve: Callable[[], None] | None = None) -> None:
        """A new policy version: its snapshot goes to every actor (and answers PARAM_REQ from now on). With
        `serve`, the parameters' host copy (seconds for a large model) is made on a helper thread while
        this one keeps serving; every process publishes at the same point, so its collectives line up."""
        t0 = time.monotonic()
        version = self.trainer.new_version()
        self.server.publish(version, run_while_serving(self.trainer.snapshot, serve, "publish"))
        self.stats.timing["publish_s"] += time.monotonic() - t0

    def save(self) -> None:
        """A checkpoint of the training state, then this process's replay, then its delivery ledger (in
        that order: a ledger file always describes a replay file, which the resume relies on)."""
        t0 = time.monotonic()
        update = self.trainer.update
        self.trainer.save(self.checkpointer, flat_dict(self.cfg))
        self.checkpointer.save_replay(update, self.replay, self.cfg.model, self.cfg.max_steps, self.rank)
        wal = self.server.wal
        position = wal.next_lsn if wal is not None else 0  # no batch waits for a sync between polls
        self.checkpointer.save_delivery(
            update, {**self.server.ledger.state(), "wal_next_lsn": position}, self.rank
        )
        if wal is not None:
            # orbax finished the previous checkpoint before starting this one (CheckpointManager.save
            # waits), so it is complete on disk: the log below its position is no longer needed.
            wal.prune(self.saved_lsn)
        self.saved_update, self.saved_lsn = update, position
        self.stats.timing["checkpoint_s"] += time.monotonic() - t0

    def prefill(self) -> None:
        """The demonstrations join the replay, stamped with the current version: fresh data whose exact
        behavior log-probs still drive the off-policy correction, ageing out by max_policy_lag."""
        self.prefill_pending = False
        version = self.trainer.version
        for ep in self.demos:
            stamped = np.full_like(ep.steps["policy_version"], version)
            self.replay.add(dataclasses.replace(ep, steps={**ep.steps, "policy_version": stamped}), version)
        self.console.print(f"learner: {len(self.demos)} demonstrations added to the replay")

    def record(self) -> dict:
        """One metrics record: what metrics.jsonl, the dashboards and the console show."""
        s, server, replay, update = self.stats, self.server, self.replay, self.trainer.update
        return {
            "run_id": server.run_id,
            "wall": round(time.monotonic() - self.schedule.start, 3),
            "update": update,
            "mode": self.cfg.mode,
            "sync_rounds": self.schedule.rounds,
            "sync_rounds_timed_out": self.schedule.rounds_timed_out,
            "phase": "warmup" if self.schedule.in_warmup(update) else "rl",
            "env_steps": s.totals["env_steps"],
            "episodes": s.totals["episodes"],
            "success_rate": s.success_rate(),
            "success_by_task": s.tasks.values(),
            "policy_version": self.trainer.version,
            "policy_lag_mean": s.lag_mean,
            "policy_lag_max": s.lag_max,
            "skipped_nonfinite": s.totals["skipped_nonfinite"],
            "instruction_filtered": s.totals["instruction_filtered"],
            "imitation_updates": s.totals["imitation_updates"],
            "behavior_version_max": s.totals["behavior_version_max"],
            "actors": server.connected_actors(),
            "replay_size": len(replay),
            "rejected": sum(server.rejected.values()),
            "rejected_by_reason": dict(server.rejected),
            "duplicates": server.duplicates,
            "dropped_replies": dict(server.drops),
            "batches_lost_in_restart": server.ledger.lost_in_restart,
            "durability": self.cfg.durability(),
            "storage_error": server.storage_error,
            **({f"wal/{k}": v for k, v in server.wal.stats.items()} if server.wal is not None else {}),
            "accepting": server.accepting,
            "dropped_episodes": replay.counts["evicted_fifo"] + replay.counts["dropped_stale"],
            **{f"replay/{k}": v for k, v in replay.stats().items()},
            **{f"train/{k}": v for k, v in s.train_metrics.items()},
            **{f"time/{k}": round(v, 3) for k, v in s.timing.items()},
        }

    def log_if_due(self) -> None:
        """Every --log-every seconds: a metrics.jsonl line, the dashboards and the console."""
        if time.monotonic() - self._last_log >= self.cfg.dashboards.log_every:
            self._last_log = time.monotonic()
            line = self.record()
            self.writer.write(line)
            self.dashboards.write(line)
            self.progress.show(line)

    def serve(self, timeout_ms: int) -> None:
        """Take in waiting messages (up to timeout_ms for the first), timed as ingest."""
        t0 = time.monotonic()
        self.server.poll(timeout_ms)
        self.stats.timing["ingest_s"] += time.monotonic() - t0

    def close(self, stopped: str) -> dict:
        """Save what is unsaved, write the last record (with why it stopped), stop the local actors and
        close the sockets. `stopped` is "" after an error: the parameters may be gone (donated) then."""
        if self.checkpointer is not None:
            if self.trainer.update > self.saved_update:
                self.save()
            self.checkpointer.close()
        last = self.record()
        last["stopped"] = stopped or "error"
        if stopped:
            last["params_digest"] = self.trainer.digest()
        self.writer.write(last)
        self.writer.close()
        try:
            self.dashboards.close(last)
        finally:
            self.progress.close(last)  # the panel's last frame stays; later messages print below it
        if self.actors is not None:
            self.actors.stop()
        self.server.close()
        return last


def open_session(cfg: LearnerConfig, console: Console) -> Session:
    """Build every part of the run (see the module docstring for the order); SystemExit naming the flag
    or file when this machine cannot run `cfg`."""
    require_wandb(cfg.dashboards.wandb_project)  # a missing wandb stops the run now, not after start-up
    curve = _curve_server(cfg)
    start = time.monotonic()
    mh = cfg.multihost
    multihost.initialize(mh.coordinator, mh.num_processes, mh.process_id)
    if cfg.model_preset == "large":
        text = {k: getattr(cfg.model, k) for k in ("text_encoder", "text_encoder_weights")}
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(large_model_config(), **text))
    try:  # the text encoder's folder, architecture and checksum, before anything is built
        cfg = dataclasses.replace(cfg, model=text_encoder.resolve(cfg.model))
    except CheckpointError as e:
        raise SystemExit(f"--model.text-encoder: {e}") from e
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
    trainer = Trainer(cfg, mesh, rank)
    buf = cfg.buffer
    replay: PrioritizedReplay[Episode] = PrioritizedReplay(
        buf.replay_capacity,
        alpha=buf.alpha,
        beta_start=buf.beta_start,
        beta_steps=buf.beta_steps,
        priority_weights=buf.priority_weights,
        max_policy_lag=buf.max_policy_lag,
        uniform=buf.replay == "uniform",
        seed=cfg.seed + rank,
    )
    checkpointer = Checkpointer(cfg.run_dir / "checkpoints") if cfg.checkpoint_every else None
    resumed = checkpointer is not None and checkpointer.latest_update() is not None
    kept = _restore(trainer, replay, checkpointer, cfg, rank, console) if resumed else None

    # A run resumed past its warm-up needs no demonstrations (nor their start-up cost), unless it keeps
    # imitating them (--demo-update-every); its replay already holds any prefilled ones.
    past_warmup = resumed and trainer.update >= cfg.imitation.warmup_updates
    demos = (
        load_warmup_demos(cfg, run_dir, console) if not past_warmup or cfg.imitation.demo_update_every else []
    )
    stats = RunStats()
    schedule = Schedule(cfg, trainer.local_batch, has_demos=bool(demos), start=start)
    if not schedule.in_warmup(trainer.update):
        stats.mark_rl_start()  # no warm-up (or past it): every episode counts towards the success target

    def on_episodes(episodes: list[Episode]) -> None:
        schedule.on_episodes(len(episodes))
        for ep in episodes:  # at the priority of the actor's own TD errors and entropy, when it sent them
            replay.add(ep, oldest_version(ep), initial_priority_terms(ep, cfg.loss.gamma))
        stats.on_episodes(episodes)

    net = cfg.transport
    durability = cfg.durability()
    wal = WriteAheadLog(run_dir / "wal", durability) if durability != "none" else None
    server = IngestServer(
        net.bind,
        net.ingest_port,
        net.params_port,
        welcome_fields={"model": cfg.model.to_dict(), "max_steps": cfg.max_steps, "mode": cfg.mode},
        feature_spec=featurize.feature_spec(cfg.model),
        vocab_size=cfg.model.vocab_size,
        text_vocab_size=text_encoder.vocab_size(cfg.model),
        max_steps=cfg.max_steps,
        on_episodes=on_episodes,
        actor_timeout=net.actor_timeout,
        credit=net.actor_credit,
        curve=curve,
        wal=wal,
        log=lambda line: console.print(line, markup=False, highlight=False),
    )
    if buf.insert_slack:
        server.gate = lambda: schedule.accepts_inserts(
            stats.totals["episodes"], len(replay), replay.counts["added"]
        )
    saved_lsn = 0
    if kept is not None:  # the ledger describes the saved replay: only with it
        try:
            ledger = checkpointer.restore_delivery(trainer.update, rank)
            if ledger is not None:
                server.ledger.load_state(ledger)
                saved_lsn = int(ledger.get("wal_next_lsn", 0))
        except ValueError as e:
            server.close()
            raise SystemExit(f"cannot resume the delivery ledger: {e}") from e
    if wal is not None:
        _recover(server, saved_lsn, trainer.version, console)
    dash = cfg.dashboards
    config = flat_dict(cfg)
    session = Session(
        cfg=cfg,
        console=console,
        run_dir=run_dir,
        rank=rank,
        trainer=trainer,
        replay=replay,
        checkpointer=checkpointer,
        demos=demos,
        stats=stats,
        schedule=schedule,
        server=server,
        writer=MetricsWriter(run_dir),
        progress=Progress(console, dash.console, cfg.checkpoint_every),  # the live panel or progress lines
        dashboards=Dashboards(run_dir, config, dash.tensorboard, dash.wandb_project if rank == 0 else ""),
        prefill_pending=cfg.imitation.prefill_demos and bool(demos) and not past_warmup,
        saved_update=trainer.update,
        saved_lsn=saved_lsn,
    )
    (run_dir / "config.json").write_text(json.dumps(config, indent=1))  # what report and readers see
    endpoints = {"ingest_port": server.ingest_port, "params_port": server.params_port, "bind": net.bind}
    tmp = run_dir / "endpoints.json.tmp"
    tmp.write_text(json.dumps(endpoints))
    tmp.replace(run_dir / "endpoints.json")  # atomic: readers never see half a file
    server.publish(trainer.version, trainer.snapshot())
    console.print(
        f"learner: ingest tcp://{net.bind}:{server.ingest_port}, params tcp://{net.bind}:{server.params_port}, "
        f"run dir {run_dir}, mesh {dict(mesh.shape)} ({cfg.mesh.param_sharding} parameters)"
        + (f", process {rank} of {jax.process_count()}" if jax.process_count() > 1 else "")
    )
    for flag, port in (("--ingest-port", server.ingest_port), ("--params-port", server.params_port)):
        if clash := adb_clash(port):
            console.print(
                f"learner: warning: {flag} {port} collides with adb on this machine: {clash}. "
                f"Emulators and `adb devices` will misbehave here; pick a port outside 5037 and 5554-5682 "
                f"(the defaults are {INGEST_PORT}/{PARAMS_PORT})."
            )
    session.actors = _start_local_actors(cfg, server, rank, run_dir, console)
    return session


def _restore(
    trainer: Trainer,
    replay: PrioritizedReplay[Episode],
    checkpointer: Checkpointer,
    cfg: LearnerConfig,
    rank: int,
    console: Console,
) -> int | None:
    """Resume the trainer and the replay from the newest checkpoint; the number of episodes the replay
    got back, or None when the checkpoint has no saved replay (it starts empty)."""
    try:
        trainer.restore(checkpointer)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    try:
        # A replay is resumed only with the ledger saved after it (a learner killed in between left it
        # alone): without the ledger the write-ahead log, replayed from its start, would store it twice.
        with_ledger = checkpointer.delivery_path(trainer.update, rank).is_file()
        kept = (
            checkpointer.restore_replay(trainer.update, replay, cfg.model, rank, max_steps=cfg.max_steps)
            if with_ledger
            else None
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot resume the replay: {e}") from e
    console.print(
        f"learner: resuming from the checkpoint at update {trainer.update} (policy v{trainer.version}), "
        + (f"{kept} episodes in the replay" if kept is not None else "no saved replay: it starts empty")
    )
    return kept


def _recover(server: IngestServer, start_lsn: int, version: int, console: Console) -> None:
    """The write-ahead log's batches after the restored checkpoint back into the replay and the ledger."""
    t0 = time.monotonic()
    try:
        counts = server.recover(start_lsn, version)
    except OSError as e:
        server.close()
        raise SystemExit(f"cannot read the write-ahead log {server.wal.directory}: {e}") from e
    damage = {k: v for k, v in server.wal.stats.items() if k in ("corrupt_records", "torn_tail_bytes") and v}
    if counts or damage:
        console.print(
            f"learner: write-ahead log: {counts['batches']} batches ({counts['episodes']} episodes) after the "
            f"checkpoint recovered in {time.monotonic() - t0:.1f}s"
            + (f", {counts['skipped']} already stored" if counts["skipped"] else "")
            + (f", {counts['unreadable']} unreadable" if counts["unreadable"] else "")
            + (f", damage skipped: {damage}" if damage else ""),
            markup=False,
        )


def _start_local_actors(
    cfg: LearnerConfig, server: IngestServer, rank: int, run_dir: Path, console: Console
) -> LocalActors | None:
    local = cfg.local
    if not local.local_actors:
        return None
    actors = LocalActors(
        local.local_actors,
        server.ingest_port,
        server.params_port,
        local.envs_per_actor,
        cfg.seed + 1000 * rank,
        run_dir,
        extra_args=(
            *("--env", local.env, "--tasks", local.tasks, "--split", local.split),
            *cli_args(cfg.emulator, "--emulator"),
        ),
    )
    console.print(f"learner: started {local.local_actors} local actor(s), logs in {run_dir}/actor-*.log")
    return actors


def _curve_server(cfg: LearnerConfig) -> CurveServer | None:
    """The CURVE keys of both sockets (LearnerConfig has checked the flags), or None."""
    net = cfg.transport
    if net.curve_secret_key is None:
        return None
    try:
        return CurveServer(net.curve_secret_key, net.curve_authorized)
    except CurveError as e:
        raise SystemExit(f"CURVE: {e}") from e


def load_warmup_demos(cfg: LearnerConfig, run_dir: Path, console: Console) -> list[Episode]:
    """Demonstrations to warm up on and prefill the replay with: `--demos FILE`, or `--warmup-demos N`
    generated by the SimPhone oracle in a `python -m actors demos` subprocess (the learner never imports
    actor code)."""
    im = cfg.imitation
    if not cfg.uses_demonstrations():
        if im.warmup_updates:
            console.print(
                "learner: no warm-up: no demonstrations (pass --demos FILE, or --warmup-demos N with SimPhone)"
            )
        return []
    path = im.demos
    if path is None:  # SimPhone oracle demonstrations, written now
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "demos.msgpack"
        cmd = [
            sys.executable, "-m", "actors", "demos", "--out", str(path),
            "--tasks", cfg.local.tasks, "--split", cfg.local.split,
            "--episodes", str(im.warmup_demos), "--noise", str(im.warmup_noise), "--max-steps", str(cfg.max_steps),
            "--seed", str(cfg.seed + 1000 * jax.process_index()), *cli_args(cfg.model, "--model"),
        ]  # fmt: skip
        console.print(f"learner: writing {im.warmup_demos} oracle demonstrations to {path}")
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
    uses = [f"warm-up for {im.warmup_updates} updates"] if im.warmup_updates else []
    uses += ["the replay when reinforcement learning starts"] if im.prefill_demos else []
    uses += [f"one in {im.demo_update_every} updates after the warm-up"] if im.demo_update_every else []
    console.print(f"learner: {len(episodes)} demonstrations (success {success:.2f}) for {' and '.join(uses)}")
    return episodes
