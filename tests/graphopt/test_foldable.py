"""One network with every foldable structure the optimizer knows (BatchNorm read at
offsets by an affine, fixed scale/bias and scale-and-offset maps around TDNN and
Linear layers, NoOp and dropout in test mode, a CompositeComponent, Sum/Scale
descriptors, a full-width dim range, sibling affines), optimized by each pass
alone and by all: same outputs and input derivatives, and a smaller network."""

from __future__ import annotations

import pytest

from pynnet3 import NetworkOptions
from pynnet3.graphopt.meta import PASS_ORDER
from tests.graphopt.common import (
    assert_equivalent,
    assert_roundtrip,
    build,
    component_nodes,
    only,
    optimize,
)

COMPOSITE = ("component1='type=TanhComponent dim=4' "
             "component2='type=BatchNormComponent dim=4 test-mode=true'")

FOLDABLE = f"""
input-node name=input dim=6
component name=a1 type=NaturalGradientAffineComponent input-dim=18 output-dim=8
component-node name=a1 component=a1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=relu1 type=RectifiedLinearComponent dim=8
component-node name=relu1 component=relu1 input=a1
component name=bn1 type=BatchNormComponent dim=8 test-mode=true
component-node name=bn1 component=bn1 input=relu1
component name=drop1 type=GeneralDropoutComponent dim=8 dropout-proportion=0.5 test-mode=true
component-node name=drop1 component=drop1 input=bn1
component name=td2 type=TdnnComponent input-dim=8 output-dim=8 time-offsets=-1,0,1
component-node name=td2 component=td2 input=drop1
component name=fs2 type=FixedScaleComponent dim=8
component-node name=fs2 component=fs2 input=td2
component name=relu2 type=RectifiedLinearComponent dim=8
component-node name=relu2 component=relu2 input=fs2
component name=so2 type=ScaleAndOffsetComponent dim=8 block-dim=4
component-node name=so2 component=so2 input=relu2
component name=lin3 type=LinearComponent input-dim=24 output-dim=4
component-node name=lin3 component=lin3 input=Append(Offset(so2, -1), so2, Offset(so2, 1))
component name=fb3 type=FixedBiasComponent dim=4
component-node name=fb3 component=fb3 input=lin3
component name=noop3 type=NoOpComponent dim=4
component-node name=noop3 component=noop3 input=Sum(fb3, Scale(0.5, Offset(fb3, -1)))
dim-range-node name=full3 input-node=noop3 dim-offset=0 dim=4
component name=comp4 type=CompositeComponent num-components=2 {COMPOSITE}
component-node name=comp4 component=comp4 input=full3
component name=d4 type=DropoutComponent dim=4 dropout-proportion=0.2 test-mode=true
component-node name=d4 component=d4 input=comp4
component name=out type=AffineComponent input-dim=8 output-dim=5
component-node name=out component=out input=Append(d4, full3)
component name=out2 type=AffineComponent input-dim=8 output-dim=3
component-node name=out2 component=out2 input=Append(d4, full3)
output-node name=output input=Append(out, out2)
"""

VARIANTS = {"all": NetworkOptions(), "all+derivatives": NetworkOptions(keep_derivatives=True),
            **{name: only(name) for name in PASS_ORDER}}


@pytest.fixture(scope="module")
def nnet():
    return build(FOLDABLE)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_pass_and_all(nnet, variant):
    opt, report = optimize(nnet, VARIANTS[variant])
    assert_equivalent(nnet, opt, derivatives=variant != "all", frames=5)


def test_all_passes_shrink_it(nnet, tmp_path):
    opt, report = optimize(nnet)
    rules = report.rules_applied()
    for rule in ("fold-batchnorm-into-next-linear", "fold-fixedscale-into-previous-linear",
                 "fold-scaleandoffset-into-next-linear", "fold-fixedbias-into-previous-linear",
                 "shatter-composite", "fuse-sibling-affines", "fuse-affine-relu"):
        assert rules.get(rule, 0) >= 1, (rule, rules)
    pruned = " ".join(n for p in report.passes if p.name == "pruning" for n in p.notes)
    for what in ("drop1 (GeneralDropoutComponent)", "full3 (full-width dim-range)",
                 "(DropoutComponent)"):
        assert what in pruned, pruned
    # a fold into the next layer drops the map's node, a fold into the previous layer
    # the layer's node (the map's node keeps its name and computes both); the
    # composite's BatchNorm part (named comp4) folds into out and out2, which fuse;
    # a layer and its ReLU become one kernel under the ReLU's name
    names = [n.name for n in opt.nodes]
    for gone in ("bn1", "drop1", "td2", "so2", "lin3", "full3", "comp4", "d4", "a1", "fs2"):
        assert gone not in names, gone
    assert {"relu1", "relu2", "fb3", "noop3", "comp4.part0"} <= set(names)
    # relu1 (a1 as a TDNN + relu1), relu2 (td2 + fs2 + relu2), fb3 (lin3 + fb3), noop3
    # (its Sum is read twice), comp4.part0 (tanh) and the fused out.out2
    assert component_nodes(opt) == 6
    assert_equivalent(nnet, opt, frames=5)
    assert_roundtrip(nnet, opt, tmp_path)
