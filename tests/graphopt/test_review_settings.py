"""Review: a layer the optimizer folds into keeps its training settings in the network
written out (which a user may train on with Kaldi). A Linear that gained a bias used
to become a plain AffineComponent, losing its natural gradient (ranks, ...) and its
orthonormal constraint; a fixed constraint stayed at its old scale on weights a
descriptor Scale() had scaled; two merged layers kept the second's constraint, which
described one factor, not the product."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.nnet import nnet_from_bytes

from .common import assert_equivalent, build, only

BN_LINEAR = """
input-node name=input dim=6
component name=bn type=BatchNormComponent dim=6 test-mode=true
component name=l type=LinearComponent input-dim=6 output-dim=4 orthonormal-constraint=-1 \
learning-rate=0.01 learning-rate-factor=0.5 max-change=0.75 l2-regularize=0.001 \
rank-in=3 rank-out=2 update-period=3 alpha=2.5 num-samples-history=1500
component-node name=bn component=bn input=input
component-node name=l component=l input=bn
output-node name=output input=l
"""


def _only_component(nnet):
    (comp,) = nnet.components.values()
    return comp


def _bn_linear(config: str = BN_LINEAR):
    nnet = build(config)
    bn = nnet.components["bn"]  # (a nonzero mean: the folded Linear gains a bias)
    bn.count, bn.stats_sum = 10.0, np.arange(1.0, 7.0) * 10.0
    bn.stats_sumsq = bn.stats_sum ** 2 / 10.0 + 40.0
    return nnet


def test_linear_gaining_a_bias_keeps_its_settings():
    nnet = _bn_linear()
    opt = pynnet3.optimize_network(nnet, only("constant_folding"))
    assert_equivalent(nnet, opt)
    for net in (opt, nnet_from_bytes(opt.to_bytes())):  # (and as written)
        comp = _only_component(net)
        assert comp.type_name == "NaturalGradientAffineComponent"
        assert comp.bias_params.any()
        assert comp.orthonormal_constraint == -1.0
        assert (comp.rank_in, comp.rank_out, comp.update_period) == (3, 2, 3)
        assert np.isclose(comp.alpha, 2.5) and np.isclose(comp.num_samples_history, 1500)
        assert np.isclose(comp.learning_rate, 0.01)
        assert np.isclose(comp.learning_rate_factor, 0.5)
        assert np.isclose(comp.max_change, 0.75) and np.isclose(comp.l2_regularize, 0.001)


def test_plain_linear_gaining_a_bias_stays_plain():
    nnet = _bn_linear(BN_LINEAR.replace("rank-in=3", "use-natural-gradient=false rank-in=3"))
    opt = pynnet3.optimize_network(nnet, only("constant_folding"))
    assert_equivalent(nnet, opt)
    comp = _only_component(opt)
    assert comp.type_name == "AffineComponent"
    assert comp.orthonormal_constraint == -1.0 and np.isclose(comp.max_change, 0.75)


def test_uniform_scale_moves_a_fixed_constraint_with_the_weights():
    nnet = build("""
input-node name=input dim=6
component name=l type=LinearComponent input-dim=6 output-dim=4 orthonormal-constraint=1.5
component-node name=l component=l input=Scale(0.5, input)
output-node name=output input=l
""")
    opt = pynnet3.optimize_network(nnet, only("arithmetic"))
    assert_equivalent(nnet, opt)
    comp = _only_component(opt)
    assert np.allclose(comp.params_, 0.5 * nnet.components["l"].params_)
    # W' W'^T = 0.25 W W^T: the constraint W W^T = 1.5^2 I reads W' W'^T = 0.75^2 I
    assert comp.orthonormal_constraint == 0.75
    assert nnet.components["l"].orthonormal_constraint == 1.5  # (the original untouched)


def test_merged_layers_keep_the_second_layers_settings_but_no_constraint():
    nnet = build("""
input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=5 learning-rate=0.002
component name=b type=NaturalGradientAffineComponent input-dim=5 output-dim=7 \
orthonormal-constraint=-1 learning-rate=0.02 max-change=1.5 rank-in=2 rank-out=3
component-node name=a component=a input=input
component-node name=b component=b input=a
output-node name=output input=b
""")
    opt = pynnet3.optimize_network(nnet, only("constant_folding"))
    assert_equivalent(nnet, opt)
    comp = _only_component(opt)
    assert comp.type_name == "NaturalGradientAffineComponent"
    assert np.isclose(comp.learning_rate, 0.02) and np.isclose(comp.max_change, 1.5)
    assert (comp.rank_in, comp.rank_out) == (2, 3)
    assert comp.orthonormal_constraint == 0.0
