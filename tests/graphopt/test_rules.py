"""Every network-optimizer rule: a network where it fires (what it applied, what the
network looks like after, same outputs, a Kaldi model that reads back) and networks
where it must not fire, with the reason the matcher or the rule gives."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3 import NetworkOptions
from pynnet3.graphopt.linear import ELEMENTWISE_TYPES
from pynnet3.rewrite import (
    Match,
    MatchFailure,
    NetworkGraph,
    NetworkRewriter,
    find_rule,
    match_pattern,
    why_not,
)
from tests.graphopt.common import (
    applied,
    assert_equivalent,
    assert_roundtrip,
    build,
    component_nodes,
    only,
    optimize,
    types_of,
)

D = 6
# One config line per elementwise type (component name "ew", dim D); the rule
# names use the type name without "Component", lower-cased.
EW_CONFIGS = {
    "BatchNormComponent": f"type=BatchNormComponent dim={D} block-dim=3 test-mode=true",
    "FixedScaleComponent": f"type=FixedScaleComponent dim={D}",
    "FixedBiasComponent": f"type=FixedBiasComponent dim={D}",
    "ScaleAndOffsetComponent": f"type=ScaleAndOffsetComponent dim={D} block-dim=3",
    "PerElementScaleComponent": f"type=PerElementScaleComponent dim={D}",
    "NaturalGradientPerElementScaleComponent":
        f"type=NaturalGradientPerElementScaleComponent dim={D}",
    "PerElementOffsetComponent": f"type=PerElementOffsetComponent dim={D} block-dim=2",
    "DropoutComponent": f"type=DropoutComponent dim={D} dropout-proportion=0.25 test-mode=true",
}
SHORT = {t: t.removesuffix("Component").lower() for t in EW_CONFIGS}


def test_every_elementwise_type_has_a_case():
    assert set(EW_CONFIGS) == set(ELEMENTWISE_TYPES)


def next_linear_net(ew_type: str, lin: str = "AffineComponent") -> str:
    """relu -> ew -> a linear component reading ew at t-1 and t (ReLU in front, so
    nothing before ew can absorb it)."""
    return f"""
input-node name=input dim={D}
component name=relu type=RectifiedLinearComponent dim={D}
component-node name=relu component=relu input=input
component name=ew {EW_CONFIGS[ew_type]}
component-node name=ew component=ew input=relu
component name=lin type={lin} input-dim={2 * D} output-dim=4
component-node name=lin component=lin input=Append(Offset(ew, -1), ew)
output-node name=output input=lin
"""


def previous_linear_net(ew_type: str, lin: str = "AffineComponent") -> str:
    """linear -> ew -> tanh (nothing after ew can absorb it)."""
    lin_cfg = (f"type={lin} input-dim=4 output-dim={D}" if lin != "TdnnComponent" else
               f"type=TdnnComponent input-dim=4 output-dim={D} time-offsets=-1,0,1 "
               "use-bias=false")
    return f"""
input-node name=input dim=4
component name=lin {lin_cfg}
component-node name=lin component=lin input=input
component name=ew {EW_CONFIGS[ew_type]}
component-node name=ew component=ew input=lin
component name=tanh type=TanhComponent dim={D}
component-node name=tanh component=tanh input=ew
output-node name=output input=tanh
"""


# -- fold-<type>-into-next-linear --------------------------------------------------------

@pytest.mark.parametrize("ew_type", list(EW_CONFIGS))
def test_fold_into_next_linear_fires(ew_type, tmp_path):
    nnet = build(next_linear_net(ew_type))
    opt, report = optimize(nnet, only("constant_folding"))
    assert report.rules_applied() == {f"fold-{SHORT[ew_type]}-into-next-linear": 1}
    # ew is gone; the linear node reads relu at the same offsets through "<ew>.<lin>"
    assert sorted(opt.components) == ["ew.lin", "relu"]
    assert [n.name for n in opt.nodes] == ["input", "relu", "lin", "output"]
    assert str(opt.node("lin").descriptor) == "Append(Offset(relu, -1), relu)"
    assert_equivalent(nnet, opt)
    assert_roundtrip(nnet, opt, tmp_path)


@pytest.mark.parametrize("lin", ["LinearComponent", "NaturalGradientAffineComponent",
                                 "FixedAffineComponent"])
def test_fold_batchnorm_into_next_linear_types(lin, tmp_path):
    nnet = build(next_linear_net("BatchNormComponent", lin))
    opt, report = optimize(nnet, only("constant_folding"))
    assert report.rules_applied() == {"fold-batchnorm-into-next-linear": 1}
    # a LinearComponent that gains the BatchNorm offset becomes an affine layer
    # with its settings (natural gradient by default: NaturalGradientAffine; Kaldi's
    # CollapseModel leaves a Linear unfolded); the other types keep their type.
    want = "NaturalGradientAffineComponent" if lin == "LinearComponent" else lin
    assert types_of(opt) == {"relu": "RectifiedLinearComponent", "lin": want}
    assert_equivalent(nnet, opt, derivatives=True)
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"fold-batchnorm-into-next-linear": 1}
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_fold_batchnorm_weights_from_the_stats():
    """The folded parameters, computed here from the BatchNorm statistics:
    y = W [s*x(t-1) + o; s*x(t) + o] + b with s = rms / sqrt(var + eps), o = -mean*s."""
    nnet = build(next_linear_net("BatchNormComponent"))
    bn, lin = nnet.components["ew"], nnet.components["lin"]
    mean = bn.stats_sum / bn.count
    var = np.maximum(bn.stats_sumsq / bn.count - mean ** 2, 0.0)  # Kaldi clamps at 0
    s = np.tile(bn.target_rms / np.sqrt(var + bn.epsilon), 2)  # block-dim 3 of dim 6
    o = np.tile(-mean, 2) * s
    s2, o2 = np.tile(s, 2), np.tile(o, 2)  # two spliced copies
    w, b = lin.linear_params.astype(np.float64), lin.bias_params.astype(np.float64)
    opt, _ = optimize(nnet, only("constant_folding"))
    folded = opt.components["ew.lin"]
    np.testing.assert_allclose(folded.linear_params, w * s2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(folded.bias_params, b + w @ o2, rtol=1e-5, atol=1e-5)


def test_fold_into_next_linear_through_sums_and_scales(tmp_path):
    """The linear reads the map in a Sum with a scale and alongside another node;
    the map stays for its other consumer (a Sum feeding a second output)."""
    lin_input = "Append(input, Sum(bn, Scale(-0.5, Offset(bn, -1))), Offset(bn, 1))"
    nnet = build(f"""
input-node name=input dim={D}
component name=relu type=RectifiedLinearComponent dim={D}
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim={D} test-mode=true
component-node name=bn component=bn input=relu
component name=lin type=AffineComponent input-dim={3 * D} output-dim=4
component-node name=lin component=lin input={lin_input}
component name=tanh type=TanhComponent dim={D}
component-node name=tanh component=tanh input=Sum(bn, input)
output-node name=output input=lin
output-node name=output2 input=tanh
""")
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"fold-batchnorm-into-next-linear": 1}
    assert "bn" in [n.name for n in opt.nodes]  # still read by tanh
    assert "bn" not in opt.node("lin").descriptor.node_names()
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_fold_batchnorm_into_tdnn(tmp_path):
    nnet = build(f"""
input-node name=input dim={D}
component name=relu type=RectifiedLinearComponent dim={D}
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim={D} test-mode=true
component-node name=bn component=bn input=relu
component name=td type=TdnnComponent input-dim={D} output-dim=5 time-offsets=-1,0,2 use-bias=false
component-node name=td component=td input=bn
output-node name=output input=td
""")
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"fold-batchnorm-into-next-linear": 1}
    assert types_of(opt)["td"] == "TdnnComponent"
    assert opt.components["bn.td"].bias_params.shape == (5,)  # the offset became a bias
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_shared_linear_component_folds_once(tmp_path):
    """Two nodes share one affine component and read two nodes of one BatchNorm
    component: both folds give the same parameters, built once (Kaldi's naming)."""
    nnet = build(f"""
input-node name=input dim={D}
component name=bn type=BatchNormComponent dim={D} test-mode=true
component-node name=bn1 component=bn input=input
component-node name=bn2 component=bn input=Offset(input, 1)
component name=a type=AffineComponent input-dim={D} output-dim=3
component-node name=a1 component=a input=bn1
component-node name=a2 component=a input=bn2
output-node name=output input=Append(a1, a2)
""")
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"fold-batchnorm-into-next-linear": 2}
    assert sorted(opt.components) == ["bn.a"]
    assert opt.node("a1").component == opt.node("a2").component == "bn.a"
    assert_equivalent(nnet, opt)
    assert_roundtrip(nnet, opt, tmp_path)


def test_equal_folds_share_one_component_when_names_clash():
    """The affine 'a' is read by four nodes, bn in column block 0 (n1, n4) or 1 (n2,
    n3): two distinct folded parameter sets, so two components."""
    nnet = build(f"""
input-node name=input dim={D}
component name=relu type=RectifiedLinearComponent dim={D}
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim={D} test-mode=true
component-node name=bn component=bn input=relu
component name=a type=AffineComponent input-dim={2 * D} output-dim=3
component-node name=n1 component=a input=Append(bn, input)
component-node name=n2 component=a input=Append(input, bn)
component-node name=n3 component=a input=Append(Offset(input, 1), bn)
component-node name=n4 component=a input=Append(bn, Offset(input, 1))
output-node name=output input=Append(n1, n2, n3, n4)
""")
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"fold-batchnorm-into-next-linear": 4}
    assert_equivalent(nnet, opt)
    assert opt.node("n1").component == opt.node("n4").component
    assert opt.node("n2").component == opt.node("n3").component
    assert len(opt.components) == 3  # relu + two folded affines


# -- fold-<type>-into-previous-linear ----------------------------------------------------

@pytest.mark.parametrize("ew_type", list(EW_CONFIGS))
def test_fold_into_previous_linear_fires(ew_type, tmp_path):
    nnet = build(previous_linear_net(ew_type))
    opt, report = optimize(nnet, only("constant_folding"))
    assert report.rules_applied() == {f"fold-{SHORT[ew_type]}-into-previous-linear": 1}
    # lin is gone; the node 'ew' (name kept) applies "<lin>.<ew>" to the input
    assert sorted(opt.components) == ["lin.ew", "tanh"]
    assert [n.name for n in opt.nodes] == ["input", "ew", "tanh", "output"]
    assert str(opt.node("ew").descriptor) == "input"
    assert_equivalent(nnet, opt)
    assert_roundtrip(nnet, opt, tmp_path)


@pytest.mark.parametrize("lin", ["LinearComponent", "TdnnComponent"])
def test_fold_offset_into_bias_free_linear(lin, tmp_path):
    """A FixedBias after a bias-free linear component gives it a bias."""
    nnet = build(previous_linear_net("FixedBiasComponent", lin))
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"fold-fixedbias-into-previous-linear": 1}
    # (a Linear with natural gradient, its default, keeps it as a NaturalGradientAffine)
    want = "NaturalGradientAffineComponent" if lin == "LinearComponent" else "TdnnComponent"
    assert types_of(opt) == {"ew": want, "tanh": "TanhComponent"}
    np.testing.assert_array_equal(opt.components["lin.ew"].bias_params,
                                  nnet.components["ew"].bias)
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_fold_fixedscale_into_previous_weights():
    nnet = build(previous_linear_net("FixedScaleComponent"))
    s = nnet.components["ew"].scales.astype(np.float64)
    lin = nnet.components["lin"]
    opt, _ = optimize(nnet)
    got = opt.components["lin.ew"]
    np.testing.assert_allclose(got.linear_params, lin.linear_params * s[:, None], rtol=1e-6)
    np.testing.assert_allclose(got.bias_params, lin.bias_params * s, rtol=1e-6)


# -- merge-affine-into-affine --------------------------------------------------------------

def test_merge_affine_plain(tmp_path):
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=6
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim=6 output-dim=3
component-node name=b component=b input=a
output-node name=output input=b
""")
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"merge-affine-into-affine": 1}
    assert sorted(opt.components) == ["a.b"]
    w1, b1 = (nnet.components["a"].linear_params.astype(np.float64),
              nnet.components["a"].bias_params.astype(np.float64))
    w2, b2 = (nnet.components["b"].linear_params.astype(np.float64),
              nnet.components["b"].bias_params.astype(np.float64))
    np.testing.assert_allclose(opt.components["a.b"].linear_params, w2 @ w1, rtol=1e-5)
    np.testing.assert_allclose(opt.components["a.b"].bias_params, w2 @ b1 + b2, rtol=1e-5)
    assert str(opt.node("b").descriptor) == "input"
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_merge_affine_spliced(tmp_path):
    """Kaldi's block-diagonal case: b reads a at t-1 and t+1; 2*2*3 = 12 multiply-adds
    per frame merged against 2*6 + 2*6*3 = 48 for the two layers."""
    nnet = build("""
input-node name=input dim=2
component name=a type=LinearComponent input-dim=2 output-dim=6
component-node name=a component=a input=input
component name=b type=NaturalGradientAffineComponent input-dim=12 output-dim=3
component-node name=b component=b input=Append(Offset(a, -1), Offset(a, 1))
output-node name=output input=b
""")
    opt, report = optimize(nnet, only("constant_folding"))
    assert report.rules_applied() == {"merge-affine-into-affine": 1}
    assert types_of(opt) == {"b": "NaturalGradientAffineComponent"}
    assert str(opt.node("b").descriptor) == "Append(Offset(input, -1), Offset(input, 1))"
    w1 = nnet.components["a"].params()["params"].astype(np.float64)  # a LinearComponent
    w2 = nnet.components["b"].linear_params.astype(np.float64)
    want = np.hstack([w2[:, :6] @ w1, w2[:, 6:] @ w1])
    np.testing.assert_allclose(opt.components["a.b"].linear_params, want, rtol=1e-5)
    assert_equivalent(nnet, opt, derivatives=True)
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {"merge-affine-into-affine": 1}
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


BOTTLENECK = """
input-node name=input dim=10
component name=a type=LinearComponent input-dim=10 output-dim=2
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim=2 output-dim=10
component-node name=b component=b input=a
output-node name=output input=b
"""


def test_merge_affine_declined_by_cost_model():
    """10 -> 2 -> 10: 40 multiply-adds per frame factored, 100 merged."""
    nnet = build(BOTTLENECK)
    rule = find_rule("merge-affine-into-affine")
    assert isinstance(match_pattern(NetworkGraph(nnet), "b", rule.pattern), Match)
    text = why_not(NetworkRewriter(nnet.copy()), rule, "b")
    assert "declined" in text and "100" in text and "40" in text, text
    assert "factored form is cheaper" in text
    opt, report = optimize(nnet)
    assert applied(report, "fold", "shatter") == {}
    assert any("merge-affine-into-affine at b" in d and "cheaper" in d
               for p in report.passes for d in p.declined)
    assert sorted(opt.components) == ["a", "b"]


def test_merge_affine_when_the_first_stays_for_another_consumer():
    """Kaldi's CollapseModel merges an affine layer into each affine consumer
    whatever else reads it (the first layer, 4 -> 6, does not reduce the
    dimension): ``b`` becomes ``a.b`` reading the input, ``a`` stays for ``t``, so
    Kaldi's model has 3 components: a, a.b, t."""
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=6
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim=6 output-dim=3
component-node name=b component=b input=a
component name=t type=TanhComponent dim=6
component-node name=t component=t input=a
output-node name=output input=Append(b, t)
""")
    assert isinstance(match_pattern(NetworkGraph(nnet), "b",
                                    find_rule("merge-affine-into-affine").pattern), Match)
    opt, report = optimize(nnet, only("constant_folding"))
    assert applied(report, "fold") == {"merge-affine-into-affine": 1}
    assert sorted(opt.components) == ["a", "a.b", "t"]
    assert str(opt.node("b").descriptor) == "input"
    assert_equivalent(nnet, opt)
    full, _ = optimize(nnet)  # (a and a.b then read the same input: one GEMM)
    assert len(full.components) <= 3
    assert_equivalent(nnet, full)


def test_merge_affine_declined_when_the_first_stays_and_reduces_the_dimension():
    """6 -> 2 then 2 -> 3, the first also read by a Tanh: merged, b would cost
    6*3 = 18 multiply-adds per frame instead of 2*3 = 6 (a is computed anyway);
    Kaldi declines too (its first layer must not reduce the dimension)."""
    nnet = build("""
input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=2
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim=2 output-dim=3
component-node name=b component=b input=a
component name=t type=TanhComponent dim=2
component-node name=t component=t input=a
output-node name=output input=Append(b, t)
""")
    rule = find_rule("merge-affine-into-affine")
    text = why_not(NetworkRewriter(nnet.copy()), rule, "b")
    assert "declined" in text and "stays for its other consumers" in text, text
    assert "18" in text and "6" in text
    opt, report = optimize(nnet)
    assert applied(report, "fold", "shatter") == {}
    assert sorted(opt.components) == ["a", "b", "t"]


# -- conditions under which a fold must not fire --------------------------------------------

def test_previous_linear_with_two_consumers():
    nnet = build(f"""
input-node name=input dim=4
component name=lin type=AffineComponent input-dim=4 output-dim={D}
component-node name=lin component=lin input=input
component name=ew type=FixedScaleComponent dim={D}
component-node name=ew component=ew input=lin
component name=tanh type=TanhComponent dim={D}
component-node name=tanh component=tanh input=Sum(ew, lin)
output-node name=output input=tanh
""")
    rule = find_rule("fold-fixedscale-into-previous-linear")
    fail = match_pattern(NetworkGraph(nnet), "ew", rule.pattern)
    assert isinstance(fail, MatchFailure)
    assert "2 consumers" in str(fail) and "exactly one" in str(fail)
    assert why_not(NetworkRewriter(nnet.copy()), rule, "ew") == str(fail)
    opt, report = optimize(nnet)
    assert applied(report, "fold", "shatter") == {}
    assert sorted(opt.components) == ["ew", "lin", "tanh"]


def test_previous_linear_also_read_by_an_output():
    nnet = build(f"""
input-node name=input dim=4
component name=lin type=AffineComponent input-dim=4 output-dim={D}
component-node name=lin component=lin input=input
component name=ew type=FixedBiasComponent dim={D}
component-node name=ew component=ew input=lin
output-node name=output input=ew
output-node name=raw input=lin
""")
    fail = match_pattern(NetworkGraph(nnet), "ew",
                         find_rule("fold-fixedbias-into-previous-linear").pattern)
    assert isinstance(fail, MatchFailure) and "2 consumers (ew, raw)" in str(fail), str(fail)


def test_previous_linear_preserved():
    nnet = build(previous_linear_net("FixedScaleComponent"))
    rule = find_rule("fold-fixedscale-into-previous-linear")
    fail = match_pattern(NetworkGraph(nnet), "ew", rule.pattern, frozenset({"lin"}))
    assert isinstance(fail, MatchFailure) and "'lin' is preserved" in str(fail)
    opt, report = optimize(nnet, preserve=("lin",))
    assert report.rules_applied() == {}
    assert {"lin", "ew"} <= {n.name for n in opt.nodes}


def test_batchnorm_in_training_mode():
    nnet = build(next_linear_net("BatchNormComponent").replace(" test-mode=true", ""))
    assert not nnet.components["ew"].test_mode
    g = NetworkGraph(nnet)
    for rule, root in (("fold-batchnorm-into-next-linear", "lin"),):
        fail = match_pattern(g, root, find_rule(rule).pattern)
        assert isinstance(fail, MatchFailure)
        assert fail.entry == 1 and "test_mode=False" in str(fail), str(fail)
    opt, report = optimize(nnet, only("constant_folding"))
    assert report.rules_applied() == {}
    assert sorted(opt.components) == sorted(nnet.components)
    opt, report = optimize(nnet)
    assert applied(report, "fold") == {}
    assert_equivalent(nnet, opt)


def test_batchnorm_training_mode_before_previous_linear():
    nnet = build(previous_linear_net("BatchNormComponent").replace(" test-mode=true", ""))
    fail = match_pattern(NetworkGraph(nnet), "ew",
                         find_rule("fold-batchnorm-into-previous-linear").pattern)
    assert isinstance(fail, MatchFailure) and fail.entry == 0
    assert "test_mode=False" in str(fail) and "want True" in str(fail)


def test_dropout_backprop_kept_with_keep_derivatives():
    """Test-mode dropout scales forward only; its backprop passes derivatives through
    unscaled where the input is 0, so it is not folded when derivatives are kept."""
    nnet = build(previous_linear_net("DropoutComponent"))
    rule = find_rule("fold-dropout-into-previous-linear")
    rw = NetworkRewriter(nnet.copy())
    assert why_not(rw, rule, "ew") == "matches"
    text = why_not(rw, rule, "ew", keep_derivatives=True)
    assert "not a fixed elementwise map" in text and "declined" not in text, text  # a check
    opt, report = optimize(nnet, only("constant_folding", keep_derivatives=True))
    assert report.rules_applied() == {}
    assert_equivalent(nnet, opt, derivatives=True)


def test_linear_reading_the_map_through_ifdefined():
    nnet = build(f"""
input-node name=input dim={D}
component name=relu type=RectifiedLinearComponent dim={D}
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim={D} test-mode=true
component-node name=bn component=bn input=relu
component name=lin type=AffineComponent input-dim={2 * D} output-dim=4
component-node name=lin component=lin input=Append(IfDefined(Offset(bn, -1)), bn)
output-node name=output input=lin
""")
    fail = match_pattern(NetworkGraph(nnet), "lin",
                         find_rule("fold-batchnorm-into-next-linear").pattern)
    assert isinstance(fail, MatchFailure)
    assert "read only through plain offsets, scales and sums" in str(fail), str(fail)
    opt, report = optimize(nnet)
    assert applied(report, "fold", "shatter") == {}
    assert_equivalent(nnet, opt)


def test_tdnn_reading_the_map_at_an_offset():
    """Kaldi folds a BatchNorm into a TdnnComponent that reads it at an offset (its
    DescriptorIsCollapsible takes ``Offset(bn, 1)``; the map is repeated over every
    time offset's block): 2 components left, bn.td and relu."""
    nnet = build(f"""
input-node name=input dim={D}
component name=relu type=RectifiedLinearComponent dim={D}
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim={D} test-mode=true
component-node name=bn component=bn input=relu
component name=td type=TdnnComponent input-dim={D} output-dim=5 time-offsets=-1,0,1
component-node name=td component=td input=Offset(bn, 1)
output-node name=output input=td
""")
    opt, report = optimize(nnet)
    assert applied(report, "fold", "shatter") == {"fold-batchnorm-into-next-linear": 1}
    assert sorted(opt.components) == ["bn.td", "relu"]
    assert str(opt.node("td").descriptor) == "Offset(relu, 1)"
    assert_equivalent(nnet, opt)


def test_wrong_root_type_reason():
    nnet = build(next_linear_net("BatchNormComponent"))
    fail = match_pattern(NetworkGraph(nnet), "relu",
                         find_rule("fold-batchnorm-into-next-linear").pattern)
    assert isinstance(fail, MatchFailure) and fail.entry == 0
    assert "'relu' is RectifiedLinearComponent, want" in str(fail)
    assert str(fail).startswith(f"{fail.pattern} at relu: entry 0: ")


# -- shatter-composite ------------------------------------------------------------------

COMPOSITE = """
input-node name=input dim=4
component name=c type=CompositeComponent num-components=3 {parts}
component name=a type=AffineComponent input-dim=4 output-dim=5
component-node name=a component=a input=input
component-node name=c component=c input=a
component name=b type=AffineComponent input-dim=5 output-dim=3
component-node name=b component=b input=c
output-node name=output input=b
"""


def composite_net(*parts: str) -> str:
    return COMPOSITE.format(parts=" ".join(f"component{i}='{p}'"
                                           for i, p in enumerate(parts, start=1)))


def test_shatter_composite_then_fold(tmp_path):
    nnet = build(composite_net("type=FixedScaleComponent dim=5", "type=TanhComponent dim=5",
                                  "type=BatchNormComponent dim=5 test-mode=true"))
    sub = nnet.components["c"].sub_components()[0]
    sub.scales = np.linspace(0.5, 1.5, 5).astype(np.float32)  # not a uniform scale
    opt, report = optimize(nnet)
    assert applied(report, "shatter", "fold") == {"shatter-composite": 1,
                                      "fold-fixedscale-into-previous-linear": 1,
                                      "fold-batchnorm-into-next-linear": 1}
    # parts c.part0 (FixedScale, absorbed by a), c.part1 (Tanh), c (BatchNorm, absorbed by b)
    assert [n.name for n in opt.nodes] == ["input", "c.part0", "c.part1", "b", "output"]
    assert types_of(opt) == {"c.part0": "AffineComponent", "c.part1": "TanhComponent",
                             "b": "AffineComponent"}
    assert sorted(opt.components) == ["a.c.part0", "c.part1", "c.part2.b"]
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_shatter_composite_without_foldable_parts():
    nnet = build(composite_net("type=TanhComponent dim=5", "type=SigmoidComponent dim=5",
                                  "type=RectifiedLinearComponent dim=5"))
    rule = find_rule("shatter-composite")
    assert isinstance(match_pattern(NetworkGraph(nnet), "c", rule.pattern), Match)
    text = why_not(NetworkRewriter(nnet.copy()), rule, "c")
    assert "declined" in text and "no part is an identity" in text, text
    opt, report = optimize(nnet)
    assert applied(report, "fold", "shatter") == {}
    assert types_of(opt)["c"] == "CompositeComponent"


def test_shatter_never_grows_the_network():
    parts = ("component1='type=PerElementScaleComponent dim=4 param-stddev=1' "
             "component2='type=TanhComponent dim=4'")
    nnet = build(f"""
input-node name=input dim=4
component name=c type=CompositeComponent num-components=2 {parts}
component-node name=c component=c input=input
output-node name=output input=c
""")
    opt, report = optimize(nnet)
    assert_equivalent(nnet, opt)
    assert len(opt.components) <= len(nnet.components)
    assert len(opt.nodes) <= len(nnet.nodes)


GROWTH_CASES = {
    # the affine before the composite has a second reader: it cannot absorb the scale
    "producer-read-twice": """
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=c type=CompositeComponent num-components=2 {scale_first}
component-node name=c component=c input=a
output-node name=output input=Sum(c, a)
""",
    # the affine after it reads it through IfDefined, not a linear read
    "consumer-ifdefined": """
input-node name=input dim=4
component name=c type=CompositeComponent num-components=2 {scale_last}
component-node name=c component=c input=input
component name=b type=AffineComponent input-dim=8 output-dim=3
component-node name=b component=b input=Append(input, IfDefined(Offset(c, -1)))
output-node name=output input=b
""",
    # a TDNN folds only a plain input
    "consumer-tdnn-offset": """
input-node name=input dim=4
component name=c type=CompositeComponent num-components=2 {scale_last}
component-node name=c component=c input=input
component name=b type=TdnnComponent input-dim=4 output-dim=3 time-offsets=0,1
component-node name=b component=b input=Offset(c, 1)
output-node name=output input=b
""",
}


@pytest.mark.parametrize("case", list(GROWTH_CASES))
def test_shatter_never_grows_next_to_unusable_linear_layers(case):
    scale = "'type=PerElementScaleComponent dim=4 param-stddev=1'"
    tanh = "'type=TanhComponent dim=4'"
    nnet = build(GROWTH_CASES[case].format(
        scale_first=f"component1={scale} component2={tanh}",
        scale_last=f"component1={tanh} component2={scale}"))
    opt, report = optimize(nnet)
    assert_equivalent(nnet, opt)
    assert len(opt.components) <= len(nnet.components), report.rules_applied()
    assert len(opt.nodes) <= len(nnet.nodes)


# -- fuse-sibling-affines -----------------------------------------------------------------

SIBLINGS = """
input-node name=input dim=4
component name=a type=AffineComponent input-dim=8 output-dim=3
component-node name=a component=a input=Append(Offset(input, -1), input)
component name=b type=LinearComponent input-dim=8 output-dim=2
component-node name=b component=b input=Append(Offset(input, -1), input)
component name=t type=TanhComponent dim=5
component-node name=t component=t input=Append(a, b)
output-node name=output input=t
"""


def test_fuse_sibling_affines(tmp_path):
    nnet = build(SIBLINGS)
    full, report = optimize(nnet)
    assert applied(report, "parameter") == {"fuse-sibling-affines": 1}
    assert_equivalent(nnet, full, derivatives=True)
    opt, report = optimize(nnet, only("parameter_fusion"))
    assert report.rules_applied() == {"fuse-sibling-affines": 1}
    fused = opt.node("a.b")
    assert fused.kind == "component-node"
    assert str(fused.descriptor) == "Append(Offset(input, -1), input)"
    for name, offset, dim in (("a", 0, 3), ("b", 3, 2)):
        n = opt.node(name)
        assert (n.kind, n.source, n.dim_offset, n.dim) == ("dim-range-node", "a.b", offset, dim)
    comp = opt.components[fused.component]
    assert comp.linear_params.shape == (5, 8)
    np.testing.assert_array_equal(comp.bias_params[3:], 0)  # b had no bias
    assert component_nodes(opt) == 2  # one GEMM and the tanh
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_fuse_siblings_in_a_recurrence(tmp_path):
    """Both siblings read a(t-1): after fusion the fused node reads a dim range of
    itself, a recurrence through a dim-range node."""
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=7 output-dim=3
component-node name=a component=a input=Append(input, IfDefined(Offset(a, -1)))
component name=b type=AffineComponent input-dim=7 output-dim=2
component-node name=b component=b input=Append(input, IfDefined(Offset(a, -1)))
component name=t type=TanhComponent dim=5
component-node name=t component=t input=Append(a, b)
output-node name=output input=t
""")
    opt, report = optimize(nnet, NetworkOptions(shatter=False))  # (no recurrent split)
    assert applied(report, "parameter") == {"fuse-sibling-affines": 1}
    assert opt.node("a").kind == "dim-range-node"
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_siblings_leading_to_different_outputs():
    nnet = build(SIBLINGS.replace("component name=t type=TanhComponent dim=5\n"
                                  "component-node name=t component=t input=Append(a, b)\n"
                                  "output-node name=output input=t",
                                  "output-node name=output input=a\n"
                                  "output-node name=output-xent input=b"))
    rule = find_rule("fuse-sibling-affines")
    rw = NetworkRewriter(nnet.copy())
    text = why_not(rw, rule, "a")
    assert "declined" in text and "lead to other outputs" in text, text
    assert "fused from its first sibling 'a'" in why_not(rw, rule, "b")
    opt, report = optimize(nnet, only("parameter_fusion"))
    assert report.rules_applied() == {}
    assert types_of(opt) == {"a": "AffineComponent", "b": "LinearComponent"}


def test_affine_without_siblings():
    nnet = build(BOTTLENECK)
    text = why_not(NetworkRewriter(nnet.copy()), find_rule("fuse-sibling-affines"), "a")
    assert "no other affine node reads the same input" in text
