"""The decoder on a ('data', 'model') device mesh: load_folder(folder, mesh=...) places every weight by the
logical-axis rules (common/backbones/axes.py) straight from the memory-mapped shards of a
model.safetensors.index.json, equal bit for bit to the unsharded load, and the jitted forward pass on a
data-split batch equals the unsharded one; LoRA adapters are placed by the same rules.

Eight devices have to exist before jax initializes, so those checks run this file as a subprocess
(`python -m tests.test_decoder_sharding FOLDER` with 8 forced CPU devices, as tests/test_bert_sharding.py
does), which prints one JSON object as its last line. Rule checks need no devices and run in-process on
AbstractMesh, including the real SmolLM2-135M shapes (nothing allocated).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from common.backbones import axes
from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.llama import Decoder
from common.backbones.decoder.lora import LoraConfig
from common.backbones.decoder.weights import checkpoint_layout, load_folder
from tests.decoder_reference import VARIANTS, left_padded_batch, write_hf_folder
from tests.test_bert_sharding import run_mesh_checks

CONFIG = VARIANTS["qwen3_qknorm"]  # 4 query heads, 2 kv heads of 16, hidden 32, MLP 48, vocab 64, untied
MESHES = [(4, 2), (8, 1), (2, 4)]
TOL = 1e-5

EXPECTED = {  # hand-written from the rule table, by flat parameter name
    (4, 2): {
        "embed_tokens/embedding": ["data", None],
        "layers/0/self_attn/q_proj/kernel": ["data", "model"],
        "layers/0/self_attn/k_proj/kernel": ["data", "model"],
        "layers/1/self_attn/o_proj/kernel": ["model", "data"],
        "layers/0/self_attn/q_norm/weight": [None],
        "layers/0/mlp/gate_proj/kernel": ["data", "model"],
        "layers/1/mlp/down_proj/kernel": ["model", "data"],
        "layers/1/input_layernorm/weight": [None],
        "norm/weight": [None],
        "lm_head/kernel": ["data", None],  # 'embed' takes 'data' first; 'vocab' finds it used
    },
    (8, 1): {
        "embed_tokens/embedding": ["data", None],
        "layers/0/self_attn/q_proj/kernel": ["data", None],
        "layers/1/mlp/down_proj/kernel": [None, "data"],
    },
    (2, 4): {
        "layers/0/self_attn/q_proj/kernel": ["data", "model"],
        "layers/0/self_attn/v_proj/kernel": ["data", "model"],
        "layers/0/mlp/up_proj/kernel": ["data", "model"],
    },
}
LORA_EXPECTED = {  # on (4, 2)
    "layers/0/self_attn/q_proj/lora_a": ["data", None],
    "layers/0/self_attn/q_proj/lora_b": [None, "model"],
    "layers/1/mlp/down_proj/lora_a": ["model", None],
    "layers/1/mlp/down_proj/lora_b": [None, "data"],
}


def flat_name(path: tuple) -> str:
    return "/".join(str(k) for k in path)


def flat_params(model) -> dict:
    return {flat_name(path): v.get_value() for path, v in nnx.to_flat_state(nnx.state(model))}


# ---- the subprocess (8 devices) ---------------------------------------------------------------------------


def _forward(model, tokens, positions, mask):
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args)[0])
    return np.asarray(run(state, tokens, positions, mask))


def _layout(model, mesh, reference: dict) -> dict:
    rules = {
        flat_name(p): list(v.get_value()) for p, v in nnx.to_flat_state(axes.partition_specs(model, mesh))
    }
    out = {}
    for name, array in flat_params(model).items():
        out[name] = {
            "spec": list(array.sharding.spec) + [None] * (array.ndim - len(array.sharding.spec)),
            "rule_spec": rules[name],
            "on_mesh": array.sharding == NamedSharding(mesh, P(*rules[name])),
            "equal": name not in reference
            or bool(np.array_equal(np.asarray(array), np.asarray(reference[name]))),
        }
    return out


def mesh_checks(folder: Path) -> dict:
    from learner.training.mesh import MeshConfig, make_mesh

    tokens, mask, positions = left_padded_batch(CONFIG["vocab_size"], [8, 5, 1, 3, 8, 2, 7, 4], 8, seed=3)
    _, reference = load_folder(folder)
    ref_params, ref_logits = flat_params(reference), _forward(reference, tokens, positions, mask)
    out: dict = {"devices": jax.device_count(), "layouts": []}
    for data, model_axis in MESHES:
        mesh = make_mesh(MeshConfig(data=data, model=model_axis))
        lora = LoraConfig(rank=4) if (data, model_axis) == (4, 2) else None
        _, model = load_folder(folder, mesh=mesh, lora=lora)
        split = [jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (tokens, positions, mask)]
        logits = _forward(model, *split)
        out["layouts"].append(
            {
                "mesh": [data, model_axis],
                "params": _layout(model, mesh, ref_params),
                "max_logit_diff": float(np.abs(logits - ref_logits)[mask].max()),
                "finite": bool(np.isfinite(logits).all()),
            }
        )
    return out


# ---- the tests --------------------------------------------------------------------------------------------


@pytest.mark.long  # started first (tests/conftest.py): the subprocess takes ten seconds or more
def test_the_sharded_decoder_on_8_devices_equals_the_unsharded_one(tmp_path):
    folder = write_hf_folder(tmp_path / "ckpt", CONFIG, shards=2)
    checks = run_mesh_checks("tests.test_decoder_sharding", folder)
    assert checks["devices"] == 8 and [r["mesh"] for r in checks["layouts"]] == [list(m) for m in MESHES]
    for r in checks["layouts"]:
        mesh = tuple(r["mesh"])
        for name, spec in EXPECTED[mesh].items():
            assert r["params"][name]["spec"] == spec, (mesh, name)
        for name, p in r["params"].items():
            assert p["spec"] == p["rule_spec"] and p["on_mesh"] and p["equal"], (mesh, name, p)
        assert r["max_logit_diff"] < TOL and r["finite"], r["mesh"]
    lora = checks["layouts"][0]["params"]
    for name, spec in LORA_EXPECTED.items():
        assert lora[name]["spec"] == spec, name
    assert sum(name.endswith(("lora_a", "lora_b")) for name in lora) == 2 * 7 * 2


# ---- in-process: annotations and rules --------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_parameter_is_annotated_and_in_the_layout_table(variant):
    cfg = DecoderConfig.from_dict(VARIANTS[variant], "c.json")
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=LoraConfig(rank=2)))
    known = {name for name, _ in axes.LOGICAL_AXIS_RULES}
    base = set()
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        logical = variable.get_metadata().get("out_sharding")
        assert logical is not None and len(logical) == len(variable.get_value().shape), path
        assert set(logical) <= known, path
        if not isinstance(variable, nnx.LoRAParam):
            base.add(path)
    assert base == set(checkpoint_layout(cfg))


def test_smollm2_135m_layout_splits_nearly_everything():
    """SmolLM2-135M's shapes (9 query / 3 kv heads of 64, d 576, MLP 1536, vocab 49152), abstract."""
    cfg = DecoderConfig.from_dict(
        {
            "model_type": "llama",
            "vocab_size": 49152,
            "hidden_size": 576,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "intermediate_size": 1536,
            "rope_theta": 100000.0,
            "tie_word_embeddings": True,
        },
        "smollm2",
    )
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    specs = {
        flat_name(p): v.get_value()
        for p, v in nnx.to_flat_state(axes.partition_specs(model, AbstractMesh((4, 2), ("data", "model"))))
    }
    assert specs["embed_tokens/embedding"] == P("data", None)
    assert specs["layers/0/self_attn/q_proj/kernel"] == P("data", "model")  # 576 heads-dims, 288 per device
    assert specs["layers/0/self_attn/k_proj/kernel"] == P("data", "model")  # 192 kv dims
    assert specs["layers/29/mlp/down_proj/kernel"] == P("model", "data")
    sizes = {flat_name(p): v.get_value().size for p, v in nnx.to_flat_state(nnx.state(model))}
    total = sum(sizes.values())
    assert 134_000_000 < total < 135_000_000  # the 134.5M parameters
    assert sum(sizes[n] for n, s in specs.items() if "data" in s) > 0.99 * total


def test_rules_for_the_decoder_names():
    sizes = {"data": 4, "model": 2}
    assert axes.logical_to_mesh_spec(("embed", "kv_heads"), (32, 32), sizes) == P("data", "model")
    assert axes.logical_to_mesh_spec(("embed", "kv_heads"), (32, 3), sizes) == P("data", None)
    assert axes.logical_to_mesh_spec(("lora_rank", "heads"), (8, 64), sizes) == P(None, "model")
    assert axes.logical_to_mesh_spec(("heads", "lora_rank"), (64, 8), sizes) == P("model", None)


if __name__ == "__main__":  # the subprocess of test_the_sharded_decoder_on_8_devices_equals_the_unsharded_one
    print(json.dumps(mesh_checks(Path(sys.argv[1]))))
