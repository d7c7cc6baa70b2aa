"""A fused affine+ReLU layer (graphopt's AffineReluComponent) forwards unknown
attributes to its linear layer (``__getattr__``). The NumPy program's zeroing skip
(runtime/program.py ``zeroing_skips``) looked up ``propagate_overwrite`` on the
component object, so it found the *linear* layer's (a TDNN's) and ran it in place
of the fused propagate: the ReLU (and a folded BatchNorm) were skipped. It shows in
any computation that still zeroes an output before the fused propagate (compiled
unoptimized, or with ``initialize_undefined=False``)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.optimize import OptimizeOptions
from pynnet3.runtime.computer import NnetComputer

_CFG = """
input-node name=input dim=6
component name=tdnn type=TdnnComponent input-dim=6 output-dim=8 time-offsets=-1,0,1
component-node name=tdnn component=tdnn input=input
component name=relu type=RectifiedLinearComponent dim=8
component-node name=relu component=relu input=tdnn
component name=out type=AffineComponent input-dim=8 output-dim=3
component-node name=out component=out input=relu
output-node name=output input=out
"""


@pytest.mark.parametrize("optimize", [False, OptimizeOptions(initialize_undefined=False)],
                         ids=["unoptimized", "no-initialize-undefined"])
def test_fused_tdnn_relu_after_a_zeroing_keeps_its_relu(optimize):
    nnet = pynnet3.Nnet.from_config(_CFG, seed=3)
    fused = pynnet3.optimize_network(copy.deepcopy(nnet))
    assert any(c.type_name == "AffineReluComponent" for c in fused.components.values())
    req = pynnet3.ComputationRequest.from_frames(range(-1, 11), range(0, 10))
    x = {"input": np.random.default_rng(0).standard_normal((12, 6)).astype(np.float32)}
    want = NnetComputer(nnet, pynnet3.compile(nnet, req, optimize=False)).run(x)
    c = pynnet3.compile(fused, req, optimize=optimize)
    plain = NnetComputer(fused, c).run(x).outputs["output"]
    np.testing.assert_allclose(plain, want.outputs["output"], rtol=1e-5, atol=1e-5)
    for _ in range(2):  # (the program, then the arena of kept buffers)
        got = NnetComputer(fused, c, cache_program=True).run(x).outputs["output"]
        np.testing.assert_allclose(got, want.outputs["output"], rtol=1e-5, atol=1e-5)
