"""--snapshot-every: the parameters at fixed wall times (learner/serving/snapshots.py), named by the multiple of
the period passed, with an index line each; a real learner run writes readable files in order."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from common import params_file
from common.config import ModelConfig
from learner.serving.snapshots import WallSnapshots, read_index
from tests.conftest import START_S

FLAT = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
FIELDS = {"update": 3, "version": 1, "episodes": 40, "env_steps": 200, "phase": "rl"}


def test_files_are_named_by_the_multiple_passed_and_never_go_back(tmp_path):
    snaps = WallSnapshots(tmp_path / "snapshots", every=10, writes=True)
    assert not snaps.due(9.9) and snaps.due(10.0)
    assert snaps.write(10.4, FLAT, ModelConfig(), FIELDS).name == "t00010.safetensors"
    assert not snaps.due(19.9)
    # An update that ran from 19 s to 41 s: 20 and 30 passed within it; the file is named 40.
    assert snaps.write(41.0, FLAT, ModelConfig(), FIELDS).name == "t00040.safetensors"
    # Another process's clock said 50 first (a multi-host run): the next name still goes up.
    assert snaps.write(49.9, FLAT, ModelConfig(), FIELDS).name == "t00050.safetensors"
    index = read_index(tmp_path / "snapshots")
    assert [(line["t"], line["wall"]) for line in index] == [(10, 10.4), (40, 41.0), (50, 49.9)]
    assert index[0] == {"t": 10, "wall": 10.4, **FIELDS}
    model_cfg, flat = params_file.read(tmp_path / "snapshots" / "t00040.safetensors")
    assert model_cfg == ModelConfig() and np.array_equal(flat["w"], FLAT["w"])
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == [
        "index.jsonl", "t00010.safetensors", "t00040.safetensors", "t00050.safetensors",
    ]  # fmt: skip


def test_the_final_parameters_stand_for_the_time_limit(tmp_path):
    snaps = WallSnapshots(tmp_path / "snapshots", every=40, writes=True)
    snaps.write(40.2, FLAT, ModelConfig(), FIELDS)
    # The learner stopped at 358.7 s because its next update would pass the 360 s limit.
    assert snaps.write(358.7, FLAT, ModelConfig(), FIELDS, stands_for=360.0).name == "t00360.safetensors"
    assert read_index(tmp_path / "snapshots")[-1] == {"t": 360, "wall": 358.7, **FIELDS, "final": True}
    assert not snaps.due(360.0)  # written once
    # A start-up longer than the limit: the first look is past it; the file still stands for the limit.
    late = WallSnapshots(tmp_path / "late", every=5, writes=True)
    assert late.write(32.9, FLAT, ModelConfig(), FIELDS, stands_for=20.0).name == "t00020.safetensors"


def test_off_or_another_process_writes_nothing(tmp_path):
    assert not WallSnapshots(tmp_path, every=0, writes=True).due(1e9)
    other = WallSnapshots(tmp_path / "snapshots", every=5, writes=False)
    assert other.write(12.0, FLAT, ModelConfig(), FIELDS).name == "t00010.safetensors"
    assert other.next_multiple == 3 and not (tmp_path / "snapshots").exists()


@pytest.mark.timeout(600)
def test_a_learner_run_writes_snapshots_in_order(learner_process):
    learner = learner_process(
        "--snapshot-every", "1", "--local-actors", "1", "--envs-per-actor", "2", "--batch-size", "4",
        "--checkpoint-every", "0",
    )  # fmt: skip
    directory = learner.run_dir / "snapshots"
    deadline = time.monotonic() + 2 * START_S
    while not _trained_snapshot(directory):
        assert learner.proc.poll() is None and time.monotonic() < deadline, learner.log()
        time.sleep(0.5)
    assert learner.stop() == 0, learner.log()
    index = read_index(directory)
    assert len(index) >= 2
    for before, after in itertools.pairwise(index):
        assert after["t"] > before["t"] and after["wall"] > before["wall"]
        assert after["update"] >= before["update"] and after["version"] >= before["version"]
    for line in index:
        assert line["wall"] >= line["t"] and line["phase"] == "rl"
        model_cfg, flat = params_file.read(directory / f"t{line['t']:05d}.safetensors")
        assert model_cfg.text_encoder == "none" and flat
    if index[0]["update"] < index[-1]["update"]:  # the usual case: the first one came before any update
        first, last = (params_file.read(directory / f"t{index[i]['t']:05d}.safetensors")[1] for i in (0, -1))
        assert any(not np.array_equal(first[k], last[k]) for k in first)  # trained in between


@pytest.mark.timeout(600)
def test_a_run_stopped_by_its_time_limit_has_the_limit_s_snapshot(learner_process):
    """The paper benchmark's last grid time is its time limit: the learner stops before it (when its
    next update would pass it), and its last parameters must still be there under that name. Here the
    limit (1 s, its clock started before the train step's compile, which takes seconds) has passed at
    the loop's first look, so the stop comes before any other snapshot could: only the stop's own
    snapshot can write the file (with a limit the loop reaches, a look between the stop's check and the
    update may write it first, without "final")."""
    learner = learner_process(
        "--snapshot-every", "1", "--time-limit", "1", "--local-actors", "0", "--checkpoint-every", "0"
    )
    assert learner.proc.wait(timeout=START_S) == 0, learner.log()
    index = read_index(learner.run_dir / "snapshots")
    assert [(line["t"], line.get("final")) for line in index] == [(1, True)], index
    assert index[0]["wall"] > 1 and index[0]["update"] == 0
    assert (learner.run_dir / "snapshots" / "t00001.safetensors").is_file()


def _trained_snapshot(directory) -> bool:
    """Two snapshots after an update exist (the index is appended once each file is complete)."""
    try:
        return sum(line["update"] > 0 for line in read_index(directory)) >= 2
    except (OSError, ValueError):
        return False
