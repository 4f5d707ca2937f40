"""The BERT encoder's sharding (common/backbones/bert.py): its logical-axis rules, and `load(folder, mesh)`,
which places every weight straight onto a ('data', 'model') mesh from slices of model.safetensors.

What must hold: the layout is the rule table's (big kernels and tables really split, biases and norms
replicated); each device reads only its own block of a split tensor; every sharded weight equals the
unsharded one bit for bit, and the jitted forward pass and mean pooling on a padded, data-split batch
match the unsharded encoder; a bad checkpoint fails with the very message of the unsharded loader.

Eight devices have to exist before jax initializes, so the mesh checks run this file as a subprocess
(`python -m tests.test_bert_sharding FOLDER BAD_FOLDER` with 8 forced CPU devices), which prints one JSON
object as its last line; one test asserts on it. Rule-table and error checks need no devices and run
in-process (on AbstractMesh, or on a 1x1 mesh of the one CPU device).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.backbones import CheckpointError, bert
from tests.conftest import CHEAP_XLA, ROOT
from tests.test_bert_encoder import CONFIG, old_layout, random_tensors, write_checkpoint

SHARD_CONFIG = {
    **CONFIG,
    # 2, 4 and 8 divide every dim the rules split; 4 heads of 8, so 'model' <= 4 never splits a head.
    "vocab_size": 48,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 16,
}
MESHES = [(4, 2), (8, 1), (2, 4)]
"""(data, model) layouts checked on the 8 devices."""
CHECK_S = 180
"""The subprocess compiles four tiny forward passes: ~10 s idle, several times that on 2 busy cores."""
MESH_ENV = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    # The cheapest XLA pipeline: the check is about layout and equality, and the unsharded reference is
    # compiled the same way.
    "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {CHEAP_XLA}",
}
TOL = 1e-5

# Hand-written layouts (not derived from the code under test), by flat parameter name.
EXPECTED = {
    (4, 2): {
        "word_embeddings/embedding": ["data", None],
        "position_embeddings/embedding": ["data", None],
        "token_type_embeddings/embedding": [None, "data"],  # 2 rows stay whole; the width follows 'embed'
        "embedding_norm/scale": [None],
        "layers/0/query/kernel": ["data", "model"],
        "layers/0/query/bias": [None],
        "layers/1/value/kernel": ["data", "model"],
        "layers/0/attention_out/kernel": ["model", "data"],
        "layers/0/intermediate/kernel": ["data", "model"],
        "layers/0/intermediate/bias": [None],
        "layers/1/output/kernel": ["model", "data"],
        "layers/1/output_norm/bias": [None],
    },
    (8, 1): {
        "word_embeddings/embedding": ["data", None],
        "position_embeddings/embedding": ["data", None],
        "layers/0/query/kernel": ["data", None],  # a 1-device 'model' axis splits nothing
        "layers/0/intermediate/kernel": ["data", None],
        "layers/1/output/kernel": [None, "data"],
    },
    (2, 4): {
        "layers/0/query/kernel": ["data", "model"],
        "layers/0/intermediate/kernel": ["data", "model"],
        "layers/1/output/kernel": ["model", "data"],
    },
}
BIG = ("word_embeddings/embedding", "query/kernel", "intermediate/kernel", "output/kernel")
"""Parameters that every layout checked must split."""


def flat_name(path: tuple) -> str:
    return "/".join(str(k) for k in path)


def flat_params(encoder: nnx.Module) -> dict[str, jax.Array]:
    return {flat_name(path): v.get_value() for path, v in nnx.to_flat_state(nnx.state(encoder))}


def padded_batch(seed: int = 0, rows: int = 8, length: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Random ids with real lengths from 1 to `length` (one row full, one a single token)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, SHARD_CONFIG["vocab_size"], (rows, length))
    lengths = np.concatenate([[length, 1], rng.integers(1, length + 1, rows - 2)])
    mask = np.arange(length)[None] < lengths[:, None]
    return np.where(mask, ids, 0), mask


def bad_shape_tensors() -> dict[str, np.ndarray]:
    tensors = random_tensors(SHARD_CONFIG)
    tensors["encoder.layer.1.intermediate.dense.weight"] = np.zeros((64, 31), np.float32)
    return tensors


# ---- the subprocess (8 devices) ---------------------------------------------------------------------------


def mesh_checks(folder: Path, bad_folder: Path) -> dict:
    """Everything the 8-device tests assert on, as JSON-able values."""
    from learner.training.mesh import MeshConfig, make_mesh

    reads: list[tuple[str, tuple[int, ...]]] = []
    read = bert.LazyTensorSource.read

    def recording_read(self, key, index):  # which blocks the sharded loader asks the file for
        block = read(self, key, index)
        reads.append((key, block.shape))
        return block

    bert.LazyTensorSource.read = recording_read

    def forward(encoder, ids, mask):
        graphdef, state = nnx.split(encoder)

        @jax.jit
        def run(state, ids, mask):
            states = nnx.merge(graphdef, state)(ids, mask)
            return states, bert.mean_pool(states, mask)

        return [np.asarray(x) for x in run(state, ids, mask)]

    ids, mask = padded_batch()
    _, reference = bert.load(folder)
    ref_params = flat_params(reference)
    ref_states, ref_pooled = forward(reference, ids, mask)
    out: dict = {"devices": jax.device_count(), "layouts": []}
    for data, model in MESHES:
        mesh = make_mesh(MeshConfig(data=data, model=model))
        reads.clear()
        _, encoder = bert.load(folder, mesh)
        expected = {
            flat_name(path): list(v.get_value())
            for path, v in nnx.to_flat_state(bert.partition_specs(encoder, mesh))
        }
        params = {}
        for name, array in flat_params(encoder).items():
            shards = {tuple(s.data.shape) for s in array.addressable_shards}
            params[name] = {
                "shape": list(array.shape),
                "spec": list(array.sharding.spec),
                "rule_spec": expected[name],
                "on_mesh": array.sharding == NamedSharding(mesh, P(*expected[name])),
                "shard_shapes": sorted(list(s) for s in shards),
                "equal": bool(np.array_equal(np.asarray(array), np.asarray(ref_params[name]))),
            }
        on_mesh = NamedSharding(mesh, P("data"))
        states, pooled = forward(encoder, jax.device_put(ids, on_mesh), jax.device_put(mask, on_mesh))
        try:
            bert.load(bad_folder, mesh)
            bad = None
        except CheckpointError as err:
            bad = str(err)
        out["layouts"].append(
            {
                "mesh": [data, model],
                "params": params,
                "reads": [[key, list(shape)] for key, shape in reads],
                "max_state_diff": float(np.abs(states - ref_states).max()),
                "max_pooled_diff": float(np.abs(pooled - ref_pooled).max()),
                "bad_shape_error": bad,
            }
        )
    return out


# ---- the tests --------------------------------------------------------------------------------------------


def run_mesh_checks(module: str, *args: object) -> dict:
    """`python -m MODULE ARGS` on 8 forced CPU devices; the JSON object its last line prints."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=ROOT,
        env=MESH_ENV,
        capture_output=True,
        text=True,
        timeout=CHECK_S,
    )
    assert proc.returncode == 0, f"mesh checks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.long  # started first (tests/conftest.py): the subprocess takes ten seconds or more
def test_the_sharded_encoder_on_8_devices_equals_the_unsharded_one(tmp_path):
    """One test for the whole subprocess: pytest-xdist hands tests out one at a time, and a module-scoped
    fixture shared by several tests would start the 8-device process once per worker."""
    good = write_checkpoint(tmp_path / "ckpt", SHARD_CONFIG, random_tensors(SHARD_CONFIG))
    bad = write_checkpoint(tmp_path / "bad", SHARD_CONFIG, bad_shape_tensors())
    checks = run_mesh_checks("tests.test_bert_sharding", good, bad)
    assert checks["devices"] == 8
    assert [r["mesh"] for r in checks["layouts"]] == [list(m) for m in MESHES]
    layouts_are_the_rule_tables(checks)
    big_weights_are_really_split(checks)
    each_device_reads_only_its_block(checks)
    sharded_weights_equal_the_unsharded_ones(checks)
    jitted_forward_and_pooling_match_unsharded(checks)
    a_wrong_shape_on_the_mesh_gets_the_unsharded_message(checks, bad)


def layout(checks: dict, data: int, model: int) -> dict:
    return next(r for r in checks["layouts"] if r["mesh"] == [data, model])


def layouts_are_the_rule_tables(checks: dict) -> None:
    for mesh, want in EXPECTED.items():
        params = layout(checks, *mesh)["params"]
        for name, spec in want.items():
            assert params[name]["spec"] == spec, (mesh, name)
        for name, p in params.items():
            assert p["spec"] == p["rule_spec"] and p["on_mesh"], (mesh, name)
            if name.endswith("bias") or "norm" in name:
                assert p["spec"] == [None], (mesh, name)


def big_weights_are_really_split(checks: dict) -> None:
    for r in checks["layouts"]:
        axis_sizes = dict(zip(("data", "model"), r["mesh"], strict=True))
        for name, p in r["params"].items():
            split = int(np.prod([axis_sizes[axis] for axis in p["spec"] if axis]))
            if name.endswith(BIG):
                assert split > 1, (r["mesh"], name)
            # every device holds one block, as large as the spec implies
            assert len(p["shard_shapes"]) == 1, (r["mesh"], name)
            assert np.prod(p["shard_shapes"][0]) * split == np.prod(p["shape"]), (r["mesh"], name)


def each_device_reads_only_its_block(checks: dict) -> None:
    r = layout(checks, 4, 2)
    reads = {}
    for key, shape in r["reads"]:
        reads.setdefault(key, set()).add(tuple(shape))
    # the loader's blocks are in nnx's layout; torch's [out, in] weights are read as [out-block, in-block]
    assert reads["embeddings.word_embeddings.weight"] == {(12, 32)}
    assert reads["encoder.layer.0.attention.self.query.weight"] == {(16, 8)}
    assert reads["encoder.layer.1.intermediate.dense.weight"] == {(32, 8)}
    assert reads["encoder.layer.1.output.dense.weight"] == {(8, 32)}
    # one read per distinct block: 4 x 2 blocks for a 2-D split, one for a replicated tensor
    names = [key for key, _ in r["reads"]]
    assert names.count("encoder.layer.0.attention.self.query.weight") == 8
    assert names.count("encoder.layer.0.attention.self.query.bias") == 1


def sharded_weights_equal_the_unsharded_ones(checks: dict) -> None:
    for r in checks["layouts"]:
        # 3 tables and a LayerNorm (2), then per layer 6 Linears (2 each) and 2 LayerNorms (2 each)
        assert len(r["params"]) == 5 + 16 * SHARD_CONFIG["num_hidden_layers"]
        unequal = [name for name, p in r["params"].items() if not p["equal"]]
        assert not unequal, (r["mesh"], unequal)


def jitted_forward_and_pooling_match_unsharded(checks: dict) -> None:
    for r in checks["layouts"]:
        assert r["max_state_diff"] < TOL, r["mesh"]
        assert r["max_pooled_diff"] < TOL, r["mesh"]


def a_wrong_shape_on_the_mesh_gets_the_unsharded_message(checks: dict, bad: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        bert.load(bad)
    assert "tensor encoder.layer.1.intermediate.dense.weight has shape (64, 31)" in str(err.value)
    for r in checks["layouts"]:
        assert r["bad_shape_error"] == str(err.value), r["mesh"]


# ---- in-process: rules and errors -------------------------------------------------------------------------


def abstract_encoder(cfg: dict) -> nnx.Module:
    config = bert.BertConfig(**{k: cfg[k] for k in (*bert._REQUIRED, "type_vocab_size", "layer_norm_eps")})
    return nnx.eval_shape(lambda: bert.BertEncoder(config, nnx.Rngs(0)))


def specs_by_name(specs) -> dict[str, P]:
    return {flat_name(path): v.get_value() for path, v in nnx.to_flat_state(specs)}


def test_mesh_axes_are_learner_meshs():
    from learner.training.mesh import AXES

    assert (bert.DATA, bert.MODEL) == AXES


def test_every_parameter_is_annotated_and_loaded():
    encoder = abstract_encoder(SHARD_CONFIG)
    known = {name for name, _ in bert.LOGICAL_AXIS_RULES}
    flat = nnx.to_flat_state(nnx.state(encoder))
    for path, variable in flat:
        logical = variable.get_metadata().get("out_sharding")
        assert logical is not None and len(logical) == len(variable.get_value().shape), path
        assert set(logical) <= known, path
    # the loaders' name table covers exactly the parameters
    assert set(bert._checkpoint_layout(encoder.cfg)) == {path for path, _ in flat}


def test_all_minilm_l6_v2_layout():
    """The shapes of sentence-transformers/all-MiniLM-L6-v2 (nothing allocated): its 30522-word vocabulary
    is not a multiple of 4 or 8, so the table's width takes 'data' instead, and nearly all of its ~22.7M
    weights are split on 8 devices."""
    minilm = {
        **CONFIG,
        "vocab_size": 30522,
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
        "max_position_embeddings": 512,
    }
    encoder = abstract_encoder(minilm)
    fsdp = specs_by_name(bert.partition_specs(encoder, AbstractMesh((8, 1), ("data", "model"))))
    assert fsdp["word_embeddings/embedding"] == P(None, "data")
    assert fsdp["position_embeddings/embedding"] == P("data", None)
    sizes = {flat_name(p): v.get_value().size for p, v in nnx.to_flat_state(nnx.state(encoder))}
    split = sum(sizes[name] for name, spec in fsdp.items() if "data" in spec)
    assert sum(sizes.values()) > 22_000_000 and split > 0.98 * sum(sizes.values())
    both = specs_by_name(bert.partition_specs(encoder, AbstractMesh((4, 2), ("data", "model"))))
    assert both["layers/5/query/kernel"] == P("data", "model")  # 12 heads: 6 per 'model' device
    assert both["layers/5/output/kernel"] == P("model", "data")


def test_rules_replicate_what_they_cannot_divide_and_reject_unknown_names():
    sizes = {"data": 4, "model": 2}
    assert bert.logical_to_mesh_spec(("vocab", "embed"), (48, 32), sizes) == P("data", None)
    assert bert.logical_to_mesh_spec(("vocab", "embed"), (30, 32), sizes) == P(None, "data")
    assert bert.logical_to_mesh_spec(("vocab", "embed"), (30, 30), sizes) == P(None, None)
    assert bert.logical_to_mesh_spec(("embed", "heads"), (32, 33), sizes) == P("data", None)
    assert bert.logical_to_mesh_spec(("mlp", "embed"), (64, 32), {"data": 1, "model": 1}) == P(None, None)
    with pytest.raises(ValueError, match="no sharding rule for logical axis 'experts'"):
        bert.logical_to_mesh_spec(("experts", "embed"), (8, 32), sizes)
    with pytest.raises(ValueError, match="mesh needs axes"):
        bert.partition_specs(abstract_encoder(SHARD_CONFIG), AbstractMesh((8,), ("batch",)))


def one_device_mesh():
    return jax.make_mesh((1, 1), (bert.DATA, bert.MODEL), devices=jax.devices()[:1])


def _truncate(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "fault",
    [
        lambda f: write_checkpoint(f, SHARD_CONFIG, bad_shape_tensors()),
        lambda f: write_checkpoint(
            f,
            SHARD_CONFIG,
            {k: v for k, v in random_tensors(SHARD_CONFIG).items() if "layer.1.attention.self.key" not in k},
        ),
        lambda f: _truncate(write_checkpoint(f, SHARD_CONFIG, random_tensors(SHARD_CONFIG))),
        lambda f: (write_checkpoint(f, SHARD_CONFIG, {}), (f / "model.safetensors").unlink()),
    ],
    ids=["wrong_shape", "missing_tensor", "truncated", "no_safetensors"],
)
def test_the_mesh_path_fails_with_the_unsharded_message(tmp_path, fault):
    folder = tmp_path / "ckpt"
    fault(folder)
    with pytest.raises(CheckpointError) as plain:
        bert.load(folder)
    with pytest.raises(CheckpointError) as sharded:
        bert.load(folder, one_device_mesh())
    assert str(sharded.value) == str(plain.value)


def test_the_mesh_path_reads_prefixed_and_gamma_beta_checkpoints(tmp_path):
    plain = random_tensors(SHARD_CONFIG)
    renamed = old_layout(plain)
    _, want = bert.load(write_checkpoint(tmp_path / "plain", SHARD_CONFIG, plain))
    _, got = bert.load(write_checkpoint(tmp_path / "renamed", SHARD_CONFIG, renamed), one_device_mesh())
    want_params, got_params = flat_params(want), flat_params(got)
    assert set(got_params) == set(want_params)
    for name, value in got_params.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want_params[name]), err_msg=name)


if __name__ == "__main__":  # the subprocess of test_the_sharded_encoder_on_8_devices_equals_the_unsharded_one
    print(json.dumps(mesh_checks(Path(sys.argv[1]), Path(sys.argv[2]))))
