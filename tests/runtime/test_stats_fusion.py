# ruff: noqa: E501
"""The forward-only statistics peephole of the NumPy program (runtime/program.py
``stats_plans``): an x-vector's statistics extraction (one row per window) read
only by the pooling is not made; the pooling sums its input's columns itself. The
same floats as running both (a column's window sums do not depend on the others)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.reference import needs_reference, realistic_decode

_CFG = """input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=5
component-node name=a component=a input=input
component name=ext type=StatisticsExtractionComponent input-dim=5 input-period=1 output-period={period} include-variance={var}
component-node name=ext component=ext input=a
component name=pool type=StatisticsPoolingComponent input-dim={pdim} input-period={period} left-context=0 right-context=30 num-log-count-features={nlc} output-stddevs={var}
component-node name=pool component=pool input=ext
component name=b type=AffineComponent input-dim={bdim} output-dim=3
component-node name=b component=b input=pool
output-node name=output input=b
"""


def _net(var=True, nlc=1, period=1):
    pdim = 1 + 5 * (2 if var else 1)
    bdim = nlc + 5 * (2 if var else 1)
    return pynnet3.Nnet.from_config(_CFG.format(var=str(var).lower(), nlc=nlc, pdim=pdim,
                                                bdim=bdim, period=period), seed=3)


def _both(nnet, n=3, frames=31):
    req = pynnet3.ComputationRequest.from_frames(range(0, frames), range(0, 1), n)
    c = pynnet3.compile(nnet, req)
    x = {"input": np.random.default_rng(1).standard_normal((n * frames, 4)).astype(np.float32)}
    fast = NnetComputer(nnet, c, cache_program=True).run(dict(x)).outputs["output"]
    plain = NnetComputer(nnet, c).run(dict(x)).outputs["output"]
    return c, fast, plain


@pytest.mark.parametrize("var, nlc", [(True, 1), (True, 0), (False, 2)])
def test_pooling_from_the_extractions_input_is_bit_identical(var, nlc):
    c, fast, plain = _both(_net(var, nlc))
    assert P.stats_plans(c)
    np.testing.assert_array_equal(fast, plain)
    assert np.abs(plain).max() > 0


def test_no_plan_for_an_extraction_with_several_rows_per_window():
    c, fast, plain = _both(_net(period=2), frames=32)
    assert not P.stats_plans(c)
    np.testing.assert_array_equal(fast, plain)


def test_a_pooling_subclass_runs_its_own_math():
    nnet = _net()
    pool = nnet.components["pool"]
    plain_c, _, want = _both(nnet)

    class Doubled(type(pool)):
        def propagate(self, indexes, in_value, out_value):
            super().propagate(indexes, in_value, out_value)
            out_value *= 2.0

    pool.__class__ = Doubled
    c, fast, plain = _both(nnet)
    np.testing.assert_array_equal(fast, plain)
    assert not np.allclose(plain, want)  # (the subclass's math ran, in both)


@needs_reference
def test_xvector_decode_matches_kaldi_and_the_plain_run():
    nnet, req, inputs, outputs = realistic_decode("xvector")
    nnet = pynnet3.optimize_network(nnet)
    c = pynnet3.CachingCompiler(nnet).compile(req)
    assert P.stats_plans(c)
    want = outputs["output"]
    fast = NnetComputer(nnet, c, cache_program=True).run(dict(inputs)).outputs["output"]
    plain = NnetComputer(nnet, c).run(dict(inputs)).outputs["output"]
    np.testing.assert_array_equal(fast, plain)
    np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
