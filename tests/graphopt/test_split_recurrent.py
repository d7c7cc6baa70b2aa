"""split-recurrent-affine: an affine layer in a recurrence split into the part that
reads the layer below (one product over all frames) and the part that reads the
previous step, with the same outputs and input derivatives."""

from __future__ import annotations

from pynnet3 import NetworkOptions
from pynnet3.rewrite import NetworkRewriter, find_rule, why_not
from tests.graphopt.common import (
    assert_equivalent,
    assert_roundtrip,
    build,
    component_nodes,
    only,
    optimize,
    types_of,
)

SPLIT = ("split-recurrent-affine",)

RNN = """
input-node name=input dim=5
component name=w type=NaturalGradientAffineComponent input-dim=8 output-dim=6
component-node name=w component=w input=Append(input, IfDefined(Offset(r, -1)))
component name=tanh type=TanhComponent dim=6
component-node name=h component=tanh input=w
dim-range-node name=r input-node=h dim-offset=0 dim=3
output-node name=output input=h
"""


def test_split_fires_and_keeps_values(tmp_path):
    nnet = build(RNN)
    opt, report = optimize(nnet, NetworkOptions(keep_derivatives=True, enable_rules=SPLIT))
    assert report.rules_applied() == {"split-recurrent-affine": 1}
    types = types_of(opt)
    assert types["w.nonrecurrent"] == "NaturalGradientAffineComponent"
    assert types["w.recurrent"] == "LinearComponent"
    # the NoOp that summed the two is inlined into its only reader
    assert "w" not in types and str(opt.node("h").descriptor) == "Sum(w.nonrecurrent, w.recurrent)"
    assert str(opt.node("w.nonrecurrent").descriptor) == "input"
    assert str(opt.node("w.recurrent").descriptor) == "IfDefined(Offset(r, -1))"
    w = nnet.components["w"]
    nonrec, rec = opt.components[opt.node("w.nonrecurrent").component], \
        opt.components[opt.node("w.recurrent").component]
    assert (nonrec.linear_params == w.linear_params[:, :5]).all()
    assert (nonrec.bias_params == w.bias_params).all()
    assert (rec.params_ == w.linear_params[:, 5:]).all()
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_split_does_not_fire_outside_a_recurrence_or_without_two_kinds_of_parts():
    rule = find_rule("split-recurrent-affine")
    plain = build("""
input-node name=input dim=5
component name=w type=AffineComponent input-dim=10 output-dim=6
component-node name=w component=w input=Append(input, Offset(input, 1))
output-node name=output input=w
""")
    assert "is not in a recurrence" in why_not(NetworkRewriter(plain.copy()), rule, "w")
    opt, report = optimize(plain, only("shatter", enable_rules=SPLIT))
    assert report.rules_applied() == {}
    only_recurrent = build("""
input-node name=input dim=5
component name=a type=AffineComponent input-dim=5 output-dim=3
component-node name=a component=a input=input
component name=w type=AffineComponent input-dim=3 output-dim=3
component-node name=w component=w input=IfDefined(Offset(h, -1))
component name=tanh type=TanhComponent dim=3
component-node name=h component=tanh input=Sum(a, w)
output-node name=output input=h
""")
    assert "no non-recurrent part" in why_not(NetworkRewriter(only_recurrent.copy()), rule, "w")
    opt, _ = optimize(only_recurrent, only("shatter", enable_rules=SPLIT))
    assert component_nodes(opt) == component_nodes(only_recurrent)


def test_split_is_off_by_default():
    nnet = build(RNN)
    opt, report = optimize(nnet)
    assert "split-recurrent-affine" not in report.rules_applied()
    assert types_of(opt)["w"] == "NaturalGradientAffineComponent"
