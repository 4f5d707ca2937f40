"""A learner that cannot write its run directory while it starts prints one line and exits with a
documented status, no traceback (learner/setup/disk.py); other errors keep their traceback."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from learner.setup.disk import DISK_FULL_STATUS, UNWRITABLE_STATUS, startup_failure
from tests.conftest import ACTOR_ENV, ROOT

NO_FILE_MAY_GROW = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1])); "
    "os.execv(sys.executable, [sys.executable, '-m', 'learner', *sys.argv[1:]])"
)
"""Runs the learner with every write to a regular file failing with EFBIG, as on a full disk (pipes still
work, so its output reaches the test; Python ignores SIGXFSZ, so the write returns the error), set in a
small launcher before exec rather than in a fork of this process, which has threads."""


def test_a_learner_started_on_a_full_disk_says_so_in_one_line(tmp_path):
    cmd = [
        sys.executable, "-c", NO_FILE_MAY_GROW, "--run-dir", str(tmp_path / "run"),
        "--ingest-port", "0", "--params-port", "0", "--env", "standin", "--warmup-updates", "0",
        "--max-steps", "8", "--model.text-encoder", "none", "--time-limit", "30",
    ]  # fmt: skip
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        env=ACTOR_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == DISK_FULL_STATUS, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("learner: cannot start:")]
    assert len(lines) == 1 and "[Errno 27]" in lines[0] and str(tmp_path / "run") in lines[0], out
    assert not (tmp_path / "run" / "endpoints.json").exists()  # it never announced ports it would not serve


@pytest.mark.parametrize(
    ("code", "status"),
    [(errno.ENOSPC, DISK_FULL_STATUS), (errno.EDQUOT, DISK_FULL_STATUS), (errno.EFBIG, DISK_FULL_STATUS),
     (errno.EROFS, UNWRITABLE_STATUS), (errno.EACCES, UNWRITABLE_STATUS)],
)  # fmt: skip
def test_write_errors_map_to_their_status_and_name_the_file(code, status):
    got = startup_failure(OSError(code, "why", "/runs/a/config.json"), Path("/runs/a"))
    assert got is not None
    assert got[0] == status
    assert got[1].startswith("learner: cannot start: /runs/a/config.json: why") and "\n" not in got[1]


def test_other_os_errors_keep_their_traceback():
    assert startup_failure(OSError(errno.ENOENT, "no such file", "/x"), Path("/r")) is None
    assert startup_failure(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), Path("/r")) is None
