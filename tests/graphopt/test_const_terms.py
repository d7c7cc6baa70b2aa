"""Const() terms: the compiler takes a Const only as the first term of a Sum, so a
rewrite that substitutes a Sum with a Const into a later term turns a network that
compiles into one that does not."""

from __future__ import annotations

from tests.graphopt.common import assert_equivalent, build, optimize


def test_pruning_inlines_a_sum_with_a_const():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Sum(Const(1.0, 4), a)
component name=t type=TanhComponent dim=4
component-node name=t component=t input=Sum(input, n)
output-node name=output input=t
""")
    opt, _ = optimize(nnet)
    assert_equivalent(nnet, opt)


def test_fold_substitutes_a_sum_with_a_const():
    nnet = build("""
input-node name=input dim=4
component name=r type=RectifiedLinearComponent dim=4
component-node name=r component=r input=input
component name=bn type=BatchNormComponent dim=4 test-mode=true
component-node name=bn component=bn input=Sum(Const(1.0, 4), r)
component name=a type=AffineComponent input-dim=4 output-dim=3
component-node name=a component=a input=Sum(bn, Offset(bn, -1))
output-node name=output input=a
""")
    opt, report = optimize(nnet)
    assert report.rules_applied() == {"fold-batchnorm-into-next-linear": 1}
    assert_equivalent(nnet, opt)


def test_const_first_stays_first():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Sum(Const(1.0, 4), a)
component name=t type=TanhComponent dim=4
component-node name=t component=t input=Offset(n, 1)
output-node name=output input=Append(t, Sum(Const(-2.0, 4), Sum(input, input)))
""")
    opt, _ = optimize(nnet)
    assert "n" not in [x.name for x in opt.nodes]
    assert str(opt.node("t").descriptor) == "Sum(Const(1, 4), Offset(a, 1))"
    assert_equivalent(nnet, opt)
