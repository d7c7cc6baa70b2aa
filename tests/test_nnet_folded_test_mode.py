"""Review: training mode on a network from ``optimize_network`` that folded a test-mode
BatchNorm away used to be silently ignored (the network kept computing the folded
test-mode map); now a GraphError names what was folded (or, for a test-mode dropout,
pruned), and nothing changes."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3 import Nnet
from pynnet3.errors import GraphError

NET = """input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=6
component name=bn type=BatchNormComponent dim=6 test-mode=true
component name={second} type={second_type} input-dim=6 output-dim=3
component-node name=a component=a input=input
component-node name=bn component=bn input=a
component-node name=b component={second} input=bn
output-node name=output input=b
"""


def _net(second_type="AffineComponent"):
    nnet = Nnet.from_config(NET.format(second="b", second_type=second_type), seed=2)
    bn = nnet.components["bn"]
    bn.count, bn.stats_sum = 10.0, np.arange(1.0, 7.0) * 10.0
    bn.stats_sumsq = bn.stats_sum ** 2 / 10.0 + 40.0
    return nnet


@pytest.mark.parametrize("second_type", ["AffineComponent", "LinearComponent"])
def test_training_mode_after_folding_is_an_error(second_type):
    opt = pynnet3.optimize_network(_net(second_type))
    assert "BatchNormComponent" not in {c.type_name for c in opt.components.values()}
    before = opt.to_bytes()
    with pytest.raises(GraphError, match=r"set_test_mode\(False\).*BatchNormComponent 'bn'"):
        opt.set_test_mode(False)
    with pytest.raises(GraphError, match=r"BatchNormComponent 'bn' \(folded into"):
        opt.set_batchnorm_test_mode(False)
    assert opt.to_bytes() == before  # (nothing was switched)
    opt.set_dropout_test_mode(False)  # (no dropout was folded)
    opt.set_test_mode(True)  # (test mode is what it computes: fine)
    opt.copy().set_test_mode(True)
    with pytest.raises(GraphError):
        opt.copy().set_test_mode(False)  # (a copy keeps the record)


def test_fused_kernel_is_refused_too():
    text = """input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=6
component name=r type=RectifiedLinearComponent dim=6
component name=bn type=BatchNormComponent dim=6 test-mode=true
component-node name=a component=a input=input
component-node name=r component=r input=a
component-node name=bn component=bn input=r
output-node name=output input=bn
"""
    nnet = Nnet.from_config(text, seed=2)
    nnet.components["bn"].count = 5.0
    nnet.components["bn"].stats_sumsq = np.full(6, 10.0)
    opt = pynnet3.optimize_network(nnet)
    assert "BatchNormComponent" not in {c.type_name for c in opt.components.values()}
    with pytest.raises(GraphError, match=r"BatchNormComponent 'bn' \(fused into"):
        opt.set_batchnorm_test_mode(False)
    opt.set_dropout_test_mode(False)  # (no dropout was removed)


def test_plain_and_unfolded_networks_switch_as_before():
    nnet = _net()
    nnet.set_test_mode(False)
    assert not nnet.components["bn"].test_mode
    opt = pynnet3.optimize_network(nnet)  # (training-mode maps stay: nothing folded)
    opt.set_test_mode(False)
    opt.set_test_mode(True)
    assert opt.components["bn"].test_mode


@pytest.mark.parametrize("dropout", [
    "type=DropoutComponent dim=6 dropout-proportion=0.3",
    "type=GeneralDropoutComponent dim=6 dropout-proportion=0.3 continuous=true",
])
def test_pruned_test_mode_dropout_is_refused_too(dropout):
    """(review: pruning takes a test-mode dropout out of the graph, a Scale at most;
    training mode then silently computed no dropout)"""
    text = f"""input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=6
component name=d {dropout}
component-node name=a component=a input=input
component-node name=d component=d input=a
output-node name=output input=d
"""
    nnet = Nnet.from_config(text, seed=2)
    nnet.set_test_mode(True)
    opt = pynnet3.optimize_network(nnet)
    assert not any("Dropout" in c.type_name for c in opt.components.values())
    for switch in (opt.set_test_mode, opt.set_dropout_test_mode, opt.copy().set_test_mode):
        with pytest.raises(GraphError, match=r"Dropout.*'d' \(pruned\)"):
            switch(False)
    opt.set_batchnorm_test_mode(False)  # (no BatchNorm was removed)
    opt.set_test_mode(True)
    nnet.set_test_mode(False)  # (the original switches as before)
