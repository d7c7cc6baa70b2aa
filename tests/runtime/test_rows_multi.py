"""COPY_ROWS_MULTI / ADD_ROWS_MULTI on the NumPy backend against a row-by-row
reference: runs of rows (copied as slices), scattered rows, rows with no source
(-1), scales, repeated calls (the cached plan) and a destination that overlaps a
source (then the gather-first path)."""

import numpy as np
import pytest

from pynnet3.runtime.numpy_backend import NumpyBackend


def reference(dst, sources, table, alpha, add):
    out = dst.copy()
    for i, (s, r) in enumerate(table.tolist()):
        v = alpha * sources[s][r] if s >= 0 else 0.0
        if add:
            out[i] += v
        else:
            out[i] = v
    return out


def make_table(rng, rows, sources):
    """Runs of consecutive rows from one source, scattered rows, and -1 rows."""
    table = np.full((rows, 2), -1, np.int32)
    i = 0
    while i < rows:
        s = int(rng.integers(1, len(sources) + 1))
        n = int(rng.integers(1, 8))
        kind = rng.integers(0, 3)
        for k in range(min(n, rows - i)):
            if kind == 0:  # a run
                table[i + k] = (s, (3 + k) % sources[s].shape[0])
            elif kind == 1:  # scattered
                table[i + k] = (s, int(rng.integers(0, sources[s].shape[0])))
        i += n
    return table


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("alpha", [1.0, -0.5])
def test_matches_row_by_row(seed, add, alpha):
    rng = np.random.default_rng(seed)
    sources = {s: rng.standard_normal((int(rng.integers(8, 20)), 5)).astype(np.float32)
               for s in (1, 2, 3)}
    table = make_table(rng, 40, sources)
    be = NumpyBackend()
    dst = rng.standard_normal((40, 5)).astype(np.float32)
    want = reference(dst, sources, table, alpha, add)
    for _ in range(2):  # the second call uses the cached plan
        got = dst.copy()
        (be.add_rows_multi if add else be.copy_rows_multi)(got, sources, table, alpha)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_runs_of_one_source_are_a_step_layout():
    # a recurrent layer's output gathered from per-step matrices: each step a run
    steps = {s: np.full((4, 3), float(s), np.float32) for s in range(1, 6)}
    table = np.array([(s, r) for s in range(1, 6) for r in range(4)], np.int32)
    dst = np.zeros((20, 3), np.float32)
    NumpyBackend().copy_rows_multi(dst, steps, table, 1.0)
    np.testing.assert_array_equal(dst[:, 0], np.repeat(np.arange(1, 6), 4))


def test_destination_overlapping_a_source():
    rng = np.random.default_rng(7)
    big = rng.standard_normal((12, 4)).astype(np.float32)
    dst = big[0:6]
    sources = {1: big[3:9], 2: rng.standard_normal((5, 4)).astype(np.float32)}
    table = np.array([(1, 5), (1, 4), (2, 0), (1, 0), (-1, -1), (2, 4)], np.int32)
    want = reference(dst, sources, table, 1.0, False)
    NumpyBackend().copy_rows_multi(dst, sources, table, 1.0)
    np.testing.assert_allclose(dst, want)
