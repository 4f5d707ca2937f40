"""Reading and writing decoder checkpoints: DecoderConfig from config.json (and back), load_folder on one
model.safetensors or a sharded model.safetensors.index.json, from_tensors, the to_tensors export round trip,
and one clear CheckpointError per bad checkpoint (the same on and off a device mesh)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from common.backbones import CheckpointError
from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.lora import LoraConfig
from common.backbones.decoder.weights import from_tensors, load_folder, to_tensors
from tests.decoder_reference import VARIANTS, left_padded_batch, random_hf_tensors, write_hf_folder
from tests.test_decoder_model import forward


def flat_params(model) -> dict:
    return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model))}


# ---- config.json -------------------------------------------------------------------------------------------


def test_configs_read_each_kind():
    llama = DecoderConfig.from_dict(VARIANTS["llama_tied"], "c.json")
    assert (llama.head_dim, llama.num_key_value_heads, llama.attention_bias, llama.qk_norm) == (
        8,
        2,
        False,
        False,
    )
    assert llama.tie_word_embeddings and llama.rope_scaling is None and llama.eos_token_id == (2,)
    qwen2 = DecoderConfig.from_dict(VARIANTS["qwen2_bias"], "c.json")
    assert qwen2.attention_bias and not qwen2.o_proj_bias and qwen2.eos_token_id == (2, 3)
    qwen3 = DecoderConfig.from_dict(VARIANTS["qwen3_qknorm"], "c.json")
    assert qwen3.qk_norm and qwen3.head_dim == 16 and not qwen3.attention_bias
    llama3 = DecoderConfig.from_dict(VARIANTS["llama3_scaled"], "c.json")
    assert llama3.rope_scaling == (
        ("factor", 8.0),
        ("high_freq_factor", 4.0),
        ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 64),
        ("rope_type", "llama3"),
    )
    assert llama3.o_proj_bias
    minimal = {
        k: VARIANTS["llama_tied"][k]
        for k in (
            "model_type",
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
        )
    }
    plain = DecoderConfig.from_dict(minimal, "c.json")  # transformers' defaults
    assert (plain.num_key_value_heads, plain.rope_theta, plain.tie_word_embeddings, plain.bos_token_id) == (
        4,
        10000.0,
        False,
        None,
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_to_dict_reads_back(variant):
    cfg = DecoderConfig.from_dict(VARIANTS[variant], "c.json")
    raw = json.loads(json.dumps(cfg.to_dict()))
    assert DecoderConfig.from_dict(raw, "c.json") == cfg
    assert raw["architectures"] == VARIANTS[variant]["architectures"] and raw["hidden_act"] == "silu"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not a supported decoder"),
        ({"hidden_size": None}, "lacks hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        (
            {"num_attention_heads": 5, "num_key_value_heads": 5},
            "hidden_size 32 is not a multiple of num_attention_heads 5",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling type 'linear'"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "rope_scaling high_freq_factor must be a positive number, got None",
        ),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
        ({"eos_token_id": "2"}, "eos_token_id must be a token id"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_bad_configs_name_the_file_and_the_field(change, says):
    raw = {**VARIANTS["llama_tied"], **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(CheckpointError) as err:
        DecoderConfig.from_dict(raw, "/ckpt/config.json")
    assert str(err.value).startswith("/ckpt/config.json: ") and says in str(err.value)


# ---- loading -----------------------------------------------------------------------------------------------


def test_a_sharded_index_loads_the_same_weights(tmp_path):
    config = VARIANTS["qwen3_qknorm"]
    tensors = random_hf_tensors(config, 4)
    _, single = load_folder(write_hf_folder(tmp_path / "one", config, tensors))
    sharded_folder = write_hf_folder(tmp_path / "three", config, tensors, shards=3)
    assert len(list(sharded_folder.glob("model-*-of-00003.safetensors"))) == 3
    _, sharded = load_folder(sharded_folder)
    want, got = flat_params(single), flat_params(sharded)
    assert set(got) == set(want)
    for path, value in got.items():
        np.testing.assert_array_equal(value, want[path], err_msg=str(path))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_to_tensors_inverts_from_tensors(variant):
    config = VARIANTS[variant]
    tensors = random_hf_tensors(config, 2)
    cfg = DecoderConfig.from_dict(config, "c.json")
    exported = to_tensors(from_tensors(cfg, tensors, where="mem"))
    used = {k for k in tensors if "rotary_emb" not in k}  # the buffer a loader ignores
    assert set(exported) == used
    for name in used:
        assert exported[name].dtype == np.float32
        np.testing.assert_array_equal(exported[name], tensors[name], err_msg=name)


def test_an_export_loads_back_with_equal_logits(tmp_path):
    """LoRA (B changed) -> to_tensors + config.to_dict -> save_file -> load_folder: the same logits."""
    config = VARIANTS["llama3_scaled"]
    cfg, model = load_folder(
        write_hf_folder(tmp_path / "src", config), lora=LoraConfig(rank=2, targets=("v_proj", "up_proj"))
    )
    for _, variable in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        variable.set_value(variable.get_value() + 0.1)
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_file(to_tensors(model), str(out / "model.safetensors"))
    cfg2, loaded = load_folder(out)
    assert cfg2 == cfg
    tokens, mask, positions = left_padded_batch(64, [8, 5, 1], 8, seed=3)
    want, _ = forward(model, tokens, mask, positions)
    got, _ = forward(loaded, tokens, mask, positions)
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-4)


# ---- bad checkpoints ---------------------------------------------------------------------------------------

CONFIG = VARIANTS["qwen2_bias"]
MISSING = "model.layers.1.self_attn.k_proj.bias"


def _without(name):
    return {k: v for k, v in random_hf_tensors(CONFIG).items() if k != name}


def _misshapen():
    return {**random_hf_tensors(CONFIG), "model.layers.0.mlp.up_proj.weight": np.zeros((48, 31), np.float32)}


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _index_without_shard(folder):
    write_hf_folder(folder, CONFIG, shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()


FAULTS = {
    "missing_folder": (lambda f: None, "{f}: not a folder"),
    "missing_config": (
        lambda f: (write_hf_folder(f, CONFIG), (f / "config.json").unlink()),
        "{f}: no config.json",
    ),
    "unknown_model_type": (
        lambda f: write_hf_folder(f, {**CONFIG, "model_type": "mistral"}),
        "{f}/config.json: model_type 'mistral'",
    ),
    "no_weights": (
        lambda f: (write_hf_folder(f, CONFIG), (f / "model.safetensors").unlink()),
        "{f}: no model.safetensors (nor a sharded model.safetensors.index.json)",
    ),
    "missing_tensor": (
        lambda f: write_hf_folder(f, CONFIG, _without(MISSING)),
        f"{{f}}: model.safetensors has no tensor {MISSING}",
    ),
    "missing_tensor_in_index": (
        lambda f: write_hf_folder(f, CONFIG, _without(MISSING), shards=2),
        f"{{f}}: model.safetensors.index.json has no tensor {MISSING}",
    ),
    "misshapen_tensor": (
        lambda f: write_hf_folder(f, CONFIG, _misshapen()),
        "{f}: tensor model.layers.0.mlp.up_proj.weight has shape (48, 31), config.json implies (48, 32)",
    ),
    "truncated": (
        lambda f: _truncate(write_hf_folder(f, CONFIG) / "model.safetensors"),
        "{f}/model.safetensors: not a complete safetensors file",
    ),
    "truncated_shard": (
        lambda f: _truncate(write_hf_folder(f, CONFIG, shards=2) / "model-00001-of-00002.safetensors"),
        "{f}/model-00001-of-00002.safetensors: not a complete safetensors file",
    ),
    "index_names_a_missing_shard": (
        _index_without_shard,
        "{f}/model.safetensors.index.json: tensor model.embed_tokens.weight is in shard model-00002-of-00002.safetensors, which is not in {f}",
    ),
}


def one_device_mesh():
    return jax.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_checkpoint_gets_one_message_naming_file_and_tensor(tmp_path, fault):
    folder = tmp_path / "ckpt"
    make, says = FAULTS[fault]
    make(folder)
    with pytest.raises(CheckpointError) as plain:
        load_folder(folder)
    assert str(plain.value).startswith(says.format(f=folder)), str(plain.value)
    with pytest.raises(CheckpointError) as sharded:
        load_folder(folder, mesh=one_device_mesh())
    assert str(sharded.value) == str(plain.value)


def test_from_tensors_names_where_they_came_from():
    cfg = DecoderConfig.from_dict(CONFIG, "c.json")
    with pytest.raises(CheckpointError, match=f"^/m/x.gguf: the checkpoint has no tensor {MISSING}$"):
        from_tensors(cfg, _without(MISSING), where="/m/x.gguf")
    with pytest.raises(
        CheckpointError, match=r"^/m/x.gguf: tensor model.layers.0.mlp.up_proj.weight has shape \(48, 31\)"
    ):
        from_tensors(cfg, _misshapen(), where="/m/x.gguf")
