"""ALLOC_MATRIX leaves contents undefined on the NumPy backend (no zeroing pass):
a run whose allocations hold NaN gives the same results, so nothing reads a
matrix before writing it (the compiler zeroes where that is needed)."""

import numpy as np
import pytest

import pynnet3
from pynnet3.runtime.backend import register_backend
from pynnet3.runtime.computer import NnetComputer
from pynnet3.runtime.matrix_pool import POOL
from pynnet3.runtime.numpy_backend import NumpyBackend
from tests.reference import REF, load_case, require_reference


class _NanAlloc(NumpyBackend):
    name = "numpy-nan-alloc-runtime"

    def alloc(self, rows, cols, dtype):
        return np.full((rows, cols), np.nan, dtype=dtype)


register_backend(_NanAlloc.name, _NanAlloc)


def test_alloc_reuses_pooled_buffer_without_clearing():
    be = NumpyBackend()
    POOL.clear()
    buf = np.full((3, 5), 7.0, np.float32)
    POOL.put(buf)
    got = be.alloc(3, 5, np.float32)
    assert got is buf  # the pooled buffer, as it was: no memset
    assert be.zeros(2, 2, np.float32).sum() == 0  # zeros() still zeroes


@pytest.mark.parametrize("net", ["tdnnf_chain", "tdnn_lstm", "tdnn_relu_bn", "xvector"])
@pytest.mark.parametrize("shape", ["decode", "train"])
def test_realistic_runs_equal_with_nan_allocations(net, shape):
    require_reference()
    case = REF / "realistic" / net / shape
    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    req = pynnet3.ComputationRequest.from_json(load_case(case)[0])
    comp = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
              .astype(np.float32) for s in req.inputs}
    derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
              .astype(np.float32) for s in req.outputs if s.has_deriv}
    plain = NnetComputer(nnet, comp, "numpy").run(dict(inputs), dict(derivs))
    nan = NnetComputer(nnet, comp, _NanAlloc.name).run(dict(inputs), dict(derivs))
    for name, v in plain.outputs.items():
        np.testing.assert_array_equal(nan.outputs[name], v)
    for name, v in plain.input_derivs.items():
        np.testing.assert_array_equal(nan.input_derivs[name], v)
    for comp_name, g in plain.gradients.items():
        for k, v in g.items():
            np.testing.assert_array_equal(nan.gradients[comp_name][k], v)


def test_released_outputs_are_handed_over_and_stay_the_users():
    """A PROVIDE_OUTPUT that releases the whole matrix hands the matrix itself over
    (no copy); later runs never write into it (it left the computer and its pool)."""
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=4
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=4
component-node name=r component=r input=a
output-node name=output input=r
""", seed=1)
    req = pynnet3.ComputationRequest(
        [pynnet3.IoSpecification("input", np.array([[0, t, 0] for t in range(5)]))],
        [pynnet3.IoSpecification("output", np.array([[0, t, 0] for t in range(5)]))])
    comp = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal((5, 3)).astype(np.float32) for _ in range(2))
    first = NnetComputer(nnet, comp).run({"input": x1}).outputs["output"]
    kept = first.copy()
    for _ in range(3):
        NnetComputer(nnet, comp).run({"input": x2})
    np.testing.assert_array_equal(first, kept)
    w, b = nnet.components["a"].linear_params, nnet.components["a"].bias_params
    np.testing.assert_allclose(first, np.maximum(x1 @ w.T + b, 0), rtol=1e-6)
