"""refine_near_zero: float32 affine outputs near zero get the float64 sign."""

import numpy as np

from pynnet3.components.affine import refine_near_zero


def test_entries_near_zero_match_float64():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 480)).astype(np.float32)
    w = rng.standard_normal((64, 480)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T + b
    # Move some biases so that a few outputs sit within rounding distance of zero.
    b2 = b.astype(np.float64).copy()
    b2[:8] -= exact[0, :8]
    b2 = b2.astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T + b2
    out = x @ w.T + b2
    refine_near_zero(out, x, w, b2)
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(480) * np.outer(
        np.linalg.norm(x, axis=1), np.linalg.norm(w, axis=1))
    near = np.abs(exact) < bound / 2
    assert near.any()
    np.testing.assert_array_equal(np.sign(out[near]), np.sign(exact[near]))
    np.testing.assert_allclose(out[near], exact[near], rtol=1e-6)
    far = ~near
    np.testing.assert_allclose(out[far], exact[far], rtol=1e-3, atol=1e-3)
