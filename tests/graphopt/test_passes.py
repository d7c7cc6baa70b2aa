"""The non-rule passes (pruning, arithmetic) and the meta-optimizer's contract:
the input network is not changed, preserve, errors, the iteration cap, the report,
and user rules in the registries."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pynnet3
from pynnet3 import NetworkOptions, NetworkReport
from pynnet3.errors import GraphError
from pynnet3.graphopt.meta import PASS_ORDER
from pynnet3.nnet import Node
from pynnet3.rewrite import REGISTRIES, NewComponent, Pattern, Replacement, Rule, register_rule
from tests.graphopt.common import (
    ALL_OFF,
    assert_equivalent,
    assert_roundtrip,
    build,
    only,
    optimize,
    types_of,
)

# -- pruning -------------------------------------------------------------------------------

IDENTITIES = {
    "NoOpComponent": "type=NoOpComponent dim=4",
    "GeneralDropoutComponent":
        "type=GeneralDropoutComponent dim=4 dropout-proportion=0.3 test-mode=true",
    "SpecAugmentTimeMaskComponent": "type=SpecAugmentTimeMaskComponent dim=4 "
                                    "zeroed-proportion=0.3",  # test mode set below
}


def identity_net(line: str) -> str:
    """a -> identity -> b reading it at t-1, t+1."""
    return f"""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n {line}
component-node name=n component=n input=a
component name=t type=TanhComponent dim=8
component-node name=t component=t input=Append(Offset(n, -1), Offset(n, 1))
output-node name=output input=t
"""


@pytest.mark.parametrize("kind", list(IDENTITIES))
def test_pruning_inlines_identities(kind, tmp_path):
    nnet = build(identity_net(IDENTITIES[kind]))
    nnet.set_test_mode(True)
    opt, report = optimize(nnet, only("pruning"))
    assert [n.name for n in opt.nodes] == ["input", "a", "t", "output"]
    assert str(opt.node("t").descriptor) == "Append(Offset(a, -1), Offset(a, 1))"
    assert sorted(opt.components) == ["a", "t"]
    assert any(f"n ({kind})" in note for p in report.passes for note in p.notes)
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_noop_with_backprop_scale():
    """NoOp backprop-scale=0.5 is the identity forward only: inlined for inference,
    kept when input derivatives must stay exact."""
    nnet = build(identity_net("type=NoOpComponent dim=4 backprop-scale=0.5"))
    opt, _ = optimize(nnet)
    assert "n" not in [n.name for n in opt.nodes]
    assert_equivalent(nnet, opt)
    opt, _ = optimize(nnet, NetworkOptions(keep_derivatives=True))
    assert opt.node("n").kind == "component-node"
    assert_equivalent(nnet, opt, derivatives=True)


@pytest.mark.parametrize("line,scale", [
    ("type=BackpropTruncationComponent dim=4 scale=0.5", 0.5),
    ("type=FixedScaleComponent dim=4 scale=0.25", 0.25),
    ("type=DropoutComponent dim=4 dropout-proportion=0.25 test-mode=true", 0.75),
])
def test_uniform_scales_become_descriptor_scales(line, scale):
    nnet = build(identity_net(line), randomize=False)
    opt, _ = optimize(nnet, only("pruning"))
    assert [n.name for n in opt.nodes] == ["input", "a", "t", "output"]
    assert str(opt.node("t").descriptor) == \
        f"Append(Offset(Scale({scale:g}, a), -1), Offset(Scale({scale:g}, a), 1))"
    assert_equivalent(nnet, opt)


def test_backprop_truncation_kept_with_keep_derivatives():
    nnet = build(identity_net("type=BackpropTruncationComponent dim=4 scale=0.5 "
                              "clipping-threshold=0.1"))
    opt, _ = optimize(nnet, NetworkOptions(keep_derivatives=True))
    assert types_of(opt)["n"] == "BackpropTruncationComponent"
    assert_equivalent(nnet, opt, derivatives=True)


def test_identity_reading_a_sum_is_kept_for_several_readers():
    """TDNN-F's bypass NoOp: its input is a Sum read by three nodes; inlining would
    compute the Sum three times."""
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Sum(a, input)
component name=b type=AffineComponent input-dim=4 output-dim=4
component-node name=b component=b input=n
component name=t type=TanhComponent dim=4
component-node name=t component=t input=Sum(n, b)
output-node name=output input=Append(t, Offset(n, 1))
""")
    opt, _ = optimize(nnet)
    assert types_of(opt)["n"] == "NoOpComponent"
    assert_equivalent(nnet, opt)


def test_identity_reading_a_sum_inlined_for_one_reader():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Sum(a, input)
component name=t type=TanhComponent dim=4
component-node name=t component=t input=Offset(n, 2)
output-node name=output input=t
""")
    opt, _ = optimize(nnet, only("pruning"))
    assert "n" not in [n.name for n in opt.nodes]
    assert str(opt.node("t").descriptor) == "Sum(Offset(a, 2), Offset(input, 2))"
    assert_equivalent(nnet, opt, derivatives=True)


def test_identity_kept_when_a_dim_range_reads_it():
    """A dim-range node can only read a node, not the NoOp's Sum: pruning keeps the
    NoOp and says why."""
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Sum(a, input)
dim-range-node name=dr input-node=n dim-offset=1 dim=2
component name=t type=TanhComponent dim=2
component-node name=t component=t input=dr
output-node name=output input=t
""")
    opt, report = optimize(nnet, only("pruning"))
    assert opt.to_bytes() == nnet.to_bytes()
    notes = [note for p in report.passes for note in p.notes]
    assert any(note.startswith("kept n:") and "'dr'" in note and "not a plain node" in note
               for note in notes), notes


def test_full_width_dim_range_is_its_source(tmp_path):
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=5
component-node name=a component=a input=input
dim-range-node name=full input-node=a dim-offset=0 dim=5
dim-range-node name=part input-node=a dim-offset=1 dim=3
dim-range-node name=full2 input-node=full dim-offset=0 dim=5
component name=t type=TanhComponent dim=13
component-node name=t component=t input=Append(Offset(full, -1), part, full2)
output-node name=output input=t
""")
    opt, report = optimize(nnet, only("pruning"))
    assert [n.name for n in opt.nodes] == ["input", "a", "part", "t", "output"]
    assert str(opt.node("t").descriptor) == "Append(Offset(a, -1), part, a)"
    assert opt.node("part").source == "a"
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_orphans_removed():
    nnet = build("""
input-node name=input dim=4
input-node name=unused dim=2
component name=a type=AffineComponent input-dim=4 output-dim=3
component-node name=a component=a input=input
component name=dead type=TanhComponent dim=3
component-node name=dead component=dead input=a
component name=spare type=SigmoidComponent dim=3
output-node name=output input=a
""")
    opt, _ = optimize(nnet, only("pruning"))
    assert [n.name for n in opt.nodes] == ["input", "unused", "a", "output"]  # inputs stay
    assert sorted(opt.components) == ["a"]


# -- arithmetic ---------------------------------------------------------------------------

def test_sum_terms_merge_and_scales_move_into_weights(tmp_path):
    desc = "Append(Sum(Scale(2.0, input), Scale(-0.5, input)), Offset(input, 1))"
    nnet = build(f"""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=8 output-dim=3
component-node name=a component=a input={desc}
output-node name=output input=a
""")
    opt, report = optimize(nnet, only("arithmetic"))
    assert str(opt.node("a").descriptor) == "Append(input, Offset(input, 1))"
    w = nnet.components["a"].linear_params
    got = opt.components[opt.node("a").component]
    np.testing.assert_allclose(got.linear_params[:, :4], 1.5 * w[:, :4], rtol=1e-6)
    np.testing.assert_array_equal(got.linear_params[:, 4:], w[:, 4:])
    np.testing.assert_array_equal(got.bias_params, nnet.components["a"].bias_params)
    assert any("merged Sum terms" in n for p in report.passes for n in p.notes)
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)


def test_sum_terms_merge_on_non_linear_readers():
    nnet = build("""
input-node name=input dim=4
component name=t type=TanhComponent dim=4
component-node name=t component=t input=Sum(Offset(input, 1), Sum(input, Offset(input, 1)))
output-node name=output input=Sum(t, t)
""")
    opt, _ = optimize(nnet, only("arithmetic"))
    assert str(opt.node("t").descriptor) == "Sum(Offset(Scale(2, input), 1), input)"
    assert str(opt.node("output").descriptor) == "Scale(2, t)"
    assert_equivalent(nnet, opt, derivatives=True)


def test_scale_of_a_tdnn_input_moves_into_its_weights():
    nnet = build("""
input-node name=input dim=4
component name=td type=TdnnComponent input-dim=4 output-dim=3 time-offsets=-1,1
component-node name=td component=td input=Scale(-2.0, input)
output-node name=output input=td
""")
    opt, _ = optimize(nnet, only("arithmetic"))
    assert str(opt.node("td").descriptor) == "input"
    np.testing.assert_allclose(opt.components[opt.node("td").component].linear_params,
                               -2.0 * nnet.components["td"].linear_params)
    assert_equivalent(nnet, opt, derivatives=True)


# -- the meta-optimizer -------------------------------------------------------------------

EVERYTHING = """
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=6
component-node name=a component=a input=input
component name=relu type=RectifiedLinearComponent dim=6
component-node name=relu component=relu input=a
component name=bn type=BatchNormComponent dim=6 test-mode=true
component-node name=bn component=bn input=relu
component name=n type=NoOpComponent dim=6
component-node name=n component=n input=bn
component name=b type=AffineComponent input-dim=18 output-dim=5
component-node name=b component=b input=Append(Offset(n, -1), n, Offset(n, 1))
component name=fs type=FixedScaleComponent dim=5
component-node name=fs component=fs input=b
component name=c type=AffineComponent input-dim=5 output-dim=3
component-node name=c component=c input=Scale(0.5, fs)
output-node name=output input=c
"""


def test_input_network_untouched():
    nnet = build(EVERYTHING)
    before = nnet.to_bytes()
    nodes = list(nnet.nodes)
    opt, report = optimize(nnet)
    assert report.rules_applied()  # something did change ...
    assert opt.to_bytes() != before
    assert nnet.to_bytes() == before  # ... in the copy only
    assert nnet.nodes == nodes


def test_everything_at_once(tmp_path):
    """Pruning, shatter, folding and arithmetic (parameter fusion and the fuse
    registry are checked on their own elsewhere)."""
    nnet = build(EVERYTHING)
    opt, report = optimize(nnet, NetworkOptions(parameter_fusion=False, fusion=False))
    # iteration 1: n inlined; bn folds into b and fs into c (next-linear folds rank
    # above fs into b); Scale(0.5) moves into c's weights. Iteration 2: c reads b
    # plainly and merges with it: 18*3 multiply-adds per frame < 18*5 + 5*3
    assert report.rules_applied() == {"fold-batchnorm-into-next-linear": 1,
                                      "fold-fixedscale-into-next-linear": 1,
                                      "merge-affine-into-affine": 1}
    assert [n.name for n in opt.nodes] == ["input", "a", "relu", "c", "output"]
    assert len(opt.components) == 3
    # parameters (Kaldi's NumParameters: updatable components) 4*6+6 + 18*5+5 + 5*3+3
    assert report.before == {"num_components": 7, "num_component_nodes": 7, "num_nodes": 9,
                             "num_parameters": 143}
    last = report.passes[-1]
    assert (last.num_components, last.num_component_nodes, last.num_nodes) == (3, 3, 5)
    assert_equivalent(nnet, opt, derivatives=True)
    opt, _ = optimize(nnet)
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)
    assert_roundtrip(nnet, opt, tmp_path, binary=True)


def test_report_structure():
    nnet = build(EVERYTHING)
    report = NetworkReport()
    pynnet3.optimize_network(nnet, report=report)
    # iterations that change things, then
    # one that changes nothing
    n = report.iterations
    assert n >= 2 and not report.hit_iteration_limit
    # (then the layout, once: it rewrites no node)
    assert [p.name for p in report.passes] == list(PASS_ORDER) * n + ["layout"]
    assert [p.iteration for p in report.passes] == [i for i in range(1, n + 1)
                                                    for _ in PASS_ORDER] + [n]
    assert report.passes[-1].changes == 0 and "column-major" in report.passes[-1].notes[0]
    assert all(p.changes == 0 for p in report.passes[-7:-1])
    assert sum(p.changes for p in report.passes[-13:-7]) > 0
    text = str(report)
    assert "fold-batchnorm-into-next-linear: 1" in text
    assert "(stopped at the iteration limit)" not in text


def test_all_passes_off_changes_nothing():
    nnet = build(EVERYTHING)
    opt, report = optimize(nnet, NetworkOptions(**ALL_OFF))
    assert opt is not nnet
    assert opt.to_bytes() == nnet.to_bytes()
    assert report.passes == [] and report.iterations == 1


@pytest.mark.parametrize("name", [*PASS_ORDER, "layout"])
def test_each_pass_off_alone(name):
    nnet = build(EVERYTHING)
    opt, report = optimize(nnet, NetworkOptions(**{name: False}))
    assert name not in [p.name for p in report.passes]
    assert_equivalent(nnet, opt)


def test_options_key_is_hashable_and_distinguishes():
    assert hash(NetworkOptions().key()) == hash(NetworkOptions().key())
    assert NetworkOptions().key() != NetworkOptions(pruning=False).key()


def test_preserve_keeps_a_node():
    nnet = build(EVERYTHING)
    opt, _ = optimize(nnet, preserve=("n",))
    node = opt.node("n")
    assert node.kind == "component-node" and types_of(opt)["n"] == "NoOpComponent"
    assert_equivalent(nnet, opt)
    opt, _ = optimize(nnet, preserve=("bn",), options=NetworkOptions(
        disable_rules=("fuse-affine-relu-map",)))
    # bn stays (its value is what preserve promises); its reader still absorbs its map
    assert types_of(opt)["bn"] == "BatchNormComponent"
    assert "bn" not in opt.node("c").descriptor.node_names()
    assert_equivalent(nnet, opt)
    # with kernel fusion, bn's node computes bn's value as one kernel with the layer and
    # ReLU before it, and its reader keeps reading it (a fold would save nothing)
    opt, report = optimize(nnet, preserve=("bn",))
    assert types_of(opt)["bn"] == "AffineReluComponent"
    assert "bn" in opt.node("c").descriptor.node_names()
    assert any("stays for 'preserve'" in d for p in report.passes for d in p.declined)
    assert_equivalent(nnet, opt)


def test_preserve_keeps_an_otherwise_orphan_node():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=3
component-node name=a component=a input=input
component name=probe type=TanhComponent dim=3
component-node name=probe component=probe input=a
output-node name=output input=a
""")
    opt, _ = optimize(nnet, preserve=("probe",))
    assert types_of(opt) == {"a": "AffineComponent", "probe": "TanhComponent"}
    opt, _ = optimize(nnet)
    assert types_of(opt) == {"a": "AffineComponent"}


def test_preserve_unknown_node():
    nnet = build(EVERYTHING)
    with pytest.raises(GraphError, match="no-such-node"):
        pynnet3.optimize_network(nnet, preserve=("no-such-node",))


# -- user rules -----------------------------------------------------------------------------

def relu_relu(match, ctx) -> Replacement:
    """relu(relu(x)) = relu(x): the root applies the inner node's component to the
    inner node's input."""
    inner = match.nodes[1]
    return Replacement([Node("component-node", match.root,
                             component=ctx.nnet.node(inner).component,
                             descriptor=match.inputs[1])], note="relu is idempotent")


@pytest.fixture
def user_rule():
    """Registers the relu-relu rule in the ``fuse`` registry for one test."""
    rule = Rule("test-relu-relu", Pattern("relu-relu", entries=(
        "RectifiedLinearComponent", "RectifiedLinearComponent")), relu_relu)
    register_rule("fuse", rule)
    try:
        yield rule
    finally:
        REGISTRIES["fuse"].unregister(rule.name)
    assert rule.name not in REGISTRIES["fuse"]


# (a is no linear layer: the built-in fuse-affine-relu would take r1 first)
RELU_RELU = """
input-node name=input dim=4
component name=a type=SigmoidComponent dim=4
component-node name=a component=a input=input
component name=r1 type=RectifiedLinearComponent dim=4
component-node name=r1 component=r1 input=a
component name=r2 type=RectifiedLinearComponent dim=4
component-node name=r2 component=r2 input=r1
component name=t type=TanhComponent dim=4
component-node name=t component=t input=r2
output-node name=output input=t
"""


def test_user_rule_fires_and_is_reported(user_rule, tmp_path):
    nnet = build(RELU_RELU)
    opt, report = optimize(nnet)
    assert report.rules_applied() == {"test-relu-relu": 1}
    fusion = [p for p in report.passes if p.name == "fusion" and p.applied]
    assert len(fusion) == 1 and fusion[0].applied == {"test-relu-relu": 1}
    assert [n.name for n in opt.nodes] == ["input", "a", "r2", "t", "output"]
    assert sorted(opt.components) == ["a", "r1", "t"]
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)
    opt, report = optimize(nnet, NetworkOptions(fusion=False))
    assert report.rules_applied() == {}


def test_user_rule_not_registered_twice(user_rule):
    with pytest.raises(ValueError, match="already"):
        register_rule("fuse", user_rule)
    with pytest.raises(KeyError, match="no rule registry"):
        register_rule("no-such-registry", user_rule)


def test_user_rules_gone_after_unregister():
    nnet = build(RELU_RELU)
    _, report = optimize(nnet)
    assert report.rules_applied() == {}


def always_fires(match, ctx) -> Replacement:
    """Replaces the root's component by a fresh copy: a change every time."""
    return Replacement([Node("component-node", match.root, component="again",
                             descriptor=match.inputs[0])],
                       [NewComponent("again", match.components[0].copy())])


def test_iteration_cap_warns():
    rule = Rule("test-always", Pattern("tanh", entries=("TanhComponent",)), always_fires)
    register_rule("fuse", rule)
    try:
        nnet = build(RELU_RELU)
        report = NetworkReport()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = pynnet3.optimize_network(
                nnet, NetworkOptions(max_iterations=3, max_rule_steps=2), report=report)
    finally:
        REGISTRIES["fuse"].unregister(rule.name)
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert any("after 3 iterations" in m for m in messages), messages
    assert any("after 2 steps" in m for m in messages), messages
    assert report.hit_iteration_limit and report.iterations == 3
    assert report.rules_applied()["test-always"] == 3 * 2
    assert "(stopped at the iteration limit)" in str(report)
    assert_equivalent(nnet, opt)  # valid and equivalent, just not a fixed point
    assert types_of(opt) == types_of(nnet)  # the same nodes, ...
    assert opt.node("t").component.startswith("again")  # ... t's component copied anew
    assert "t" not in opt.components
