"""Saved replay: a buffer restored from its state (or its file) continues exactly as the original would;
damaged or foreign files are refused by name and leave the target buffer empty."""

from __future__ import annotations

import dataclasses
import itertools
import re
import struct

import numpy as np
import pytest

from actors.envs.standin import StandInPhoneEnv
from common import protocol, trajectory_file, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from learner.replay import file as replay_file
from learner.replay.file import load_replay, save_replay
from learner.replay.prioritized import PrioritizedReplay, ReplaySample, oldest_version

CFG = ModelConfig()
MAX_STEPS = 6
KW = dict(alpha=0.7, beta_steps=10, max_policy_lag=3, seed=3)


def make_episodes(count: int, seed: int = 0) -> list[protocol.Episode]:
    """Episodes of 1..MAX_STEPS steps on real featurized stand-in screens; episode i's policy versions
    are in i // 2 + [0, 3)."""
    env, rng = StandInPhoneEnv(max_steps=MAX_STEPS), np.random.default_rng(seed)
    out = []
    for i in range(count):
        obs, _ = env.reset(seed=seed * 1000 + i)
        n = int(rng.integers(1, MAX_STEPS + 1))
        feats = featurize.stack([featurize.featurize(obs, CFG)] * (n + 1))
        steps = {k: np.zeros(n, np.dtype(dt)) for k, dt in protocol.STEP_ARRAYS.items()}
        steps["action_type"] = rng.integers(0, 3, n).astype(np.int32)
        steps["behavior_logp"] = -rng.random(n).astype(np.float32)
        steps["reward"][-1] = float(i % 2)
        steps["policy_version"] = np.sort(i // 2 + rng.integers(0, 3, n)).astype(np.int32)
        out.append(protocol.Episode(env.task.family, bool(i % 2), not i % 2, feats, steps))
    return out


def churn(replay: PrioritizedReplay, items: list, rng: np.random.Generator, version: int) -> list:
    """A mix of every operation (sample, priority updates, adds past capacity, stale drops); returns what
    each one gave back, to compare two buffers driven alike."""
    log = []
    for item in items:
        log.append(
            replay.add(item, oldest_version(item) if isinstance(item, protocol.Episode) else version - 2)
        )
        s = replay.sample(4, policy_version=version)
        log.append(sample_view(s))
        terms = rng.random((3, 4))
        log.append(replay.update_priorities(s.indices, s.generations, *terms))
        version += 1
    log.append(replay.stats())
    return log


def sample_view(s: ReplaySample) -> tuple:
    items = [id(x) if isinstance(x, protocol.Episode) else x for x in s.items]
    return items, s.indices.tolist(), s.generations.tolist(), s.weights.tolist(), s.probs.tolist(), s.beta


def filled(capacity: int = 6) -> PrioritizedReplay[int]:
    """A buffer past its capacity with evictions, updated priorities, stale drops and samples behind it."""
    replay = PrioritizedReplay[int](capacity, **KW)
    rng = np.random.default_rng(1)
    for i in range(3 * capacity):
        version = i // 2 if i % 4 else max(i // 2 - 3, 0)  # some fall behind while stored
        s = replay.sample(3, policy_version=i // 2) if i % 3 == 2 else None
        replay.add(i, version)
        replay.add(100 + i, i // 2)  # full by now: evicts, perhaps an item sampled above
        if s is not None:
            replay.update_priorities(s.indices, s.generations, *rng.random((3, 3)))
    for item, version in ((50, 12), (51, 9), (52, 12), (53, 12)):
        replay.add(item, version)
    replay.sample(3, policy_version=14)  # cutoff 11: drops 51 (between live items) and all older
    assert replay.counts["evicted_fifo"] and replay.counts["dropped_stale"] and replay.counts["stale_updates"]
    assert replay.items() == [50, 52, 53] and len(replay._order) > len(replay)
    return replay


def assert_same_internals(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    np.testing.assert_array_equal(a.tree._tree, b.tree._tree)
    np.testing.assert_array_equal(a.priorities, b.priorities)
    np.testing.assert_array_equal(a.generations, b.generations)
    np.testing.assert_array_equal(a.live, b.live)
    assert a._free == b._free and a.items() == b.items() and a.stats() == b.stats()
    assert a._cutoff == b._cutoff and a._rng.bit_generator.state == b._rng.bit_generator.state


# ---- state dict ------------------------------------------------------------------------------------------
def test_restored_state_continues_exactly_like_the_original():
    original = filled()
    items, state = original.state_dict()
    assert items == original.items()
    restored = PrioritizedReplay[int](original.capacity, **KW)
    restored.load_state_dict(items, state)
    assert_same_internals(original, restored)
    new_items = list(range(100, 115))
    want = churn(original, new_items, np.random.default_rng(2), version=15)
    got = churn(restored, new_items, np.random.default_rng(2), version=15)
    assert got == want
    assert_same_internals(original, restored)


def test_state_of_an_empty_buffer_round_trips():
    items, state = PrioritizedReplay[int](4, **KW).state_dict()
    restored = PrioritizedReplay[int](4, **KW)
    restored.load_state_dict(items, state)
    assert len(restored) == 0 and restored.add(7, 0) == 0


def test_other_alpha_recomputes_the_tree_and_other_lag_resets_the_cutoff():
    original = filled()
    restored = PrioritizedReplay[int](original.capacity, **{**KW, "alpha": 1.0, "max_policy_lag": 5})
    restored.load_state_dict(*original.state_dict())
    live = restored.live
    np.testing.assert_allclose(restored.tree.leaves[live], restored.priorities[live])
    assert restored.tree.total == pytest.approx(restored.priorities.sum())
    assert restored._cutoff == -np.inf and original._cutoff > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(capacity=7), "capacity"),
        (lambda s: s.update(slots=s["slots"][::-1].copy() * 0), "cover each slot once"),
        (lambda s: s.update(priorities=-s["priorities"]), "finite and >= 0"),
        (lambda s: s.update(generations=s["generations"][:-1]), "generations"),
        (lambda s: s.update(rng='{"bit_generator": "MT19937"}'), "rng"),
        (lambda s: s["counts"].pop("added"), "counts"),
        (lambda s: s.update(max_priority=float("nan")), "max_priority"),
    ],
)
def test_bad_state_is_refused_without_changing_the_buffer(change, message):
    items, state = filled().state_dict()
    change(state)
    target = PrioritizedReplay[int](6, **KW)
    before = target.state_dict()
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(items, state)
    assert_state_equal(target.state_dict(), before)


def assert_state_equal(a: tuple[list, dict], b: tuple[list, dict]) -> None:
    assert a[0] == b[0] and a[1].keys() == b[1].keys()
    for k, v in a[1].items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, b[1][k], err_msg=k)
        else:
            assert v == b[1][k], k


# ---- files -----------------------------------------------------------------------------------------------
def episode_buffer(
    episodes: list[protocol.Episode], capacity: int = 8
) -> PrioritizedReplay[protocol.Episode]:
    replay = PrioritizedReplay[protocol.Episode](capacity, **KW)
    rng = np.random.default_rng(4)
    for j, ep in enumerate(episodes):
        replay.add(ep, oldest_version(ep))
        s = replay.sample(3, policy_version=j // 2)
        replay.update_priorities(s.indices, s.generations, *rng.random((3, 3)))
    return replay


def assert_same_episode(a: protocol.Episode, b: protocol.Episode) -> None:
    assert (a.task, a.success, a.truncated) == (b.task, b.success, b.truncated)
    for k in a.obs:
        np.testing.assert_array_equal(a.obs[k], b.obs[k], err_msg=k)
    for k in a.steps:
        np.testing.assert_array_equal(a.steps[k], b.steps[k], err_msg=k)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A file of a buffer that evicted, dropped stale episodes and updated priorities, and that buffer."""
    path = tmp_path_factory.mktemp("replay") / "r.replay"
    replay = episode_buffer(make_episodes(14))
    assert replay.counts["evicted_fifo"] and replay.counts["dropped_stale"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_file, "EPISODES_PER_MESSAGE", 3)  # several TRAJ records
        save_replay(path, replay, CFG, MAX_STEPS)
    return path, replay


def test_file_round_trip_restores_episodes_and_state(saved):
    path, original = saved
    restored = PrioritizedReplay[protocol.Episode](original.capacity, **KW)
    assert load_replay(path, restored, CFG) == len(original) > 0
    for a, b in zip(original.items(), restored.items(), strict=True):
        assert_same_episode(a, b)
    np.testing.assert_array_equal(original.tree._tree, restored.tree._tree)
    np.testing.assert_array_equal(original.generations, restored.generations)
    assert original.stats() == restored.stats() and original._free == restored._free
    assert not path.with_name(path.name + ".tmp").exists()
    # both continue alike: same slots, weights and probabilities; the items are equal episodes
    fresh = make_episodes(5, seed=1)
    original_copy = PrioritizedReplay[protocol.Episode](original.capacity, **KW)
    original_copy.load_state_dict(*original.state_dict())  # leave the module fixture as it was
    for ep in fresh:
        assert original_copy.add(ep, oldest_version(ep)) == restored.add(ep, oldest_version(ep))
        a, b = original_copy.sample(4, policy_version=10), restored.sample(4, policy_version=10)
        assert sample_view(a)[1:] == sample_view(b)[1:]
        for x, y in zip(a.items, b.items, strict=True):
            assert_same_episode(x, y)


def test_saving_replaces_the_file_atomically(saved, tmp_path, monkeypatch):
    """A save that fails midway leaves the previous file as it was and no temporary behind."""
    path = tmp_path / "r.replay"
    save_replay(path, PrioritizedReplay[protocol.Episode](8, **KW), CFG, MAX_STEPS)
    previous = path.read_bytes()
    calls = []

    def failing_write(f, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError("disk full")
        trajectory_file.write_record(f, data)

    monkeypatch.setattr(replay_file, "write_record", failing_write)
    with pytest.raises(OSError, match="disk full"):
        save_replay(path, saved[1], CFG, MAX_STEPS)
    assert path.read_bytes() == previous and list(tmp_path.iterdir()) == [path]
    monkeypatch.undo()
    save_replay(path, saved[1], CFG, MAX_STEPS)
    assert load_replay(path, PrioritizedReplay[protocol.Episode](8, **KW), CFG) == len(saved[1])
    assert list(tmp_path.iterdir()) == [path]


def record_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    return offsets


def test_truncated_files_are_refused_and_leave_the_buffer_empty(saved, tmp_path):
    data = saved[0].read_bytes()
    starts = record_offsets(data)
    assert len(starts) == 5  # header, 3 TRAJ, state
    cuts = {
        0,
        3,
        10,
        starts[1],
        starts[1] + 2,
        starts[1] + 500,
        starts[2],
        starts[-1],
        starts[-1] + 50,
        len(data) - 1,
    }
    for cut in sorted(cuts):
        path = tmp_path / f"cut{cut}.replay"
        path.write_bytes(data[:cut])
        assert_refused(path, "truncated|not a replay file|cut short")


def assert_refused(path, reason: str, model: ModelConfig = CFG, capacity: int = 8) -> None:
    replay = PrioritizedReplay[protocol.Episode](capacity, **KW)
    before = replay.state_dict()
    with pytest.raises(ValueError, match=re.escape(str(path))) as info:
        load_replay(path, replay, model)
    assert re.search(reason, str(info.value)), str(info.value)
    assert len(replay) == 0
    assert_state_equal(replay.state_dict(), before)


def test_foreign_files_are_refused_by_name(saved, tmp_path):
    demos = tmp_path / "demos.msgpack"
    with demos.open("wb") as f:
        header = protocol.message("DEMOS", model=CFG.to_dict(), max_steps=MAX_STEPS)
        trajectory_file.write_record(f, wire.encode(header))
    assert_refused(demos, "not a replay file .*'DEMOS'")
    garbage = tmp_path / "garbage.replay"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_refused(garbage, "not a replay file")
    small = tmp_path / "small.replay"
    small.write_bytes(struct.pack("<I", 3) + b"\xc1\xc1\xc1")
    assert_refused(small, "not a replay file")
    empty = tmp_path / "empty.replay"
    empty.write_bytes(b"")
    assert_refused(empty, "not a replay file")
    assert_refused(saved[0], "recorded for model", model=dataclasses.replace(CFG, d_model=32))
    assert_refused(saved[0], "capacity", capacity=9)
    with pytest.raises(ValueError, match="not a demos file"):
        trajectory_file.load_episodes(saved[0], CFG)
    missing = tmp_path / "missing.replay"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_replay(missing, PrioritizedReplay[protocol.Episode](8), CFG)


def test_damaged_episode_is_refused_by_name(saved, tmp_path):
    """A TRAJ record whose episode fails validation (here a version newer than the header allows)."""
    data = saved[0].read_bytes()
    starts = record_offsets(data)
    header = wire.decode(data[starts[0] + 4 : starts[1]])
    header["newest_version"] = 0
    encoded = wire.encode(header)
    path = tmp_path / "newer.replay"
    path.write_bytes(struct.pack("<I", len(encoded)) + encoded + data[starts[1] :])
    assert_refused(path, "record 1: future_version")


def as_version_2(data: bytes) -> bytes:
    """The file as the learner wrote it before protocol version 3: format 1, each TRAJ a list of episode
    maps of array ext values (what `episode_fields` gives, encoded as it is) under `v` 2."""
    starts = [*record_offsets(data), len(data)]
    records = [data[a + 4 : b] for a, b in itertools.pairwise(starts)]
    out = []
    for i, record in enumerate(records):
        msg = wire.decode(record)
        if msg["kind"] == protocol.TRAJ:
            episodes = protocol.validate_episodes(
                msg, featurize.episode_spec(CFG, text_vocab_size=0), MAX_STEPS, 10**6
            )
            fields = [
                protocol.episode_fields(e.task, e.success, e.truncated, e.obs, e.steps) for e in episodes
            ]
            msg = {**msg, "episodes": fields}
        msg = {**msg, "v": 2, **({"format": 1} if i in (0, len(records) - 1) else {})}
        encoded = wire.encode(msg)
        out.append(struct.pack("<I", len(encoded)) + encoded)
    return b"".join(out)


def test_files_of_protocol_version_2_still_load(saved, tmp_path):
    """Replay files of format 1 and demonstration files written before TRAJ episodes were packed."""
    path = tmp_path / "old.replay"
    path.write_bytes(as_version_2(saved[0].read_bytes()))
    assert b"\xc7" in path.read_bytes()  # array ext values: the old encoding indeed
    restored = PrioritizedReplay[protocol.Episode](saved[1].capacity, **KW)
    assert load_replay(path, restored, CFG) == len(saved[1])
    for a, b in zip(saved[1].items(), restored.items(), strict=True):
        assert_same_episode(a, b)
    demos = tmp_path / "old_demos.msgpack"
    with demos.open("wb") as f:
        trajectory_file.write_record(
            f, wire.encode({"v": 2, "kind": "DEMOS", "model": CFG.to_dict(), "max_steps": MAX_STEPS})
        )
        demo_episodes = [  # demonstrations: version 0
            dataclasses.replace(e, steps={**e.steps, "policy_version": 0 * e.steps["policy_version"]})
            for e in saved[1].items()
        ]
        fields = [
            protocol.episode_fields(e.task, e.success, e.truncated, e.obs, e.steps) for e in demo_episodes
        ]
        trajectory_file.write_record(
            f, wire.encode({"v": 2, "kind": "TRAJ", "actor_id": 0, "seq": 1, "episodes": fields})
        )
    for a, b in zip(demo_episodes, trajectory_file.load_episodes(demos, CFG), strict=True):
        assert_same_episode(a, b)
    broken = tmp_path / "broken_old.replay"
    old = as_version_2(saved[0].read_bytes())
    broken.write_bytes(old.replace(b"\xa7success\xc3", b"\xa7success\x01", 1))  # an int, not a bool
    assert_refused(broken, "record 1: bad_field")


def test_files_of_protocol_version_3_still_load(saved, tmp_path):
    """A format 2 replay file (TRAJ records of protocol version 3: packed, one value per step) loads as
    written today; a format this learner does not know is refused."""
    data = saved[0].read_bytes()
    starts = [*record_offsets(data), len(data)]
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(starts)):
        msg = wire.decode(data[a + 4 : b])
        assert msg.get("format", replay_file.FORMAT) == replay_file.FORMAT and msg["v"] == 4
        encoded = wire.encode({**msg, "v": 3, **({"format": 2} if i in (0, len(starts) - 2) else {})})
        out.append(struct.pack("<I", len(encoded)) + encoded)
    path = tmp_path / "v3.replay"
    path.write_bytes(b"".join(out))
    restored = PrioritizedReplay[protocol.Episode](saved[1].capacity, **KW)
    assert load_replay(path, restored, CFG) == len(saved[1])
    for a, b in zip(saved[1].items(), restored.items(), strict=True):
        assert_same_episode(a, b)


def test_max_steps_limits_the_episodes_loaded(saved):
    longest = max(ep.length for ep in saved[1].items())
    replay = PrioritizedReplay[protocol.Episode](8, **KW)
    with pytest.raises(ValueError, match=f"allowed 1 to {longest - 1}"):
        load_replay(saved[0], replay, CFG, max_steps=longest - 1)
    assert len(replay) == 0
    assert load_replay(saved[0], replay, CFG, max_steps=longest) == len(saved[1])


def test_saving_refuses_what_could_not_be_loaded(tmp_path):
    replay = PrioritizedReplay[protocol.Episode](4)
    replay.add(make_episodes(1)[0], 0)
    with pytest.raises(ValueError, match="exceeds max_steps"):
        save_replay(tmp_path / "r.replay", replay, CFG, max_steps=0)
    ints = PrioritizedReplay[int](4)
    ints.add(1, 0)
    with pytest.raises(TypeError, match="Episodes"):
        save_replay(tmp_path / "r.replay", ints, CFG, MAX_STEPS)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())
