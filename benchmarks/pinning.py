"""Run a learner on one CPU core and its local actors on the others, as separate machines would.

DistRL's learner has its own accelerators; on a 2-core machine the learner and the actors compete for
the same cores, and that contention, not the algorithm, decides how much of the collected data can be
trained on. Pinning the learner to core 0 and its actor processes to the remaining cores mimics
separate hardware. Linux affinity is per thread, so the actors' threads are moved one by one, and again
every second (threads started later inherit their creator's affinity, but some start before the first
pass).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:  # field 4, after "pid (comm) state"
                out.append(int(entry.name))
    return out


def _pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus`."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread (or the process) ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def available() -> bool:
    """Pinning needs Linux and at least 2 usable cores."""
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


def run_pinned(
    cmd: list[str], timeout: float, capture_output: bool = False, **popen
) -> subprocess.CompletedProcess:
    """subprocess.run(cmd) with the process on the first usable core and its children on the others."""
    if capture_output:
        popen |= {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    cores = sorted(os.sched_getaffinity(0))
    learner_cpus, actor_cpus = {cores[0]}, set(cores[1:])
    # No preexec_fn (it forks a multithreaded parent): the new process is pinned right after it starts,
    # before its imports start threads, and every second again with its children.
    proc = subprocess.Popen(cmd, **popen)
    _pin_process(proc.pid, learner_cpus)
    done = threading.Event()

    def keep_pinning() -> None:
        while not done.wait(1.0):
            _pin_process(proc.pid, learner_cpus)
            for child in _children(proc.pid):
                _pin_process(child, actor_cpus)

    pinner = threading.Thread(target=keep_pinning, daemon=True)
    pinner.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise
    finally:
        done.set()
        pinner.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
