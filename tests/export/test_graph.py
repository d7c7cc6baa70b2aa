"""pynnet3.export.graph: a matrix held as a tiling of rectangles reads back what
was written (checked against a plain NumPy matrix under random writes and reads),
and row gathers with -1 give zero rows."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import fx  # noqa: E402

from pynnet3.export.graph import GraphBuilder, MatrixValue  # noqa: E402


def _rect(rng, rows, cols):
    r0 = int(rng.integers(0, rows))
    c0 = int(rng.integers(0, cols))
    return r0, int(rng.integers(r0 + 1, rows + 1)), c0, int(rng.integers(c0 + 1, cols + 1))


@pytest.mark.parametrize("seed", range(6))
def test_tiling_reads_what_was_written(seed):
    rng = np.random.default_rng(seed)
    rows, cols = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    g = GraphBuilder()
    g.ref = g.graph.placeholder("ref")
    g.batch = g.method("size", g.ref, 0)
    m = MatrixValue(rows, cols)
    shadow = np.zeros((rows, cols), np.float32)  # what the matrix must hold
    expected, outputs = [], []
    for _ in range(25):
        r0, r1, c0, c1 = _rect(rng, rows, cols)
        if rng.random() < 0.5:
            value = rng.standard_normal((r1 - r0, c1 - c0)).astype(np.float32)
            zero = rng.random() < 0.2
            m.write(r0, r1, c0, c1, None if zero else g.const(value[None]))
            shadow[r0:r1, c0:c1] = 0.0 if zero else value
        else:
            outputs.append(m.read(g, r0, r1, c0, c1))
            expected.append(shadow[r0:r1, c0:c1].copy())
        covered = np.zeros((rows, cols), int)
        for p in m.pieces:  # the invariant: disjoint pieces covering the matrix
            covered[p.r0:p.r1, p.c0:p.c1] += 1
        assert (covered == 1).all()
    g.graph.output(tuple(outputs))
    module = fx.GraphModule(g.root, g.graph)
    got = module(torch.zeros(1, rows, cols))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a[0].numpy(), b)


def test_gather_rows_with_missing_rows():
    g = GraphBuilder()
    x = g.graph.placeholder("x")
    g.graph.output((g.gather_rows(x, [2, -1, 0, 2], 3), g.rows(x, [1, 2], 3)))
    module = fx.GraphModule(g.root, g.graph)
    data = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    gathered, run = module(data)
    want = np.stack([data[:, 2].numpy(), np.zeros((2, 2)), data[:, 0].numpy(),
                     data[:, 2].numpy()], axis=1)
    np.testing.assert_array_equal(gathered.numpy(), want)
    np.testing.assert_array_equal(run.numpy(), data[:, 1:3].numpy())
