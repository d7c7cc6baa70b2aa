"""The NumPy program skips the zeroing that Kaldi's PROPAGATE_ADDS asks for before a
propagate whose component writes every entry anyway (``propagate_overwrite``:
TDNN layers without bias, Linear, StatisticsExtraction): the same results, one pass
less (runtime/program.py ``zeroing_skips``)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.reference import needs_reference, realistic_decode

_CFG = """
input-node name=input dim=5
component name=lin type=LinearComponent input-dim=5 output-dim=6
component-node name=lin component=lin input=input
component name=tdnn type=TdnnComponent input-dim=6 output-dim=4 time-offsets=-1,0,2 use-bias=false
component-node name=tdnn component=tdnn input=lin
component name=ext type=StatisticsExtractionComponent input-dim=4 input-period=1 output-period=1 include-variance=true
component-node name=ext component=ext input=tdnn
component name=pool type=StatisticsPoolingComponent input-dim=9 input-period=1 left-context=0 right-context=20 num-log-count-features=0 output-stddevs=true
component-node name=pool component=pool input=ext
output-node name=output input=pool
"""  # noqa: E501


def _net():
    return pynnet3.Nnet.from_config(_CFG, seed=5)


@pytest.mark.parametrize("name", ["lin", "tdnn", "ext"])
def test_propagate_overwrite_is_propagate_onto_zeros(name):
    nnet = _net()
    req = pynnet3.ComputationRequest.from_frames(range(-1, 20), range(0, 1))
    c = pynnet3.compile(nnet, req, optimize=False)
    node = nnet.node(name)
    comp = nnet.components[node.component]
    cmd = next(k for k in c.commands if k.type.name == "PROPAGATE" and k.node == name)
    pre = c.precomputed[cmd.precomputed]
    sin, sout = c.submatrices[cmd.in_value], c.submatrices[cmd.out_value]
    x = np.random.default_rng(1).standard_normal((sin.num_rows, sin.num_cols)).astype(np.float32)
    want = np.zeros((sout.num_rows, sout.num_cols), np.float32)
    comp.propagate(pre, x, want)
    got = np.full_like(want, np.nan)
    comp.propagate_overwrite(pre, x, got)
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).sum() > 0


def test_program_skips_the_zeroing_and_computes_the_same():
    nnet = _net()
    req = pynnet3.ComputationRequest.from_frames(range(-1, 20), range(0, 1), 3)
    c = pynnet3.compile(nnet, req)
    assert P.zeroing_skips(c), "no zeroing before a PROPAGATE_ADDS propagate found"
    x = {"input": np.random.default_rng(2).standard_normal((63, 5)).astype(np.float32)}
    fast = NnetComputer(nnet, c, cache_program=True).run(x).outputs["output"]
    plain = NnetComputer(nnet, c).run(x).outputs["output"]
    np.testing.assert_array_equal(fast, plain)


def test_a_component_without_overwrite_keeps_its_zeroing():
    """A PROPAGATE_ADDS component with no propagate_overwrite (a user's, say) gets
    the zeroing as before."""
    nnet = _net()
    req = pynnet3.ComputationRequest.from_frames(range(-1, 20), range(0, 1), 2)
    c = pynnet3.compile(nnet, req)
    comp = nnet.components["tdnn"]
    x = {"input": np.random.default_rng(3).standard_normal((42, 5)).astype(np.float32)}
    plain = NnetComputer(nnet, c).run(x).outputs["output"]
    comp.propagate_overwrite = None  # (instance attribute: getattr finds None)
    try:
        P._PROGRAMS.clear()
        fast = NnetComputer(nnet, c, cache_program=True).run(x).outputs["output"]
    finally:
        del comp.propagate_overwrite
    np.testing.assert_array_equal(fast, plain)


@needs_reference
def test_xvector_decode_matches_kaldi():
    nnet, req, inputs, outputs = realistic_decode("xvector")
    c = pynnet3.CachingCompiler(nnet).compile(req)
    assert P.zeroing_skips(c)
    want = outputs["output"]
    out = NnetComputer(nnet, c, cache_program=True).run(inputs).outputs["output"]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_a_subclass_with_its_own_propagate_keeps_its_math():
    """Review case: a user's LinearComponent subclass overriding only propagate
    inherits propagate_overwrite; the program must still run the subclass's math."""
    from pynnet3.compiler.request import request_for_frames
    from pynnet3.components.affine import LinearComponent

    class Doubled(LinearComponent):
        def propagate(self, indexes, in_value, out_value):
            out_value += 2.0 * (in_value @ self.params_.T)

    cfg = ("input-node name=input dim=6\n"
           "component name=a type=LinearComponent input-dim=6 output-dim=8\n"
           "component-node name=a component=a input=input\n"
           "output-node name=output input=a\n")
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    nnet.components["a"].__class__ = Doubled
    c = pynnet3.compile(nnet, request_for_frames(range(10), range(10), 2))
    assert P.zeroing_skips(c)
    x = {"input": np.random.default_rng(0).standard_normal((20, 6)).astype(np.float32)}
    plain = NnetComputer(nnet, c).run(dict(x)).outputs["output"]
    fast = NnetComputer(nnet, c, cache_program=True).run(dict(x)).outputs["output"]
    np.testing.assert_allclose(fast, plain, rtol=1e-6)
    np.testing.assert_allclose(plain, 2.0 * x["input"] @ nnet.components["a"].params_.T,
                               rtol=1e-5, atol=1e-6)
