"""learner.training.{mesh,sharding,sharded_step}: the sharded train step equals the unsharded one on 1x1, 8x1 and 4x2 meshes of forced CPU
devices, parameters really are split as param_specs says, and bad mesh shapes fail clearly.

The 8 devices must exist before jax initializes, so the step checks run in a subprocess
(tests/mesh_check.py) that prints JSON; the parameter-layout rules of the 134M preset are checked here on
an AbstractMesh with jax.eval_shape (nothing allocated).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from common.policies.pointer import sizes
from learner.training import mesh as M
from learner.training import sharding as S
from tests.conftest import CHEAP_XLA, ROOT

CHECKS_S = 900
"""The mesh checks compile a dozen sharded steps: a minute or two idle, several times that on a busy machine."""
pytestmark = [pytest.mark.timeout(CHECKS_S + 120), pytest.mark.long]

MESH_ENV = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    # 8 host devices; the cheapest XLA backend pipeline (the check is about partitioning, not speed:
    # the unsharded reference is compiled the same way).
    "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {CHEAP_XLA}",
}
TOL = 1e-5


@pytest.fixture(scope="module")
def checks() -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.mesh_check"],
        cwd=ROOT,
        env=MESH_ENV,
        capture_output=True,
        text=True,
        timeout=CHECKS_S,
    )
    assert proc.returncode == 0, f"mesh_check failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def layout(checks: dict, data: int, model: int, mode: str) -> dict:
    return next(r for r in checks["layouts"] if r["mesh"] == [data, model] and r["mode"] == mode)


def test_sharded_step_matches_unsharded(checks):
    assert checks["devices"] == 8
    assert all(change > 1e-4 for change in checks["ref_param_change"].values())  # the steps do move params
    assert {tuple(r["mesh"]) for r in checks["layouts"]} >= {(1, 1), (8, 1), (4, 2)}
    for r in checks["layouts"]:
        where = f"{r['mesh']} {r['mode']} {r['loss']}"
        for got, want in zip(r["losses"], r["ref_losses"], strict=True):
            assert abs(got - want) < TOL, where
        assert r["max_metric_diff"] < TOL, where  # every metric, grad_norm and [B] priorities included
        assert r["max_param_diff"] < TOL, where
        assert r["moments_follow_params"], where
        assert r["count_replicated"] == "P()", where
        assert r["donated"], where
    aride = next(r for r in checks["layouts"] if r["loss"] == "aride")
    assert "priority_delta" in aride["metric_keys"]


def test_replicated_layouts_split_nothing(checks):
    assert layout(checks, 1, 1, "replicated")["sharded"] == {}
    assert layout(checks, 8, 1, "replicated")["sharded"] == {}


def _split_correctly(sharded: dict) -> None:
    for name, p in sharded.items():
        assert p["shard_shapes"] == [p["expected_shard_shape"]], name
        assert p["expected_shard_shape"] != p["shape"], name


def test_model_sharding_splits_kernels_over_model(checks):
    sharded = layout(checks, 4, 2, "model")["sharded"]
    assert all("model" in p["spec"] and "data" not in p["spec"] for p in sharded.values())
    assert sharded["embed/embedding"]["spec"] == ["model"]
    assert sharded["embed/embedding"]["shard_shapes"] == [[256, 32]]
    assert sharded["blocks/0/attn/query/kernel"]["spec"] == [None, "model"]  # [d, heads, head_dim]
    assert sharded["blocks/0/attn/out/kernel"]["spec"] == ["model"]
    assert sharded["blocks/0/mlp_in/kernel"]["spec"] == [None, "model"]
    assert sharded["blocks/0/mlp_out/kernel"]["spec"] == ["model"]
    assert not any(name.endswith(("bias", "scale")) or "head" in name for name in sharded)
    _split_correctly(sharded)


def test_fsdp_splits_large_params_over_data(checks):
    sharded = layout(checks, 8, 1, "fsdp")["sharded"]
    assert {"embed/embedding", "blocks/0/mlp_in/kernel", "blocks/0/mlp_out/kernel"} <= set(sharded)
    assert all(p["spec"].count("data") == 1 for p in sharded.values())
    assert sharded["embed/embedding"]["shard_shapes"] == [[64, 32]]
    _split_correctly(sharded)
    # on a 4x2 mesh, FSDP comes on top of the tensor-parallel split
    both = layout(checks, 4, 2, "fsdp")["sharded"]
    assert both["blocks/0/mlp_in/kernel"]["spec"] == ["data", "model"]
    _split_correctly(both)


def test_bad_shapes_fail_clearly(checks):
    errors = checks["errors"]
    assert "does not divide the 8 available devices" in errors["data3"]
    assert "model axis 3 does not divide the 8" in errors["model3"]
    assert "does not divide" in errors["data16"]
    assert "does not divide" in errors["data4_model4"]
    assert "--mesh.param-sharding must be one of" in errors["bad_mode"]
    assert "batch size 6 is not divisible by the mesh's 'data' axis (4" in errors["batch6_on_data4"]


def _specs_by_name(specs) -> dict[str, PartitionSpec]:
    leaves = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]
    return {S.param_name(path): spec for path, spec in leaves}


def test_large_preset_is_over_100m_and_splits_over_model():
    cfg = sizes.large_model_config()
    params = sizes.abstract_params(cfg)  # jax.eval_shape: no memory, no compute
    n = sizes.count_params(params)
    assert n >= 100_000_000
    specs = _specs_by_name(S.param_specs(params, AbstractMesh((4, 2), M.AXES), "model"))
    big = [name for name in specs if name.endswith("kernel") and ("attn" in name or "mlp" in name)]
    assert len(big) == 6 * cfg.num_layers
    for name in [*big, "embed/embedding"]:
        assert "model" in specs[name], name
    for name in ("type_head/kernel", "value_head/kernel", "elem_feat/kernel", "blocks/0/norm1/scale"):
        assert specs[name] == PartitionSpec(), name
    elements = {
        S.param_name(path): math.prod(x.shape) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    split = sum(elements[name] for name, spec in specs.items() if "model" in spec)
    assert split > 0.95 * n  # nearly all the weight memory is divided between the 'model' devices

    fsdp = _specs_by_name(S.param_specs(params, AbstractMesh((8, 1), M.AXES), "fsdp"))
    assert "data" in fsdp["embed/embedding"]
    assert all("model" not in s for s in fsdp.values())  # the model axis has size 1


def test_mesh_config_validates():
    with pytest.raises(ValueError, match=r"--mesh\.param-sharding"):
        M.MeshConfig(param_sharding="tensor")
    with pytest.raises(ValueError, match=r"--mesh\.model must be >= 1"):
        M.MeshConfig(model=0)
    with pytest.raises(ValueError, match=r"--mesh\.data must be >= 1 or -1"):
        M.MeshConfig(data=0)


def _trimmed(spec: list) -> list:
    """A spec without its trailing unsplit dims (P('data', None) and P('data') are the same layout)."""
    spec = list(spec)
    while spec and spec[-1] is None:
        spec.pop()
    return spec


def test_fine_tuned_text_encoder_step_matches_unsharded_and_follows_its_logical_axes(checks):
    """--model.train-text-encoder on the 4x2 FSDP mesh: the A-RIDE step (encoder forward and backward,
    and the acted observations' own encoding) equals the unsharded step, and every encoder parameter
    sits where the encoder's logical axis names put it (bert.partition_specs), big ones really split."""
    r = checks["text_encoder"]
    for got, want in zip(r["losses"], r["ref_losses"], strict=True):
        assert abs(got - want) < TOL
    assert r["max_metric_diff"] < TOL and r["max_param_diff"] < TOL
    assert r["encoder_change"] > 1e-4  # the encoder is trained, not frozen
    assert {k: _trimmed(v) for k, v in r["encoder_specs"].items()} == {
        k: _trimmed(v) for k, v in r["logical_specs"].items()
    }
    specs = r["encoder_specs"]
    assert _trimmed(specs["text/encoder/layers/0/intermediate/kernel"]) == ["data", "model"]
    assert _trimmed(specs["text/encoder/word_embeddings/embedding"]) == ["data"]
    assert _trimmed(specs["text/encoder/layers/0/query/bias"]) == []
    assert r["split_encoder_params"] >= 8
