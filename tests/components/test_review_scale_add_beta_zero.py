"""blas.scale_add promises the floats of ``c *= beta; c += a``. OpenBLAS's ?geadd
(through ?axpby) special-cases beta == 0: it writes ``a`` without reading ``c``, so
an inf or NaN in ``c`` vanished where the two passes give NaN (0 * inf). A
``Sum(Scale(0.0, x), y)`` descriptor compiles into exactly that pair."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import blas


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_add_with_beta_zero_keeps_the_two_passes_non_finite_values(dtype, bad):
    rng = np.random.default_rng(0)
    c = rng.standard_normal((160, 128)).astype(dtype)
    c[3, 5] = bad
    a = rng.standard_normal(c.shape).astype(dtype)
    want = c.copy()
    with np.errstate(invalid="ignore"):
        want *= 0.0
    want += a
    if not blas.scale_add(c, a, 0.0):  # (declined: the caller runs the two passes)
        with np.errstate(invalid="ignore"):
            c *= 0.0
        c += a
    np.testing.assert_array_equal(c, want)
    assert np.isnan(c[3, 5])
