# ruff: noqa: E501  (a network config)
"""runtime/computer.py: in a training run, a PROPAGATE whose output no use gates on
the sign of an entry (only softmax-like or sigmoid/tanh nodes read it, or it goes
to an output) runs without the affine near-zero refinement; every other one keeps
it. Results stay within float32 rounding of the fully refined run."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.components import affine
from pynnet3.runtime import computer as rc
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N
from tests.optimize import memory_cases as mc
from tests.reference import needs_reference

NET = """
input-node name=input dim=4
component name=affine1 type=AffineComponent input-dim=12 output-dim=8
component-node name=affine1 component=affine1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=relu1 type=RectifiedLinearComponent dim=8
component-node name=relu1 component=relu1 input=affine1
component name=affine2 type=AffineComponent input-dim=8 output-dim=6
component-node name=affine2 component=affine2 input=relu1
component name=lsm type=LogSoftmaxComponent dim=6
component-node name=lsm component=lsm input=affine2
component name=affine3 type=AffineComponent input-dim=8 output-dim=5
component-node name=affine3 component=affine3 input=relu1
component name=affine4 type=AffineComponent input-dim=8 output-dim=5
component-node name=affine4 component=affine4 input=relu1
component name=tanh4 type=TanhComponent dim=5
component-node name=tanh4 component=tanh4 input=affine4
component name=relu4 type=RectifiedLinearComponent dim=5
component-node name=relu4 component=relu4 input=affine4
output-node name=output input=lsm objective=linear
output-node name=out3 input=affine3 objective=linear
output-node name=out4 input=Sum(tanh4, relu4) objective=linear
"""


def _case(n=16):
    nnet = pynnet3.Nnet.from_config(NET, seed=4)
    outs = {name: N.frames(0, 6, n=n) for name in ("output", "out3", "out4")}
    req = N.request({"input": N.frames(-1, 7, n=n)}, outs, True, True, True)
    rng = np.random.default_rng(7)
    return (nnet, req, N.random_inputs(nnet, req, rng, np.float32),
            N.random_output_derivs(nnet, req, rng, np.float32))


def _refined_nodes(nnet, comp, x, d, cache_program=False):
    """{affine node: whether its propagate ran with the refinement on}, the result."""
    names = {id(nnet.components[n.component]): n.name for n in nnet.nodes
             if n.kind == "component-node"}
    seen = {}
    orig = affine.AffineComponent._propagate

    def spy(self, *a, **k):
        seen[names[id(self)]] = affine.backward_follows()
        return orig(self, *a, **k)

    affine.AffineComponent._propagate = spy
    try:
        result = NnetComputer(nnet, comp, cache_program=cache_program).run(dict(x), dict(d))
    finally:
        affine.AffineComponent._propagate = orig
    return seen, result


def test_only_sign_gated_outputs_are_refined(monkeypatch):
    nnet, req, x, d = _case()
    comp = pynnet3.compile(nnet, req)
    seen, got = _refined_nodes(nnet, comp, x, d)
    # affine1 feeds a ReLU; affine4 a tanh and a ReLU: refined. affine2 feeds a
    # log-softmax, affine3 an output: not.
    assert seen == {"affine1": True, "affine2": False, "affine3": False, "affine4": True}
    seen2, got2 = _refined_nodes(nnet, comp, x, d, cache_program=True)  # (the program)
    assert seen2 == seen
    np.testing.assert_array_equal(got2.outputs["output"], got.outputs["output"])
    monkeypatch.setattr(rc, "sign_free_propagates", lambda c, comps: [])  # (all refined)
    seen, ref = _refined_nodes(nnet, comp, x, d)
    assert all(seen.values())
    for what in ("outputs", "input_derivs"):
        for k, v in getattr(ref, what).items():
            np.testing.assert_allclose(getattr(got, what)[k], v, rtol=2e-6, atol=1e-6)
    for c, grads in ref.gradients.items():
        for p, v in grads.items():
            np.testing.assert_allclose(got.gradients[c][p], v, rtol=1e-5, atol=1e-5)


def test_forward_only_runs_are_unchanged():
    nnet, req, x, _ = _case()
    for s in req.outputs:
        s.has_deriv = False
    for s in req.inputs:
        s.has_deriv = False
    req.need_model_derivative = False
    comp = pynnet3.compile(nnet, req)
    seen, _ = _refined_nodes(nnet, comp, x, {})
    assert seen and not any(seen.values())


@needs_reference
@pytest.mark.parametrize(("rel", "free"), [
    ("realistic/tdnn_relu_bn/train", {"output.affine"}),
    ("realistic/tdnnf_chain/train", {"output.affine", "output-xent.affine"}),
])
def test_realistic_sign_free_layers(rel, free):
    """The realistic networks' output layers feed a log-softmax or an output node
    (through a row copy); every other affine or TDNN layer feeds a ReLU (directly, or
    through a TDNN-F bottleneck) and keeps its refinement."""
    nnet, req, *_ = mc.reference_case(rel)
    comp = pynnet3.compile(nnet, req)
    comps = {n.name: nnet.components[n.component] for n in nnet.nodes
             if n.kind == "component-node"}
    got = {comp.commands[i].node for i in rc.sign_free_propagates(comp, comps)}
    assert got == free
