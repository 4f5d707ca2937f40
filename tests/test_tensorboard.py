"""TensorBoard event files of a real learner run, the scalars they hold, and the optional wandb's start-up check.

The real run is tests/test_learner_lifecycle.py's test_restart_resumes_from_the_checkpoint (its first
learner), which checks what it wrote with assert_a_real_run_wrote_tensorboard below.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from tensorboardX.proto import event_pb2

from learner.config import DashboardConfig, LearnerConfig
from learner.observe.tensorboard import Dashboards, flatten, require_wandb


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `logdir` as tag -> [(step, value)]. TFRecord framing: [uint64
    length][uint32 crc][Event protobuf][uint32 crc] (the CRCs are not checked: tensorboardX wrote them)."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_flatten_keeps_numbers_and_nests_dicts():
    record = {
        "update": 3, "success_rate": 0.5, "run_id": "abc", "accepting": True, "phase": "rl",
        "success_by_task": {"open_app": 0.75}, "dropped_replies": {"full": 2}, "replay/size": 7,
        "train/loss": float("nan"), "nothing": None,
    }  # fmt: skip
    flat = flatten(record)
    assert flat.pop("train/loss") != flat.get("train/loss")  # NaN is kept (TensorBoard shows it)
    assert flat == {
        "update": 3.0, "success_rate": 0.5, "accepting": 1.0, "success_by_task/open_app": 0.75,
        "dropped_replies/full": 2.0, "replay/size": 7.0,
    }  # fmt: skip


def test_dashboards_write_interval_shares_at_the_update_step(tmp_path):
    boards = Dashboards(tmp_path, {}, tensorboard=True, wandb_project="")
    base = {"update": 0, "wall": 10.0, "env_steps": 0, "time/train_s": 1.0, "time/ingest_s": 2.0}
    boards.write(base)
    boards.close(
        {**base, "update": 4, "wall": 14.0, "env_steps": 400, "time/train_s": 2.0, "time/ingest_s": 5.0}
    )
    boards.close()  # idempotent
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars["time/train_share"] == [(4, 0.25)]  # 1 s of the 4 s interval
    assert scalars["time/ingest_share"] == [(4, 0.75)]
    assert scalars["time/train_interval_s"] == [(4, 1.0)]
    assert scalars["rate/env_steps_per_s"] == [(4, 100.0)]
    assert scalars["rate/updates_per_s"] == [(4, 1.0)]
    assert scalars["update"] == [(0, 0.0), (4, 4.0)]


def test_no_tensorboard_writes_nothing(tmp_path):
    boards = Dashboards(tmp_path, {}, tensorboard=False, wandb_project="")
    boards.close({"update": 0, "wall": 1.0, "env_steps": 0})
    assert not (tmp_path / "tensorboard").exists()


def assert_a_real_run_wrote_tensorboard(learner, final: dict) -> None:
    """What a real learner run (started with --log-every 0.3 --console auto, stopped by --max-updates, its
    final metrics record `final`) leaves behind: progress lines in its log, and every record's scalars in
    RUN_DIR/tensorboard at the record's update. Called by tests/test_learner_lifecycle.py's
    test_restart_resumes_from_the_checkpoint on the first of its two runs (a learner with a local actor
    to an update limit, which is what this module once started a learner of its own for: 30 s of the
    suite's time)."""
    update = final["update"]
    assert f" upd {update:5d} " in learner.log()  # not a terminal: "auto" printed progress lines
    scalars = read_scalars(learner.run_dir / "tensorboard")
    for tag in ("success_rate", "env_steps", "replay_size", "time/train_s", "time/train_share",
                "time/ingest_share", "time/publish_share", "rate/env_steps_per_s", "rate/updates_per_s"):  # fmt: skip
        assert tag in scalars, sorted(scalars)
    assert scalars["success_rate"][-1] == (update, pytest.approx(final["success_rate"]))
    assert scalars["env_steps"][-1] == (update, final["env_steps"])
    assert any(tag.startswith("success_by_task/") for tag in scalars), sorted(scalars)
    assert "run_id" not in scalars and "phase" not in scalars
    steps = [step for step, _ in scalars["update"]]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == update  # global step = the update
    assert all(0.0 <= share <= 1.0 for _, share in scalars["time/train_share"])


def test_wandb_project_without_wandb_stops_at_start_up(monkeypatch, tmp_path):
    from learner.loop import run

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails even where it is installed
    assert require_wandb("") is None  # off: never imported
    with pytest.raises(SystemExit, match=r"pip install wandb.*pip install -e '\.\[wandb\]'"):
        run(LearnerConfig(run_dir=tmp_path / "run", dashboards=DashboardConfig(wandb_project="phone-rl")))
    assert not (tmp_path / "run").exists()  # stopped before anything started
