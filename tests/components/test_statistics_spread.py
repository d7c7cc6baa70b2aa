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


@pytest.mark.parametrize("disjoint", [False, True])
def test_spread_to_a_dtype_is_the_cast_float64_result(disjoint):
    rng = np.random.default_rng(8 + disjoint)
    for _ in range(100):
        r = _random_case(rng, disjoint)
        d = rng.standard_normal((len(r.lo), 5))[:, 1:4]  # float64, strided
        for dtype in (np.float32, np.float64):
            got = r.spread(d, dtype)
            assert got.dtype == dtype and not np.shares_memory(got, d)
            np.testing.assert_array_equal(got, r.spread(d).astype(dtype))
        d32 = d.astype(np.float32)
        np.testing.assert_array_equal(r.spread(d32, np.float32), r.spread(d32).astype(np.float32))


def _stats_pair():
    from tests.components.common import from_config

    ext = from_config("component name=e type=StatisticsExtractionComponent input-dim=4 "
                      "output-period=1 include-variance=true")
    pool = from_config("component name=p type=StatisticsPoolingComponent input-dim=9 "
                       "left-context=0 right-context=5 num-log-count-features=1 "
                       "output-stddevs=true")
    return ext, pool


def test_identity_extraction_and_pooling_backprop_equal_former_formulas():
    rng = np.random.default_rng(12)
    ext, pool = _stats_pair()
    t = np.arange(12)
    idx = np.stack([np.repeat([0, 1], 12), np.tile(t, 2), np.zeros(24, np.int64)], 1)
    r = ext.precompute_indexes(idx, idx, True)
    assert r.is_identity
    x = rng.standard_normal((24, 4)).astype(np.float32)
    out = np.full((24, 9), np.nan, np.float32)
    ext.propagate(r, x, out)
    want = np.empty_like(out)  # the former formula: float64 window sums, cast back
    want[:, 0] = 1.0
    want[:, 1:5] = r.window_sums(x).astype(np.float32)
    want[:, 5:] = r.window_sums(np.square(x)).astype(np.float32)
    np.testing.assert_array_equal(out, want)
    # pooling: one window of 6 per sequence at t = 0 and t = 6
    out_idx = np.array([[n, tt, 0] for n in (0, 1) for tt in (0, 6)], np.int64)
    rp = pool.precompute_indexes(idx, out_idx, True)
    pooled = np.zeros((4, 9), np.float32)
    pool.propagate(rp, out, pooled)
    od = rng.standard_normal((4, 9)).astype(np.float32)
    got = np.ones((24, 9), np.float32)
    pool.backprop(rp, out, pooled, od, None, None, got)
    # the former formula: float64 spread, cast, added
    deriv = od[:, 1:].astype(np.float64)
    mean, std = pooled[:, 1:5].astype(np.float64), pooled[:, 5:].astype(np.float64)
    deriv[:, 4:] *= 0.5 / std
    deriv[:, :4] -= 2.0 * mean * deriv[:, 4:]
    deriv /= np.exp(pooled[:, 0].astype(np.float64))[:, None]
    want = np.ones((24, 9), np.float32)
    want[:, 1:] += rp.spread(deriv).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("variance", [True, False])
def test_identity_extraction_backprop_equals_former_formula(variance):
    from tests.components.common import from_config

    rng = np.random.default_rng(14)
    ext = from_config("component name=e type=StatisticsExtractionComponent input-dim=5 "
                      f"output-period=1 include-variance={str(variance).lower()}")
    idx = np.stack([np.repeat([0, 1, 2], 9), np.tile(np.arange(9), 3),
                    np.zeros(27, np.int64)], 1)
    r = ext.precompute_indexes(idx, idx, True)
    assert r.is_identity
    x = rng.standard_normal((27, 5)).astype(np.float32)
    x[0, :2] = [0.0, -0.0]
    od = rng.standard_normal((27, 12)).astype(np.float32)[:, :ext.output_dim]  # strided
    od[0, 1:3] = -0.0
    got = np.full((27, 5), np.nan, np.float32)
    ext.backprop(r, x, None, od, None, None, got)
    deriv = r.spread(od[:, 1:6])  # the former formula (float64, then cast)
    if variance:
        deriv += 2.0 * r.spread(od[:, 6:]) * x
    want = deriv.astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spread_add_adds_the_definition(disjoint, dtype):
    """spread_add (broadcast per window where every input row is in one window, in
    order; else through spread) adds the definition, cast to the target's dtype, to
    what the target held."""
    rng = np.random.default_rng(11 + disjoint)
    segments = 0
    for _ in range(300):
        r = _random_case(rng, disjoint)
        d = rng.standard_normal((len(r.lo), 3))
        target = rng.standard_normal((r.num_input_rows, 3)).astype(dtype)
        want = target + _definition(d, r.perm, r.lo, r.hi, r.num_input_rows).astype(dtype)
        r.spread_add(target, d)
        np.testing.assert_allclose(target, want, rtol=1e-6 if dtype == np.float32 else 1e-12,
                                   atol=1e-6 if dtype == np.float32 else 1e-12)
        segments += r.__dict__.get("_segments") is not None
    assert segments > 0 or not disjoint  # the broadcast path was taken


def test_spread_add_of_pooling_windows_uses_no_gather():
    """One window per sequence over all its rows (x-vector pooling): segments."""
    lo, hi = np.array([0, 5, 9]), np.array([5, 9, 12])
    r = RangeIndexes(np.arange(12), lo, hi, 12)
    d = np.arange(6.0).reshape(3, 2)
    target = np.ones((12, 2), np.float32)
    r.spread_add(target, d)
    assert r.__dict__["_segments"] == [(0, 0, 5), (1, 5, 9), (2, 9, 12)]
    np.testing.assert_array_equal(target, 1 + np.repeat(d, [5, 4, 3], axis=0))
