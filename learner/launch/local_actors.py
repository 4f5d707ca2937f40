"""Start actor processes on loopback for the one-command demo, and make sure none outlives the learner."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from common.actor_command import actor_command
from common.config import EmulatorModelConfig

PENDING_PER_ENV = 2
"""Finished episodes a local actor keeps waiting for credit, per environment (--max-pending-episodes):
few, so that when the learner's insert side withholds credit (--insert-slack, on by default with local
actors) they wait within a couple of episodes, not after buffering the actor's default of 256."""


STOP_GRACE_S = 15.0
"""How long a stopping learner waits for its local actors after SIGTERM before it kills them. An actor
stops between acts, and an lm actor's batched act takes seconds, many more on a loaded machine: 5 s killed
one in the middle of its act in a busy test run (its last episodes and final counters lost). The least
`stop_grace` gives."""


def stop_grace(actor_timeout: float) -> float:
    """How long to wait for local actors after SIGTERM: half of --actor-timeout, the silence the learner
    allows a live actor (the lm recipe's 120 s, because its batched act takes 15-30 s on a loaded 2-core
    machine and sends no heartbeat), at least STOP_GRACE_S. With 15 s an lm actor in the middle of its act
    at the time limit was killed (BENCHMARKS.md "LM agent: the recipe's warm-up, 15 minutes", seed 2)."""
    return max(STOP_GRACE_S, actor_timeout / 2)


class LocalActors:
    """N `python -m actors` children, each with its own log file in the run dir."""

    def __init__(
        self,
        count: int,
        ingest_port: int,
        params_port: int,
        num_envs: int,
        seed: int,
        run_dir: Path,
        extra_args: tuple[str, ...] = (),
        *,
        env: str | None = None,
        tasks: str | None = None,
        split: str | None = None,
        emulator: EmulatorModelConfig | None = None,
        grace: float = STOP_GRACE_S,
    ):
        """`env`, `tasks`, `split` and `emulator`: the actors' environments (None: the actor's default);
        `extra_args`: further `python -m actors` flags, last (so they win over PENDING_PER_ENV's); `grace`:
        how long `stop` waits for them (`stop_grace`)."""
        self.grace = grace
        self.procs: list[subprocess.Popen] = []
        self._logs = []
        env_vars = dict(os.environ)
        # Actors run small batched inference; one XLA thread each keeps them off the learner's cores.
        env_vars.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        env_vars.setdefault("JAX_PLATFORMS", "cpu")
        where = {"env": env, "tasks": tasks, "split": split, "emulator": emulator}
        for i in range(count):
            log = (run_dir / f"actor-{i}.log").open("ab")
            self._logs.append(log)
            cmd = local_actor_command(i, ingest_port, params_port, num_envs, seed, extra_args, **where)
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env_vars))

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def terminate(self) -> None:
        """SIGTERM to every actor still running (each sends what it holds and stops); returns at once."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def stop(self, serve: Callable[[], None] | None = None) -> list[int]:
        """SIGTERM, wait up to `grace` seconds calling `serve()` meanwhile (the learner acknowledges the
        actors' last batches, so they need not wait out their --flush-timeout), then SIGKILL what is left;
        the indices of the actors killed (their logs end without a "stopped" line)."""
        self.terminate()
        deadline = time.monotonic() + self.grace
        while self.alive() and time.monotonic() < deadline:
            if serve is not None:
                serve()
            else:
                time.sleep(0.01)
        killed = [i for i, p in enumerate(self.procs) if p.poll() is None]
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in self._logs:
            log.close()
        return killed


def local_actor_command(
    index: int,
    ingest_port: int,
    params_port: int,
    num_envs: int,
    seed: int,
    extra_args: tuple[str, ...] = (),
    *,
    env: str | None = None,
    tasks: str | None = None,
    split: str | None = None,
    emulator: EmulatorModelConfig | None = None,
) -> list[str]:
    """Local actor `index`'s argv (the arguments are LocalActors')."""
    return actor_command(
        host="127.0.0.1",
        ingest_port=ingest_port,
        params_port=params_port,
        num_envs=num_envs,
        seed=seed * 1000 + index,
        name=f"local-{index}",
        parent_pid=os.getpid(),
        # The learner stops them after its last record: nothing they could flush then is stored.
        flush_timeout=0,
        env=env,
        tasks=tasks,
        split=split,
        emulator=emulator,
        extra=("--max-pending-episodes", str(PENDING_PER_ENV * num_envs), *extra_args),
    )
