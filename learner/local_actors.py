"""Start actor processes on loopback for the one-command demo, and make sure none outlives the learner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


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
    ):
        self.procs: list[subprocess.Popen] = []
        self._logs = []
        env = dict(os.environ)
        # Actors run small batched inference; one XLA thread each keeps them off the learner's cores.
        env.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        env.setdefault("JAX_PLATFORMS", "cpu")
        for i in range(count):
            log = (run_dir / f"actor-{i}.log").open("ab")
            self._logs.append(log)
            cmd = [
                sys.executable, "-m", "actors",
                "--host", "127.0.0.1",
                "--ingest-port", str(ingest_port),
                "--params-port", str(params_port),
                "--num-envs", str(num_envs),
                "--seed", str(seed * 1000 + i),
                "--name", f"local-{i}",
                "--parent-pid", str(os.getpid()),
                # The learner stops them after its last record: nothing they could flush then is stored.
                "--flush-timeout", "0",
                *extra_args,
            ]  # fmt: skip
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL what is left."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self._logs:
            log.close()
