"""The chaos soak's judge of the write-ahead log after the stop (benchmarks/chaos/log_pruning.py): it reads
what two checkpoints need from the files a save writes (through the Checkpointer's own paths) and flags a
log that keeps segments no restore needs, or lacks a record the final checkpoint needs."""

from __future__ import annotations

from benchmarks.chaos.log_pruning import judge, needed_from
from learner.ingest.wal import WriteAheadLog, pack_batch
from learner.replay.file import save_replay
from learner.replay.prioritized import oldest_version
from learner.training.checkpoint import Checkpointer
from tests.test_incremental_checkpoint import logged_buffer, traj_bytes
from tests.test_replay_file import CFG, MAX_STEPS, make_episodes


def _save(ckpt: Checkpointer, update: int, replay, wal: WriteAheadLog) -> int:
    """A checkpoint's files as a save writes them (the replay by reference, the ledger last); returns the
    oldest record it needs, computed here from the buffer's items: the least of their records and the
    log position."""
    (ckpt.directory / str(update)).mkdir()  # orbax's step folder
    ckpt.replay_path(update).parent.mkdir(exist_ok=True)
    save_replay(ckpt.replay_path(update), replay, CFG, MAX_STEPS, by_reference=True)
    ckpt.save_delivery(update, {"wal_next_lsn": wal.next_lsn})
    origins = replay.state_dict()[1]["origins"][:, 0]
    return min([wal.next_lsn, *origins[origins >= 0].tolist()])


def test_the_judge_flags_kept_segments_and_missing_records(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", "os", segment_bytes=2_000)  # about a record per segment
    list(wal.recover())
    episodes = make_episodes(30)
    replay, *_ = logged_buffer(wal, [episodes[i : i + 3] for i in range(0, 18, 3)], capacity=4)
    ckpt = Checkpointer(tmp_path / "checkpoints")
    previous = _save(ckpt, 10, replay, wal)
    for seq, i in enumerate(range(18, 30, 3), 7):  # more batches, the oldest items evicted
        lsn = wal.append(pack_batch("actor-a", seq, traj_bytes(episodes[i : i + 3], seq)))
        for j, ep in enumerate(episodes[i : i + 3]):
            replay.add(ep, oldest_version(ep), origin=(lsn, j))
    final = _save(ckpt, 20, replay, wal)
    ckpt.close()
    dirs = [tmp_path / "wal"]
    assert needed_from(tmp_path / "checkpoints", 10, 0)[0] == previous
    assert needed_from(tmp_path / "checkpoints", 20, 0) == (final, wal.next_lsn)
    assert 0 < previous < final < wal.next_lsn

    kept = judge(tmp_path / "checkpoints", dirs)  # nothing pruned yet: every segment below `previous`
    assert kept["judged"] and (kept["final"], kept["previous"]) == (20, 10)
    below = [s for s, _ in wal.segments()]
    assert kept["excess_segments"] == sum(1 for nxt in below[1:] if nxt <= previous) > 0

    wal.prune(previous)  # what the final save prunes: one save late
    assert judge(tmp_path / "checkpoints", dirs)["excess_segments"] == 0
    assert judge(tmp_path / "checkpoints", dirs)["short"] == 0

    wal.prune(wal.next_lsn)  # too far: the final checkpoint's referenced records are gone
    assert judge(tmp_path / "checkpoints", dirs)["short"] == 1
    wal.close()


def test_one_complete_checkpoint_is_not_judged(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", "os", segment_bytes=2_000)
    list(wal.recover())
    replay, *_ = logged_buffer(wal, [make_episodes(3)], capacity=4)
    ckpt = Checkpointer(tmp_path / "checkpoints")
    _save(ckpt, 10, replay, wal)
    (ckpt.directory / "20").mkdir()  # a second save whose ledger was never written: not complete
    ckpt.close()
    report = judge(tmp_path / "checkpoints", [tmp_path / "wal"])
    assert report == {"judged": False, "complete_checkpoints": [10], "excess_segments": 0, "short": 0}
    wal.close()
