"""Command-line configuration of `python -m actors` (tyro builds --help from these docstrings).

Each config checks its own values in `__post_init__` and raises ValueError naming the flag; tyro shows
that message in its error box and exits with status 2, before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import tyro

from actors.envs.adb.config import AdbConfig
from common.config import EmulatorModelConfig
from common.net.curve import CurveClient, CurveError
from common.net.ports import INGEST_PORT, PARAMS_PORT
from common.protocol import MAX_EPISODES_PER_BATCH


@dataclass
class ActorConfig:
    """Run phone environments with the newest policy and stream episodes to a learner."""

    host: str = "127.0.0.1"
    """Address of the learner machine (what it binds to, or its LAN address / DNS name)."""
    ingest_port: int = INGEST_PORT
    """The learner's ingest (ROUTER) port."""
    curve_secret_key: str = ""
    """For a learner that uses CURVE: this actor's key pair (a .key_secret file whose public half is in the
    learner's --curve-authorized folder). Needs --curve-server-key."""
    curve_server_key: str = ""
    """The learner's public key (its learner.key file)."""
    params_port: int = PARAMS_PORT
    """The learner's parameter (PUB) port."""
    params_endpoint: str = ""
    """Take parameter snapshots from here instead, e.g. a per-host relay's "tcp://127.0.0.1:7557"
    (`python -m actors relay`), so many actors on one machine share one network copy of each snapshot."""
    inference: Literal["local", "remote"] = "local"
    """Where the policy runs: "local", on this machine with the newest snapshot (every actor holds the
    model); "remote", on the learner's inference service, which batches the observations of all actors on
    the learner's devices with its newest parameters (no model, no accelerator and no snapshots here)."""
    inference_timeout: float = 30.0
    """--inference remote: seconds without an answer before the actor gives the step up (counted as
    inference_refused_no_answer), keeps heartbeating, and asks again on a new connection."""
    env: Annotated[Literal["simphone", "standin", "adb"], tyro.conf.arg(aliases=("--backend",))] = "simphone"
    """Environment backend: "simphone" (the built-in phone), "standin" (a tiny phone with four task
    families) or "adb" (real phones or emulators through an adb server; see the --adb.* flags)."""
    tasks: str = "general"
    """Tasks: a shipped suite (SimPhone: "general", "webshop"; adb: "stock"), a task .json file, or a
    folder of them. With --backend adb the default "general" means "stock"."""
    split: str = "train"
    """Split to draw tasks from: train, test, dev, validation or heldout (actors/envs/simphone/tasks.py SPLITS)."""
    compose_rate: float = 0.0
    """SimPhone: chance that an episode's task composes two training tasks ("A and B", "A, then B" from
    templates with independent success predicates; actors/envs/simphone/compose.py), so the policy learns
    to carry on after a subgoal; train and dev splits only. 0 = never (the default: 0.3 did not beat it on
    validation, BENCHMARKS.md "generalization")."""
    num_envs: int = 16
    """Environments stepped together; inference runs on all of them in one batched, jitted call
    (--backend adb: one environment per device instead)."""
    threads: Literal["auto", "on", "off"] = "auto"
    """Step each environment on its own thread, so slow ones do not hold up the others: "auto" = for
    devices (adb, or the emulator model), inline for in-process phones."""
    adb: AdbConfig = field(default_factory=AdbConfig)
    """The ADB backend: adb server, devices or AVDs, timeouts, evaluator."""
    seed: int = -1
    """Seed of the environments and of action sampling; -1 (the default) draws one from the operating
    system and logs it, so actors started by hand do not all repeat the same tasks and layouts (pass the
    logged value to repeat a run). Local actors get `--seed` from the learner."""
    name: str = ""
    """Name shown in the learner's logs (default: hostname-pid)."""
    max_episodes: int = 0
    """Stop after this many episodes have finished, once they are acknowledged (or flush_timeout has
    passed); 0 = run until stopped."""
    max_episode_rate: float = 0.0
    """Start at most this many episodes per second in this actor process (all its environments
    together); 0 = no limit. After each slot's first episode, a slot whose episode ended waits until a
    token bucket (burst 1: starts evenly spaced) lets it reset. A benchmark control: async collection
    throttled to sync's episode rate."""
    handshake_timeout: float = 2.0
    """Seconds to wait for the learner's WELCOME before retrying; doubles per retry up to max_backoff."""
    max_backoff: float = 15.0
    """Longest wait between handshake retries, in seconds."""
    heartbeat_every: float = 2.0
    """Seconds between heartbeats to the learner."""
    learner_timeout: float = 20.0
    """Join again (new socket, new handshake, unacknowledged batches re-sent) when the learner has said
    nothing for this long; it sends a heartbeat every second."""
    ack_timeout: float = 15.0
    """Join again when a sent batch has waited this long for its ACK."""
    when_blocked: Literal["wait", "discard"] = "wait"
    """When the learner grants no credit and max_pending_episodes are waiting: "wait" stops stepping the
    environments until it does; "discard" keeps collecting and drops the oldest waiting episodes (counted
    as episodes_discarded_backlog)."""
    max_pending_episodes: int = 256
    """Finished episodes kept while waiting for credit (sent batches awaiting their ACK are extra)."""
    max_batch_episodes: int = 32
    """Most episodes in one TRAJ message."""
    flush_timeout: float = 5.0
    """On stop (--max-episodes reached, SIGINT/SIGTERM, parent gone), seconds to wait for the learner to
    acknowledge what is still held; a second SIGINT/SIGTERM stops at once."""
    status_every: float = 10.0
    """Seconds between status lines on the console."""
    ack_log: Path | None = None
    """Append one JSON line per acknowledged batch to this file: {"instance", "seq", "episodes",
    "duplicate"}, flushed at once (for audits such as `python -m benchmarks chaos`)."""
    emulator: EmulatorModelConfig = field(default_factory=EmulatorModelConfig)
    """Make every environment behave like a real emulator (latency, stalls, faults); off by default."""
    parent_pid: int = 0
    """Exit when this process is gone (set by `python -m learner --local-actors`)."""

    def __post_init__(self) -> None:
        for name in ("ingest_port", "params_port"):
            port = getattr(self, name)
            if not 1 <= port <= 65535:
                raise ValueError(f"{_flag(name)} must be in [1, 65535], got {port}")
        for name in (
            "num_envs", "max_pending_episodes", "handshake_timeout", "max_backoff", "heartbeat_every",
            "learner_timeout", "ack_timeout", "status_every", "inference_timeout",
        ):  # fmt: skip
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{_flag(name)} must be positive, got {value}")
        if not 1 <= self.max_batch_episodes <= MAX_EPISODES_PER_BATCH:
            raise ValueError(
                f"--max-batch-episodes must be in [1, {MAX_EPISODES_PER_BATCH}], got {self.max_batch_episodes}"
            )
        for name in ("flush_timeout", "max_episodes", "max_episode_rate", "parent_pid"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{_flag(name)} must be >= 0, got {value}")
        if self.seed < -1:
            raise ValueError(f"--seed must be >= 0 (or -1: drawn), got {self.seed}")
        if not 0.0 <= self.compose_rate <= 1.0:
            raise ValueError(f"--compose-rate must be in [0, 1], got {self.compose_rate}")
        if self.compose_rate and (self.env != "simphone" or self.split not in ("train", "dev")):
            raise ValueError(
                "--compose-rate composes SimPhone training tasks: it needs --env simphone and --split train or dev"
            )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def curve_client(cfg: ActorConfig) -> CurveClient | None:
    """The actor's CURVE keys, or None; a missing or unusable key file stops the actor with its name."""
    if bool(cfg.curve_secret_key) != bool(cfg.curve_server_key):
        raise SystemExit("--curve-secret-key and --curve-server-key go together")
    if not cfg.curve_secret_key:
        return None
    try:
        return CurveClient(Path(cfg.curve_secret_key), Path(cfg.curve_server_key))
    except CurveError as e:
        raise SystemExit(f"CURVE: {e}") from e
