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
        # (forward only: skipped, or not even reached where the bias goes in first)
        assert seen == [True] if with_deriv else not any(seen)


def _blocks(rng, rows=7, widths=(5, 6, 4)):
    return [rng.standard_normal((rows, w)).astype(np.float32) for w in widths]


def test_blockwise_product_only_forward_only():
    from pynnet3.components.affine import matmul_blocks_into

    rng = np.random.default_rng(3)
    blocks = _blocks(rng)
    w = rng.standard_normal((2, 15)).astype(np.float32)  # narrow output: blocks pay
    want = np.hstack(blocks).astype(np.float64) @ w.T.astype(np.float64)
    out = np.zeros((7, 2), np.float32)
    assert not matmul_blocks_into(out, blocks, w, add=False)  # a backward pass may follow
    assert not out.any()
    with near_zero_refinement(False):
        assert matmul_blocks_into(out, blocks, w, add=False)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        assert matmul_blocks_into(out, blocks, w, add=True)  # adds to what is there
        np.testing.assert_allclose(out, 2 * want, rtol=1e-5, atol=1e-5)
        # wide outputs too: BLAS accumulates each block's product (no temporary)
        wide = rng.standard_normal((20, 15)).astype(np.float32)
        got = np.zeros((7, 20), np.float32)
        assert matmul_blocks_into(got, blocks, wide, add=False)
        np.testing.assert_allclose(got, np.hstack(blocks).astype(np.float64) @ wide.T,
                                   rtol=1e-5, atol=1e-5)
        assert not matmul_blocks_into(got, blocks[:1], wide[:, :5], add=False)  # one block


def test_tdnn_forward_only_equals_spliced_product():
    nnet = pynnet3.Nnet.from_config(
        "component name=t type=TdnnComponent input-dim=12 output-dim=3 time-offsets=-2,0,2\n"
        "input-node name=input dim=12\n"
        "component-node name=t component=t input=input\n"
        "output-node name=output input=t\n")
    idx = np.stack([np.zeros(14, np.int64), np.arange(-2, 12), np.zeros(14, np.int64)], 1)
    out = np.stack([np.zeros(10, np.int64), np.arange(10), np.zeros(10, np.int64)], 1)
    x = np.random.default_rng(4).standard_normal((14, 12)).astype(np.float32)
    comp = nnet.components["t"]
    w, b = comp.linear_params.astype(np.float64), comp.bias_params.astype(np.float64)
    xs = x.astype(np.float64)
    want = np.hstack([xs[0:10], xs[2:12], xs[4:14]]) @ w.T + b  # rows t-2, t, t+2
    for deriv in (False, True):
        req = pynnet3.ComputationRequest(
            inputs=[pynnet3.IoSpecification("input", idx, has_deriv=deriv)],
            outputs=[pynnet3.IoSpecification("output", out, has_deriv=deriv)])
        d = {"output": np.ones((10, 3), np.float32)} if deriv else {}
        res = pynnet3.run(nnet, pynnet3.compile(nnet, req), inputs={"input": x},
                          output_derivs=d)
        np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-5, atol=1e-5)
