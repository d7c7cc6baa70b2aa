"""Sizes that only show while compiling (a statistics window, an attention context,
a matrix of the computation) are checked against pynnet3.limits before they are
allocated: a ComputeError that names the limit, not a MemoryError."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3 import ComputationRequest, IoSpecification, limits
from pynnet3.cache import CachingCompiler
from pynnet3.errors import ComputeError


def _frames(ts, n: int = 1) -> np.ndarray:
    return np.array([[i, t, 0] for i in range(n) for t in ts], dtype=np.int64)


def _request(inputs: dict, outputs: dict) -> ComputationRequest:
    return ComputationRequest([IoSpecification(k, v) for k, v in inputs.items()],
                              [IoSpecification(k, v) for k, v in outputs.items()])


POOLING = """input-node name=input dim=3
component name=s type=StatisticsExtractionComponent input-dim=3 input-period=1 output-period=1
component-node name=s component=s input=input
component name=p type=StatisticsPoolingComponent input-dim=7 input-period=1 \
left-context={ctx} right-context={ctx}
component-node name=p component=p input=s
output-node name=output input=p
"""  # (a backslash-newline joins the lines)


def test_statistics_window_dependencies():
    # fuzz (issue 14): a statistics period of 10^8 was a 384 GiB allocation while
    # compiling; today the period is limited, and the dependency table too
    nnet = pynnet3.Nnet.from_config(POOLING.format(ctx=1000))
    req = _request({"input": _frames(range(0, 300))}, {"output": _frames(range(0, 300))})
    with limits.override(max_rows=10000):
        with pytest.raises(ComputeError, match=r"dependencies of a statistics window = 90000 "
                                               r"exceeds the limit max_rows = 10000"):
            pynnet3.compile(nnet, req, optimize=False)
    comp = pynnet3.compile(nnet, req, optimize=False)  # within the default limit
    assert comp.matrices


ATTENTION = """input-node name=input dim={din}
component name=a type=RestrictedAttentionComponent num-heads=1 key-dim=2 value-dim=2 \
num-left-inputs={ctx} num-right-inputs=0 num-left-inputs-required=0 \
num-right-inputs-required=0 output-context=false
component-node name=a component=a input=input
output-node name=output input=a
"""


def test_attention_context_dependencies():
    ctx = 200
    nnet = pynnet3.Nnet.from_config(ATTENTION.format(ctx=ctx, din=2 * 2 + 2 + ctx + 1))
    req = _request({"input": _frames(range(0, 50))}, {"output": _frames(range(0, 50))})
    with limits.override(max_rows=5000):
        with pytest.raises(ComputeError, match=r"dependencies of an attention context = 10050 "
                                               r"exceeds the limit max_rows"):
            pynnet3.compile(nnet, req, optimize=False)
    pynnet3.compile(nnet, req, optimize=False)


WIDE = """input-node name=input dim=64
component name=a type=NoOpComponent dim=64
component-node name=a component=a input=input
output-node name=output input=a
"""


def test_matrix_size_is_checked_before_running():
    nnet = pynnet3.Nnet.from_config(WIDE)
    req = _request({"input": _frames(range(100))}, {"output": _frames(range(100))})
    with limits.override(max_floats=6399):
        with pytest.raises(ComputeError, match=r"floats in matrix m\d+ \(100x64, node '\w+'\) "
                                               r"= 6400 exceeds the limit max_floats = 6399"):
            pynnet3.compile(nnet, req)
    with limits.override(max_floats=6400):
        pynnet3.compile(nnet, req)


def test_matrix_size_after_shortcut_expansion():
    # the two-sequence computation is small, the expanded one is not
    nnet = pynnet3.Nnet.from_config(WIDE)
    req = _request({"input": _frames(range(10), n=40)}, {"output": _frames(range(10), n=40)})
    with limits.override(max_floats=10 * 64 * 39):
        cc = CachingCompiler(nnet, use_shortcut=True)
        with pytest.raises(ComputeError, match=r"\(400x64, .* exceeds the limit max_floats"):
            cc.compile(req)
    assert CachingCompiler(nnet, use_shortcut=True).compile(req) is not None
