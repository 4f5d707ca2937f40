"""Low-rank adapters (LoRA, Hu et al. 2021) on the decoder's projections.

A projection with an adapter computes x @ W + b + (alpha / rank) * (x @ A) @ B, with W frozen and only A
[d_in, rank] and B [rank, d_out] trained. B starts at zero, so a fresh adapter leaves the model's output
exactly as the checkpoint's. The adapters are `nnx.LoRAParam` variables and the base weights plain
`nnx.Param`s, so `nnx.state(model, ADAPTERS)` is all a LoRA train step updates and all a publisher needs to
send (a few MB instead of the whole base), and `BASE` selects the frozen rest. Folding the adapters
into W for export is `common/backbones/decoder/weights.py:merge_lora`, beside the decoder's weights (this
module is below the decoder, which builds its projections from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.backbones.axes import names

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections of a decoder block that can carry an adapter (Hugging Face / PEFT names)."""

ADAPTERS = nnx.LoRAParam
"""Filter: the adapters only (what a LoRA train step differentiates and a publisher sends)."""
BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
"""Filter: every base weight (nnx.LoRAParam subclasses nnx.Param, so plain nnx.Param would include adapters)."""


class HeadParam(nnx.LoRAParam):
    """A small head's weight on a LoRA-tuned backbone (the LM agent's value head): trained, and sent to
    actors, together with the adapters (the ADAPTERS filter selects it too). A fully fine-tuned model's
    heads are plain nnx.Param: with no adapters, everything trains."""


def has_adapters(params: Any) -> bool:
    """Whether `params` (an nnx.State, or a tree of the same structure such as its shardings) holds LoRA
    adapters (or HeadParams): then only those train, and only those are published."""
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return any(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(params, is_leaf=is_variable))


def split_trained(params: Any) -> tuple[Any, Any]:
    """(what the optimizer updates and actors receive, what stays frozen): (adapters and heads, the base)
    when there are adapters, else (params, None). The frozen part is never differentiated, has no
    optimizer state and is never re-sent."""
    if not has_adapters(params):
        return params, None
    trained, frozen = nnx.split_state(params, nnx.LoRAParam, ...)
    return trained, frozen


@dataclass(frozen=True)
class LoraConfig:
    """Which projections get adapters, and how large."""

    rank: int
    """Inner width r of each adapter (A: [d_in, r], B: [r, d_out])."""
    alpha: float = 16.0
    """The adapter's output is scaled by alpha / rank (PEFT's lora_alpha), so rank changes keep its size."""
    targets: tuple[str, ...] = PROJECTIONS
    """Projection names (of PROJECTIONS) that get an adapter, in every adapted block."""
    last_layers: int = 0
    """Adapt only the last this many blocks (0: every block). The blocks below are then frozen whole, so a
    train step keeps none of their activations and runs no backward pass through them: on a CPU or a
    small device, the difference between a step that fits and one that does not."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be positive, got {self.alpha!r}")
        unknown = sorted(set(self.targets) - set(PROJECTIONS))
        if not isinstance(self.last_layers, int) or self.last_layers < 0:
            raise ValueError(f"LoRA last_layers must be an integer >= 0 (0 = all), got {self.last_layers!r}")
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets must be a non-empty subset of {PROJECTIONS}, got {self.targets}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class Projection(nnx.Module):
    """A torch-style Linear (kernel stored [d_in, d_out], the transpose of torch's weight), with an optional
    bias and an optional LoRA adapter. `axes` are the logical names of the kernel's two dims."""

    def __init__(
        self,
        d_in: int,
        d_out: int,
        axes: tuple[str, str],
        *,
        bias: bool,
        rngs: nnx.Rngs,
        param_dtype: Any = jnp.float32,
        lora: LoraConfig | None = None,
    ):
        init = nnx.initializers.normal(0.02)  # transformers' initializer_range
        self.kernel = nnx.Param(init(rngs.params(), (d_in, d_out), param_dtype), **names(*axes))
        self.bias = nnx.Param(jnp.zeros((d_out,), param_dtype), **names("bias")) if bias else None
        if lora is None:
            self.lora_a = self.lora_b = None
            self.scale = 0.0
        else:  # PEFT's init: A kaiming-uniform (bound 1/sqrt(d_in)), B zero
            bound = 1.0 / np.sqrt(d_in)
            a = jax.random.uniform(rngs.params(), (d_in, lora.rank), param_dtype, -bound, bound)
            self.lora_a = nnx.LoRAParam(a, **names(axes[0], "lora_rank"))
            b = jnp.zeros((lora.rank, d_out), param_dtype)
            self.lora_b = nnx.LoRAParam(b, **names("lora_rank", axes[1]))
            self.scale = lora.scale

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.kernel[...]
        if self.bias is not None:
            y = y + self.bias[...]
        if self.lora_a is not None:
            y = y + lora_delta(x, self.lora_a[...], self.lora_b[...]) * jnp.asarray(self.scale, y.dtype)
        return y


@jax.custom_vjp
def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """(x @ a) @ b, the adapter's update to a projection (before its scale), with the gradient written out:
    JAX's own asked XLA:CPU for the activations transposed ([d_in, tokens], the SwiGLU's [1536, tokens]
    among them, written element by element), which was a quarter of the LM update's time; here only the
    thin [tokens, rank] factors are transposed. Same values (tests/test_decoder_lora.py); the update 4.0 -> 3.3 s
    (benchmarks/lm_agent.py)."""
    return (x @ a) @ b


def _lora_fwd(x, a, b):
    xa = x @ a
    return xa @ b, (x, a, b, xa)


def _lora_bwd(res, g):
    """d/dx = g b^T a^T, d/da = x^T (g b^T), d/db = (x a)^T g, with tokens flattened."""
    x, a, b, xa = res
    x2, g2, xa2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), xa.reshape(-1, a.shape[-1])
    gb = g2 @ b.T
    dx = (gb @ a.T).reshape(x.shape)
    da = jnp.einsum("nr,ni->ri", gb, x2).T
    db = jnp.einsum("nr,no->ro", xa2, g2)
    return dx, da, db


lora_delta.defvjp(_lora_fwd, _lora_bwd)
