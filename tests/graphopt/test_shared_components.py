"""Components shared by several nodes. A rewrite that builds a new component from a
shared one may reuse it for another node (Kaldi builds a merge once) only when the
other node needs exactly the same parameters; what it reads (which column blocks,
of which widths, recurrent or not) is part of that."""

from __future__ import annotations

import pytest

from pynnet3 import NetworkOptions
from tests.graphopt.common import assert_equivalent, build, only, optimize


def test_folds_into_a_shared_linear_with_different_layouts():
    """Covered in test_rules too; here with every pass: bn in column block 0 for n1,
    n4 and block 1 for n2, n3."""
    nnet = build("""
input-node name=input dim=4
component name=relu type=RectifiedLinearComponent dim=4
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim=4 test-mode=true
component-node name=bn component=bn input=relu
component name=a type=AffineComponent input-dim=8 output-dim=3
component-node name=n1 component=a input=Append(bn, input)
component-node name=n2 component=a input=Append(input, bn)
component-node name=n3 component=a input=Append(Offset(input, 1), bn)
component-node name=n4 component=a input=Append(bn, Offset(input, 1))
output-node name=output input=Append(n1, n2, n3, n4)
""")
    opt, report = optimize(nnet)
    assert report.rules_applied()["fold-batchnorm-into-next-linear"] == 4
    assert_equivalent(nnet, opt, derivatives=True)


def test_merges_of_shared_affines():
    """b1 and b2 share b, a1 and a2 share a; b1 reads a1 at t-1, t and b2 reads a2 at
    t, t+1: both merges have the same parameters (one component) but other inputs."""
    nnet = build("""
input-node name=input dim=2
component name=a type=LinearComponent input-dim=2 output-dim=6
component-node name=a1 component=a input=input
component-node name=a2 component=a input=Offset(input, 2)
component name=b type=AffineComponent input-dim=12 output-dim=3
component-node name=b1 component=b input=Append(Offset(a1, -1), a1)
component-node name=b2 component=b input=Append(a2, Offset(a2, 1))
output-node name=output input=Append(b1, b2)
""")
    opt, report = optimize(nnet, only("constant_folding"))
    assert report.rules_applied() == {"merge-affine-into-affine": 2}
    assert opt.node("b1").component == opt.node("b2").component
    assert len(opt.components) == 1
    assert_equivalent(nnet, opt, derivatives=True)
    opt, _ = optimize(nnet)
    assert_equivalent(nnet, opt, derivatives=True)


def test_shattered_shared_composite():
    parts = ("component1='type=FixedScaleComponent dim=4 scale=0.5' "
             "component2='type=TanhComponent dim=4'")
    nnet = build(f"""
input-node name=input dim=4
component name=c type=CompositeComponent num-components=2 {parts}
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a1 component=a input=input
component-node name=a2 component=a input=Offset(input, 1)
component-node name=c1 component=c input=a1
component-node name=c2 component=c input=a2
output-node name=output input=Append(c1, c2)
""")
    opt, report = optimize(nnet)
    assert report.rules_applied().get("shatter-composite") == 2
    assert_equivalent(nnet, opt, derivatives=True)


SCALED = """
input-node name=input dim=6
component name=A type=AffineComponent input-dim=8 output-dim=3
dim-range-node name=x4 input-node=input dim-offset=0 dim=4
dim-range-node name=x2 input-node=input dim-offset=0 dim=2
component-node name=n1 component=A input=Append(Scale(2.0, x4), x4)
component-node name=n2 component=A input=Append(Scale(2.0, x2), input)
output-node name=output input=Append(n1, n2)
"""


def test_scales_into_a_shared_affine_with_different_block_widths():
    """Both nodes scale their first column block by 2, but n1's block is 4 columns
    and n2's 2: the weights differ."""
    nnet = build(SCALED)
    opt, _ = optimize(nnet, only("arithmetic"))
    assert_equivalent(nnet, opt, derivatives=True)


def test_scales_into_a_shared_affine_with_equal_layouts():
    nnet = build(SCALED.replace("Append(Scale(2.0, x2), input)",
                                "Append(Scale(2.0, Offset(x4, 1)), Offset(x4, 1))"))
    opt, _ = optimize(nnet, only("arithmetic"))
    assert opt.node("n1").component == opt.node("n2").component != "A"
    assert_equivalent(nnet, opt, derivatives=True)


ON = ("split-recurrent-affine",)  # (off by default)
SPLIT = """
input-node name=input dim=3
component name=W type=AffineComponent input-dim=6 output-dim=3
component-node name=w1 component=W input=Append(input, IfDefined(Offset(h1, -1)))
component-node name=w2 component=W input=Append(IfDefined(Offset(h2, -1)), input)
component name=tanh type=TanhComponent dim=3
component-node name=h1 component=tanh input=w1
component-node name=h2 component=tanh input=w2
output-node name=output input=Append(h1, h2)
"""


@pytest.mark.parametrize("options", [NetworkOptions(enable_rules=ON), only("shatter",
                                                                          enable_rules=ON)],
                         ids=["all", "shatter"])
def test_split_of_a_shared_recurrent_affine_with_different_layouts(options):
    nnet = build(SPLIT)
    opt, report = optimize(nnet, options)
    assert report.rules_applied()["split-recurrent-affine"] == 2
    assert_equivalent(nnet, opt, derivatives=True)


def test_split_of_a_shared_recurrent_affine_with_equal_layouts():
    nnet = build(SPLIT.replace("Append(IfDefined(Offset(h2, -1)), input)",
                               "Append(Offset(input, 1), IfDefined(Offset(h2, -1)))"))
    opt, report = optimize(nnet, only("shatter", enable_rules=ON))
    assert report.rules_applied()["split-recurrent-affine"] == 2
    assert opt.node("w1.recurrent").component == opt.node("w2.recurrent").component
    assert_equivalent(nnet, opt, derivatives=True)
