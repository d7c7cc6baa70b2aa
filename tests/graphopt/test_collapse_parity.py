"""The network optimizer against Kaldi's CollapseModel (nnet-utils.cc, class
ModelCollapser) with all four options, pattern by pattern, on small networks shaped
like the ones the xconfig layers make.

What ModelCollapser does: for every component node whose input descriptor reads a
single component node ``x`` in every part, plainly or as ``Offset(x, t)`` / a
``Scale`` of those (DescriptorIsCollapsible; no Sum, IfDefined, Round,
ReplaceIndex, dim-range or input node), it asks CollapseComponents for one
component doing both; if there is one, the node uses it and reads ``x``'s input
expression instead. It does not care how many other nodes read ``x`` (``x`` stays
while someone still reads it) or whether a component is shared. The pairs:

* dropout: a test-mode ``DropoutComponent`` (scale ``1/(1-p)``) or
  ``GeneralDropoutComponent`` (scale 1) before an Affine, NaturalGradientAffine,
  Linear, Tdnn or TimeHeightConvolution layer (a copy named ``<layer>.scale<s>``);
  with scale 1 (p = 0, or GeneralDropout) before any component (no new one).
* batchnorm: a test-mode ``BatchNormComponent`` before an Affine /
  NaturalGradientAffine (copy), Linear (becomes an AffineComponent) or Tdnn (gains
  a bias), named ``<bn>.<layer>``.
* affine: a FixedAffine, Affine or NaturalGradientAffine layer that does not reduce
  the dimension, before an Affine / NaturalGradientAffine one (block-diagonal when
  read at several offsets): an AffineComponent ``<first>.<second>``.
* scale: an Affine / NaturalGradientAffine layer before a ``FixedScaleComponent``
  of the same dimension: a copy of the affine layer, ``<affine>.<scale>``.

Each test derives the number of components Kaldi's collapsed model has by applying
those rules by hand (said in the test), and checks that ``optimize_network`` leaves
no more, in memory and in the Kaldi model it writes (text and binary, which hold
only Kaldi component types), and that every one computes what the network in test
mode computes. Where Kaldi's own collapse departs from the network (a
DropoutComponent with p > 0, which computes ``(1-p) x`` in test mode, is folded as
``x / (1-p)``; a bias scaled by a ``Scale()`` read is not scaled) the optimizer
keeps the network's values.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import pynnet3
from tests.graphopt.common import assert_equivalent, build

# The component types Kaldi's NewComponentOfType (nnet-component-itf.cc) knows.
KALDI_COMPONENT_TYPES = frozenset("""
SigmoidComponent TanhComponent SoftmaxComponent LogSoftmaxComponent RectifiedLinearComponent
NormalizeComponent PnormComponent AffineComponent LinearComponent NaturalGradientAffineComponent
PerElementScaleComponent NaturalGradientPerElementScaleComponent PerElementOffsetComponent
SumGroupComponent FixedAffineComponent FixedScaleComponent FixedBiasComponent NoOpComponent
ClipGradientComponent ElementwiseProductComponent ConvolutionComponent TdnnComponent
MaxpoolingComponent PermuteComponent DistributeComponent CompositeComponent
RepeatedAffineComponent BlockAffineComponent NaturalGradientRepeatedAffineComponent
StatisticsExtractionComponent StatisticsPoolingComponent ConstantFunctionComponent
ConstantComponent DropoutComponent DropoutMaskComponent GeneralDropoutComponent
SpecAugmentTimeMaskComponent BackpropTruncationComponent LstmNonlinearityComponent
BatchNormComponent TimeHeightConvolutionComponent RestrictedAttentionComponent
SumBlockComponent GruNonlinearityComponent OutputGruNonlinearityComponent
ScaleAndOffsetComponent""".split())


def prepared(config: str, seed: int = 0) -> pynnet3.Nnet:
    """The network of ``config`` in test mode, its BatchNorms with statistics (mean
    N(0, 1), variance in [0.5, 2], count 100) as after training."""
    nnet = build(config, seed=seed)
    rng = np.random.default_rng(seed + 7)
    for comp in nnet.components.values():
        if comp.type_name == "BatchNormComponent":
            mean = rng.standard_normal(comp.block_dim)
            var = rng.uniform(0.5, 2.0, comp.block_dim)
            comp.count = 100.0
            comp.stats_sum = mean * 100.0
            comp.stats_sumsq = (var + mean ** 2) * 100.0
    nnet.set_test_mode(True)
    return nnet


def written_types(path) -> set[str]:
    """The component types a text model holds."""
    return set(re.findall(r"<ComponentName> \S+ <(\w+)>", path.read_text()))


def check_collapse(nnet: pynnet3.Nnet, kaldi_components: int, tmp_path) -> pynnet3.Nnet:
    """Optimize ``nnet`` (no warning) and check the result against Kaldi's count and
    the network's outputs, also as written (text and binary) and read back."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        opt = pynnet3.optimize_network(nnet)
    assert len(opt.components) <= kaldi_components, sorted(opt.components)
    assert_equivalent(nnet, opt)
    for binary in (False, True):
        path = tmp_path / f"collapsed.{'bin' if binary else 'txt'}"
        opt.write(path, binary=binary)
        back = pynnet3.read_nnet(path)
        assert len(back.components) <= kaldi_components, sorted(back.components)
        if not binary:
            assert written_types(path) <= KALDI_COMPONENT_TYPES, written_types(path)
        assert_equivalent(nnet, back)
    return opt


# -- what the optimizer missed: more components than Kaldi leaves ------------------------

TDNN_READS_BN = """
input-node name=input dim=6
component name=relu type=RectifiedLinearComponent dim=6
component-node name=relu component=relu input=input
component name=bn type=BatchNormComponent dim=6 block-dim=3
component-node name=bn component=bn input=relu
component name=td type=TdnnComponent input-dim={dim} output-dim=5 time-offsets=-1,0,1
component-node name=td component=td input={read}
output-node name=output input=td
"""


@pytest.mark.parametrize("read, dim", [("Offset(bn, 1)", 6), ("Append(Offset(bn, -2), bn)", 12),
                                       ("Append(bn, Offset(relu, -1))", 12)])
def test_batchnorm_into_a_tdnn_reading_it_at_offsets(read, dim, tmp_path):
    """Kaldi: td's input is bn at offsets (collapsible), BatchNorm before Tdnn folds
    into ``bn.td`` (the map repeated over td's whole input); bn and td are then
    orphans: relu, bn.td = 2 components. (With relu in the Append Kaldi declines, two
    nodes: 3 left; the optimizer folds anyway.)"""
    kaldi = 3 if "relu" in read else 2
    opt = check_collapse(prepared(TDNN_READS_BN.format(read=read, dim=dim)), kaldi, tmp_path)
    assert "bn" not in opt.components


LDA_TWO_AFFINES = """
input-node name=input dim=6
component name=lda type=FixedAffineComponent input-dim=18 output-dim=18
component-node name=lda component=lda input=Append(Offset(input, -1), input, Offset(input, 1))
component name=a type=NaturalGradientAffineComponent input-dim=18 output-dim=7
component-node name=a component=a input=lda
component name=b type=AffineComponent input-dim=36 output-dim=5
component-node name=b component=b input=Append(Offset(lda, -2), Offset(lda, 2))
component name=ra type=RectifiedLinearComponent dim=7
component-node name=ra component=ra input=a
component name=rb type=RectifiedLinearComponent dim=5
component-node name=rb component=rb input=b
output-node name=output input=Append(ra, rb)
"""


def test_lda_read_by_two_affine_layers(tmp_path):
    """An LDA (FixedAffine 18 -> 18, not dimension-reducing) read by two affine
    layers, one of them at two offsets. Kaldi merges it into each (``lda.a``, and
    ``lda.b`` block-diagonal), whatever else reads it; lda, a and b are then
    orphans: lda.a, lda.b, ra, rb = 4 components."""
    opt = check_collapse(prepared(LDA_TWO_AFFINES), 4, tmp_path)
    assert "lda" not in opt.components


AFFINE_SCALED = """
input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=8
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim={dim} output-dim=5
component-node name=b component=b input={read}
component name=rb type=RectifiedLinearComponent dim=5
component-node name=rb component=rb input=b
output-node name=output input=rb
"""


@pytest.mark.parametrize("read, dim", [("Scale(0.5, a)", 8),
                                       ("Append(Scale(-2, Offset(a, -1)), a)", 16)])
def test_affine_into_affine_through_a_scale(read, dim, tmp_path):
    """``Scale(s, a)`` is collapsible for Kaldi (a SimpleForwardingDescriptor with a
    scale): a (6 -> 8) and b merge into ``a.b``: a.b, rb = 2 components. The merged
    bias is ``b2 + sum_j s_j W2_j b1`` (Kaldi's drops the ``s_j``; the network's
    values are kept)."""
    check_collapse(prepared(AFFINE_SCALED.format(read=read, dim=dim)), 2, tmp_path)


AFFINE_FIXED_SCALE = """
input-node name=input dim=6
component name=relu type=RectifiedLinearComponent dim=6
component-node name=relu component=relu input=input
component name=a type=NaturalGradientAffineComponent input-dim=6 output-dim=5
component-node name=a component=a input=relu
component name=fs type=FixedScaleComponent dim=5
component-node name=fs component=fs input={read}
component name=sm type=LogSoftmaxComponent dim=5
component-node name=sm component=sm input=fs
output-node name=output input=sm
"""


@pytest.mark.parametrize("read", ["a", "Offset(a, -1)", "Scale(-0.5, Offset(a, 2))"])
def test_fixed_scale_after_an_affine_layer(read, tmp_path):
    """Kaldi's collapse-scale: fs reads a (an AffineComponent subclass of fs's dim,
    at an offset or scaled too): ``a.fs``; a and fs are orphans: relu, a.fs, sm =
    3 components."""
    opt = check_collapse(prepared(AFFINE_FIXED_SCALE.format(read=read)), 3, tmp_path)
    assert not any(c.type_name == "FixedScaleComponent" for c in opt.components.values())


DROPOUT_OVER_AN_EXPRESSION = """
input-node name=input dim=6
component name=r1 type=RectifiedLinearComponent dim=6
component-node name=r1 component=r1 input=input
component name=t1 type=TanhComponent dim=6
component-node name=t1 component=t1 input=input
component name=drop type={dropout} dim={dim}
component-node name=drop component=drop input={expression}
component name=a type=AffineComponent input-dim={spliced} output-dim=4
component-node name=a component=a input=Append(Offset(drop, -1), drop)
{second}
"""
SECOND_READER = """component name=s type=SigmoidComponent dim={dim}
component-node name=s component=s input=Offset(drop, 1)
output-node name=output input=Append(a, s)"""


@pytest.mark.parametrize("dropout", ["GeneralDropoutComponent dropout-proportion=0.5",
                                     "DropoutComponent dropout-proportion=0.0"])
@pytest.mark.parametrize("expression, dim", [("Sum(r1, t1)", 6), ("Append(r1, t1)", 12)])
@pytest.mark.parametrize("readers", [1, 2])
def test_dropout_over_an_expression(dropout, expression, dim, readers, tmp_path):
    """A dropout of scale 1 (GeneralDropout, or Dropout with p = 0) whose input is a
    Sum or an Append, read at two offsets by an affine layer (and at an offset by a
    Sigmoid). Kaldi's collapse-dropout makes every reader read the expression
    (scale 1: any component type, the reader's own component), so the dropout is
    an orphan: r1, t1, a (and s) = 3 (4) components."""
    second = (SECOND_READER.format(dim=dim) if readers == 2
              else "output-node name=output input=a")
    config = DROPOUT_OVER_AN_EXPRESSION.format(dropout=dropout, dim=dim, expression=expression,
                                               spliced=2 * dim, second=second)
    opt = check_collapse(prepared(config), 2 + readers, tmp_path)
    assert "drop" not in opt.components


FIXED_SCALE_TWO_READERS = """
input-node name=input dim=6
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=input
component name=a type=AffineComponent input-dim=6 output-dim=5
component-node name=a component=a input=r
component name=fs type=FixedScaleComponent dim=5
component-node name=fs component=fs input=a
component name=lin type=LinearComponent input-dim=5 output-dim=3
component-node name=lin component=lin input=fs
component name=t type=TanhComponent dim=5
component-node name=t component=t input=fs
output-node name=output input=Append(lin, t)
"""


def test_fixed_scale_read_by_a_linear_and_a_tanh(tmp_path):
    """Kaldi: fs folds into a (``a.fs``; a is an orphan); lin is a LinearComponent,
    no affine merge; t reads a.fs's node: r, a.fs, lin, t = 4. (Folding fs into lin
    first would leave fs for t and a read twice, so no longer foldable: 5.)"""
    opt = check_collapse(prepared(FIXED_SCALE_TWO_READERS), 4, tmp_path)
    assert not any(c.type_name == "FixedScaleComponent" for c in opt.components.values())


SHARED_AFFINE_SCALED_READ = """
input-node name=input dim=6
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=input
component name=t type=TanhComponent dim=6
component-node name=t component=t input=input
component name=a type=AffineComponent input-dim=6 output-dim=4
component-node name=a1 component=a input=r
component-node name=a2 component=a input=Scale(-2, t)
output-node name=output input=Append(a1, a2)
"""


def test_shared_affine_read_through_a_scale_by_one_node(tmp_path):
    """a is shared by a1 (reads r) and a2 (reads ``Scale(-2, t)``): nothing for
    Kaldi (a ReLU and a Tanh before them): r, t, a = 3. Moving the scale into a2's
    weights would make a second copy of a."""
    opt = check_collapse(prepared(SHARED_AFFINE_SCALED_READ), 3, tmp_path)
    assert sorted(opt.components) == ["a", "r", "t"]


SHARED = """
input-node name=input dim=6
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=input
component name=bn type=BatchNormComponent dim=6
component-node name=bn component=bn input=r
component name=t type=TanhComponent dim=6
component-node name=t component=t input=bn
component name=a type=AffineComponent input-dim=12 output-dim=4
component-node name=a1 component=a input=Append(Offset(bn, -1), bn)
component-node name=a2 component=a input=Append(bn, Offset(bn, 2))
output-node name=output input=Append(a1, a2, t)
"""


def test_batchnorm_read_by_a_shared_affine_and_a_tanh(tmp_path):
    """r, bn, t, a (shared by a1 and a2). Kaldi: a1 and a2 both get ``bn.a`` (made
    once: the same name), a goes, bn stays for t: r, bn, t, bn.a = 4. (a1 and a2
    read bn at different offsets: one TDNN copy of bn.a each would be 5.)"""
    check_collapse(prepared(SHARED), 4, tmp_path)


SHARED_LAYER_SHARED_MAP = """
input-node name=input dim=6
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=input
component name=fs type=FixedScaleComponent dim=6
component-node name=fs1 component=fs input=r
component-node name=fs2 component=fs input=Offset(r, 1)
component name=t type=TanhComponent dim=6
component-node name=t component=t input=fs2
component name=a type=AffineComponent input-dim=6 output-dim=4
component-node name=a1 component=a input=fs1
component-node name=a2 component=a input=Offset(input, -1)
output-node name=output input=Append(a1, a2, t)
"""


def test_map_into_a_shared_layer_when_both_stay(tmp_path):
    """a is shared by a1 (reads fs1) and a2 (reads the input); fs by fs1 and fs2 (read by
    t). Nothing for Kaldi (a FixedScale before an affine layer is none of its
    pairs, nor a ReLU before anything): r, fs, t, a = 4. Folding fs1 into a1 makes
    a copy of a while a stays for a2 and fs for fs2: 5."""
    check_collapse(prepared(SHARED_LAYER_SHARED_MAP), 4, tmp_path)


# -- every pattern in the shapes the xconfig layers make ---------------------------------

def tdnn_stack(dropout: str, layers: int = 3) -> str:
    """relu-batchnorm-dropout-layer x ``layers`` (Append(-1,0,1) splicing), then an
    output layer with a log-softmax."""
    lines, prev, dim = ["input-node name=input dim=6"], "input", 6
    for i in range(1, layers + 1):
        n = f"tdnn{i}"
        lines += [
            f"component name={n}.affine type=NaturalGradientAffineComponent "
            f"input-dim={3 * dim} output-dim=8",
            f"component-node name={n}.affine component={n}.affine "
            f"input=Append(Offset({prev}, -1), {prev}, Offset({prev}, 1))",
            f"component name={n}.relu type=RectifiedLinearComponent dim=8",
            f"component-node name={n}.relu component={n}.relu input={n}.affine",
            f"component name={n}.batchnorm type=BatchNormComponent dim=8",
            f"component-node name={n}.batchnorm component={n}.batchnorm input={n}.relu",
            f"component name={n}.dropout type={dropout} dim=8",
            f"component-node name={n}.dropout component={n}.dropout input={n}.batchnorm"]
        prev, dim = f"{n}.dropout", 8
    lines += ["component name=output.affine type=NaturalGradientAffineComponent "
              f"input-dim={dim} output-dim=5",
              f"component-node name=output.affine component=output.affine input={prev}",
              "component name=output.log-softmax type=LogSoftmaxComponent dim=5",
              "component-node name=output.log-softmax component=output.log-softmax "
              "input=output.affine",
              "output-node name=output input=output.log-softmax"]
    return "\n".join(lines)


@pytest.mark.parametrize("dropout", [
    "DropoutComponent dropout-proportion=0.5", "DropoutComponent dropout-proportion=0.0",
    "GeneralDropoutComponent dropout-proportion=0.5",
    "GeneralDropoutComponent dropout-proportion=0.5 continuous=true"])
def test_relu_batchnorm_dropout_layers(dropout, tmp_path):
    """14 components. Kaldi: tdnn2/tdnn3/output affines read a dropout (spliced or
    plain): dropout collapsed into them (scaled copies for p = 0.5), then the
    BatchNorm before it: 3 dropouts and 3 BatchNorms go, each affine is replaced
    by one new component: 14 - 6 = 8 (tdnn1.affine reads the input node)."""
    check_collapse(prepared(tdnn_stack(dropout)), 8, tmp_path)


TDNNF = """
input-node name=input dim=6
input-node name=ivector dim=3
component name=idct type=FixedAffineComponent input-dim=6 output-dim=6
component-node name=idct component=idct input=input
component name=lda type=FixedAffineComponent input-dim=21 output-dim=21
component-node name=lda component=lda input=Append(Offset(idct, -1), idct, Offset(idct, 1), ReplaceIndex(ivector, t, 0))
component name=tdnn1.affine type=NaturalGradientAffineComponent input-dim=21 output-dim=10
component-node name=tdnn1.affine component=tdnn1.affine input=lda
component name=tdnn1.relu type=RectifiedLinearComponent dim=10
component-node name=tdnn1.relu component=tdnn1.relu input=tdnn1.affine
component name=tdnn1.batchnorm type=BatchNormComponent dim=10
component-node name=tdnn1.batchnorm component=tdnn1.batchnorm input=tdnn1.relu
component name=tdnn1.dropout type=GeneralDropoutComponent dim=10 dropout-proportion=0.5
component-node name=tdnn1.dropout component=tdnn1.dropout input=tdnn1.batchnorm
{layers}
component name=prefinal.affine type=NaturalGradientAffineComponent input-dim=10 output-dim=12
component-node name=prefinal.affine component=prefinal.affine input={last}
component name=prefinal.relu type=RectifiedLinearComponent dim=12
component-node name=prefinal.relu component=prefinal.relu input=prefinal.affine
component name=prefinal.batchnorm1 type=BatchNormComponent dim=12
component-node name=prefinal.batchnorm1 component=prefinal.batchnorm1 input=prefinal.relu
component name=prefinal.linear type=LinearComponent input-dim=12 output-dim=5 orthonormal-constraint=-1
component-node name=prefinal.linear component=prefinal.linear input=prefinal.batchnorm1
component name=prefinal.batchnorm2 type=BatchNormComponent dim=5
component-node name=prefinal.batchnorm2 component=prefinal.batchnorm2 input=prefinal.linear
component name=output.affine type=NaturalGradientAffineComponent input-dim=5 output-dim=7
component-node name=output.affine component=output.affine input=prefinal.batchnorm2
output-node name=output input=output.affine
"""  # noqa: E501
TDNNF_LAYER = """
component name={n}.linear type=TdnnComponent input-dim=10 output-dim=4 time-offsets=-1,0 use-bias=false orthonormal-constraint=-1.0
component-node name={n}.linear component={n}.linear input={prev}
component name={n}.affine type=TdnnComponent input-dim=4 output-dim=10 time-offsets=0,1
component-node name={n}.affine component={n}.affine input={n}.linear
component name={n}.relu type=RectifiedLinearComponent dim=10
component-node name={n}.relu component={n}.relu input={n}.affine
component name={n}.batchnorm type=BatchNormComponent dim=10
component-node name={n}.batchnorm component={n}.batchnorm input={n}.relu
component name={n}.dropout type=GeneralDropoutComponent dim=10 dropout-proportion=0.3 continuous=true
component-node name={n}.dropout component={n}.dropout input={n}.batchnorm
component name={n}.noop type=NoOpComponent dim=10
component-node name={n}.noop component={n}.noop input=Sum(Scale(0.66, {prev}), {n}.dropout)
"""  # noqa: E501


def test_tdnnf_with_lda_and_prefinal_layer(tmp_path):
    """idct + lda, relu-batchnorm-dropout tdnn1, three tdnnf layers (dropout in the
    bypass), prefinal layer, output: 30 components. Kaldi: lda (21 -> 21) merges
    into tdnn1.affine (-1); tdnnf2.linear reads tdnn1.dropout (GeneralDropout) then
    tdnn1.batchnorm: one new Tdnn for it (tdnn1.dropout and tdnn1.batchnorm stay
    for tdnnf2.noop's Sum: 0); batchnorm1 into prefinal.linear and batchnorm2 into
    output.affine (-1 each; the merged prefinal layer, 12 -> 5, reduces the
    dimension: no affine merge after). tdnnfN.dropout only feeds Sums, and the
    NoOps are nothing Kaldi collapses: 30 - 3 = 27."""
    layers, prev = [], "tdnn1.dropout"
    for i in (2, 3, 4):
        layers.append(TDNNF_LAYER.format(n=f"tdnnf{i}", prev=prev))
        prev = f"tdnnf{i}.noop"
    config = TDNNF.format(layers="".join(layers).strip(), last=prev)
    check_collapse(prepared(config), 27, tmp_path)


def conv_stack(dropout: str) -> str:
    """conv-batchnorm-relu-dropout, conv-relu-batchnorm-so, then an affine layer
    reading the BatchNorm at three offsets and one reading the ScaleAndOffset."""
    return f"""
input-node name=input dim=12
component name=conv1.conv type=TimeHeightConvolutionComponent num-filters-in=1 num-filters-out=2 height-in=12 height-out=12 height-offsets=-1,0,1 time-offsets=-1,0,1
component-node name=conv1.conv component=conv1.conv input=input
component name=conv1.batchnorm type=BatchNormComponent dim=24 block-dim=2
component-node name=conv1.batchnorm component=conv1.batchnorm input=conv1.conv
component name=conv1.relu type=RectifiedLinearComponent dim=24 block-dim=2
component-node name=conv1.relu component=conv1.relu input=conv1.batchnorm
component name=conv1.dropout type={dropout} dim=24
component-node name=conv1.dropout component=conv1.dropout input=conv1.relu
component name=conv2.conv type=TimeHeightConvolutionComponent num-filters-in=2 num-filters-out=2 height-in=12 height-out=6 height-subsample-out=2 height-offsets=-1,0,1 time-offsets=-1,0,1
component-node name=conv2.conv component=conv2.conv input=conv1.dropout
component name=conv2.relu type=RectifiedLinearComponent dim=12 block-dim=2
component-node name=conv2.relu component=conv2.relu input=conv2.conv
component name=conv2.batchnorm type=BatchNormComponent dim=12 block-dim=2
component-node name=conv2.batchnorm component=conv2.batchnorm input=conv2.relu
component name=conv2.so type=ScaleAndOffsetComponent dim=12 block-dim=2
component-node name=conv2.so component=conv2.so input=conv2.batchnorm
component name=aff type=NaturalGradientAffineComponent input-dim=36 output-dim=5
component-node name=aff component=aff input=Append(Offset(conv2.batchnorm, -1), conv2.batchnorm, Offset(conv2.batchnorm, 1))
component name=aff2 type=NaturalGradientAffineComponent input-dim=12 output-dim=5
component-node name=aff2 component=aff2 input=conv2.so
output-node name=output input=Sum(aff, aff2)
"""  # noqa: E501


@pytest.mark.parametrize("dropout", ["DropoutComponent dropout-proportion=0.5",
                                     "GeneralDropoutComponent dropout-proportion=0.5"])
def test_convolution_layers_with_batchnorm_and_dropout(dropout, tmp_path):
    """10 components. Kaldi: the dropout goes into conv2.conv (a scaled copy for
    p = 0.5: -1); conv2.batchnorm into aff (it stays for conv2.so: 0); BatchNorm
    before a ReLU or a ScaleAndOffset, a ScaleAndOffset before an affine layer and
    anything around a convolution but dropout: nothing. 10 - 1 = 9."""
    check_collapse(prepared(conv_stack(dropout)), 9, tmp_path)


BATCHNORM_AFTER_LAYERS = """
input-node name=input dim=6
component name=td type=TdnnComponent input-dim=6 output-dim=8 time-offsets=-1,0,1
component-node name=td component=td input=input
component name=bn1 type=BatchNormComponent dim=8
component-node name=bn1 component=bn1 input=td
component name=lin type=LinearComponent input-dim=8 output-dim=5
component-node name=lin component=lin input=bn1
component name=bn2 type=BatchNormComponent dim=5
component-node name=bn2 component=bn2 input=lin
component name=aff type=AffineComponent input-dim=5 output-dim=8
component-node name=aff component=aff input=bn2
component name=bn3 type=BatchNormComponent dim=8
component-node name=bn3 component=bn3 input=aff
component name=td2 type=TdnnComponent input-dim=8 output-dim=4 time-offsets=0,2
component-node name=td2 component=td2 input=bn3
output-node name=output input=td2
"""


def test_batchnorm_after_tdnn_linear_and_affine_layers(tmp_path):
    """7 components. Kaldi: bn1 into lin (an AffineComponent), bn2 into aff, bn3 into
    td2 (-3); then bn1.lin (8 -> 5) before bn2.aff reduces the dimension: no merge.
    td, bn1.lin, bn2.aff, bn3.td2 = 4."""
    check_collapse(prepared(BATCHNORM_AFTER_LAYERS), 4, tmp_path)


AFFINE_CHAIN = """
input-node name=input dim=6
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=input
component name=a type=AffineComponent input-dim=6 output-dim=8
component-node name=a component=a input=r
component name=fs type=FixedScaleComponent dim=8
component-node name=fs component=fs input=a
component name=b type=AffineComponent input-dim=24 output-dim=5
component-node name=b component=b input=Append(Offset(fs, -1), fs, Offset(fs, 1))
output-node name=output input=b
"""


def test_affine_fixed_scale_then_spliced_affine(tmp_path):
    """r, a, fs, b. Kaldi: fs into a (``a.fs``, an affine 6 -> 8), then that into b
    (block-diagonal over 3 offsets): r, a.fs.b = 2."""
    check_collapse(prepared(AFFINE_CHAIN), 2, tmp_path)
