"""Incremental checkpoints: a replay file references the episodes the write-ahead log holds instead of
copying them, reads them back exactly (capped versions included), refuses a log that lost one by name,
and a learner's saves (on a helper thread) prune the log only below what the newest complete
checkpoint needs, so a restart gets the replay of its checkpoint back."""

from __future__ import annotations

import dataclasses
import io
from functools import partial

import numpy as np
import pytest
from rich.console import Console

from benchmarks.chaos.log_pruning import judge
from common import protocol, wire
from common.policies.pointer import featurize
from learner.config import parse_args
from learner.ingest.settler import LoggedEpisodes
from learner.ingest.wal import WriteAheadLog, pack_batch
from learner.replay.file import load_replay, save_replay
from learner.replay.prioritized import PrioritizedReplay, oldest_origin, oldest_version
from learner.setup.open_session import open_session
from learner.training.checkpoint import Checkpointer, complete
from learner.training.checkpoint_files import CheckpointFiles
from tests.test_replay_file import CFG, KW, MAX_STEPS, assert_same_episode, make_episodes

SPEC = featurize.episode_spec(CFG, text_vocab_size=0)


def traj_bytes(episodes: list[protocol.Episode], seq: int) -> bytes:
    """A TRAJ message as an actor sends it."""
    return wire.encode(
        protocol.Traj(actor_id=1, seq=seq, episodes=[e.wire_fields() for e in episodes]).to_msg()
    )


def validate(traj: protocol.Traj, newest: int) -> list[protocol.Episode]:
    return traj.validate(SPEC, MAX_STEPS, newest)


def logged_buffer(wal: WriteAheadLog, batches: list[list[protocol.Episode]], capacity: int = 8):
    """Every batch appended to `wal` and its episodes stored with their record; in the last batch, an
    episode whose versions differ stored capped at its oldest (as recovery caps a re-sent batch); one
    demonstration with no record. Priorities updated and items evicted on the way, as in a run. Returns
    the buffer, the demonstration and the capped episode."""
    replay = PrioritizedReplay[protocol.Episode](capacity, **KW)
    rng = np.random.default_rng(4)
    capped = None
    for seq, batch in enumerate(batches, 1):
        lsn = wal.append(pack_batch("actor-a", seq, traj_bytes(batch, seq)))
        for i, ep in enumerate(batch):
            versions = ep.steps["policy_version"]
            if seq == len(batches) and capped is None and versions.max() > versions.min():
                ep = capped = dataclasses.replace(
                    ep, steps={**ep.steps, "policy_version": versions.clip(max=versions.min())}
                )
            replay.add(ep, oldest_version(ep), origin=(lsn, i))
        s = replay.sample(3, policy_version=seq)
        replay.update_priorities(s.indices, s.generations, *rng.random((3, 3)))
    assert capped is not None
    demo = make_episodes(1, seed=9)[0]  # stamped with the current version, as demonstrations are
    demo = dataclasses.replace(
        demo, steps={**demo.steps, "policy_version": np.full(demo.length, seq, np.int32)}
    )
    assert replay.add(demo, oldest_version(demo)) is not None  # no origin: it must be in the file
    return replay, demo, capped


@pytest.fixture
def log_and_buffer(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", "os", segment_bytes=20_000)
    list(wal.recover())
    episodes = make_episodes(18)
    replay, demo, capped = logged_buffer(wal, [episodes[i : i + 3] for i in range(0, 18, 3)])
    assert replay.counts["evicted_fifo"] > 0 and len(wal.segments()) > 2
    yield wal, replay, demo, capped
    wal.close()


def test_a_file_by_reference_restores_the_same_buffer_from_the_log(log_and_buffer, tmp_path):
    wal, replay, demo, capped = log_and_buffer
    by_value, by_reference = tmp_path / "value.replay", tmp_path / "reference.replay"
    value_bytes = save_replay(by_value, replay, CFG, MAX_STEPS)
    reference_bytes = save_replay(by_reference, replay, CFG, MAX_STEPS, by_reference=True)
    assert value_bytes == by_value.stat().st_size and reference_bytes == by_reference.stat().st_size
    assert reference_bytes < value_bytes / 3  # the state, and one demonstration's episode
    restored = PrioritizedReplay[protocol.Episode](replay.capacity, **KW)
    assert load_replay(by_reference, restored, CFG, logged=LoggedEpisodes(wal, validate)) == len(replay)
    items = restored.items()
    for a, b in zip(replay.items(), items, strict=True):
        assert_same_episode(a, b)
    assert (
        sum(
            ep.task == capped.task
            and ep.length == capped.length
            and np.array_equal(ep.steps["policy_version"], capped.steps["policy_version"])
            for ep in items
        )
        == 1
    )  # capped again
    assert_same_episode(items[-1], demo)
    np.testing.assert_array_equal(replay.tree._tree, restored.tree._tree)
    assert replay.stats() == restored.stats() and replay._free == restored._free
    np.testing.assert_array_equal(replay._origin, restored._origin)  # the next save references them too
    s1, s2 = replay.sample(4, policy_version=7), restored.sample(4, policy_version=7)
    assert s1.indices.tolist() == s2.indices.tolist() and s1.weights.tolist() == s2.weights.tolist()


def test_a_record_the_log_lost_is_refused_by_name(log_and_buffer, tmp_path):
    wal, replay, _, _ = log_and_buffer
    path = tmp_path / "reference.replay"
    save_replay(path, replay, CFG, MAX_STEPS, by_reference=True)
    target = PrioritizedReplay[protocol.Episode](replay.capacity, **KW)
    with pytest.raises(ValueError, match=r"references .* episodes in the write-ahead log, and no log"):
        load_replay(path, target, CFG)
    oldest = oldest_origin(replay)
    wal.prune(oldest + 1)  # the segment holding the oldest referenced record is gone
    with pytest.raises(ValueError, match=rf"{path}: .*record {oldest} is not in the log"):
        load_replay(path, target, CFG, logged=LoggedEpisodes(wal, validate))
    assert len(target) == 0


def test_saves_prune_the_log_below_what_the_newest_complete_checkpoint_needs(tmp_path):
    """A real session: one-episode batches go through the log into the replay (8 slots, so most are
    evicted), a save by reference after each on the helper thread: the replay holds records older than
    the previous checkpoint's log position. The log loses old segments, keeps every record the newest
    checkpoint references, and a restart has exactly the replay of that checkpoint."""
    args = ["--run-dir", str(tmp_path), "--ingest-port", "0", "--params-port", "0", "--local-actors", "0",
            "--env", "standin", "--checkpoint-every", "1", "--replay-capacity", "8", "--max-steps", str(MAX_STEPS),
            "--durability", "os", "--model.text-encoder", "none"]  # fmt: skip
    s = open_session(parse_args(args), Console(file=io.StringIO()))
    episodes = make_episodes(20, seed=2)
    wal, store = s.server.wal, s.server.settler.on_episodes
    wal.segment_bytes = 2_000  # about a record per segment
    try:
        for seq, ep in enumerate(episodes, 1):
            store([ep], wal.append(pack_batch("actor-a", seq, traj_bytes([ep], seq))))
            s.server.ledger.record("actor-a", seq)
            s.trainer.update += 1
            s.save()
        s.checkpoint_files.wait()
        assert s.checkpoint_files.stats["errors"] == 0 and s.checkpoint_files.stats["saves"] == 20
        first_kept = wal.segments()[0][0]
        assert wal.stats["pruned_segments"] > 0 and first_kept > 0
        assert first_kept <= oldest_origin(s.replay) < wal.next_lsn - 1  # older than the last position
        expected = s.replay.items()
        size = s.checkpointer.replay_path(20).stat().st_size
    finally:
        s.close("test")
    assert size < 10_000  # the state of 8 items: no episode is copied
    judged = judge(tmp_path / "checkpoints", [tmp_path / "wal"])  # the chaos soak's judge reads these files
    assert judged["judged"] and judged["excess_segments"] == judged["short"] == 0, judged
    again = open_session(parse_args(args), Console(file=io.StringIO()))
    try:
        for a, b in zip(expected, again.replay.items(), strict=True):
            assert_same_episode(a, b)
        assert len(again.replay) == len(expected) == 8
        # what the resumed checkpoint needs is fixed now, before training evicts its oldest items
        assert again.checkpoint_files.log_needed_from == oldest_origin(again.replay) <= again.saved_lsn
    finally:
        again.close("test")


def test_a_failed_write_keeps_the_log_for_the_previous_checkpoint():
    """A full disk during a save's files: counted and logged, the checkpoint stays incomplete, and the
    log is neither pruned by it nor later below what the previous complete checkpoint needs."""
    pruned, lines = [], []
    files = CheckpointFiles((0, 5), prune=pruned.append, complete=lambda update: True, log=lines.append)
    files.start(10, lambda: 123, needed_from=40)
    files.wait()
    assert (files.log_needed_from, pruned, files.stats["replay_bytes"]) == (40, [5], 123)

    def disk_full() -> int:
        raise OSError(28, "No space left on device")

    files.start(20, disk_full, needed_from=70)
    files.wait()
    assert files.stats["errors"] == 1 and "update 20 could not be saved" in lines[-1]
    assert (files.log_needed_from, pruned) == (40, [5])  # not pruned by the failed save
    files.start(30, lambda: 99, needed_from=90)
    files.wait()
    assert pruned == [5, 40] and files.log_needed_from == 90 and files.stats["saves"] == 2


def test_a_save_failed_on_one_process_keeps_every_log_what_the_fallback_needs(tmp_path):
    """Two learner processes saving into one checkpoint directory, each with its own log. Process 1's
    files of checkpoint 20 fail (a full disk): 20 is incomplete, so a restart resumes both from 10.
    Process 0 wrote its files of 20 and of 30: its log must still keep what its part of 10 needs (not
    what its part of 20 needs, which a rule of "one own save late" would prune to), and only once a newer
    checkpoint is complete on both processes may it move on."""
    checkpointer = Checkpointer(tmp_path / "checkpoints", processes=2)
    pruned: dict[int, list[int]] = {0: [], 1: []}
    files = {
        rank: CheckpointFiles((0, 0), pruned[rank].append, partial(complete, checkpointer), lambda line: None)
        for rank in (0, 1)
    }

    def save(update: int, rank: int, needed: int, disk_full: bool = False) -> None:
        def write() -> int:
            if disk_full:
                raise OSError(28, "No space left on device")
            checkpointer.save_delivery(update, {"update": update}, rank)
            return 1

        files[rank].start(update, write, needed)
        files[rank].wait()

    save(10, 0, needed=40)
    save(10, 1, needed=41)
    save(20, 0, needed=70)
    save(20, 1, needed=71, disk_full=True)
    save(30, 0, needed=90)  # the moment: its own files of 20 are complete, process 1's are not
    assert complete(checkpointer, 10) and not complete(checkpointer, 20)  # a restart resumes from 10
    assert pruned[0][-1] == 40 and files[0].log_needed_from == 40  # what its part of 10 needs
    assert files[1].stats["errors"] == 1 and pruned[1] == [] and files[1].log_needed_from == 41
    save(30, 1, needed=91)
    assert pruned[1] == [41] and complete(checkpointer, 30)
    save(40, 0, needed=120)
    assert pruned[0][-1] == 90 and files[0].log_needed_from == 90  # 30 is complete on both now
    checkpointer.close()
