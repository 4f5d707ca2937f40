"""Per-step arrays with a row shape (protocol version 4): a toy family whose every step carries A token ids,
their count and the behaviour policy's A per-token log-probs goes from the actor's builder over the wire,
through validation, into a padded Batch, a replay file and the write-ahead log, shapes and bits intact;
hostile TRAJs are refused with the right code, naming the episode."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from common import protocol, trajectory_file, wire
from common.config import ModelConfig
from common.episode import EpisodeBuilder
from common.types import Action, ActionType
from learner.batch import Batch, collate, example_batch
from learner.ingest.delivery import DeliveryLedger
from learner.ingest.settler import BatchSettler
from learner.ingest.wal import WriteAheadLog, pack_batch
from learner.replay import file as replay_file
from learner.replay.prioritized import PrioritizedReplay

A, P, VOCAB, MAX_STEPS = 5, 7, 50, 6
SPEC = protocol.EpisodeSpec(
    observations={"prompt_ids": ((P,), "<i4"), "prompt_length": ((), "<i4")},
    choices={"action_tokens": ("<i4", VOCAB), "action_length": ("<i4", A + 1)},
    id_ranges={"prompt_ids": (0, VOCAB)},
    choice_shapes={"action_tokens": (A,)},
    step_logps={"token_logp": (A,)},
)
SHAPED = ("action_tokens", "token_logp")


def act(rng: np.random.Generator) -> dict:
    """One step's choice as a family's act gives it to the actor: Python ints and lists (PolicyRunner.act
    does `np.asarray(v).tolist()`), the token log-probs inside the choice dict, zeros past the length."""
    n = int(rng.integers(1, A + 1))
    tokens = np.zeros(A, np.int32)
    tokens[:n] = rng.integers(1, VOCAB, n)
    logp = np.zeros(A, np.float32)
    logp[:n] = -rng.random(n).astype(np.float32) * 3
    return {"action_tokens": tokens.tolist(), "action_length": n, "token_logp": logp.tolist()}


def features(rng: np.random.Generator) -> dict[str, np.ndarray]:
    length = int(rng.integers(1, P + 1))
    ids = np.zeros(P, np.int32)
    ids[P - length :] = rng.integers(1, VOCAB, length)  # left-padded
    return {"prompt_ids": ids, "prompt_length": np.int32(length)}


def build(rng: np.random.Generator, steps: int, version: int = 0) -> tuple[dict, list[dict]]:
    """An episode built as the actor builds it (EpisodeBuilder + the spec), and the choices it was given."""
    builder, choices = EpisodeBuilder("toy"), []
    for _ in range(steps):
        choice = act(rng)
        choices.append(choice)
        logp = float(np.float32(sum(choice["token_logp"])))
        builder.add(features(rng), choice, logp, float(rng.random()), version, Action(ActionType.PRESS_BACK))
    return builder.finish(features(rng), bool(steps % 2), not steps % 2, SPEC), choices


def episodes_fields(seed: int, lengths=(3, 1, MAX_STEPS, 2)) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [build(rng, n, version=i)[0] for i, n in enumerate(lengths)]


def over_the_wire(fields: list[dict], newest: int = 10) -> list[protocol.Episode]:
    """What the learner makes of a TRAJ of these episodes: encoded, parsed, validated."""
    raw = wire.encode(protocol.Traj(1, 1, fields).to_msg())
    return protocol.Traj.from_msg(protocol.parse(raw)).validate(SPEC, MAX_STEPS, newest)


def assert_bit_exact(a: np.ndarray, b: np.ndarray) -> None:
    assert (a.dtype.str, a.shape, a.tobytes()) == (b.dtype.str, b.shape, b.tobytes())


def assert_same_episode(got: protocol.Episode, want: dict | protocol.Episode) -> None:
    want = want.wire_fields() if isinstance(want, protocol.Episode) else want
    assert (got.task, got.success, got.truncated) == (want["task"], want["success"], want["truncated"])
    assert list(got.steps) == list(SPEC.step_arrays())
    for name in SPEC.step_arrays():
        assert_bit_exact(got.steps[name], want[name])
    assert set(got.obs) == set(want["obs"])
    for key, arr in want["obs"].items():
        assert_bit_exact(got.obs[key], arr)


# ---- the spec ----------------------------------------------------------------------------------------
def test_the_spec_lists_every_per_step_array_with_its_row_shape_in_wire_order():
    assert SPEC.step_arrays() == {
        "action_tokens": "<i4", "action_length": "<i4", "token_logp": "<f4", **protocol.BASE_STEP_ARRAYS,
    }  # fmt: skip
    assert list(SPEC.step_shapes()) == list(SPEC.step_arrays())
    assert SPEC.step_shapes()["action_tokens"] == ((A,), "<i4")
    assert SPEC.step_shapes()["action_length"] == ((), "<i4")
    assert SPEC.step_shapes()["token_logp"] == ((A,), "<f4")
    assert all(SPEC.step_shapes()[name] == ((), dt) for name, dt in protocol.BASE_STEP_ARRAYS.items())
    assert SPEC.choice_arrays() == {
        k: v for k, v in SPEC.step_shapes().items() if k not in protocol.BASE_STEP_ARRAYS
    }


@pytest.mark.parametrize(
    "change",
    [
        {"step_logps": {"reward": (A,)}},  # a reserved name
        {"step_logps": {"action_length": (A,)}},  # a choice's name
        {"step_logps": {"value": (A,)}},  # an estimate's name
        {"choice_shapes": {"token_logp": (A,)}},  # not a choice
        {"choice_shapes": {"action_tokens": (0,)}},
        {"choice_shapes": {"action_tokens": [A]}},  # a list, not a tuple
        {"step_logps": {"token_logp": (A, True)}},
        {"step_logps": {"token_logp": (2.0,)}},
    ],
)
def test_the_spec_refuses_clashing_names_and_bad_row_shapes(change):
    fields = {
        "observations": SPEC.observations, "choices": SPEC.choices, "id_ranges": SPEC.id_ranges,
        "choice_shapes": SPEC.choice_shapes, "step_logps": SPEC.step_logps, **change,
    }  # fmt: skip
    with pytest.raises(ValueError):
        protocol.EpisodeSpec(**fields)


# ---- the sender ----------------------------------------------------------------------------------------
def test_the_builder_stacks_per_step_rows_in_the_specs_dtypes():
    ep, choices = build(np.random.default_rng(1), 4)
    want_tokens = np.array([c["action_tokens"] for c in choices], np.int32)  # reference: stack by hand
    want_logp = np.array([[np.float32(x) for x in c["token_logp"]] for c in choices], np.float32)
    assert_bit_exact(ep["action_tokens"], want_tokens)
    assert_bit_exact(ep["token_logp"], want_logp)
    assert_bit_exact(ep["action_length"], np.array([c["action_length"] for c in choices], np.int32))
    assert list(ep)[4:] == list(SPEC.step_arrays())  # after task, success, truncated, obs


def test_episode_fields_refuses_rows_of_another_shape():
    ep = episodes_fields(2, (2,))[0]
    steps = {name: ep[name] for name in SPEC.step_arrays()}
    for name, wrong, shape in (
        ("token_logp", ep["token_logp"][:, :4], "(4,)"),
        ("action_length", ep["action_tokens"], "(5,)"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"'{name}' has rows of shape {shape}")):
            protocol.episode_fields("toy", True, False, ep["obs"], {**steps, name: wrong}, spec=SPEC)


# ---- over the wire -------------------------------------------------------------------------------------
def test_shaped_episodes_cross_the_wire_unchanged():
    fields = episodes_fields(3)
    got = over_the_wire(fields)
    assert [ep.length for ep in got] == [3, 1, MAX_STEPS, 2]
    for ep, want in zip(got, fields, strict=True):
        assert_same_episode(ep, want)
        assert ep.steps["action_tokens"].shape == (ep.length, A)


def _set(field: str, episode: int, index: tuple, value) -> callable:
    def mutate(fields: list[dict]) -> None:
        fields[episode][field][index] = value

    return mutate


def _every(change) -> callable:
    def mutate(fields: list[dict]) -> None:
        for ep in fields:
            change(ep)

    return mutate


HOSTILE = {
    "a row of another shape": (
        _every(lambda ep: ep.update(action_tokens=np.zeros((len(ep["reward"]), A + 1), np.int32))),
        "bad_array",
        r"TRAJ action_tokens has shape \(12, 6\), expected \(12, 5\)",
    ),
    "a scalar where rows belong": (
        _every(lambda ep: ep.update(token_logp=ep["token_logp"][:, 0].copy())),
        "bad_array",
        r"TRAJ token_logp has shape \(12,\), expected \(12, 5\)",
    ),
    "token ids of another dtype": (
        _every(lambda ep: ep.update(action_tokens=ep["action_tokens"].astype(np.int64))),
        "bad_array",
        "TRAJ action_tokens has dtype <i8, expected <i4",
    ),
    "log-probs of another dtype": (
        _every(lambda ep: ep.update(token_logp=ep["token_logp"].astype(np.float64))),
        "bad_array",
        "TRAJ token_logp has dtype <f8, expected <f4",
    ),
    "a token id at its bound": (
        _set("action_tokens", 2, (4, 3), VOCAB),
        "bad_array",
        r"episode 2 action_tokens outside \[0, 50\)",
    ),
    "a negative token id": (
        _set("action_tokens", 3, (1, 0), -1),
        "bad_array",
        r"episode 3 action_tokens outside \[0, 50\)",
    ),
    "a length past A": (
        _set("action_length", 1, (0,), A + 1),
        "bad_array",
        r"episode 1 action_length outside",
    ),
    "a NaN token log-prob": (
        _set("token_logp", 2, (5, 4), np.nan),
        "non_finite",
        "episode 2 token_logp has NaN",
    ),
    "an infinite token log-prob": (
        _set("token_logp", 0, (0, 0), -np.inf),
        "non_finite",
        "episode 0 token_logp has NaN or infinity",
    ),
    "a positive token log-prob": (
        _set("token_logp", 3, (1, 2), 0.5),
        "bad_array",
        "episode 3 token_logp must be <= 0",
    ),
    "no token log-probs": (
        _every(lambda ep: ep.pop("token_logp")),
        "bad_field",
        "TRAJ episodes need array 'token_logp'",
    ),
    "no token ids": (
        _every(lambda ep: ep.pop("action_tokens")),
        "bad_field",
        "TRAJ episodes need array 'action_tokens'",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_shaped_arrays_are_refused_naming_the_episode(case):
    mutate, code, reason = HOSTILE[case]
    fields = episodes_fields(4)
    mutate(fields)
    with pytest.raises(protocol.ProtocolError) as err:
        over_the_wire(fields)
    assert err.value.code == code
    assert re.search(reason, err.value.reason), err.value.reason


def test_a_rounding_size_positive_log_prob_is_tolerated():
    fields = episodes_fields(5)
    fields[1]["token_logp"][0, 0] = 1e-3
    assert len(over_the_wire(fields)) == 4


def test_random_damage_to_a_shaped_array_is_a_protocol_error_or_valid():
    """Any dtype, shape or values in place of one shaped array: refused with a ProtocolError (never
    another exception) unless it is a valid array of the spec."""
    rng = np.random.default_rng(6)
    codes = Counter()
    for _ in range(150):
        fields = episodes_fields(7)
        name = str(rng.choice([*SPEC.step_arrays()]))
        dtype = rng.choice(["<i4", "<f4", "<i8", "|b1", "<u1"])
        shape = (12, *rng.integers(0, 7, int(rng.integers(0, 3))))  # 12: the episodes' steps
        values = rng.integers(-60, 60, shape).astype(dtype)
        start = 0
        for ep in fields:
            n = len(ep["reward"])
            ep[name] = values[start : start + n]
            start += n
        try:
            over_the_wire(fields)
            codes["valid"] += 1
        except protocol.ProtocolError as e:
            codes[e.code] += 1
    assert set(codes) <= {"valid", "bad_array", "non_finite", "future_version"}
    assert codes["bad_array"] > 100, codes


def test_a_version_3_hello_gets_bad_version():
    hello = {"v": 3, "kind": "HELLO", "actor": "a", "num_envs": 1, "instance": "i", "first_unacked": 1}
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.parse(wire.encode(hello))
    assert err.value.code == "bad_version"
    assert protocol.PROTOCOL_VERSION == 4
    assert protocol.Hello.from_msg(protocol.parse(wire.encode({**hello, "v": 4}))).actor == "a"


# ---- the batch -----------------------------------------------------------------------------------------
def slow_collate_steps(episodes: list[protocol.Episode], max_steps: int) -> dict[str, np.ndarray]:
    """Reference: each per-step array [B, T, *row], element by element, zeros past each length."""
    out = {}
    for name, (shape, dtype) in SPEC.step_shapes().items():
        arr = np.zeros((len(episodes), max_steps, *shape), np.dtype(dtype))
        for b, ep in enumerate(episodes):
            for t in range(ep.length):
                for idx in np.ndindex(*shape):
                    arr[(b, t, *idx)] = ep.steps[name][(t, *idx)]
        out[name] = arr
    return out


def test_collate_pads_shaped_steps_to_b_t_row_with_zeros():
    episodes = over_the_wire(episodes_fields(8))
    batch = collate(episodes, MAX_STEPS + 2)
    want = slow_collate_steps(episodes, MAX_STEPS + 2)
    assert list(batch.choice) == [*SPEC.choice_arrays()]  # the choices and the step log-probs, not the base
    for name, arr in want.items():
        got = batch.choice.get(name, getattr(batch, name, None))
        assert_bit_exact(got, arr)
    assert batch.choice["action_tokens"].shape == (4, MAX_STEPS + 2, A)
    assert not batch.choice["token_logp"][1, 1:].any()  # episode 1 has one step


def _shapes(batch: Batch) -> dict[str, tuple]:
    out = {}
    for field in Batch._fields:
        value = getattr(batch, field)
        items = value.items() if isinstance(value, dict) else [("", value)]
        out.update(
            {f"{field}/{k}": (np.shape(v), np.asarray(v).dtype.str) for k, v in items if v is not None}
        )
    return out


def test_example_batch_has_the_shapes_and_dtypes_of_collate():
    episodes = over_the_wire(episodes_fields(9))
    feature_spec = {name: shape for name, shape in SPEC.observations.items()}
    example = example_batch(feature_spec, len(episodes), MAX_STEPS, choices=SPEC.choice_arrays())
    assert _shapes(example) == _shapes(collate(episodes, MAX_STEPS))
    assert example.choice["token_logp"].shape == (4, MAX_STEPS, A)


# ---- storage -------------------------------------------------------------------------------------------
def test_a_replay_file_keeps_shaped_steps_bit_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(replay_file, "episode_spec", lambda model: SPEC)  # the toy family's spec
    episodes = over_the_wire(episodes_fields(10))
    replay = PrioritizedReplay[protocol.Episode](8, seed=1)
    for ep in episodes:
        replay.add(ep, 0)
    path = tmp_path / "toy.replay"
    replay_file.save_replay(path, replay, ModelConfig(), MAX_STEPS)
    restored = PrioritizedReplay[protocol.Episode](8, seed=1)
    assert replay_file.load_replay(path, restored, ModelConfig()) == len(episodes)
    for got, want in zip(restored.items(), episodes, strict=True):
        assert_same_episode(got, want)


def _settler(wal: WriteAheadLog, stored: list) -> BatchSettler:
    return BatchSettler(
        DeliveryLedger(8),
        wal,
        lambda eps, _record: stored.extend(eps),
        None,
        lambda: True,
        print,
    )


def test_the_write_ahead_log_recovers_shaped_steps_bit_exact_also_from_version_3(tmp_path):
    fields = episodes_fields(11)
    v4 = wire.encode(protocol.Traj(1, 1, fields[:2]).to_msg())
    v3 = wire.encode({**protocol.Traj(1, 2, fields[2:]).to_msg(), "v": 3})  # logged by the older learner
    wal = WriteAheadLog(tmp_path / "wal", "os")
    list(wal.recover())
    for seq, raw in ((1, v4), (2, v3)):
        wal.append(pack_batch("actor-a", seq, raw))
    wal.close()
    stored: list[protocol.Episode] = []
    counts = _settler(WriteAheadLog(tmp_path / "wal", "os"), stored).recover(
        0, 10, lambda traj, newest: traj.validate(SPEC, MAX_STEPS, newest)
    )
    assert counts == Counter(batches=2, episodes=4), counts
    for got, want in zip(stored, fields, strict=True):
        assert_same_episode(got, want)


def test_version_3_and_2_trajectory_records_are_read_as_version_4():
    fields = episodes_fields(12)
    msg = protocol.Traj(0, 1, fields).to_msg()
    v2 = {**msg, "v": 2, "episodes": fields}  # a list of episode maps of array ext values
    for record in ({**msg, "v": 3}, msg, v2):
        parsed = trajectory_file.parse_record(wire.encode(record))
        assert parsed["v"] == protocol.PROTOCOL_VERSION
        for got, want in zip(protocol.validate_episodes(parsed, SPEC, MAX_STEPS, 10), fields, strict=True):
            assert_same_episode(got, want)
    with pytest.raises(protocol.ProtocolError, match="bad_version"):
        trajectory_file.parse_record(wire.encode({**msg, "v": 5}))
