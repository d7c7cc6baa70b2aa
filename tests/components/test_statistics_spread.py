"""RangeIndexes.spread (the statistics components' backprop): both strategies
(a gather for disjoint windows, a cumulative sum of a difference array for
overlapping ones) equal the definition summed in float64, and the former
np.add.at formula to float64 rounding; rows in no window get an exact 0."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.statistics import RangeIndexes


def _definition(d, perm, lo, hi, nin):
    out = np.zeros((nin, d.shape[1]))
    for o, (a, b) in enumerate(zip(lo, hi, strict=True)):
        for j in range(a, b):
            out[perm[j]] += d[o].astype(np.float64)
    return out


def _add_at_formula(r, d):
    """The formula spread used before (np.add.at into a difference array)."""
    diff = np.zeros((len(r.perm) + 1, d.shape[1]), dtype=np.float64)
    np.add.at(diff, r.lo, d)
    np.subtract.at(diff, r.hi, d)
    per_sorted = np.cumsum(diff[:-1], axis=0)
    cover = np.zeros(len(r.perm) + 1, dtype=np.int64)
    np.add.at(cover, r.lo, 1)
    np.subtract.at(cover, r.hi, 1)
    per_sorted[np.cumsum(cover[:-1]) == 0] = 0.0
    out = np.zeros((r.num_input_rows, d.shape[1]), dtype=np.float64)
    out[r.perm] = per_sorted
    return out


def _random_case(rng, disjoint: bool):
    nin = int(rng.integers(0, 40))
    m = int(rng.integers(0, nin + 1))
    perm = (rng.permutation(nin)[:m] if rng.random() < 0.5 else np.arange(m)).astype(np.int64)
    if disjoint:  # cut [0, m) at sorted points, maybe leave gaps, shuffle the windows
        cuts = np.sort(rng.integers(0, m + 1, int(rng.integers(0, 8))))
        edges = np.r_[0, cuts, m].astype(np.int64)
        lo, hi = edges[:-1].copy(), edges[1:].copy()
        gap = rng.random(len(lo)) < 0.3
        lo[gap] = np.minimum(lo[gap] + 1, hi[gap])
        k = rng.permutation(len(lo))
        lo, hi = lo[k], hi[k]
    else:
        k = int(rng.integers(0, 12))
        lo = rng.integers(0, m + 1, k).astype(np.int64)
        hi = np.minimum(m, lo + rng.integers(0, m + 1, k)).astype(np.int64)
    return RangeIndexes(perm, lo, hi, nin)


@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spread_matches_definition_and_former_formula(disjoint, dtype):
    rng = np.random.default_rng(3 + disjoint)
    for _ in range(300):
        r = _random_case(rng, disjoint)
        full = rng.standard_normal((len(r.lo), 7)).astype(dtype)
        d = full[:, 2:5]  # a non-contiguous view, as the components pass
        got = r.spread(d)
        assert got.dtype == np.float64 and got.shape == (r.num_input_rows, 3)
        want = _definition(d, r.perm, r.lo, r.hi, r.num_input_rows)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, _add_at_formula(r, d), rtol=1e-12, atol=1e-12)
        # float32 results agree after rounding to float32 (to one step at most)
        np.testing.assert_array_max_ulp(got.astype(np.float32),
                                        _add_at_formula(r, d).astype(np.float32), 1)
        # rows in no window: an exact 0
        covered = np.zeros(r.num_input_rows, dtype=bool)
        for a, b in zip(r.lo, r.hi, strict=True):
            covered[r.perm[a:b]] = True
        assert np.all(got[~covered] == 0.0)
        assert not np.shares_memory(got, full)
        got[...] = 1.0  # a fresh array each call
        np.testing.assert_allclose(r.spread(d), want, rtol=1e-12, atol=1e-12)


def test_disjoint_windows_are_gathered_exactly():
    rng = np.random.default_rng(5)
    perm = np.arange(12, dtype=np.int64)
    r = RangeIndexes(perm, np.array([0, 4, 8]), np.array([4, 8, 12]), 12)
    d = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(r.spread(d), np.repeat(d, 4, axis=0).astype(np.float64))
    ident = RangeIndexes(perm, np.arange(12), np.arange(1, 13), 12)
    d = rng.standard_normal((12, 5)).astype(np.float32)
    got = ident.spread(d)
    np.testing.assert_array_equal(got, d.astype(np.float64))
    assert not np.shares_memory(got, d)


def test_overlapping_windows_sharing_starts_and_ends():
    # outputs clipped at a sequence start share lo; the pooling with a long window
    perm = np.arange(30, dtype=np.int64)
    lo = np.r_[np.zeros(10, np.int64), np.arange(10, 20)]
    hi = np.r_[np.arange(5, 15), np.full(10, 30, np.int64)]
    r = RangeIndexes(perm, lo, hi, 30)
    d = np.random.default_rng(9).standard_normal((20, 4))
    np.testing.assert_allclose(r.spread(d), _definition(d, perm, lo, hi, 30),
                               rtol=1e-12, atol=1e-12)


def test_no_windows_and_no_rows():
    r = RangeIndexes(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 5)
    assert np.array_equal(r.spread(np.zeros((0, 3), np.float32)), np.zeros((5, 3)))
    r = RangeIndexes(np.arange(4), np.array([2, 2]), np.array([2, 2]), 4)  # empty windows
    assert np.array_equal(r.spread(np.ones((2, 3), np.float32)), np.zeros((4, 3)))
