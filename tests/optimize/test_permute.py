"""hoist_output_permutations: outputs requested sequence by sequence (n-major) are
computed in that order, so their final gather goes away. Expected values come from
the same computation with the pass off (float64, so equal to rounding)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from tests.compiler import nets

OFF = OptimizeOptions(hoist_output_permutations=False)

# An LSTM-like shape: a recurrence whose steps are gathered into the output layers
# (two heads, one with a log-softmax), as in tdnn_lstm's output layers.
RECURRENT_HEADS = """
input-node name=input dim=4
component name=affine1 type=NaturalGradientAffineComponent input-dim=7 output-dim=3
component-node name=affine1 component=affine1 input=Append(input, IfDefined(Offset(affine1, -2)))
component name=head1 type=AffineComponent input-dim=3 output-dim=6
component-node name=head1 component=head1 input=affine1
component name=head2 type=AffineComponent input-dim=3 output-dim=6
component-node name=head2 component=head2 input=affine1
component name=logsm type=LogSoftmaxComponent dim=6
component-node name=logsm component=logsm input=head2
output-node name=output input=Offset(head1, 1)
output-node name=output-xent input=Offset(logsm, 1)
"""

# A TDNN whose last affine reads a spliced layer in place: the output layer's input
# is cut (gathered in the output's order, 5 columns instead of the output's 9).
SPLICED = """
input-node name=input dim=3
component name=tdnn1 type=AffineComponent input-dim=9 output-dim=5
component-node name=tdnn1 component=tdnn1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=relu1 type=RectifiedLinearComponent dim=5
component-node name=relu1 component=relu1 input=tdnn1
component name=tdnn2 type=AffineComponent input-dim=10 output-dim=5
component-node name=tdnn2 component=tdnn2 input=Append(Offset(relu1, -2), relu1)
component name=out type=AffineComponent input-dim=5 output-dim=9
component-node name=out component=out input=tdnn2
component name=logsm type=LogSoftmaxComponent dim=9
component-node name=logsm component=logsm input=out
output-node name=output input=logsm
"""


def _case(config, n=3, t1=6, deriv=False, order="n"):
    nnet = pynnet3.Nnet.from_config(config, seed=3)
    nets.to_float64(nnet)
    left, right = nnet.context()
    outs = nets.frames(0, t1, n=n)
    if order == "t":  # Kaldi's own order: t, then n
        outs = outs[np.lexsort((outs[:, 0], outs[:, 1]))]
    req = nets.request({"input": nets.frames(-left, t1 + right, n=n)},
                       {name: outs.copy() for name in nnet.output_names()},
                       input_deriv=deriv, output_deriv=deriv, model=deriv)
    return nnet, req


def _output_gathers(c) -> int:
    """Whole-matrix COPY_ROWS into a matrix that is handed to the user."""
    provided = {c.submatrices[cmd.src].matrix for cmd in c.commands
                if cmd.type is CT.PROVIDE_OUTPUT}
    return sum(1 for cmd in c.commands if cmd.type is CT.COPY_ROWS
               and c.submatrices[cmd.dst].matrix in provided)


def _run(nnet, req, options, shortcut=False):
    comp = pynnet3.CachingCompiler(nnet, optimize=options, use_shortcut=shortcut).compile(req)
    pynnet3.analysis.check_computation(comp, nnet)
    rng = np.random.default_rng(5)
    res = pynnet3.run(nnet, comp, nets.random_inputs(nnet, req, rng),
                      output_derivs=nets.random_output_derivs(nnet, req, rng))
    return comp, res


@pytest.mark.parametrize("config", [RECURRENT_HEADS, SPLICED], ids=["recurrent", "spliced"])
@pytest.mark.parametrize("shortcut", [False, True], ids=["full", "shortcut"])
def test_outputs_lose_their_gather_and_keep_their_values(config, shortcut):
    nnet, req = _case(config)
    off, want = _run(nnet, req, OFF, shortcut)
    on, got = _run(nnet, req, OptimizeOptions(), shortcut)
    assert _output_gathers(off) == len(req.outputs)  # what the pass is for
    assert _output_gathers(on) == 0
    for name, value in want.outputs.items():
        np.testing.assert_allclose(got.outputs[name], value, rtol=1e-12, atol=1e-12)
    assert on.stats()["num_commands"] <= off.stats()["num_commands"] + 2 * (config is SPLICED)


def test_the_cut_is_one_gather_of_the_narrower_input():
    nnet, req = _case(SPLICED)
    on, _ = _run(nnet, req, OptimizeOptions())
    gathers = [cmd for cmd in on.commands if cmd.type is CT.COPY_ROWS]
    widths = sorted(on.submatrices[cmd.dst].num_cols for cmd in gathers)
    off, _ = _run(nnet, req, OFF)
    old = sorted(off.submatrices[cmd.dst].num_cols for cmd in off.commands
                 if cmd.type is CT.COPY_ROWS)
    # the output's 9-column gather is replaced by one of the last affine's 5 columns
    assert 9 in old and 9 not in widths
    assert sorted(old + [5]) == sorted(widths + [9])


@pytest.mark.parametrize("why, kwargs", [
    ("a backward pass", {"deriv": True}),
    ("outputs already in Kaldi's row order", {"order": "t"}),
    ("one sequence: nothing to reorder", {"n": 1}),
])
def test_left_alone(why, kwargs):
    nnet, req = _case(RECURRENT_HEADS, **kwargs)
    off, want = _run(nnet, req, OFF)
    on, got = _run(nnet, req, OptimizeOptions())
    assert [cmd.type for cmd in on.commands] == [cmd.type for cmd in off.commands], why
    for name, value in want.outputs.items():
        np.testing.assert_array_equal(got.outputs[name], value)


def test_not_through_a_component_that_mixes_rows():
    """StatisticsPooling reads many rows for each output row: the output's order
    cannot be pushed through it, and its input is not cut (it is not row-wise)."""
    config = "\n".join([
        "input-node name=input dim=2",
        "component name=extract type=StatisticsExtractionComponent input-dim=2 "
        "input-period=1 output-period=1 include-variance=false",
        "component-node name=extract component=extract input=input",
        "component name=pool type=StatisticsPoolingComponent input-dim=3 input-period=1 "
        "left-context=1 right-context=1 num-log-count-features=0 output-stddevs=false",
        "component-node name=pool component=pool input=extract",
        "output-node name=output input=pool"])
    nnet, req = _case(config, n=3, t1=4)
    off, want = _run(nnet, req, OFF)
    on, got = _run(nnet, req, OptimizeOptions())
    assert _output_gathers(on) == _output_gathers(off)
    np.testing.assert_array_equal(got.outputs["output"], want.outputs["output"])
