"""RunResult.gradients with need_model_derivative: one entry per updatable component,
as Kaldi's delta network has, zeros where the request never reaches a component;
the same from every compile path (plain, optimized, cached, shortcut, stepping)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N

# ``h`` is a recurrence through the updatable ``H`` that reads the input 8 frames back;
# the output takes it only IfDefined. With input frames 0..4 no h(t) is computable, so
# the output is a(t) = A x(t) + b and no command ever reaches ``H``.
UNREACHED = """
input-node name=input dim=3
component name=A type=AffineComponent input-dim=3 output-dim=2
component-node name=a component=A input=input
component name=H type=AffineComponent input-dim=5 output-dim=2
component-node name=h component=H input=Append(Offset(input, -8), IfDefined(Offset(h, -1)))
output-node name=output input=Sum(a, IfDefined(h))
"""
NUM_SEQ = 3  # more than two sequences, so the CachingCompiler takes its shortcut


@pytest.fixture(scope="module")
def case():
    nnet = pynnet3.Nnet.from_config(UNREACHED, seed=2)
    req = N.request({"input": N.frames(0, 5, n=NUM_SEQ)},
                    {"output": N.frames(0, 5, n=NUM_SEQ)}, False, True, True)
    rng = np.random.default_rng(0)
    x = N.random_inputs(nnet, req, rng, np.float32)
    d = N.random_output_derivs(nnet, req, rng, np.float32)
    return nnet, req, x, d


def _paths(nnet, req):
    """(label, computation) for every way of compiling ``req``."""
    yield "unoptimized", pynnet3.compile(nnet, req, optimize=False)
    yield "optimized", pynnet3.compile(nnet, req, optimize=True)
    yield "cached", pynnet3.CachingCompiler(nnet, use_shortcut=False).compile(req)
    cc = pynnet3.CachingCompiler(nnet, use_shortcut=True)
    comp = cc.compile(req)
    assert cc.info()["shortcut"] == 1, "the shortcut path was not taken"
    yield "shortcut", comp


def _check(label, nnet, x, d, grads):
    A, H = nnet.components["A"], nnet.components["H"]
    assert set(grads) == {"A", "H"}, label
    # H: present, zero, shaped like its parameters
    assert set(grads["H"]) == {"linear_params", "bias_params"}, label
    assert grads["H"]["linear_params"].shape == H.linear_params.shape == (2, 5)
    assert grads["H"]["bias_params"].shape == H.bias_params.shape == (2,)
    for v in grads["H"].values():
        assert not v.any(), label
    # A: the gradient of sum(output .* d) for output = x A^T + b
    xs, ds = x["input"].astype(np.float64), d["output"].astype(np.float64)
    assert grads["A"]["linear_params"].shape == A.linear_params.shape
    np.testing.assert_allclose(grads["A"]["linear_params"], ds.T @ xs, rtol=1e-5, atol=1e-5,
                               err_msg=label)
    np.testing.assert_allclose(grads["A"]["bias_params"], ds.sum(0), rtol=1e-5, atol=1e-5,
                               err_msg=label)


def test_unreached_component_has_a_zero_gradient_on_every_path(case):
    nnet, req, x, d = case
    for label, comp in _paths(nnet, req):
        res = pynnet3.run(nnet, comp, x, d)
        # the output is A x + b alone: h is never defined
        A = nnet.components["A"]
        np.testing.assert_allclose(res.outputs["output"],
                                   x["input"] @ A.linear_params.T + A.bias_params,
                                   rtol=1e-5, atol=1e-6, err_msg=label)
        _check(label, nnet, x, d, res.gradients)


def test_stepping_gives_the_same_gradient_entries(case):
    nnet, req, x, d = case
    comp = NnetComputer(nnet, pynnet3.compile(nnet, req, optimize=True))
    comp.accept_input("input", x["input"])
    comp.run_until_io()
    comp.get_output("output")
    comp.accept_input("output", d["output"], is_deriv=True)
    comp.run_until_io()
    _check("stepping", nnet, x, d, comp.gradients())


def test_no_gradients_without_need_model_derivative(case):
    nnet, _, x, d = case
    req = N.request({"input": N.frames(0, 5, n=NUM_SEQ)},
                    {"output": N.frames(0, 5, n=NUM_SEQ)}, True, True, False)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req), x, d)
    assert res.gradients == {}
    assert res.input_derivs["input"].shape == x["input"].shape
