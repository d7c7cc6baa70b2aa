"""Review finding: NnetComputer.run enters near_zero_refinement(self._has_backward),
but the stepping API (accept_input / run_until_io / get_output; what
runtime/looped.py's DecodableNnetLooped uses) never does. A forward-only
computation stepped through therefore runs with backward_follows() True: the
float64 near-zero refinement runs and matmul_blocks_into is never used, so looped
decoding pays for the refinement and gives other float32 bits than run() of the
same computation."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.components import affine
from pynnet3.optimize.io_ops import consolidate_io_operations
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N


def test_stepping_forward_only_sees_no_backward(monkeypatch):
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 13)}, {"output": N.frames(0, 10)})
    c = pynnet3.compile(nnet, req)
    consolidate_io_operations(c)
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    seen = []
    orig = affine.AffineComponent.propagate

    def spy(self, *a, **k):
        seen.append(affine.backward_follows())
        return orig(self, *a, **k)

    monkeypatch.setattr(affine.AffineComponent, "propagate", spy)
    NnetComputer(nnet, c).run(x)
    assert seen and not any(seen)  # run(): forward-only detected
    seen.clear()
    comp = NnetComputer(nnet, c)
    comp.accept_input("input", x["input"])
    comp.run_until_io()
    comp.get_output("output")
    assert seen and not any(seen), seen
