"""A residual connection's in-place scale and add run as one pass
(runtime/program.scale_add_plans, components/blas.scale_add): the same floats as
the two commands, forward and backward, and refused where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.components import blas
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N
from tests.runtime.test_program import _assert_same, _both

# TDNN-F's bypass: each layer's output plus 0.66 times the previous one, wide enough
# (dim 96, a few hundred rows) for the one-pass call
RESIDUAL = """
input-node name=input dim=96
component name=a1 type=AffineComponent input-dim=96 output-dim=96
component-node name=a1 component=a1 input=input
component name=t1 type=TanhComponent dim=96
component-node name=t1 component=t1 input=a1
component name=a2 type=AffineComponent input-dim=96 output-dim=96
component-node name=a2 component=a2 input=t1
component name=t2 type=TanhComponent dim=96
component-node name=t2 component=t2 input=Sum(Scale(0.66, t1), a2)
component name=a3 type=AffineComponent input-dim=96 output-dim=96
component-node name=a3 component=a3 input=t2
component name=t3 type=TanhComponent dim=96
component-node name=t3 component=t3 input=Sum(Scale(0.66, t2), a3)
output-node name=output input=t3
"""


@pytest.mark.skipif(not blas._GEADD, reason="no OpenBLAS geadd in NumPy's library")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_add_is_the_two_passes(dtype):
    rng = np.random.default_rng(0)
    big = rng.standard_normal((600, 130)).astype(dtype)
    for view, beta in ((np.s_[10:550], 0.66), (np.s_[:, 2:129], -1.5), (np.s_[:], 0.85)):
        want, got = big.copy(), big.copy()
        a = rng.standard_normal(big[view].shape).astype(dtype)
        w = want[view]
        w *= beta
        w += a
        assert blas.scale_add(got[view], a, beta)
        np.testing.assert_array_equal(got, want)


def test_scale_add_refuses_what_it_cannot_do():
    x = np.ones((300, 100), np.float32)
    assert not blas.scale_add(x, x[::-1].copy().T.T[:, :99], 0.5)  # shapes differ
    assert not blas.scale_add(x, x, 0.5)  # the same memory
    assert not blas.scale_add(x[:, :50], x[:, 50:], 0.5)  # overlapping ranges of one array
    assert not blas.scale_add(x, np.ones((300, 100), np.float64), 0.5)  # dtypes differ
    assert not blas.scale_add(x.T, np.ones((100, 300), np.float32).T.T.copy(), 0.5)
    assert not blas.scale_add(x[:10], np.ones((10, 100), np.float32), 0.5)  # small: NumPy
    np.testing.assert_array_equal(x, 1.0)  # (nothing written)


@pytest.mark.parametrize("derivs", [(False, False, False), (True, True, True)],
                         ids=["forward", "backward"])
def test_residual_runs_as_one_pass_with_the_same_floats(derivs):
    nnet = pynnet3.Nnet.from_config(RESIDUAL, seed=1)
    req = N.request({"input": N.frames(0, 400)}, {"output": N.frames(0, 400)}, *derivs)
    c = pynnet3.compile(nnet, req)
    # (one per bypass where the sum is made in place, as in decoding; a training
    # computation keeps the previous layer's value for its backprop and sums into a
    # new matrix: nothing to plan, and the run must be unchanged)
    want = 0 if derivs[0] else 2
    assert len(P.scale_add_plans(c)) == want
    program = P.program_for(c)
    assert sum(prep is P._prepare_scale_add for prep, _ in program.recipe) == want
    rng = np.random.default_rng(2)
    x = N.random_inputs(nnet, req, rng, np.float32)
    d = N.random_output_derivs(nnet, req, rng, np.float32)
    plain, fast = _both(nnet, c, x, d)
    assert not P.row_block_plans(c)  # (so _assert_same compares bit for bit)
    _assert_same(plain, fast, c)
    if not derivs[0]:  # a second run goes through kept buffers (runtime/arena.py)
        again = NnetComputer(nnet, c, cache_program=True).run(x)
        np.testing.assert_array_equal(again.outputs["output"], plain.outputs["output"])


def test_no_plan_when_the_add_reads_the_scaled_matrix():
    """``S = a * S`` then ``S += S'`` with ``S'`` in ``S``'s own matrix is left as
    two commands (the one-pass call needs separate memory)."""
    from pynnet3.computation import Command
    from pynnet3.computation import CommandType as CT

    nnet = pynnet3.Nnet.from_config(RESIDUAL, seed=1)
    req = N.request({"input": N.frames(0, 400)}, {"output": N.frames(0, 400)})
    c = pynnet3.compile(nnet, req).copy()
    j, i = next(iter(P.scale_add_plans(c).items()))
    add = c.commands[j]
    c.commands[j] = Command(CT.MATRIX_ADD, dst=add.dst, src=add.dst, alpha=1.0)
    assert j not in P.scale_add_plans(c)
    c.commands[j] = Command(CT.MATRIX_ADD, dst=add.dst, src=add.src, alpha=0.5)
    assert j not in P.scale_add_plans(c)
