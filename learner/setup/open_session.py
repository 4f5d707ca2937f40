"""Everything a learner run is made of, built in order and released in reverse: `open_session` -> Session.

The order, stated once:
1. what can refuse the run before anything starts: the flags handed to local actors and the demo writer
   (checked by the actor's own parser, learner/launch/actor_check.py), wandb installed when asked for, the CURVE
   key files;
2. join the other learner processes (jax.distributed), then settle the model config (--model-preset, the
   text encoder's folder and checksum);
3. the training state and replay (learner/setup/training_state.py): device mesh -> Trainer -> empty replay;
4. the demonstrations (learner/setup/demos.py); a run resuming past its warm-up needs none, and which
   checkpoint it resumes from is known before it is read;
5. run statistics, the schedule and the ReplayInserter -> the ingest (learner/setup/ingest.py: sockets
   bound, the write-ahead log opened) and the inference service beside it;
6. the resume (learner/setup/resume.py): training state, replay, delivery ledger, the write-ahead log's batches;
7. outputs (learner/observe/run_outputs.py): metrics.jsonl, dashboards, the console panel, config.json;
   endpoints.json once the ports are known;
8. the current version published, then the local actors started.
What only the machine can refuse (the mesh, key files, a checkpoint for another model, ports in use) stops
the run here with one message naming the flag or file; the sockets are closed again when a later step fails.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
import time
from pathlib import Path

import jax
from rich.console import Console

from common.backbones import CheckpointError
from common.net.ports import INGEST_PORT, PARAMS_PORT, adb_clash
from common.policies import PRESETS, resolved_config
from learner import warmup
from learner.config import LearnerConfig
from learner.ingest.server import IngestServer
from learner.inserter import ReplayInserter
from learner.launch.actor_check import check_local_flags
from learner.launch.local_actors import LocalActors, stop_grace
from learner.observe.run_outputs import RunOutputs, write_endpoints
from learner.observe.run_stats import RunStats
from learner.observe.tensorboard import require_wandb
from learner.replay.prioritized import PrioritizedReplay, oldest_origin
from learner.schedule import Schedule
from learner.session import Session, publish_version
from learner.setup.demos import demonstrations
from learner.setup.ingest import curve_server, open_ingest
from learner.setup.resume import resume
from learner.setup.training_state import Training, build_training
from learner.training import multihost
from learner.training.checkpoint import Checkpointer, complete
from learner.training.checkpoint_files import CheckpointFiles
from learner.warmup import Validation, Warmup


def open_session(cfg: LearnerConfig, console: Console) -> Session:
    """Build every part of the run in the order of the module docstring; SystemExit naming the flag or
    file when this machine cannot run `cfg`."""
    check_local_flags(
        cfg
    )  # 1: bad --env/--tasks/--split/--emulator.*: one line, status 2, before any process
    require_wandb(cfg.dashboards.wandb_project)  # a missing wandb stops the run now, not after start-up
    curve = curve_server(cfg)
    start = time.monotonic()
    cfg = _joined_config(cfg)  # 2
    rank = jax.process_index()
    run_dir = cfg.run_dir if rank == 0 else cfg.run_dir / f"process-{rank}"  # checkpoints: cfg.run_dir's
    training = build_training(cfg, rank)  # 3
    trainer, replay = training.trainer, training.replay
    checkpoints = cfg.run_dir / "checkpoints"
    checkpointer = Checkpointer(checkpoints, processes=jax.process_count()) if cfg.checkpoint_every else None
    resume_update = checkpointer.latest_update() if checkpointer is not None else None
    warmup_end = warmup.ended_at(cfg.run_dir) if resume_update is not None else None
    demos, prefill = demonstrations(cfg, run_dir, console, resume_update, warmup_end)  # 4
    demos, held_back = _held_back(cfg, demos, trainer.local_batch, console)
    stats = RunStats()  # 5
    schedule = Schedule(cfg, trainer.local_batch, has_demos=bool(demos), start=start, warmup_end=warmup_end)
    if not schedule.in_warmup(resume_update or 0):
        stats.mark_rl_start()  # no warm-up (or past it): every episode counts towards the success target
    inserter = ReplayInserter(replay, schedule, stats, cfg.loss.gamma, lambda: trainer.version)
    server, inference = open_ingest(cfg, run_dir, inserter, trainer.graphdef, curve, console)
    try:
        saved_lsn = resume(cfg, rank, checkpointer, trainer, replay, server, console)  # 6
        session = Session(
            cfg=cfg,
            console=console,
            run_dir=run_dir,
            rank=rank,
            trainer=trainer,
            replay=replay,
            checkpointer=checkpointer,
            demos=demos,
            warmup=Warmup(
                trainer,
                schedule,
                stats,
                console,
                run_dir,
                rank,
                cfg.seed,
                len(demos),
                held_back,
                Validation(cfg.imitation.warmup_patience) if held_back else None,
            ),
            stats=stats,
            schedule=schedule,
            server=server,
            inference=inference,
            outputs=RunOutputs(cfg, run_dir, rank, console),  # 7
            prefill_pending=prefill,
            warmup_end_pending=schedule.in_warmup(trainer.update),
            saved_update=trainer.update,
            resumed_update=trainer.update,
            saved_lsn=saved_lsn,
            checkpoint_files=_checkpoint_files(
                cfg, server, replay, checkpointer, trainer.update, saved_lsn, console
            )
            if checkpointer
            else None,
        )
        _go_live(session, training)  # 8
    except BaseException:
        if inference is not None:
            inference.close()
        server.close()
        raise
    return session


def _held_back(cfg: LearnerConfig, demos: list, local_batch: int, console: Console) -> tuple[list, list]:
    """(the demonstrations to imitate, those held back to validate the warm-up: --validation-demos,
    learner/warmup.py); SystemExit when that leaves none, or with several learner processes."""
    n = cfg.imitation.validation_demos
    if not n or not demos:
        return demos, []
    if jax.process_count() > 1:
        raise SystemExit("--validation-demos runs in a single learner process (set it to 0 with several)")
    train, held = warmup.split_validation(demos, n)
    epoch = -(-len(train) // local_batch)
    patience = cfg.imitation.warmup_patience
    console.print(
        f"learner: the last {n} demonstrations held back: their imitation loss is measured before and after "
        f"each epoch of the warm-up ({len(train)} to imitate, an epoch is {epoch} updates)"
        + (f"; it ends after {patience} epoch(s) without a new low" if patience else "")
    )
    return train, held


def _checkpoint_files(
    cfg: LearnerConfig,
    server: IngestServer,
    replay: PrioritizedReplay,
    checkpointer: Checkpointer,
    update: int,
    saved_lsn: int,
    console: Console,
) -> CheckpointFiles:
    """The helper that writes checkpoint files, told what the checkpoint just resumed from (`update`)
    needs of the log: its position, or the oldest record its replay references (asked now, before
    training evicts any of those items; the batches recovered from the log are newer)."""
    wal, oldest = server.wal, oldest_origin(replay)
    needed = saved_lsn if oldest is None else min(saved_lsn, oldest)
    prune = wal.prune if wal is not None and not cfg.transport.keep_log else None
    done = functools.partial(complete, checkpointer)
    return CheckpointFiles((update, needed), prune, done, lambda line: console.print(line, markup=False))


def _go_live(session: Session, training: Training) -> None:
    """endpoints.json, the current version published (version 0, or the resumed one), the endpoints on
    the console, then the local actors."""
    cfg, server, run_dir, rank = session.cfg, session.server, session.run_dir, session.rank
    inference_port = session.inference.port if session.inference is not None else 0
    write_endpoints(run_dir, server, cfg.transport.bind, session.outputs.status, inference_port)
    publish_version(server, session.inference, training.trainer, training.trainer.version, None)
    _announce(cfg, server, inference_port, training, rank, run_dir, session.console)
    if (status := session.outputs.status) is not None:
        session.console.print(
            f"learner: metrics http://{cfg.transport.bind}:{status.port}/metrics, health /livez /readyz"
        )
    start = functools.partial(_start_local_actors, cfg, server, rank, run_dir, session.console)
    if (
        cfg.local.actors_after_warmup
        and cfg.local.local_actors
        and session.schedule.in_warmup(session.trainer.update)
    ):
        session.start_actors = start
        session.console.print(
            f"learner: the {cfg.local.local_actors} local actor(s) start when the warm-up ends (--actors-after-warmup)"
        )
    else:
        session.actors = start()


def _joined_config(cfg: LearnerConfig) -> LearnerConfig:
    """Join the other learner processes, then the model config this run trains: the large preset's
    sizes (keeping the text encoder flags), with the text encoder's folder, architecture and checksum
    resolved before anything is built."""
    mh = cfg.multihost
    multihost.initialize(mh.coordinator, mh.num_processes, mh.process_id)
    if cfg.model_preset in PRESETS:
        text = {k: getattr(cfg.model, k) for k in ("text_encoder", "text_encoder_weights")}
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(PRESETS[cfg.model_preset](), **text))
    try:
        return dataclasses.replace(cfg, model=resolved_config(cfg.model))
    except CheckpointError as e:
        raise SystemExit(f"--model.text-encoder: {e}") from e


def _announce(
    cfg: LearnerConfig,
    server: IngestServer,
    inference_port: int,
    training: Training,
    rank: int,
    run_dir: Path,
    console: Console,
) -> None:
    """The learner's endpoints on the console (`inference_port` 0: no inference service), and a warning
    for a port adb uses on this machine."""
    bind = cfg.transport.bind
    console.print(
        f"learner: ingest tcp://{bind}:{server.ingest_port}, params tcp://{bind}:{server.params_port}, "
        + (f"inference tcp://{bind}:{inference_port}, " if inference_port else "")
        + f"run dir {run_dir}, mesh {dict(training.mesh.shape)} ({cfg.mesh.param_sharding} parameters)"
        + (f", process {rank} of {jax.process_count()}" if jax.process_count() > 1 else "")
    )
    for flag, port in (("--ingest-port", server.ingest_port), ("--params-port", server.params_port)):
        if clash := adb_clash(port):
            console.print(
                f"learner: warning: {flag} {port} collides with adb on this machine: {clash}. "
                f"Emulators and `adb devices` will misbehave here; pick a port outside 5037 and 5554-5682 "
                f"(the defaults are {INGEST_PORT}/{PARAMS_PORT})."
            )


def _start_local_actors(
    cfg: LearnerConfig, server: IngestServer, rank: int, run_dir: Path, console: Console
) -> LocalActors | None:
    """--local-actors N: N `python -m actors` children on loopback (None without)."""
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
        tuple(shlex.split(local.local_actor_args)),
        env=local.env,
        tasks=local.tasks,
        split=local.split,
        emulator=cfg.emulator,
        grace=stop_grace(cfg.transport.actor_timeout),
    )
    console.print(f"learner: started {local.local_actors} local actor(s), logs in {run_dir}/actor-*.log")
    return actors
