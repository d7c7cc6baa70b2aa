"""Pruning of an identity node over an Append read only by dim-range nodes that each
select one part (an LSTM's BackpropTruncation over Append(c, r), read back as c_trunc
and r_trunc): the dim-range nodes become their parts where the parts are computable at
the same indexes, and the network computes what it computed (expected values from the
unoptimized network, bit for bit: no arithmetic changes)."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.compiler.request import request_for_frames
from tests.compiler.nets import FAST_LSTMP
from tests.graphopt.common import assert_equivalent, build, only, optimize

LSTM = FAST_LSTMP.format(x="input", delay=-1)


def _commands(nnet, request) -> int:
    return pynnet3.compile(nnet, request, optimize=True).stats()["num_commands"]


def test_lstm_truncation_split_into_its_parts():
    nnet = build(LSTM, seed=3)
    nnet.set_test_mode(True)
    opt, report = optimize(nnet, only("pruning"))
    names = [n.name for n in opt.nodes]
    assert not {"cr_trunc", "c_trunc", "r_trunc"} & set(names)
    assert "trunc" not in opt.components
    assert str(opt.node("nonlin").descriptor) == "Append(W_all, IfDefined(Offset(c, -1)))"
    assert str(opt.node("W_all").descriptor) == "Append(input, IfDefined(Offset(r, -1)))"
    notes = [note for p in report.passes for note in p.notes]
    assert "c_trunc (reads c; cr_trunc is the identity)" in notes, notes
    request = request_for_frames(range(0, 12), range(12), 3)
    assert _commands(opt, request) < _commands(nnet, request)
    inputs = {"input": np.random.default_rng(0).standard_normal((36, 5)).astype(np.float32)}
    want = pynnet3.run(nnet, request, inputs).outputs["output"]
    got = pynnet3.run(opt, request, inputs).outputs["output"]
    np.testing.assert_array_equal(got, want)
    assert_equivalent(nnet, opt, frames=9)


def test_kept_with_keep_derivatives():
    """Truncation is not the identity for derivatives: nothing changes."""
    nnet = build(LSTM, seed=3)
    opt, _ = optimize(nnet, only("pruning", keep_derivatives=True))
    assert "cr_trunc" in [n.name for n in opt.nodes]


# The parts are computable at different indexes (b only where input(t+1) exists), and
# a consumer reads the dim range through IfDefined: Append(a, b) is undefined at the
# last frame, where a alone is defined, so splitting would change the value there.
UNEQUAL = """
input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=2
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim=3 output-dim=2
component-node name=b component=b input=Offset(input, 1)
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Append(a, b)
dim-range-node name=na input-node=n dim-offset=0 dim=2
dim-range-node name=nb input-node=n dim-offset=2 dim=2
component name=o type=AffineComponent input-dim=7 output-dim=2
component-node name=o component=o input=Append(input, IfDefined(na), IfDefined(Offset(nb, -1)))
output-node name=output input=o
"""


def test_parts_with_other_computability_are_kept():
    nnet = build(UNEQUAL, seed=1)
    opt, _ = optimize(nnet, only("pruning"))
    assert {"n", "na", "nb"} <= {n.name for n in opt.nodes}
    # the last frame is where the difference would show: input(t+1) is missing there
    request = request_for_frames(range(0, 6), range(6), 1)
    inputs = {"input": np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32)}
    want = pynnet3.run(nnet, request, inputs).outputs["output"]
    np.testing.assert_array_equal(pynnet3.run(opt, request, inputs).outputs["output"], want)


def test_a_range_across_parts_is_kept():
    """A dim range that is not exactly one part (here c[1:] and r[:1]) leaves the
    truncation node as it is."""
    nnet = build(LSTM.replace("name=c_trunc input-node=cr_trunc dim-offset=0",
                              "name=c_trunc input-node=cr_trunc dim-offset=1"), seed=3)
    nnet.set_test_mode(True)
    opt, _ = optimize(nnet, only("pruning"))
    assert {"cr_trunc", "c_trunc", "r_trunc"} <= {n.name for n in opt.nodes}


def test_kept_when_another_node_reads_the_whole():
    nnet = build(LSTM + "output-node name=both input=cr_trunc\n", seed=3)
    nnet.set_test_mode(True)
    opt, _ = optimize(nnet, only("pruning"))
    assert {"cr_trunc", "c_trunc", "r_trunc"} <= {n.name for n in opt.nodes}
