# ruff: noqa: E501
"""pads_at_end (runtime/simple.py): when a short last chunk may be computed full-size
and cut back. Every network it accepts gives the short chunk's rows (checked by
computing both), and the review's counterexamples are refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler
from pynnet3.runtime.simple import DecodableNnetSimple, SimpleOptions, pads_at_end
from tests.compiler.nets import FAST_LSTMP


def _outputs(nnet, length=23, fpc=20):
    f = np.random.default_rng(5).standard_normal((length, nnet.input_dim("input")))
    return [DecodableNnetSimple(nnet, CachingCompiler(nnet), f.astype(np.float32),
                                SimpleOptions(frames_per_chunk=fpc),
                                pad_last_chunk=pad).output() for pad in (True, False)]


def _differs(nnet) -> bool:
    padded, short = _outputs(nnet)
    return not np.allclose(padded, short, rtol=1e-5, atol=1e-6 * float(np.abs(short).max()))


_HEAD = """input-node name=input dim=3
component name=ya type=AffineComponent input-dim=3 output-dim=2
component-node name=y component=ya input=Offset(input, {y})
"""

# Each would change its last rows if padded (shown by the last assertion).
REFUSED = {
    # Switch and Round reach an offset at some times only: the context bound fails
    "switch": _HEAD.format(y=5) + """\
component name=ca type=AffineComponent input-dim=5 output-dim=3
component-node name=c component=ca input=Append(Switch(input, Offset(input, 5)), IfDefined(Offset(y, -1)))
output-node name=output input=Switch(Offset(c, 4), input)
""",
    "round": _HEAD.format(y=6) + """\
component name=ca type=AffineComponent input-dim=5 output-dim=3
component-node name=c component=ca input=Append(Round(Offset(input, 5), 2), IfDefined(Offset(y, -1)))
output-node name=output input=Append(input, Round(Offset(c, 1), 2))
""",
    # a non-input node at a fixed time (t = 0: near the chunk's start)
    "replace-index-optional": _HEAD.format(y=6) + """\
component name=ca type=AffineComponent input-dim=5 output-dim=3
component-node name=c component=ca input=Append(input, IfDefined(ReplaceIndex(y, t, 0)))
output-node name=output input=c
""",
    "replace-index-required": _HEAD.format(y=6) + """\
component name=na type=AffineComponent input-dim=2 output-dim=2
component-node name=n component=na input=ReplaceIndex(y, t, 0)
component name=ca type=AffineComponent input-dim=5 output-dim=3
component-node name=c component=ca input=Append(input, IfDefined(Offset(n, -1)))
output-node name=output input=c
""",
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_review_counterexamples_are_refused(name):
    nnet = pynnet3.Nnet.from_config(REFUSED[name], seed=1)
    assert not pads_at_end(nnet)
    assert _differs(nnet)  # (padding them would have changed outputs)


def test_a_batchnorm_in_training_mode_is_refused():
    cfg = """input-node name=input dim=3
component name=a type=AffineComponent input-dim=5 output-dim=2
component-node name=a component=a input=Append(input, IfDefined(Offset(b, -1)))
component name=bn type=BatchNormComponent dim=2
component-node name=b component=bn input=a
output-node name=output input=b
"""
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    assert not pads_at_end(nnet)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (no statistics: made up)
        nnet.set_test_mode(True)
    assert pads_at_end(nnet)
    assert not _differs(nnet)


def test_an_ivector_at_a_fixed_time_is_fine():
    cfg = """input-node name=input dim=3
input-node name=ivector dim=2
component name=a type=AffineComponent input-dim=7 output-dim=2
component-node name=a component=a input=Append(input, ReplaceIndex(ivector, t, 0), IfDefined(Offset(a, -2)))
output-node name=output input=a
"""
    assert pads_at_end(pynnet3.Nnet.from_config(cfg, seed=1))


def test_a_deep_network_is_analysed_without_recursion():
    """3000 layers listed consumers first (review: RecursionError at 250+)."""
    n = 3000
    lines = ["input-node name=input dim=2",
             "component name=a type=AffineComponent input-dim=4 output-dim=2"]
    lines += [f"component name=c{i} type=NoOpComponent dim=2" for i in range(1, n)]
    nodes = ["component-node name=n0 component=a input=Append(input, IfDefined(Offset(n0, -1)))"]
    nodes += [f"component-node name=n{i} component=c{i} input=n{i - 1}" for i in range(1, n)]
    cfg = "\n".join(lines + nodes[::-1] + [f"output-node name=output input=n{n - 1}"])
    assert pads_at_end(pynnet3.Nnet.from_config(cfg, seed=1))


_LSTM = FAST_LSTMP.format(x="Offset(input, 1)", delay=-2)


def test_an_lstm_with_its_recurrent_product_split_is_accepted():
    """split-recurrent-affine leaves a node with only optional inputs (the recurrent
    product): its readers' required inputs bound it, and padding keeps the rows."""
    nnet = pynnet3.Nnet.from_config(_LSTM, seed=2)
    nnet.set_test_mode(True)
    split = pynnet3.optimize_network(nnet, pynnet3.NetworkOptions(
        enable_rules=("split-recurrent-affine",)))
    assert "W_all.recurrent" in [n.name for n in split.nodes]
    assert str(split.node("W_all.recurrent").descriptor).startswith("IfDefined(")
    assert pads_at_end(nnet) and pads_at_end(split)
    assert not _differs(split)
    np.testing.assert_allclose(_outputs(split)[0], _outputs(nnet)[0], rtol=1e-4, atol=1e-5)


# A node with only optional inputs whose optional input looks further ahead than its
# reader's required inputs (y needs input(t + 5), its reader only input(t)): near the
# end y is undefined in the short chunk and defined in the padded one.
ONLY_OPTIONAL = _HEAD.format(y=5) + """\
component name=ba type=AffineComponent input-dim=2 output-dim=2
component-node name=b component=ba input=IfDefined(Offset(y, -1))
component name=ca type=AffineComponent input-dim=5 output-dim=3
component-node name=c component=ca input=Append(input, b)
output-node name=output input=c
"""


@pytest.mark.parametrize("cfg", [
    ONLY_OPTIONAL,
    # ... or read optionally itself: no reader's required inputs bound it
    ONLY_OPTIONAL.replace("input=Append(input, b)", "input=Append(input, IfDefined(b))"),
], ids=["looks-ahead", "read-optionally"])
def test_only_optional_inputs_beyond_the_readers_bound_are_refused(cfg):
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    assert not pads_at_end(nnet)
    assert _differs(nnet)  # (padding it would have changed outputs)
