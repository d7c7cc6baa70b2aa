"""Review of the NumPy runtime's row copies through strided grid views, the
per-table plans of COPY/ADD_ROWS_MULTI and outputs handed over without a copy:
adversarial cases against row-by-row references (read every source row first,
then write, which is what the gather fallbacks do)."""

import numpy as np
import pytest

import pynnet3
from pynnet3.runtime.computer import NnetComputer
from pynnet3.runtime.numpy_backend import NumpyBackend, _grid

TABLES = {
    "descending": np.arange(11, -1, -1, dtype=np.int32),
    "zero stride in both": np.full(8, 5, np.int64),
    "descending blocks": np.array([9, 10, 11, 6, 7, 8, 3, 4, 5, 0, 1, 2], np.int32),
    "interleaved": np.array([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11], np.int32),
    # the first break says q = 2, and the rest is not that grid
    "misleading first break": np.array([0, 1, 5, 6, 7, 8], np.int32),
    "steps of two, then back": np.array([0, 2, 4, 1, 3, 5, 0, 2, 4], np.int32),
}


def _reference(dst, src, table, alpha, add):
    vals = alpha * src.copy()[table]
    return dst + vals if add else vals.astype(dst.dtype)


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("layout", ["separate", "column block", "same matrix"])
def test_copy_and_add_rows(name, add, layout):
    table = TABLES[name]
    n, rng = len(table), np.random.default_rng(len(table))
    alpha = 1.0 if add else -0.5
    if layout == "same matrix":  # dst and src are overlapping views of one matrix
        whole = rng.standard_normal((n + 12, 4)).astype(np.float32)
        src, dst = whole[:12], whole[3:3 + n]
    elif layout == "column block":
        src = rng.standard_normal((12, 9)).astype(np.float32)[:, 2:6]
        dst = rng.standard_normal((n, 7)).astype(np.float32)[:, 1:5]
    else:
        src = rng.standard_normal((12, 4)).astype(np.float32)
        dst = rng.standard_normal((n, 4)).astype(np.float32)
    want = _reference(dst.copy(), src, table, alpha, add)
    be = NumpyBackend()
    (be.add_rows if add else be.copy_rows)(dst, src, table, alpha)
    np.testing.assert_allclose(dst, want, rtol=1e-6, atol=1e-6)


def test_grid_plan_is_exact_or_none():
    for table in TABLES.values():
        plan = _grid(table)
        if plan is None:
            continue
        start, p, q, a, b = plan
        i, j = np.meshgrid(np.arange(p), np.arange(q), indexing="ij")
        np.testing.assert_array_equal((start + a * i + b * j).reshape(-1), table)


@pytest.mark.parametrize("add", [False, True])
def test_rows_multi_out_of_order_and_overlapping_a_source(add):
    rng = np.random.default_rng(3)
    whole = rng.standard_normal((20, 3)).astype(np.float32)
    s1, s2 = whole[:6], rng.standard_normal((5, 3)).astype(np.float32)
    dst = whole[4:12]  # overlaps s1's last rows
    table = np.array([[2, 4], [1, 5], [1, 0], [-1, -1], [2, 0], [1, 4], [2, 3], [1, 1]],
                     np.int32)
    snap = {1: s1.copy(), 2: s2.copy()}
    want = dst.copy()
    for i, (s, r) in enumerate(table.tolist()):
        v = 0.0 if s < 0 else 0.75 * snap[s][r]
        want[i] = want[i] + v if add else v
    be = NumpyBackend()
    (be.add_rows_multi if add else be.copy_rows_multi)(dst, {1: s1, 2: s2}, table, 0.75)
    np.testing.assert_allclose(dst, want, rtol=1e-6)


def test_two_outputs_of_one_node_are_separate_arrays():
    """Two output nodes reading one node: the one handed over without a copy and the
    copied one are distinct arrays, and neither changes in later runs."""
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=4
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=4
component-node name=r component=r input=a
output-node name=output input=r
output-node name=output2 input=r
""", seed=1)
    rows = np.array([[0, t, 0] for t in range(5)])
    req = pynnet3.ComputationRequest(
        [pynnet3.IoSpecification("input", rows)],
        [pynnet3.IoSpecification("output", rows), pynnet3.IoSpecification("output2", rows)])
    comp = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal((5, 3)).astype(np.float32) for _ in range(2))
    got = NnetComputer(nnet, comp).run({"input": x1}).outputs
    assert not np.may_share_memory(got["output"], got["output2"])
    kept = {k: v.copy() for k, v in got.items()}
    got["output"][...] = 7.0  # the user's to change
    for _ in range(3):
        NnetComputer(nnet, comp).run({"input": x2})
    np.testing.assert_array_equal(got["output2"], kept["output2"])
    assert (got["output"] == 7.0).all()
    w, b = nnet.components["a"].linear_params, nnet.components["a"].bias_params
    np.testing.assert_allclose(kept["output"], np.maximum(x1 @ w.T + b, 0), rtol=1e-6)


def test_network_optimized_run_keeps_requested_derivatives():
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=5
component name=a type=AffineComponent input-dim=5 output-dim=6
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=a
component name=bt type=BackpropTruncationComponent dim=6 clipping-threshold=0.01
component-node name=bt component=bt input=r
component name=o type=AffineComponent input-dim=6 output-dim=3
component-node name=o component=o input=bt
output-node name=output input=o
""", seed=0)
    rows = np.array([[0, t, 0] for t in range(6)])
    req = pynnet3.ComputationRequest([pynnet3.IoSpecification("input", rows, True)],
                                     [pynnet3.IoSpecification("output", rows, True)],
                                     need_model_derivative=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    dy = rng.standard_normal((6, 3)).astype(np.float32)
    want = pynnet3.run(nnet, req, {"input": x}, {"output": dy})
    got = pynnet3.run(nnet, req, {"input": x}, {"output": dy}, network_optimize=True)
    np.testing.assert_allclose(got.input_derivs["input"], want.input_derivs["input"],
                               rtol=1e-5, atol=1e-6)
