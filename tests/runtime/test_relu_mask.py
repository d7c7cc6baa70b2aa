"""runtime: a ReLU backprop that is the only reader of its sign-only compressed
output takes the codes as its ``y > 0`` mask (runtime.computer.relu_mask_plans,
runtime.compression.positive_mask): no decompression, the same bits."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.components.nonlinear import RectifiedLinearComponent
from pynnet3.computation import CommandType as CT
from pynnet3.runtime import compression
from pynnet3.runtime import computer as rc
from pynnet3.runtime.compression import CompressedMatrix, positive_mask
from pynnet3.runtime.computer import NnetComputer
from tests.optimize import memory_cases as mc


def _run(nnet, comp, x, d, cache_program=False):
    return NnetComputer(copy.deepcopy(nnet), comp, cache_program=cache_program).run(
        dict(x), dict(d))


def _same(a, b):
    for what in ("outputs", "input_derivs"):
        for k, v in getattr(a, what).items():
            np.testing.assert_array_equal(getattr(b, what)[k], v)
    for c, grads in a.gradients.items():
        for p, v in grads.items():
            np.testing.assert_array_equal(b.gradients[c][p], v)


@pytest.mark.parametrize("cache_program", [False, True])
def test_masked_relu_backprop_is_bit_identical(monkeypatch, cache_program):
    nnet, req, x, d = mc.small_case(mc.RELU, n=8)
    comp = pynnet3.compile(nnet, req)
    decompressions = [i for i, c in enumerate(comp.commands)
                      if c.type is CT.DECOMPRESS_MATRIX]
    assert decompressions
    comps = {n.name: nnet.components[n.component] for n in nnet.nodes
             if n.kind == "component-node"}
    plans = rc.relu_mask_plans(comp, comps)
    assert sorted(plans) == decompressions
    masks, calls = [], []
    orig_backprop, orig_decompress = RectifiedLinearComponent.backprop, compression.decompress

    def spy_backprop(self, indexes, in_value, out_value, *rest):
        masks.append(out_value.dtype == np.bool_)
        return orig_backprop(self, indexes, in_value, out_value, *rest)

    def spy_decompress(obj, out):
        calls.append(1)
        orig_decompress(obj, out)

    monkeypatch.setattr(RectifiedLinearComponent, "backprop", spy_backprop)
    monkeypatch.setattr(compression, "decompress", spy_decompress)
    # (the spy is not Kaldi's backprop: plan with the real one, then run)
    monkeypatch.setattr(rc, "relu_mask_plans", lambda c, comps: plans)
    got = _run(nnet, comp, x, d, cache_program)
    assert sum(masks) == len(plans) and not calls  # (a ReLU not compressed: floats)
    n_relu = len(masks)
    masks.clear()
    monkeypatch.setattr(rc, "relu_mask_plans", lambda c, comps: {})
    want = _run(nnet, comp, x, d, cache_program)
    assert len(masks) == n_relu and not any(masks) and len(calls) == len(decompressions)
    _same(want, got)


def test_a_relu_subclass_with_its_own_backprop_gets_floats():
    class MyRelu(RectifiedLinearComponent):
        def backprop(self, *args):
            return super().backprop(*args)

    nnet, req, *_ = mc.small_case(mc.RELU, n=2)
    comp = pynnet3.compile(nnet, req)
    comps = {n.name: nnet.components[n.component] for n in nnet.nodes
             if n.kind == "component-node"}
    assert rc.relu_mask_plans(comp, comps)
    for k, c in comps.items():
        if isinstance(c, RectifiedLinearComponent):
            comps[k] = copy.copy(c)
            comps[k].__class__ = MyRelu
    assert rc.relu_mask_plans(comp, comps) == {}


@pytest.mark.parametrize("kind", [compression.UINT8, compression.INT8, compression.INT16,
                                  compression.UINT16])
def test_positive_mask_is_decompressed_greater_than_zero(kind):
    x = np.random.default_rng(0).standard_normal((50, 7)).astype(np.float32)
    x[::5] = 0.0
    c = compression.compress(x, kind, 0.0)
    out = np.empty_like(x)
    compression.decompress(c, out)
    np.testing.assert_array_equal(positive_mask(c), out > 0)
    with pytest.raises(pynnet3.errors.PynnetError):
        positive_mask(CompressedMatrix(c.data, 0.5))
