"""Seconds from SIGTERM to exit, for both policy families (issue 46): `python -m benchmarks stopping`.

What runs: the README's training command for each family (`python -m learner --local-actors 2`, and with
`--model.kind lm`), each in a fresh run directory. Once the learner is training (the pointer policy: 5
updates made; lm: an update in flight for 5 s, the case that used to keep it for a minute), SIGTERM goes to
the learner, and the seconds until its process has exited are timed, its local actors stopped with it.
Reported per family: those seconds, what the learner left unfinished (`abandoned`: "update" when it gave
up an update in flight, learner/loop.py `_Stop`), the update it stopped at and the newest checkpoint in
the run directory. Kubernetes' default grace period is 30 s; the recipe's learner has 300 s.
`--quick` writes fewer demonstrations for the lm run's warm-up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_S = 900.0
"""How long a family's learner may take to start training (the lm family loads and compiles a 135M
decoder and writes its demonstrations first: minutes on 2 busy cores)."""


def run(quick: bool) -> list[dict]:
    lm_demos = ("--warmup-demos", "20") if quick else ()
    return [
        _stop_timed("pointer", (), lambda m: m["update"] >= 5),
        _stop_timed("lm", ("--model.kind", "lm", *lm_demos), lambda m: m.get("update_in_flight_s", 0) >= 5),
    ]


def _stop_timed(family: str, flags: tuple[str, ...], training) -> dict:
    """SIGTERM to `python -m learner --local-actors 2 *flags` once a metrics record satisfies `training`."""
    with tempfile.TemporaryDirectory(prefix=f"stopping-{family}-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "learner", "--local-actors", "2", "--run-dir", str(run_dir), *flags]
        cmd += ["--ingest-port", "0", "--params-port", "0", "--log-every", "1"]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        with (Path(tmp) / "learner.log").open("wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                seen = _wait_for(run_dir / "metrics.jsonl", training, proc)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                rc = proc.wait(timeout=600)
                seconds = time.monotonic() - t0
            finally:
                if proc.poll() is None:
                    proc.kill()
        last = _records(run_dir / "metrics.jsonl")[-1]
        checkpoints = sorted(int(p.name) for p in (run_dir / "checkpoints").glob("[0-9]*"))
        return {
            "family": family,
            "sigterm_to_exit_s": round(seconds, 2),
            "exit_code": rc,
            "in_flight_at_signal_s": seen.get("update_in_flight_s", 0.0),
            "abandoned": last.get("abandoned", ""),
            "stopped_at_update": last["update"],
            "newest_checkpoint": checkpoints[-1] if checkpoints else None,
        }


def _wait_for(path: Path, training, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the learner exited early ({proc.returncode}); see its log")
        for record in reversed(_records(path)):
            if training(record):
                return record
        time.sleep(0.5)
    raise TimeoutError(f"no training record within {START_S:.0f} s")


def _records(path: Path) -> list[dict]:
    """The complete lines of metrics.jsonl (the learner may be mid-append)."""
    if not path.exists():
        return []
    text = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in text.splitlines() if line.strip()]
