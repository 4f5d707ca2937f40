"""Command-line configuration of `python -m learner` (tyro builds --help from these docstrings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.config import ModelConfig


@dataclass
class LearnerConfig:
    """Train a phone-control policy from actors' trajectories and publish parameter snapshots."""

    run_dir: Path = Path("runs/latest")
    """Where metrics.jsonl, endpoints.json and the local actors' logs go (created if missing)."""
    bind: str = "127.0.0.1"
    """Address the sockets bind to. Use 0.0.0.0 (or this host's LAN address) for actors on other machines."""
    ingest_port: int = 5555
    """ROUTER port for handshakes, trajectories, acks and parameter requests (0 picks a free port)."""
    params_port: int = 5556
    """PUB port for parameter snapshots (0 picks a free port)."""
    local_actors: int = 0
    """Actor processes to start on loopback (the one-command demo); 0 means actors connect from elsewhere."""
    env: str = "simphone"
    """Environment of the local actors: "simphone" (the built-in phone) or "standin" (a tiny one)."""
    tasks: str = "general"
    """SimPhone tasks of the local actors (a suite name, a .json file or a folder)."""
    split: str = "train"
    """SimPhone split of the local actors."""
    demos: Path | None = None
    """Demonstrations to warm up on (written by `python -m actors demos`)."""
    warmup_demos: int = 1000
    """Generate this many SimPhone oracle demonstrations at start-up to warm up on (ignored with --env
    standin or --demos)."""
    warmup_noise: float = 0.1
    """Share of random actions in generated demonstrations."""
    warmup_updates: int = 150
    """Updates of behavior cloning on the demonstrations before reinforcement learning starts (0: none)."""
    envs_per_actor: int = 16
    """Environments each local actor runs (batched inference)."""
    time_limit: float = 0.0
    """Stop after this many seconds (0 = no limit)."""
    max_updates: int = 0
    """Stop after this many updates (0 = no limit)."""
    batch_size: int = 32
    """Episodes per update."""
    max_steps: int = 12
    """Longest episode in steps; actors truncate there and the learner refuses longer ones."""
    queue_capacity: int = 1024
    """Episodes waiting for training; beyond it the oldest are dropped (counted as dropped_episodes)."""
    publish_every: int = 2
    """Publish a new parameter snapshot every this many updates."""
    learning_rate: float = 1e-3
    """AdamW learning rate."""
    max_grad_norm: float = 1.0
    """Global-norm gradient clipping."""
    gamma: float = 0.95
    """Discount."""
    entropy_coef: float = 0.01
    """Weight of the exact entropy bonus."""
    value_coef: float = 0.5
    """Weight of the critic loss."""
    checkpoint_every: int = 200
    """Save a checkpoint (orbax) to RUN_DIR/checkpoints every this many updates and at exit; a run dir
    that holds one resumes from it. 0 disables checkpoints."""
    log_every: float = 2.0
    """Seconds between metrics.jsonl lines and progress prints."""
    actor_timeout: float = 15.0
    """An actor silent this long no longer counts as connected."""
    seed: int = 0
    """Seed of the model initialization and of the local actors' environments."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy network size (sent to every actor in WELCOME)."""
