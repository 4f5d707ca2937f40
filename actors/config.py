"""Command-line configuration of `python -m actors` (tyro builds --help from these docstrings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from actors.envs.simphone.emulator import EmulatorModelConfig


@dataclass
class ActorConfig:
    """Run phone environments with the newest policy and stream episodes to a learner."""

    host: str = "127.0.0.1"
    """Address of the learner machine (what it binds to, or its LAN address / DNS name)."""
    ingest_port: int = 5555
    """The learner's ingest (ROUTER) port."""
    params_port: int = 5556
    """The learner's parameter (PUB) port."""
    env: Literal["simphone", "standin"] = "simphone"
    """Environment backend: "simphone" (the built-in phone) or "standin" (a tiny phone with four task families)."""
    tasks: str = "general"
    """SimPhone tasks: a shipped suite ("general", "webshop"), a task .json file, or a folder of them."""
    split: str = "train"
    """SimPhone split to draw tasks from: "train" or "test"."""
    num_envs: int = 16
    """Environments stepped together; inference runs on all of them in one batched, jitted call."""
    seed: int = 0
    """Seed of the environments and of action sampling."""
    name: str = ""
    """Name shown in the learner's logs (default: hostname-pid)."""
    max_episodes: int = 0
    """Stop after sending this many episodes (0 = run until stopped)."""
    handshake_timeout: float = 2.0
    """Seconds to wait for the learner's WELCOME before retrying; doubles per retry up to max_backoff."""
    max_backoff: float = 15.0
    """Longest wait between handshake retries, in seconds."""
    heartbeat_every: float = 2.0
    """Seconds between heartbeats to the learner."""
    status_every: float = 10.0
    """Seconds between status lines on the console."""
    emulator: EmulatorModelConfig = field(default_factory=EmulatorModelConfig)
    """Make every environment behave like a real emulator (latency, stalls, faults); off by default."""
    parent_pid: int = 0
    """Exit when this process is gone (set by `python -m learner --local-actors`)."""
