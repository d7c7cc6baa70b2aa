"""The forward-only row-block peephole of the NumPy program (runtime/computer.py
``_row_block_plans``): an input block filled with a few rows repeated (an iVector
appended to every frame) is multiplied once per source row. Outputs equal the
command-by-command run's up to float32 rounding; where the component has no
row-block product, or a backward pass follows, nothing changes at all."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler.request import request_for_frames
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.blas_probe import assert_same_floats_if, matmul_keeps_row_blocks, random_operands
from tests.reference import needs_reference, realistic_decode

_AFFINE = ("""
input-node name=input dim=6
input-node name=ivector dim=4
component name=a type=NaturalGradientAffineComponent input-dim=22 output-dim=8
component-node name=a component=a input=Append(Offset(input, -1), input, Offset(input, 1), """
           """ReplaceIndex(ivector, t, 0))
component name=r type=RectifiedLinearComponent dim=8
component-node name=r component=r input=a
output-node name=output input=r
""")

# the same input, read by a component with no row-block product (the plan's fallback)
_NOOP = """
input-node name=input dim=6
input-node name=ivector dim=4
component name=n type=NoOpComponent dim=10
component-node name=n component=n input=Append(input, Scale(0.5, ReplaceIndex(ivector, t, 0)))
output-node name=output input=n
"""


def _inputs(req, seed=0):
    rng = np.random.default_rng(seed)
    return {io.name: rng.standard_normal((len(io.indexes), 6 if io.name == "input" else 4))
            .astype(np.float32) for io in req.inputs}


def _runs(nnet, req):
    """(program result, command-by-command result, plans of the computation)."""
    c = pynnet3.compile(nnet, req)
    x = _inputs(req)
    fast = NnetComputer(nnet, c, cache_program=True).run(x)
    plain = NnetComputer(nnet, c).run(x)
    return fast, plain, P.row_block_plans(c)


@pytest.mark.parametrize("n", [1, 3])
def test_ivector_block_product_taken_once_per_sequence(n):
    nnet = pynnet3.Nnet.from_config(_AFFINE, seed=1)
    req = request_for_frames(range(-1, 11), range(10), n, ivector=True)
    fast, plain, plans = _runs(nnet, req)
    assert plans, "the iVector block was not planned"
    a, b = fast.outputs["output"], plain.outputs["output"]
    assert a.shape == b.shape == (10 * n, 8)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
    assert (a > 0).any()  # (not all rectified away: the check means something)


def test_a_sequence_computes_the_same_floats_in_any_batch():
    """pynnet3 compute's batches (and --jobs) must not change a chunk's output: the
    planned product of one sequence is bit-identical alone and among others, where
    this BLAS gives a product's rows the same floats whatever their position (NumPy's
    own matmul of the layer's shapes, tests/blas_probe.py); elsewhere no batched GEMM
    can, and the outputs agree to float32 rounding."""
    exact = all(matmul_keeps_row_blocks(*random_operands((30, k), (k, 8)), [10, 10, 10])
                for k in (18, 22))
    nnet = pynnet3.Nnet.from_config(_AFFINE, seed=4)
    x3 = _inputs(request_for_frames(range(-1, 11), range(10), 3, ivector=True), seed=5)
    three = NnetComputer(nnet, pynnet3.compile(
        nnet, request_for_frames(range(-1, 11), range(10), 3, ivector=True)),
        cache_program=True).run(x3).outputs["output"]
    for s in range(3):
        one_req = request_for_frames(range(-1, 11), range(10), 1, ivector=True)
        c = pynnet3.compile(nnet, one_req)
        assert P.row_block_plans(c)
        x1 = {"input": x3["input"][12 * s:12 * (s + 1)], "ivector": x3["ivector"][s:s + 1]}
        one = NnetComputer(nnet, c, cache_program=True).run(x1).outputs["output"]
        assert_same_floats_if(exact, one, three[10 * s:10 * (s + 1)])


def test_independent_math():
    """The planned product against float64 math of the layer itself."""
    nnet = pynnet3.Nnet.from_config(_AFFINE, seed=2)
    req = request_for_frames(range(-1, 11), range(10), 2, ivector=True)
    c = pynnet3.compile(nnet, req)
    x = _inputs(req, seed=3)
    out = NnetComputer(nnet, c, cache_program=True).run(x).outputs["output"]
    comp = nnet.components["a"]
    w, b = comp.linear_params.astype(np.float64), comp.bias_params.astype(np.float64)
    feats = x["input"].astype(np.float64).reshape(2, 12, 6)
    want = []
    for s in range(2):
        for t in range(10):  # input rows are t = -1 .. 10: row t + 1 is time t
            row = np.concatenate([feats[s, t], feats[s, t + 1], feats[s, t + 2],
                                  x["ivector"][s].astype(np.float64)])
            want.append(np.maximum(w @ row + b, 0.0))
    np.testing.assert_allclose(out, np.array(want), rtol=1e-5, atol=1e-5)


def test_fallback_without_row_block_product_is_exact():
    nnet = pynnet3.Nnet.from_config(_NOOP, seed=0)
    req = request_for_frames(range(0, 8), range(8), 2, ivector=True)
    fast, plain, plans = _runs(nnet, req)
    np.testing.assert_array_equal(fast.outputs["output"], plain.outputs["output"])
    np.testing.assert_array_equal(fast.outputs["output"][:8, 6:],
                                  np.repeat(0.5 * _inputs(req)["ivector"][:1], 8, axis=0))


def test_no_plan_when_a_backward_pass_follows():
    nnet = pynnet3.Nnet.from_config(_AFFINE, seed=1)
    req = request_for_frames(range(-1, 11), range(10), 2, ivector=True,
                             output_deriv=True, need_model_derivative=True)
    c = pynnet3.compile(nnet, req)
    program = P.program_for(c)
    assert program.has_backward
    x = _inputs(req)
    d = {"output": np.ones((20, 8), np.float32)}
    fast = NnetComputer(nnet, c, cache_program=True).run(x, d)
    plain = NnetComputer(nnet, c).run(x, d)
    np.testing.assert_array_equal(fast.outputs["output"], plain.outputs["output"])


def test_no_plan_when_rows_are_not_repeated():
    """A row copy with as many source rows as it fills (an Offset, not an iVector)."""
    cfg = _AFFINE.replace("ReplaceIndex(ivector, t, 0)", "Offset(input, 2)").replace(
        "input-dim=22", "input-dim=24").replace("input-node name=ivector dim=4\n", "")
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = request_for_frames(range(-1, 12), range(10), 3)
    c = pynnet3.compile(nnet, req)
    assert P.row_block_plans(c) == {}


@needs_reference
def test_tdnnf_chain_decode_matches_kaldi_with_the_plan():
    """The realistic TDNN-F (iVector appended to the first layer's input), network
    optimized, at Kaldi's decode request: the plan fires and the output still
    matches Kaldi's."""
    nnet, req, inputs, outputs = realistic_decode("tdnnf_chain")
    opt = pynnet3.optimize_network(nnet)
    c = pynnet3.compile(opt, req)
    assert P.row_block_plans(c)
    want = outputs["output"]
    out = NnetComputer(opt, c, cache_program=True).run(inputs).outputs["output"]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


_TWO_CONSUMERS = ("""
input-node name=input dim=6
input-node name=ivector dim=4
component name=a type=AffineComponent input-dim=14 output-dim=8
component-node name=a component=a input=Append(ReplaceIndex(ivector, t, 0), input, """
                  """Scale(2.0, ReplaceIndex(ivector, t, 0)))
component name=b type=AffineComponent input-dim=10 output-dim=8
component-node name=b component=b input=Append(input, ReplaceIndex(ivector, t, 0))
output-node name=output input=Sum(a, b)
""")


def test_one_source_deallocation_is_not_moved_for_two_plans():
    """Review case: both layers' input copies (reading one iVector matrix) put before
    both propagates, the iVector freed in between (a valid order the checker
    accepts): the freeing may wait for one planned propagate, not for two."""
    import copy

    nnet = pynnet3.Nnet.from_config(_TWO_CONSUMERS, seed=3)
    req = request_for_frames(range(-1, 14), range(12), 2, ivector=True)
    c = pynnet3.compile(nnet, req)
    order = [0, 1, 2, 3, 4, 8, 9, 10, 12, 11, 13, 5, 6, 7, 14, 15]
    order += list(range(16, len(c.commands)))
    assert sorted(order) == list(range(len(c.commands)))
    c2 = copy.deepcopy(c)
    c2.commands = [c.commands[i] for i in order]
    pynnet3.check(c2, nnet)
    moved = [j for _, deallocs in P.row_block_plans(c2).values() for j in deallocs]
    assert len(moved) == len(set(moved))
    rng = np.random.default_rng(0)
    x = {io.name: rng.standard_normal((len(io.indexes), nnet.input_dim(io.name)))
         .astype(np.float32) for io in req.inputs}
    plain = NnetComputer(nnet, c2).run(dict(x)).outputs["output"]
    fast = NnetComputer(nnet, c2, cache_program=True).run(dict(x)).outputs["output"]
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def test_an_affine_subclass_with_its_own_product_is_not_bypassed():
    from pynnet3.components.affine import AffineComponent

    class Doubled(AffineComponent):
        type_name = "AffineComponent"  # (not registered: put into the network by hand)

        def _propagate(self, in_value, out_value, blocks):
            super()._propagate(in_value, out_value, blocks)
            out_value *= 2.0

    nnet = pynnet3.Nnet.from_config(_AFFINE, seed=1)
    plain_comp = nnet.components["a"]
    doubled = Doubled(plain_comp.linear_params.copy(), plain_comp.bias_params.copy())
    req = request_for_frames(range(-1, 11), range(10), 2, ivector=True)
    c = pynnet3.compile(nnet, req)
    x = _inputs(req)
    want = NnetComputer(nnet, c, cache_program=True).run(x).outputs["output"]
    nnet.components["a"] = doubled
    got = NnetComputer(nnet, c, cache_program=True).run(x).outputs["output"]
    np.testing.assert_allclose(got, np.maximum(2.0 * np.where(want > 0, want, 0), 0),
                               rtol=1e-5, atol=1e-5)
