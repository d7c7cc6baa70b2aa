"""The affine near-zero refinement: on by default, off inside
``near_zero_refinement(False)``, and the runtime turns it off exactly for
computations without a backward pass."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.components import affine
from pynnet3.components.affine import near_zero_refinement, refine_near_zero


def _wrong_sign_case():
    # x @ w.T is exactly 0; a float32 product could have rounded it to +-1e-9
    x = np.array([[1.0, 1.0]], np.float32)
    w = np.array([[1.0, -1.0]], np.float32)
    out = np.array([[1e-9]], np.float32)
    return out, x, w


def test_refinement_on_by_default_and_switchable():
    out, x, w = _wrong_sign_case()
    refine_near_zero(out, x, w)
    assert out[0, 0] == 0.0
    out, x, w = _wrong_sign_case()
    with near_zero_refinement(False):
        refine_near_zero(out, x, w)
    assert out[0, 0] == np.float32(1e-9)
    out, x, w = _wrong_sign_case()  # the context is left again
    refine_near_zero(out, x, w)
    assert out[0, 0] == 0.0


def _net_and_request(with_deriv: bool):
    nnet = pynnet3.Nnet.from_config(
        "component name=a type=AffineComponent input-dim=3 output-dim=4\n"
        "component name=r type=RectifiedLinearComponent dim=4\n"
        "input-node name=input dim=3\n"
        "component-node name=a component=a input=input\n"
        "component-node name=r component=r input=a\n"
        "output-node name=output input=r\n")
    idx = np.stack([np.zeros(5, np.int64), np.arange(5), np.zeros(5, np.int64)], axis=1)
    req = pynnet3.ComputationRequest(
        inputs=[pynnet3.IoSpecification("input", idx, has_deriv=with_deriv)],
        outputs=[pynnet3.IoSpecification("output", idx, has_deriv=with_deriv)])
    return nnet, req


def test_runtime_refines_only_with_a_backward_pass(monkeypatch):
    seen = []
    real = affine.refine_near_zero

    def spy(out, x, w, b=None):
        seen.append(affine._REFINE.get())
        real(out, x, w, b)

    monkeypatch.setattr(affine, "refine_near_zero", spy)
    rng = np.random.default_rng(0)
    for with_deriv in (False, True):
        seen.clear()
        nnet, req = _net_and_request(with_deriv)
        comp = pynnet3.compile(nnet, req)
        x = rng.standard_normal((5, 3)).astype(np.float32)
        derivs = {"output": np.ones((5, 4), np.float32)} if with_deriv else {}
        pynnet3.run(nnet, comp, inputs={"input": x}, output_derivs=derivs)
        assert seen == [with_deriv]
