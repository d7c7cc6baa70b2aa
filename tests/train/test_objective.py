"""compute_objective (Kaldi's ComputeObjectiveFunction for dense supervision): totals
against float64 sums written out, and the non-finite supervision check."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.errors import RuntimeInputError
from pynnet3.train import compute_objective


def _data(rng, rows=300, cols=37):
    out = rng.standard_normal((rows, cols)).astype(np.float32)
    y = rng.random((rows, cols)).astype(np.float32)
    return out, y


def test_linear_and_quadratic_totals():
    rng = np.random.default_rng(0)
    out, y = _data(rng)
    objf, weight, deriv = compute_objective("linear", out, y, "o")
    assert objf == pytest.approx(float(np.sum(out.astype(np.float64) * y)), rel=1e-6)
    assert weight == float(np.sum(y.astype(np.float64)))
    assert deriv is not None and np.array_equal(deriv, y)
    objf, weight, deriv = compute_objective("quadratic", out, y, "o")
    diff = y.astype(np.float64) - out
    assert objf == pytest.approx(-0.5 * float(np.sum(diff * diff)), rel=1e-6)
    assert weight == out.shape[0]
    np.testing.assert_allclose(deriv, diff, rtol=0, atol=1e-6)
    # float64 outputs are summed in float64 throughout
    objf64, _, _ = compute_objective("linear", out.astype(np.float64), y, "o")
    assert objf64 == pytest.approx(float(np.sum(out.astype(np.float64) * y)), rel=1e-12)


@pytest.mark.parametrize("bad", [[np.inf], [np.nan], [np.inf, -np.inf], [-np.inf]])
def test_non_finite_supervision_is_refused(bad):
    rng = np.random.default_rng(1)
    out, y = _data(rng)
    for k, v in enumerate(bad):
        y[3 + k, 5] = v
    with pytest.raises(RuntimeInputError, match="non-finite value"):
        compute_objective("linear", out, y, "o")


def test_large_finite_supervision_is_accepted():
    """(the check sums in float64: no overflow for values near float32's largest)"""
    out = np.ones((4, 3), np.float32)
    y = np.full((4, 3), 3.0e38, np.float32)
    _, weight, _ = compute_objective("linear", out, y, "o")
    assert weight == pytest.approx(12 * 3.0e38)
