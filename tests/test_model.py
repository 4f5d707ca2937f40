"""common.policies.pointer.network (shapes, masking, parameter snapshots) and actors.policy_runner."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from actors.policy_runner import PolicyRunner
from common import protocol
from common.config import ModelConfig
from common.params_file import flat_to_params, params_to_flat
from common.policies import PointerPolicy
from common.policies.pointer import distribution, featurize
from common.policies.pointer import network as model
from common.types import Action, ActionType, Observation, PolicyChoice, SwipeDirection, UIElement

CFG = ModelConfig(
    vocab_size=97,
    max_instruction_tokens=5,
    max_elements=4,
    max_element_tokens=3,
    d_model=16,
    num_heads=2,
    num_layers=2,
    mlp_dim=32,
)
SPEC = featurize.feature_spec(CFG)
EPISODE_SPEC = featurize.episode_spec(CFG, text_vocab_size=0)
N = 6  # rows per forward pass; [N] and [2, 3] leading axes
HEADS = {"type": 7, "element": CFG.max_elements, "word": CFG.max_instruction_tokens, "direction": 4}


@pytest.fixture(scope="module")
def net():
    graphdef, params = model.create(CFG, 0)
    return graphdef, params, jax.jit(lambda p, f: model.apply(graphdef, p, f))


def random_features(seed: int, lead: tuple[int, ...] = (N,)) -> dict[str, np.ndarray]:
    """Features with random masks; row 1 has no valid element and row 2 no valid word."""
    rng = np.random.default_rng(seed)
    f = {}
    for name, (shape, dtype) in SPEC.items():
        full = (*lead, *shape)
        if name.endswith("tokens"):
            f[name] = rng.integers(0, CFG.vocab_size, full).astype(dtype)
        elif name.endswith("mask"):
            f[name] = rng.random(full) < 0.6
        else:
            f[name] = rng.random(full).astype(dtype)
    flat_e, flat_i = (
        f["elem_mask"].reshape(-1, CFG.max_elements),
        f["instr_mask"].reshape(-1, CFG.max_instruction_tokens),
    )
    flat_e[0], flat_i[0] = True, True
    flat_e[1], flat_i[2] = False, False
    return f


def to_np(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def test_shapes_for_batch_and_time_axes(net):
    _, params, apply = net
    f = random_features(0)
    logits, value = to_np(apply(params, f))
    assert value.shape == (N,) and value.dtype == np.float32
    for head, size in HEADS.items():
        assert logits[head].shape == (N, size) and logits[head].dtype == np.float32, head
    bt = {k: v.reshape(2, 3, *v.shape[1:]) for k, v in f.items()}
    logits_bt, value_bt = to_np(apply(params, bt))
    assert value_bt.shape == (2, 3)
    for head, size in HEADS.items():
        assert logits_bt[head].shape == (2, 3, size)
        # [B, T] is the same computation as [B * T]: rows line up after the reshape
        np.testing.assert_allclose(logits_bt[head].reshape(N, size), logits[head], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value_bt.reshape(N), value, rtol=1e-5, atol=1e-5)
    assert np.isfinite(value).all() and all(np.isfinite(v).all() for v in logits.values())


def test_masked_slots_get_no_probability(net):
    _, params, apply = net
    f = random_features(1)
    logits, _ = to_np(apply(params, f))
    for head, mask_name in (("element", "elem_mask"), ("word", "instr_mask")):
        mask = f[mask_name].copy()
        empty = ~mask.any(-1)
        assert empty.any() and (~mask[~empty]).any()  # both cases are exercised
        mask[empty, 0] = True  # an all-invalid row keeps slot 0 so the softmax stays defined
        probs = np.asarray(jax.nn.softmax(logits[head]))
        assert (probs[~mask] < 1e-30).all(), head
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
        np.testing.assert_array_equal(probs[empty, 0], 1.0)
        assert (np.abs(logits[head][mask]) < 1e3).all()  # real logits on real slots


def test_masked_slots_do_not_influence_anything(net):
    """Whatever sits in masked element/word slots, every real output is unchanged."""
    _, params, apply = net
    f = random_features(2)
    g = {k: v.copy() for k, v in f.items()}
    rng = np.random.default_rng(3)
    for tok, mask, feats in (
        ("elem_tokens", "elem_mask", "elem_feats"),
        ("instr_tokens", "instr_mask", "instr_feats"),
    ):
        hidden = ~f[mask]
        g[tok][hidden] = rng.integers(1, CFG.vocab_size, g[tok][hidden].shape)
        g[feats][hidden] = rng.random(g[feats][hidden].shape) * 10
    assert any((g[k] != f[k]).any() for k in f)
    (la, va), (lb, vb) = to_np(apply(params, f)), to_np(apply(params, g))
    np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-5)
    for head in ("type", "direction"):
        np.testing.assert_allclose(la[head], lb[head], rtol=1e-5, atol=1e-5)
    for head in ("element", "word"):  # (slot 0 of an all-invalid row is a placeholder with probability 1)
        pa, pb = np.asarray(jax.nn.softmax(la[head])), np.asarray(jax.nn.softmax(lb[head]))
        np.testing.assert_allclose(pa, pb, rtol=1e-5, atol=1e-6)
    # while a real slot does matter
    h = {k: v.copy() for k, v in f.items()}
    h["elem_feats"][0, 0] += 5.0
    assert not np.allclose(to_np(apply(params, h))[1], va)


def test_params_flat_round_trip(net):
    _, template, apply = net
    _, other = model.create(CFG, 1)
    flat = params_to_flat(other)
    assert "blocks/0/attn/query/kernel" in flat and "embed/embedding" in flat and "summary" in flat
    assert flat["embed/embedding"].shape == (CFG.vocab_size, CFG.d_model)
    assert all(isinstance(v, np.ndarray) for v in flat.values())
    f = random_features(4)
    want = to_np(apply(other, f))
    before = to_np(apply(template, f))
    assert not np.allclose(want[1], before[1])  # different seeds, different outputs
    rebuilt = flat_to_params(template, flat)
    got = to_np(apply(rebuilt, f))
    np.testing.assert_array_equal(got[1], want[1])
    for head in HEADS:
        np.testing.assert_array_equal(got[0][head], want[0][head])
    np.testing.assert_array_equal(to_np(apply(template, f))[1], before[1])  # the template is untouched
    # and through the PARAMS frames, as actors receive them
    frames = [bytes(x) for x in protocol.params_frames(9, flat)]
    version, received = protocol.parse_params(frames)
    assert version == 9
    got = to_np(apply(flat_to_params(template, received), f))
    np.testing.assert_array_equal(got[1], want[1])
    for name, arr in params_to_flat(rebuilt).items():
        np.testing.assert_array_equal(arr, flat[name])


def _bad_flats() -> dict[str, dict[str, np.ndarray]]:
    _, params = model.create(CFG, 0)
    flat = params_to_flat(params)
    k = "blocks/0/mlp_in/kernel"
    return {
        "missing name": {n: v for n, v in flat.items() if n != "summary"},
        "extra name": {**flat, "blocks/9/mlp_in/kernel": flat[k]},
        "renamed": {("Summary" if n == "summary" else n): v for n, v in flat.items()},
        "transposed": {**flat, k: flat[k].T},
        "flattened": {**flat, k: flat[k].reshape(-1)},
        "float64": {**flat, k: flat[k].astype(np.float64)},
        "float16": {**flat, k: flat[k].astype(np.float16)},
        "int32": {**flat, "summary": flat["summary"].astype(np.int32)},
    }


@pytest.mark.parametrize("case", list(_bad_flats()))
def test_flat_to_params_refuses(net, case):
    _, template, _ = net
    with pytest.raises(ValueError):
        flat_to_params(template, _bad_flats()[case])


def test_an_abstract_template_receives_snapshots_as_a_real_one_does(net):
    graphdef, template, apply = net
    abstract_graphdef, abstract = model.abstract(CFG)
    assert abstract_graphdef == graphdef
    assert all(
        isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(abstract)
    )  # nothing computed
    _, other = model.create(CFG, 1)
    flat = params_to_flat(other)
    from_abstract, from_real = flat_to_params(abstract, flat), flat_to_params(template, flat)
    assert jax.tree.structure(from_abstract) == jax.tree.structure(from_real)
    f = random_features(4)
    np.testing.assert_array_equal(to_np(apply(from_abstract, f))[1], to_np(apply(from_real, f))[1])
    for bad in _bad_flats().values():
        with pytest.raises(ValueError, match="parameter"):
            flat_to_params(abstract, bad)


def test_out_of_vocabulary_ids_are_refused_because_they_make_nan(net):
    """An id >= vocab_size turns into NaN in the embedding lookup, so validation must refuse it
    (at commit 48dd261 validate_episodes checked only ids >= 0)."""
    _, params, apply = net
    f = random_features(5)  # an episode of N - 1 steps: N observations
    f["instr_mask"][:, 0] = True
    f["instr_tokens"][0, 0] = CFG.vocab_size  # one id past the vocabulary
    _, value = to_np(apply(params, f))
    assert np.isnan(value[0]) and np.isfinite(value[1:]).all()
    steps = {k: np.zeros(N - 1, np.dtype(dt)) for k, dt in protocol.STEP_ARRAYS.items()}
    msg = protocol.Traj(1, 1, [protocol.episode_fields("t", True, False, f, steps)]).to_msg()
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.validate_episodes(msg, EPISODE_SPEC, max_steps=10, newest_version=0)
    assert e.value.code == "bad_array"
    f["instr_tokens"][0, 0] = CFG.vocab_size - 1
    msg = protocol.Traj(1, 1, [protocol.episode_fields("t", True, False, f, steps)]).to_msg()
    (ep,) = protocol.validate_episodes(msg, EPISODE_SPEC, max_steps=10, newest_version=0)
    assert np.isfinite(to_np(apply(params, dict(ep.obs)))[1]).all()


# ---- policy runner ------------------------------------------------------------------------------------
_TEXT = "android.widget.TextView"
ELEMENTS = (
    UIElement(_TEXT, text="12:00", bounds=(0, 0, 1080, 80)),
    UIElement(_TEXT, content_desc="Clock", bounds=(270, 1600, 540, 1900), clickable=True),
    UIElement(_TEXT, text="Menu", bounds=(361, 2201, 720, 2400), clickable=True),
    UIElement(_TEXT, text="A", bounds=(10, 20, 31, 41)),
    UIElement(_TEXT, text="beyond max_elements", bounds=(0, 0, 100, 100)),
)
OBS = Observation("Write Milk in the Notes app please now", ELEMENTS, (1080, 2400))


def to_action(obs: Observation, choice: PolicyChoice):
    """The pointer policy's action for a typed choice (families take choices as dicts of ints)."""
    return PointerPolicy(CFG).to_action(obs, choice.as_dict())


@pytest.mark.parametrize(
    ("index", "center"),
    [(0, (540, 40)), (1, (405, 1750)), (2, (540, 2300)), (3, (20, 30))],
)
def test_to_action_tap_hits_the_element_center(index, center):
    action = to_action(OBS, PolicyChoice(int(ActionType.TAP), element=index, word=3, direction=2))
    assert action.type == ActionType.TAP
    assert action.x == pytest.approx(center[0] / 1080, abs=1e-12)
    assert action.y == pytest.approx(center[1] / 2400, abs=1e-12)
    assert action.note == OBS.elements[index].label  # what the memory remembers of it


def test_to_action_tap_on_a_missing_element_taps_the_middle():
    for index in (4, 7):  # cut by max_elements / not there at all
        action = to_action(OBS, PolicyChoice(int(ActionType.TAP), element=index))
        assert action == Action.tap(0.5, 0.5)


def test_to_action_tap_uses_the_screen_size():
    obs = Observation("x", (UIElement(_TEXT, bounds=(100, 200, 300, 600)),), (400, 800))
    action = to_action(obs, PolicyChoice(int(ActionType.TAP), element=0))
    assert (action.x, action.y) == (0.5, 0.5)


def test_to_action_type_uses_the_chosen_instruction_word():
    words = ["Write", "Milk", "in", "the", "Notes"]  # as written (case kept), cut at max_instruction_tokens
    for i, w in enumerate(words):
        action = to_action(OBS, PolicyChoice(int(ActionType.TYPE), element=1, word=i))
        assert action == Action(ActionType.TYPE, text=w) and action.note == w  # the memory's words
    assert to_action(OBS, PolicyChoice(int(ActionType.TYPE), word=5)).text == ""


def test_to_action_swipe_and_keys():
    for d in SwipeDirection:
        action = to_action(OBS, PolicyChoice(int(ActionType.SWIPE), element=1, word=1, direction=int(d)))
        assert action == Action(ActionType.SWIPE, direction=d) and action.note == d.name.lower()
    for kind in (
        ActionType.PRESS_BACK,
        ActionType.PRESS_HOME,
        ActionType.PRESS_ENTER,
        ActionType.STATUS_COMPLETE,
    ):
        action = to_action(OBS, PolicyChoice(int(kind), element=1, word=1, direction=3))
        assert action == Action(kind)


def test_policy_runner_samples_valid_actions_with_their_log_probs(net):
    _, _, apply = net
    _, params = model.create(CFG, 3)
    runner = PolicyRunner(CFG, seed=11)
    with pytest.raises(ValueError):
        runner.load(1, {"summary": np.zeros(CFG.d_model, np.float32)})
    assert runner.version == -1 and runner.params is None
    flat = params_to_flat(params)
    runner.load(4, flat)
    assert runner.version == 4
    f = random_features(6)
    choices, logp, _, _ = runner.act(f)
    assert len(choices) == N and logp.shape == (N,) and logp.dtype == np.float32
    assert (logp <= 0).all()
    for i, c in enumerate(choices):
        assert 0 <= c["action_type"] < 7 and 0 <= c["direction"] < 4
        if f["elem_mask"][i].any():
            assert f["elem_mask"][i, c["element"]]
        if f["instr_mask"][i].any():
            assert f["instr_mask"][i, c["word"]]
    logits, _ = apply(params, f)
    choice = {k: np.array([c[k] for c in choices], np.int32) for k in distribution.CHOICE_KEYS}
    np.testing.assert_allclose(logp, np.asarray(distribution.log_prob(logits, choice)), rtol=1e-5, atol=1e-5)


def test_memory_is_read_and_its_masked_slots_are_not():
    """With ModelConfig.history the remembered actions change the outputs (the memory is read), what sits
    in unused memory slots does not, and without a memory the network has no parameters for one."""
    import dataclasses

    cfg = dataclasses.replace(CFG, history=3)
    spec = featurize.feature_spec(cfg)
    graphdef, params = model.create(cfg, 0)
    apply = jax.jit(lambda p, f: model.apply(graphdef, p, f))
    rng = np.random.default_rng(4)
    f = random_features(5)
    f["hist_tokens"] = rng.integers(1, CFG.vocab_size, (N, *spec["hist_tokens"][0])).astype(np.int32)
    f["hist_feats"] = rng.random((N, *spec["hist_feats"][0])).astype(np.float32)
    f["hist_mask"] = np.tile([True, True, False], (N, 1))
    f["episode_step"] = np.full((N, 1), 0.25, np.float32)
    _, value = to_np(apply(params, f))
    hidden = {k: v.copy() for k, v in f.items()}
    hidden["hist_tokens"][:, 2] = rng.integers(1, CFG.vocab_size, (N, CFG.max_element_tokens))
    hidden["hist_feats"][:, 2] += 7.0
    np.testing.assert_allclose(to_np(apply(params, hidden))[1], value, rtol=1e-5, atol=1e-5)
    remembered = {k: v.copy() for k, v in f.items()}
    remembered["hist_tokens"][:, 0] = rng.integers(1, CFG.vocab_size, (N, CFG.max_element_tokens))
    assert not np.allclose(to_np(apply(params, remembered))[1], value, atol=1e-4)
    steps = {**f, "episode_step": np.full((N, 1), 0.75, np.float32)}
    assert not np.allclose(to_np(apply(params, steps))[1], value, atol=1e-4)
    without = set(params_to_flat(model.create(CFG, 0)[1]))
    assert not any(name.startswith(("hist_feat", "step_feat")) for name in without)
    assert {"hist_feat/kernel", "step_feat/kernel"} <= set(params_to_flat(params))
