"""RangeIndexes.window_sums: both strategies (per-window sums when the windows
cover the rows about once, float64 prefix sums when they overlap a lot) equal the
definition, summed in float64 from the float32 rows."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.statistics import RangeIndexes


def _definition(v, perm, lo, hi):
    return np.array([v[perm[a:b]].astype(np.float64).sum(0) if b > a
                     else np.zeros(v.shape[1]) for a, b in zip(lo, hi, strict=True)])


@pytest.mark.parametrize("overlap", [False, True])
def test_window_sums_match_the_definition(overlap):
    rng = np.random.default_rng(7 + overlap)
    for _ in range(200):
        nin = int(rng.integers(1, 40))
        m = int(rng.integers(0, nin + 1))
        perm = rng.permutation(nin)[:m].astype(np.int64)
        k = int(rng.integers(1, 6)) * (8 if overlap else 1)
        lo = rng.integers(0, m + 1, k).astype(np.int64)
        hi = np.minimum(m, lo + rng.integers(0, m + 1, k)).astype(np.int64)
        r = RangeIndexes(perm, lo, hi, nin)
        v = rng.standard_normal((nin, 3)).astype(np.float32)
        np.testing.assert_allclose(r.window_sums(v), _definition(v, perm, lo, hi),
                                   rtol=1e-9, atol=1e-9)


def test_one_window_per_sequence_is_summed_directly(monkeypatch):
    perm = np.arange(20, dtype=np.int64)
    r = RangeIndexes(perm, np.array([0, 10]), np.array([10, 20]), 20)
    monkeypatch.setattr(np, "cumsum", None)  # the prefix-sum path would fail
    v = np.arange(40, dtype=np.float32).reshape(20, 2)
    np.testing.assert_array_equal(r.window_sums(v), _definition(v, perm, [0, 10], [10, 20]))


def test_many_short_windows():
    rng = np.random.default_rng(11)
    for _ in range(100):
        nin = int(rng.integers(600, 700))
        perm = rng.permutation(nin).astype(np.int64)
        lo = np.sort(rng.integers(0, nin, 600)).astype(np.int64)
        hi = np.minimum(nin, lo + rng.integers(0, 3, 600)).astype(np.int64)
        r = RangeIndexes(perm, lo, hi, nin)
        v = rng.standard_normal((nin, 2)).astype(np.float32)
        np.testing.assert_allclose(r.window_sums(v), _definition(v, perm, lo, hi),
                                   rtol=1e-12, atol=1e-12)


def test_from_data_rejects_a_row_listed_twice():
    """A cache file cannot hand spread() a perm with duplicates (it writes each input
    row once, so a duplicate would lose a contribution)."""
    good = {"perm": np.array([1, 0]), "lo": np.array([0]), "hi": np.array([2]),
            "num_input_rows": 2}
    assert RangeIndexes.from_data(good).perm.tolist() == [1, 0]
    with pytest.raises(ValueError, match="listed twice"):
        RangeIndexes.from_data({**good, "perm": np.array([0, 0])})


@pytest.mark.parametrize("layout", ["sequences", "some-empty", "permuted", "overlapping"])
def test_sums_and_squares_are_window_sums_of_both(layout):
    """window_sums_and_squares: the floats of window_sums(v) and window_sums(v**2)
    (squares in float32), whichever path it takes (window by window through small
    buffers for a few long windows in order; the two calls otherwise)."""
    rng = np.random.default_rng(len(layout))
    nin = 300
    perm = np.arange(nin, dtype=np.int64)
    lo, hi = np.arange(0, nin, 60), np.arange(60, nin + 1, 60)
    if layout == "some-empty":
        hi = hi.copy()
        hi[[1, 3]] = lo[[1, 3]]
    elif layout == "permuted":
        perm = rng.permutation(nin).astype(np.int64)
    elif layout == "overlapping":
        lo = np.arange(0, nin - 60, 3)
        hi = lo + 60
    r = RangeIndexes(perm, lo.astype(np.int64), hi.astype(np.int64), nin)
    assert r._sum_strategy() == ("prefix" if layout == "overlapping" else "direct")
    v = (rng.standard_normal((nin, 7)) * 3).astype(np.float32)
    sums, squares = r.window_sums_and_squares(v)
    np.testing.assert_array_equal(sums, r.window_sums(v))
    np.testing.assert_array_equal(squares, r.window_sums(np.square(v)))
    np.testing.assert_allclose(squares, _definition(np.square(v), perm, lo, hi), rtol=1e-12)
