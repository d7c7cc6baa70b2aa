"""runtime/matrix_pool: freed matrices are reused only when nothing else holds
them, come back zeroed, stay within the limit; runs give the same results with
and without the pool (also from two threads at once)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pynnet3
from pynnet3.runtime import matrix_pool
from pynnet3.runtime.matrix_pool import MatrixPool
from pynnet3.runtime.numpy_backend import NumpyBackend
from tests.compiler import nets as N


def test_released_buffer_is_reused_and_zeroed():
    pool = MatrixPool(1 << 20)
    a = np.full((4, 3), 7.0, np.float32)
    ident = id(a)
    mats = {5: a}
    del a
    pool.release(mats, 5)
    assert 5 not in mats and pool.held_bytes == 48
    assert pool.take(4, 3, np.float64) is None and pool.take(3, 4, np.float32) is None
    b = pool.take(4, 3, np.float32)
    assert id(b) == ident and pool.held_bytes == 0
    assert pool.take(4, 3, np.float32) is None


def test_backend_zeros_from_the_pool_are_zero(monkeypatch):
    pool = MatrixPool(1 << 20)
    monkeypatch.setattr("pynnet3.runtime.numpy_backend.POOL", pool)
    be = NumpyBackend()
    m = be.zeros(5, 2, np.float32)
    m[...] = -3.0
    mats = {1: m}
    del m
    be.release_matrix(mats, 1)
    assert pool.held_bytes == 40
    z = be.zeros(5, 2, np.float32)
    assert pool.held_bytes == 0
    assert np.array_equal(z, np.zeros((5, 2))) and not np.signbit(z).any()


@pytest.mark.parametrize("holder", ["view", "ref", "memo"])
def test_a_matrix_still_referenced_is_not_pooled(holder):
    pool = MatrixPool(1 << 20)
    a = np.ones((6, 4), np.float32)
    if holder == "view":
        keep = a[1:3]
    elif holder == "ref":
        keep = [a]
    else:
        keep = {"x": a[:, :2]}
    mats = {0: a}
    del a
    pool.release(mats, 0)
    assert pool.held_bytes == 0 and 0 not in mats
    assert keep is not None


def test_views_and_odd_arrays_are_not_pooled():
    pool = MatrixPool(1 << 20)
    base = np.ones((6, 4), np.float32)
    mats = {0: base[:, :2].copy(order="F"), 1: np.ones(5, np.float32), 2: "compressed"}
    for k in list(mats):
        pool.release(mats, k)
    assert pool.held_bytes == 0 and not mats


def test_limit_and_least_recently_used_eviction():
    pool = MatrixPool(100)
    for shape in [(2, 5), (3, 5), (1, 5)]:  # 40, 60, 20 bytes of float32
        mats = {0: np.zeros(shape, np.float32)}
        pool.release(mats, 0)
    # 120 > 100: the first released (2, 5) went
    assert pool.held_bytes == 80
    assert pool.take(2, 5, np.float32) is None
    assert pool.take(3, 5, np.float32) is not None
    mats = {0: np.zeros((30, 30), np.float32)}  # larger than the limit: never kept
    pool.release(mats, 0)
    assert pool.held_bytes == 20
    old = matrix_pool.POOL.limit_bytes
    try:
        matrix_pool.set_pool_limit(0)
        mats = {0: np.zeros((2, 2), np.float32)}
        matrix_pool.POOL.release(mats, 0)
        assert matrix_pool.POOL.held_bytes == 0
    finally:
        matrix_pool.set_pool_limit(old)


@pytest.fixture(scope="module")
def train_case():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9, n=2)}, {"output": N.frames(0, 6, n=2)},
                    True, True, True)
    comp = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    return (nnet, comp, N.random_inputs(nnet, req, rng, np.float32),
            N.random_output_derivs(nnet, req, rng, np.float32))


def _same(a, b):
    for k in a.outputs:
        np.testing.assert_array_equal(a.outputs[k], b.outputs[k])
    for k in a.input_derivs:
        np.testing.assert_array_equal(a.input_derivs[k], b.input_derivs[k])
    for c in a.gradients:
        for p in a.gradients[c]:
            np.testing.assert_array_equal(a.gradients[c][p], b.gradients[c][p])


def test_runs_agree_with_and_without_the_pool(train_case):
    nnet, comp, x, d = train_case
    old = matrix_pool.POOL.limit_bytes
    try:
        matrix_pool.set_pool_limit(0)
        ref = pynnet3.run(nnet, comp, x, d)
        matrix_pool.set_pool_limit(64 << 20)
        first = pynnet3.run(nnet, comp, x, d)
        assert matrix_pool.POOL.held_bytes > 0  # the second run reuses these
        _same(ref, first)
        _same(ref, pynnet3.run(nnet, comp, x, d))
        results = [None] * 4

        def work(i):
            results[i] = [pynnet3.run(nnet, comp, x, d) for _ in range(5)]

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for rs in results:
            for r in rs:
                _same(ref, r)
    finally:
        matrix_pool.set_pool_limit(old)


def test_compressed_matrices_go_through_the_pool(monkeypatch):
    """COMPRESS_MATRIX hands the float matrix's buffer to the pool and
    DECOMPRESS_MATRIX takes its output from there (undefined contents, all
    overwritten): the same bits as without the pool, on stale buffers too. (The
    ReLU backprops' mask from the codes is turned off: it skips the decompression.)"""
    import copy

    from pynnet3.computation import CommandType as CT
    from pynnet3.runtime import compression
    from pynnet3.runtime import computer as rc
    from tests.optimize import memory_cases as mc

    monkeypatch.setattr(rc, "relu_mask_plans", lambda c, comps: {})

    nnet, req, x, d = mc.small_case(mc.RELU, n=64)
    comp = pynnet3.compile(nnet, req)
    assert any(cmd.type is CT.DECOMPRESS_MATRIX for cmd in comp.commands)

    def run():
        return pynnet3.run(copy.deepcopy(nnet), comp, dict(x), dict(d))

    old = matrix_pool.POOL.limit_bytes
    try:
        matrix_pool.set_pool_limit(0)
        ref = run()
        matrix_pool.set_pool_limit(64 << 20)
        pooled, results, into = set(), [], []
        take, decompress = matrix_pool.POOL.take, compression.decompress

        def spy_take(rows, cols, dtype):
            arr = take(rows, cols, dtype)
            if arr is not None:
                arr.fill(np.nan)  # (stale contents must not matter)
                pooled.add(arr.ctypes.data)
            return arr

        def spy_decompress(obj, out):
            into.append(out.ctypes.data in pooled)
            decompress(obj, out)

        monkeypatch.setattr(matrix_pool.POOL, "take", spy_take)
        monkeypatch.setattr(compression, "decompress", spy_decompress)
        for _ in range(3):
            results.append(run())  # (kept: no fresh array reuses a pooled address)
            _same(ref, results[-1])
        # (in the first run a same-shaped allocation in between may take the buffer)
        assert len(into) == 3 and all(into[1:])
    finally:
        matrix_pool.set_pool_limit(old)
