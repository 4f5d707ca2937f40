"""A pin on the maths of the update: fixed batches (replay and imitation, A-RIDE and the plain
actor-critic) through the jitted train step, and a fingerprint of the parameters they leave.

Restructuring the policy, the losses or the batch must keep these numbers. A change that alters the maths
on purpose says so in its commit and records the new fingerprints (run this file with PIN_PRINT=1).
The fingerprint is a fixed random projection of every parameter, compared with a relative tolerance, so
it survives float reassociation across XLA versions but not a changed loss, target or gradient.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from common.config import ModelConfig
from common.params_file import flat_to_params, params_to_flat
from common.policies.pointer import network as model
from tests.pinned_batch import pinned_batch, run_updates

CFG = ModelConfig(vocab_size=256, d_model=16, num_heads=2, num_layers=1, mlp_dim=32, max_elements=6,
                  max_instruction_tokens=5, max_element_tokens=3)  # fmt: skip

PINNED = {
    ("aride", False): [-7.65185190764398, 16.226430235087076, -30.687231023437583, 0.7308879834586373],
    ("aride", True): [-7.784373891884947, 16.600412795012904, -30.533723639014184, 0.6455651402027152],
    ("a2c", False): [-7.777713736850026, 16.291619720583988, -30.64825344201587, 0.6677845442079466],
    ("a2c", True): [-7.718172119142402, 16.50841474540713, -30.578655435569065, 0.6926864462448769],
}


def fingerprint(params) -> np.ndarray:
    """[4] float64: projections of all parameters (sorted by name) onto fixed random directions."""
    flat = params_to_flat(jax.device_get(params))
    rng = np.random.default_rng(1234)
    out = np.zeros(4)
    for name in sorted(flat):
        x = np.asarray(flat[name], np.float64).ravel()
        out += rng.standard_normal((4, x.size)) @ x
    return out


@pytest.mark.parametrize(("algorithm", "imitation"), list(PINNED))
def test_fixed_batches_leave_the_pinned_parameters(algorithm: str, imitation: bool):
    batch = pinned_batch(CFG, seed=7)
    params, metrics = run_updates(CFG, batch, algorithm, imitation, updates=3)
    got = fingerprint(params)
    if os.environ.get("PIN_PRINT"):
        print(f"PIN {algorithm} {imitation} {got.tolist()!r} loss {metrics}")
    assert np.isfinite(got).all()
    want = PINNED[(algorithm, imitation)]
    assert want is not None, f"record the fingerprint: {got.tolist()!r}"
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_the_fingerprint_sees_one_changed_parameter():
    """The pin is only as good as its fingerprint: one parameter nudged by 1e-3 moves it past the tolerance."""
    _, params = model.create(CFG, 0)
    flat = params_to_flat(params)
    base = fingerprint(params)
    name = sorted(flat)[len(flat) // 2]
    flat[name] = np.asarray(flat[name]) + 1e-3
    nudged = fingerprint(flat_to_params(params, flat))
    assert not np.allclose(nudged, base, rtol=2e-5)
