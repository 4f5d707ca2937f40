"""benchmarks/lm_ratios.py's statistics (per-token against step-level importance weights), on steps whose
ratios are known, against the definitions written out here."""

from __future__ import annotations

import numpy as np

from benchmarks.lm_ratios import lag_row


def test_step_and_token_weights_follow_their_definitions():
    log2 = np.log(2.0)
    mu = [np.zeros(2), np.zeros(3), np.zeros(1), np.zeros(2)]
    pi = [
        np.array([log2, -log2]),  # rho_k = 2, 1/2: step ratio 1
        np.array([-log2, -log2, 0.0]),  # step ratio 1/4
        np.array([log2]),  # step ratio 2
        np.array([0.0, 0.0]),  # a step at another lag: left out
    ]
    row = lag_row("run", 1, 3, pi, mu, np.array([1, 2, 3, 0]))
    w_step = np.array([1.0, 0.25, 1.0])
    w_token = np.array([1.0, 0.5, 0.5, 0.5, 1.0, 1.0])
    assert (row["steps"], row["tokens"], row["lag"]) == (3, 6, "1-3")
    np.testing.assert_allclose(row["w_step_mean"], w_step.mean())
    np.testing.assert_allclose(row["w_token_mean"], w_token.mean())
    np.testing.assert_allclose(row["ess_step"], w_step.sum() ** 2 / (w_step**2).sum() / 3)
    np.testing.assert_allclose(row["ess_token"], w_token.sum() ** 2 / (w_token**2).sum() / 6)
    np.testing.assert_allclose(row["rho_step_max"], 2.0)
    np.testing.assert_allclose(row["rho_step_p50"], 1.0)
    np.testing.assert_allclose(row["max_abs_log_rho"], log2)
    # |w_step - mean_k w_k| per step: |1 - 0.75|, |0.25 - 2/3|, |1 - 1|.
    np.testing.assert_allclose(row["gap_mean"], np.mean([0.25, 2 / 3 - 0.25, 0.0]))
    np.testing.assert_allclose(row["std_log_rho_step"], np.std([0.0, -2 * log2, log2]))
