"""`python -m learner generate` and `python -m learner export` on tiny Hugging Face folders.

generate: with --prompt-ids and --temperature 0 the JSON holds the greedy continuation and its
log-probabilities as the float64 reference computes them (Llama, Qwen2, Qwen3); --prompt goes through the
folder's chat template unless --no-chat; every fault is one line and exit status 2.
export: the folder written loads back with equal logits and the same tokenizer; a run's LoRA snapshot is
exported merged (logits equal to the unmerged model's); a taken target or a bad snapshot is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.backbones.checkpoint import CheckpointError
from common.backbones.decoder import snapshot as decoder_snapshot
from common.backbones.decoder.lora import LoraConfig
from common.backbones.decoder.tokenizer import DecoderTokenizer
from common.backbones.pretrained import load_pretrained
from learner.tools.export import ExportConfig, export
from learner.tools.generate import GenerateConfig, generate
from tests.conftest import ROOT
from tests.decoder_reference import VARIANTS, random_hf_tensors, write_hf_folder
from tests.test_decoder_generate import reference_step_logp
from tests.test_decoder_tokenizer import tiny_metadata

PROMPT = [5, 9, 14, 3, 22]


def folder_of(tmp_path, variant: str, seed: int = 0, tokenizer: bool = False):
    """(config, tensors, folder) of a tiny checkpoint; with `tokenizer`, a byte-level BPE tokenizer (267
    tokens, so the vocabulary grows to 272) saved beside it."""
    config = dict(VARIANTS[variant])
    if tokenizer:
        config["vocab_size"] = 272
    tensors = random_hf_tensors(config, seed)
    folder = write_hf_folder(tmp_path / variant, config, tensors)
    if tokenizer:
        DecoderTokenizer.from_gguf(tiny_metadata("gpt-2"), "tiny.gguf").save(folder)
    return config, tensors, folder


def assert_greedy_reference(config, tensors, result: dict) -> None:
    prefix = list(result["prompt_ids"])
    for token, logp in zip(result["tokens"], result["logprobs"], strict=True):
        want = reference_step_logp(config, tensors, prefix, 0.0)
        assert token == int(np.argmax(want)) and logp == pytest.approx(want[token], abs=1e-3)
        prefix.append(token)


def test_the_generate_command_writes_the_reference_greedy_continuation(tmp_path):
    config, tensors, folder = folder_of(tmp_path, "llama_tied")
    out = tmp_path / "out.json"
    ids = ",".join(map(str, PROMPT))
    cmd = [sys.executable, "-m", "learner", "generate", "--model", str(folder), "--prompt-ids", ids,
           "--max-new-tokens", "6", "--temperature", "0", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["prompt_ids"] == PROMPT and len(result["tokens"]) == 6 and result["text"] is None
    assert_greedy_reference(config, tensors, result)


@pytest.mark.parametrize("variant", ["qwen2_bias", "qwen3_qknorm"])
def test_generate_on_qwen_folders_equals_the_reference(tmp_path, variant):
    config, tensors, folder = folder_of(tmp_path, variant, seed=4)
    result = generate(GenerateConfig(model=str(folder), prompt_ids="5, 9,14,3,22", max_new_tokens=5))
    assert result["prompt_ids"] == PROMPT
    assert_greedy_reference(config, tensors, result)


def test_a_text_prompt_goes_through_the_chat_template(tmp_path):
    _, _, folder = folder_of(tmp_path, "llama_tied", tokenizer=True)
    tok = DecoderTokenizer.from_folder(folder)
    chat = generate(GenerateConfig(model=str(folder), prompt="the 123", max_new_tokens=3))
    assert chat["prompt_ids"] == tok.encode(tok.chat_prompt("the 123"))
    assert chat["prompt_ids"] != tok.encode("the 123")
    assert chat["text"] == tok.decode(chat["tokens"], skip_special=True)
    plain = generate(GenerateConfig(model=str(folder), prompt="the 123", no_chat=True, max_new_tokens=3))
    assert plain["prompt_ids"] == tok.encode("the 123")


def test_generate_faults_are_one_line(tmp_path, capsys):
    from learner.tools.generate import main

    assert main(GenerateConfig(model=str(tmp_path / "nowhere"), prompt_ids="1", max_new_tokens=2)) == 2
    assert "nowhere: no such file or folder" in capsys.readouterr().err
    _, _, folder = folder_of(tmp_path, "llama_tied")
    assert main(GenerateConfig(model=str(folder), prompt="hi", max_new_tokens=2)) == 2
    assert "no tokenizer.json" in capsys.readouterr().err
    assert main(GenerateConfig(model=str(folder), prompt_ids="1,99", max_new_tokens=2)) == 2
    assert "outside the vocabulary" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="exactly one of"):
        GenerateConfig(prompt="a", prompt_ids="1")
    with pytest.raises(SystemExit, match="comma-separated integers"):
        generate(GenerateConfig(model=str(folder), prompt_ids="1,x"))


def logits_of(model, tokens) -> np.ndarray:
    tokens = jnp.asarray([tokens], jnp.int32)
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    return np.asarray(model(tokens, positions, jnp.ones(tokens.shape, bool))[0])


@pytest.mark.parametrize("variant", ["llama_tied", "qwen2_bias", "qwen3_qknorm", "llama3_scaled"])
def test_an_exported_folder_loads_back_with_equal_logits(tmp_path, variant):
    _, tensors, folder = folder_of(tmp_path, variant, tokenizer=True)
    out = export(ExportConfig(source=str(folder), out_dir=tmp_path / "hf"))
    source, back = load_pretrained(folder), load_pretrained(out)
    np.testing.assert_array_equal(logits_of(back.model, PROMPT), logits_of(source.model, PROMPT))
    assert back.config == source.config
    assert back.tokenizer.encode("the 12345") == source.tokenizer.encode("the 12345")
    assert back.tokenizer.chat_template == source.tokenizer.chat_template
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == VARIANTS[variant]["model_type"] and written["torch_dtype"] == "float32"
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
    assert names == {n for n in tensors if "rotary_emb" not in n}  # Hugging Face's own names


def randomize_adapters(model, seed: int) -> None:
    """Give every LoRA matrix random values (B starts at zero, where merged and unmerged agree trivially)."""
    state = nnx.state(model, nnx.LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    values = [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    nnx.update(model, jax.tree.unflatten(tree, values))


def test_a_runs_lora_snapshot_exports_merged(tmp_path):
    _, _, folder = folder_of(tmp_path, "qwen2_bias", tokenizer=True)
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    trained = load_pretrained(folder, lora=lora).model
    randomize_adapters(trained, 0)
    run_dir = tmp_path / "run"
    size = decoder_snapshot.write(run_dir / "decoder.safetensors", trained, str(folder), lora, "float32")
    assert size < 40_000  # the adapters only: the base alone is ~110 kB
    out = export(ExportConfig(source=str(run_dir), out_dir=tmp_path / "hf"))
    back = load_pretrained(out).model
    base = load_pretrained(folder).model
    want = logits_of(trained, PROMPT)
    np.testing.assert_allclose(logits_of(back, PROMPT), want, atol=1e-5)
    assert np.abs(logits_of(base, PROMPT) - want).max() > 1e-2  # the adapters changed the model


def test_export_refuses_a_taken_target_and_a_bad_snapshot(tmp_path):
    _, _, folder = folder_of(tmp_path, "llama_tied")
    (tmp_path / "taken").mkdir()
    with pytest.raises(CheckpointError, match="already exists"):
        export(ExportConfig(source=str(folder), out_dir=tmp_path / "taken"))
    lora = LoraConfig(rank=2)
    model = load_pretrained(folder, lora=lora).model
    path = tmp_path / "run" / "decoder.safetensors"
    decoder_snapshot.write(path, model, str(folder), lora, "float32")
    meta, flat = decoder_snapshot.read(path)
    from safetensors.numpy import save_file

    save_file(
        dict(list(flat.items())[1:]),
        str(path),
        metadata={"decoder": json.dumps({**meta, "lora": vars(lora)})},
    )
    with pytest.raises(CheckpointError, match="snapshot has no tensor"):
        export(ExportConfig(source=str(tmp_path / "run"), out_dir=tmp_path / "hf"))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()
