"""Llama 3's RoPE frequency scaling, recovered from the per-frequency factors a GGUF file stores.

Hugging Face describes the scaling by four numbers (`factor`, `low_freq_factor`, `high_freq_factor`,
`original_max_position_embeddings`); llama.cpp's converter instead writes the factor each rotary frequency is
divided by (`rope_freqs.weight`): 1 for short wavelengths, `factor` for long ones, and in between
1 / ((1 - s) / factor + s) with s linear in 1 / wavelength. The four numbers are not all determined by the
factors (only the two wavelength thresholds are), so `llama3_scaling` fixes low_freq_factor = 1 (as every
Llama 3.x release has it), solves for the rest, and checks that the result reproduces every stored factor.
"""

from __future__ import annotations

import math

import numpy as np

from common.backbones.checkpoint import CheckpointError

_TOL = 1e-4


def llama3_factors(scaling: dict, head_dim: int, theta: float) -> np.ndarray:
    """The per-frequency divisors of a Hugging Face llama3 `rope_scaling` dict, as llama.cpp's converter
    computes them (float64)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    smooth = (old / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mid))


def _thresholds(wavelen: np.ndarray, factors: np.ndarray, factor: float) -> tuple[float, float]:
    """(high-frequency wavelength threshold, low-frequency one) consistent with the factors."""
    smooth = (factors > 1 + _TOL) & (factors < factor * (1 - _TOL))
    s = (1 / factors - 1 / factor) / (1 - 1 / factor)  # 0 at `factor`, 1 at 1, linear in 1/wavelen
    if smooth.sum() >= 2:  # the line through the smooth points gives both thresholds exactly
        slope, offset = np.polyfit(1 / wavelen[smooth], s[smooth], 1)
        return slope / (1 - offset), slope / -offset
    unscaled = wavelen[factors <= 1 + _TOL]
    scaled = wavelen[factors >= factor * (1 - _TOL)]
    below = unscaled.max() if unscaled.size else wavelen.min() / 2
    above = scaled.min() if scaled.size else wavelen.max() * 2
    if not smooth.any():
        return below + (above - below) / 3, below + 2 * (above - below) / 3
    w, t = wavelen[smooth][0], s[smooth][0]
    high = (below + w) / 2  # any threshold under the one smooth point; the line through both fixes the other
    slope = (t - 1) / (1 / w - 1 / high)
    return high, 1 / (1 / high - 1 / slope)


def llama3_scaling(factors: np.ndarray, head_dim: int, theta: float, where: str) -> dict | None:
    """The Hugging Face `rope_scaling` dict (rope_type llama3) whose factors equal `factors`, None when every
    factor is 1, CheckpointError naming `where` when no llama3 scaling produces them."""
    factors = np.asarray(factors, np.float64)
    if factors.shape != (head_dim // 2,):
        raise CheckpointError(
            f"{where}: rope_freqs has {factors.size} factors, head_dim {head_dim} needs {head_dim // 2}"
        )
    if np.allclose(factors, 1.0, rtol=0, atol=_TOL):
        return None
    factor = float(factors.max())
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    high_wl, low_wl = _thresholds(wavelen, factors, factor)
    exact = _dict(factor, low_wl / high_wl, float(low_wl))
    tidy = _dict(round(factor, 4), round(low_wl / high_wl, 4), round(low_wl))  # 8192, not 8191.99997
    for scaling in (tidy, exact):
        if np.allclose(llama3_factors(scaling, head_dim, theta), factors, rtol=_TOL, atol=0):
            return scaling
    raise CheckpointError(
        f"{where}: the rope_freqs factors are not a Llama 3 frequency scaling; this RoPE variant is not supported"
    )


def _dict(factor: float, high_freq_factor: float, original: float | int) -> dict:
    return {
        "rope_type": "llama3",
        "factor": float(factor),
        "low_freq_factor": 1.0,
        "high_freq_factor": float(high_freq_factor),
        "original_max_position_embeddings": original,
    }
