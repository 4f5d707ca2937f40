"""The packaged SmolLM2-135M on this machine: prefill and decode tokens/s at batch 1, 8 and 32; the train
step's tokens/s, full fine-tuning against LoRA; and what a published snapshot weighs either way.

Reference in the same process: a jitted chain of [4096, 576] x [576, 576] matmuls (the model's width),
so `vs_matmul` says what share of this machine's dense float32 throughput each path reaches (the GFLOP
of a call come from XLA's cost analysis of the compiled call). The decode row is one KV-cached step
with the cache filled to the prompt length; prefill is the whole prompt in one call, logits of the last
position only (as generation computes them). The train step is next-token cross-entropy through the
whole decoder with Adam, on [batch, length] tokens: the shape of the LM agent's update.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.report import best_seconds, compiled_gflop, matmul_gflops
from common.backbones.decoder import snapshot as decoder_snapshot
from common.backbones.decoder.llama import init_cache
from common.backbones.decoder.lora import LoraConfig
from common.backbones.generate import left_pad
from common.backbones.pretrained import load_pretrained


def _row(path: str, batch: int, tokens: int, seconds: float, gflop: float, ref: float, **extra) -> dict:
    return {
        "path": path,
        "batch": batch,
        "ms_per_call": seconds * 1e3,
        "tokens_per_s": tokens / seconds,
        "gflops": gflop / seconds,
        "vs_matmul": gflop / seconds / ref,
        **extra,
    }


def _inference_rows(model, prompt_len: int, batches, repeats: int, ref: float) -> list[dict]:
    graphdef, state = nnx.split(model)

    def forward(state, tokens, positions, mask, cache):
        logits, cache = nnx.merge(graphdef, state)(tokens, positions, mask, cache, last_only=True)
        return logits[:, -1], cache

    step = jax.jit(forward)
    rows, rng = [], np.random.default_rng(0)
    for b in batches:
        prompts = rng.integers(0, model.cfg.vocab_size, (b, prompt_len)).tolist()
        tokens, positions, mask = left_pad(prompts, prompt_len, b)
        cache = init_cache(model.cfg, b, prompt_len + 16)
        args = (state, tokens, positions, mask, cache)
        rows.append(
            _row("prefill", b, b * prompt_len, _timed(step, args, repeats), compiled_gflop(step, *args), ref)
        )
        _, filled = step(*args)
        one = (state, tokens[:, -1:], positions[:, -1:] + 1, mask[:, -1:], filled)
        rows.append(_row("decode step", b, b, _timed(step, one, repeats), compiled_gflop(step, *one), ref))
    return rows


def _timed(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    return best_seconds(lambda: jax.block_until_ready(fn(*args)), repeats)


def timed_train_step(model, lora: bool, batch: int, length: int, repeats: int) -> dict:
    """One jitted train step of `model` (next-token cross-entropy through the whole decoder, Adam; the
    adapters alone with `lora`) on random [batch, length] tokens: best seconds, GFLOP (XLA's count),
    compile seconds (the first call included) and the trained parameters' MB."""
    trained = nnx.LoRAParam if lora else nnx.Param
    graphdef, params, rest = nnx.split(model, trained, ...)
    optimizer = optax.adam(1e-4)
    opt_state = optimizer.init(params)
    tokens = jnp.asarray(
        np.random.default_rng(1).integers(0, model.cfg.vocab_size, (batch, length)), jnp.int32
    )
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    mask = jnp.ones((batch, length), bool)

    def loss(params, rest):  # the frozen rest is an argument: closed over, XLA would fold 0.5 GB of constants
        logits, _ = nnx.merge(graphdef, params, rest)(tokens, positions, mask)
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    def step(params, opt_state, rest):
        value, grads = jax.value_and_grad(loss)(params, rest)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    jitted = jax.jit(step, donate_argnums=(0, 1))
    t0 = time.perf_counter()
    gflop = compiled_gflop(jitted, params, opt_state, rest)
    state = [params, opt_state]

    def once():
        state[0], state[1], value = jitted(state[0], state[1], rest)
        jax.block_until_ready(value)

    once()
    compile_s = time.perf_counter() - t0
    return {
        "seconds": best_seconds(once, repeats),
        "gflop": gflop,
        "compile_s": compile_s,
        "trained_mb": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state[0])) / 1e6,
    }


def _train_row(lora: LoraConfig | None, batch: int, length: int, repeats: int, ref: float) -> dict:
    step = timed_train_step(
        load_pretrained("default", lora=lora).model, lora is not None, batch, length, repeats
    )
    name = f"train step, LoRA rank {lora.rank}" if lora else "train step, full"
    return _row(
        name, batch, batch * length, step["seconds"], step["gflop"], ref, trained_params_mb=step["trained_mb"]
    )


def _snapshot_rows(tmp) -> list[dict]:
    rows = []
    for lora in (None, LoraConfig(rank=8)):
        model = load_pretrained("default", lora=lora).model
        size = decoder_snapshot.write(tmp / "s.safetensors", model, "default", lora, "float32")
        rows.append(
            {"path": "published snapshot", "lora_rank": lora.rank if lora else 0, "snapshot_mb": size / 1e6}
        )
    return rows


def run(quick: bool) -> list[dict]:
    import tempfile
    from pathlib import Path

    repeats = 2 if quick else 5
    t0 = time.perf_counter()
    model = load_pretrained("default").model
    load_s = time.perf_counter() - t0
    ref = matmul_gflops(model.cfg.hidden_size, repeats)
    rows = _inference_rows(model, 64 if quick else 128, (1, 8) if quick else (1, 8, 32), repeats, ref)
    del model
    length = 64 if quick else 128
    rows += [_train_row(lora, 4, length, repeats, ref) for lora in (None, LoraConfig(rank=8))]
    with tempfile.TemporaryDirectory() as tmp:
        rows += _snapshot_rows(Path(tmp))
    rows.append({"path": "load default checkpoint", "seconds": load_s, "ref_matmul_gflops": ref})
    return rows
