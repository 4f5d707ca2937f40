"""The BERT-family encoder (common/backbones/bert.py) against a slow numpy reference, on a tiny random
checkpoint written here in the Hugging Face layout (config.json + model.safetensors), and its errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import save_file

from common.backbones import CheckpointError, bert

CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "vocab_size": 40,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 24,
    "max_position_embeddings": 10,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
}


def random_tensors(cfg: dict, seed: int = 0, prefix: str = "") -> dict[str, np.ndarray]:
    """Every tensor of a BertModel in torch's layout (Linear weights [out, in]), plus a pooler we ignore."""
    rng = np.random.default_rng(seed)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]

    def r(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    t = {
        "embeddings.word_embeddings.weight": r(cfg["vocab_size"], h),
        "embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": r(cfg["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": 1 + r(h),
        "embeddings.LayerNorm.bias": r(h),
        "pooler.dense.weight": r(h, h),
    }
    for n in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{n}"
        for name in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
        ):
            t[f"{p}.{name}.weight"], t[f"{p}.{name}.bias"] = r(h, h), r(h)
        t[f"{p}.intermediate.dense.weight"], t[f"{p}.intermediate.dense.bias"] = r(i, h), r(i)
        t[f"{p}.output.dense.weight"], t[f"{p}.output.dense.bias"] = r(h, i), r(h)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[f"{p}.{name}.weight"], t[f"{p}.{name}.bias"] = 1 + r(h), r(h)
    return {prefix + k: v for k, v in t.items()}


def old_layout(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same tensors as a BertFor* model with old LayerNorm names saves them ("bert." prefix, gamma/beta)."""
    return {
        "bert."
        + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in tensors.items()
    }


def write_checkpoint(folder, cfg=CONFIG, tensors=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(random_tensors(cfg) if tensors is None else tensors, str(folder / "model.safetensors"))
    return folder


def reference(t: dict[str, np.ndarray], cfg: dict, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """BertModel's token states, one sequence, one head and one token at a time, in float64."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = h // heads
    eps = cfg["layer_norm_eps"]
    t = {k: v.astype(np.float64) for k, v in t.items()}

    def ln(x, name):
        mu, var = x.mean(), x.var()
        return (x - mu) / math.sqrt(var + eps) * t[f"{name}.weight"] + t[f"{name}.bias"]

    def dense(x, name):
        return t[f"{name}.weight"] @ x + t[f"{name}.bias"]

    def gelu(x):
        return np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])

    out = np.zeros((*ids.shape, h))
    for b in range(ids.shape[0]):
        n = ids.shape[1]
        x = [
            ln(
                t["embeddings.word_embeddings.weight"][ids[b, j]]
                + t["embeddings.position_embeddings.weight"][j]
                + t["embeddings.token_type_embeddings.weight"][0],
                "embeddings.LayerNorm",
            )
            for j in range(n)
        ]
        for layer in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{layer}"
            q = [dense(v, f"{p}.attention.self.query") for v in x]
            k = [dense(v, f"{p}.attention.self.key") for v in x]
            val = [dense(v, f"{p}.attention.self.value") for v in x]
            new = []
            for j in range(n):
                context = np.zeros(h)
                for head in range(heads):
                    s = slice(head * d, (head + 1) * d)
                    real = [m for m in range(n) if mask[b, m]] or list(range(n))  # all padded: uniform
                    scores = np.array([q[j][s] @ k[m][s] / math.sqrt(d) for m in real])
                    w = np.exp(scores - scores.max())
                    w /= w.sum()
                    context[s] = sum(wi * val[m][s] for wi, m in zip(w, real, strict=True))
                a = ln(
                    x[j] + dense(context, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm"
                )
                mlp = dense(gelu(dense(a, f"{p}.intermediate.dense")), f"{p}.output.dense")
                new.append(ln(a + mlp, f"{p}.output.LayerNorm"))
            x = new
        out[b] = np.stack(x)
    return out


IDS = np.array([[2, 17, 5, 39, 8, 0, 0], [3, 4, 1, 22, 11, 30, 6]])
MASK = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]], bool)


def test_token_states_and_pooling_match_the_numpy_reference(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt")
    cfg, encoder = bert.load(folder)
    assert cfg.hidden_size == 16 and cfg.num_hidden_layers == 2
    got = np.asarray(encoder(IDS, MASK))
    want = reference(random_tensors(CONFIG), CONFIG, IDS, MASK)
    np.testing.assert_allclose(got[MASK], want[MASK], rtol=1e-4, atol=1e-5)
    pooled = np.asarray(bert.mean_pool(got, MASK))
    np.testing.assert_allclose(pooled[0], want[0, :5].mean(axis=0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pooled[1], want[1].mean(axis=0), rtol=1e-4, atol=1e-5)


def test_padding_does_not_change_the_real_tokens(tmp_path):
    _, encoder = bert.load(write_checkpoint(tmp_path / "ckpt"))
    short = np.asarray(encoder(IDS[:1, :5], MASK[:1, :5]))
    padded = np.asarray(encoder(IDS[:1], MASK[:1]))
    np.testing.assert_allclose(padded[0, :5], short[0], rtol=1e-5, atol=1e-6)


def test_prefixed_and_gamma_beta_checkpoints_load_the_same(tmp_path):
    plain = random_tensors(CONFIG)
    renamed = old_layout(plain)
    _, a = bert.load(write_checkpoint(tmp_path / "plain"))
    _, b = bert.load(write_checkpoint(tmp_path / "renamed", tensors=renamed))
    np.testing.assert_array_equal(np.asarray(a(IDS, MASK)), np.asarray(b(IDS, MASK)))


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        (lambda f: None, "not a folder"),
        (lambda f: (f.mkdir(), None), "no config.json"),
        (lambda f: write_checkpoint(f, {**CONFIG, "model_type": "gpt2"}), "model_type 'gpt2'"),
        (
            lambda f: write_checkpoint(
                f, {k: v for k, v in CONFIG.items() if k != "hidden_size"}, random_tensors(CONFIG)
            ),
            "lacks hidden_size",
        ),
        (lambda f: write_checkpoint(f, {**CONFIG, "num_attention_heads": 5}), "not a multiple"),
        (lambda f: (write_checkpoint(f), (f / "model.safetensors").unlink()), "no model.safetensors"),
        (lambda f: _truncate(write_checkpoint(f) / "model.safetensors"), "not a complete safetensors file"),
        (
            lambda f: write_checkpoint(
                f,
                tensors={
                    k: v for k, v in random_tensors(CONFIG).items() if "layer.1.output.dense.bias" not in k
                },
            ),
            "no tensor encoder.layer.1.output.dense.bias",
        ),
        (
            lambda f: write_checkpoint(
                f,
                tensors={
                    **random_tensors(CONFIG),
                    "embeddings.word_embeddings.weight": np.zeros((41, 16), "f4"),
                },
            ),
            "tensor embeddings.word_embeddings.weight has shape (41, 16), config.json implies (40, 16)",
        ),
    ],
)
def test_a_bad_checkpoint_gets_one_message_naming_folder_and_fault(tmp_path, break_it, says):
    folder = tmp_path / "ckpt"
    break_it(folder)
    with pytest.raises(CheckpointError, match="ckpt") as err:
        bert.load(folder)
    assert says in str(err.value)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
