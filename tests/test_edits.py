"""pynnet3.edits: Kaldi's ReadEditConfig directives (nnet3/nnet-utils.h) on small
networks, each checked against what the directive means (reasoned out here, not
read back from the code under test)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.components.affine import (
    AffineComponent,
    FixedAffineComponent,
    LinearComponent,
    NaturalGradientAffineComponent,
)
from pynnet3.edits import (
    EditLog,
    apply_edits,
    edits_from_option,
    name_matches_pattern,
    parse_edits,
)
from pynnet3.errors import ConfigError

CONFIG = """\
input-node name=input dim=6
input-node name=ivector dim=3
component name=lda type=FixedAffineComponent input-dim=6 output-dim=6
component name=tdnn1.affine type=NaturalGradientAffineComponent input-dim=18 output-dim=10 \
learning-rate-factor=0.5 max-change=0.75 l2-regularize=0.01
component name=tdnn1.relu type=RectifiedLinearComponent dim=10
component name=tdnn1.dropout type=DropoutComponent dim=10 dropout-proportion=0.0
component name=tdnn2.affine type=AffineComponent input-dim=10 output-dim=8
component name=tdnn2.relu type=RectifiedLinearComponent dim=8
component name=tdnn2.linear type=LinearComponent input-dim=8 output-dim=8
component name=output.affine type=NaturalGradientAffineComponent input-dim=8 output-dim=5
component name=output-xent.affine type=NaturalGradientAffineComponent input-dim=8 output-dim=5
component name=output-xent.log-softmax type=LogSoftmaxComponent dim=5
component name=spare type=AffineComponent input-dim=4 output-dim=4
component name=never-used type=AffineComponent input-dim=4 output-dim=4
component-node name=lda component=lda input=input
component-node name=tdnn1.affine component=tdnn1.affine \
input=Append(Offset(lda, -1), lda, Offset(lda, 1))
component-node name=tdnn1.relu component=tdnn1.relu input=tdnn1.affine
component-node name=tdnn1.dropout component=tdnn1.dropout input=tdnn1.relu
component-node name=tdnn2.affine component=tdnn2.affine input=tdnn1.dropout
component-node name=tdnn2.relu component=tdnn2.relu \
input=Sum(tdnn2.affine, Offset(tdnn2.affine, -2))
component-node name=tdnn2.linear component=tdnn2.linear input=tdnn2.relu
dim-range-node name=tdnn2.first input-node=tdnn2.relu dim-offset=0 dim=4
component-node name=spare component=spare input=tdnn2.first
component-node name=output.affine component=output.affine input=tdnn2.linear
component-node name=output-xent.affine component=output-xent.affine input=tdnn2.linear
component-node name=output-xent.log-softmax component=output-xent.log-softmax \
input=output-xent.affine
output-node name=output input=output.affine
output-node name=output-xent input=output-xent.log-softmax
"""


def _net(seed: int = 0) -> pynnet3.Nnet:
    text = CONFIG.replace("\\\n", "")
    return pynnet3.Nnet.from_config(text, seed=seed)


def _request(names=("output",), frames: int = 6):
    t_in = np.arange(-4, frames + 2)
    idx_in = np.stack([np.zeros_like(t_in), t_in, np.zeros_like(t_in)], 1)
    t_out = np.arange(frames)
    idx_out = np.stack([np.zeros_like(t_out), t_out, np.zeros_like(t_out)], 1)
    return pynnet3.ComputationRequest(
        inputs=[pynnet3.IoSpecification("input", idx_in)],
        outputs=[pynnet3.IoSpecification(n, idx_out) for n in names])


def _outputs(nnet, names=("output",)):
    x = np.random.default_rng(5).standard_normal((12, 6)).astype(np.float32)
    comp = pynnet3.compile(nnet, _request(names))
    return pynnet3.run(nnet, comp, inputs={"input": x}).outputs


def _node_names(nnet):
    return [n.name for n in nnet.nodes]


def _round_trip(nnet, tmp_path, binary: bool):
    path = tmp_path / ("m.bin" if binary else "m.txt")
    nnet.write(path, binary=binary)
    return pynnet3.read_nnet(path)


# -- patterns -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, pattern, expected", [
    # the cases of Kaldi's UnitTestNameMatchesPattern
    ("hello", "hello", True), ("hello", "hellox", False), ("hellox", "hello", False),
    ("hellox", "hello*", True), ("hello", "hello*", True), ("", "*", True),
    ("x", "*", True), ("foo12bar", "foo*bar", True), ("foo12bar", "foo*", True),
    ("foo12bar", "*bar", True), ("foo12bar", "foo*baz", False),
    # only '*' is special: '.', '?', '[' match themselves
    ("tdnn1.affine", "tdnn1.affine", True), ("tdnn1xaffine", "tdnn1.affine", False),
    ("a?", "a?", True), ("ab", "a?", False), ("a[1]", "a[1]", True),
    ("tdnn1.affine", "*.affine", True), ("tdnn1.affine.x", "*.affine", False),
    ("abcabc", "a*c*c", True), ("abcab", "a*c*c", False), ("ab", "a**b", True),
])
def test_name_matches_pattern_as_kaldi(name, pattern, expected):
    assert name_matches_pattern(name, pattern) is expected


# -- learning rates -----------------------------------------------------------------------

def test_set_learning_rate_changes_only_matching_updatable_components():
    nnet = _net()
    before = {n: getattr(c, "learning_rate", None) for n, c in nnet.components.items()}
    log = apply_edits(nnet, "set-learning-rate name=tdnn* learning-rate=0.25")
    lr = {n: getattr(c, "learning_rate", None) for n, c in nnet.components.items()}
    # underlying rate times the component's learning-rate-factor (0.5 for tdnn1.affine)
    assert lr["tdnn1.affine"] == pytest.approx(0.125)
    assert lr["tdnn2.affine"] == pytest.approx(0.25)
    assert lr["tdnn2.linear"] == pytest.approx(0.25)
    for name in ("output.affine", "output-xent.affine", "spare", "never-used"):
        assert lr[name] == before[name] == pytest.approx(0.001)
    assert log == [EditLog("LOG", "Set learning rates for 3 components.")]


def test_set_learning_rate_default_pattern_skips_fixed_affine():
    nnet = _net()
    log = apply_edits(nnet, "set-learning-rate learning-rate=0.1")
    # 4 affine + 2 plain affine (spare, never-used) + 1 linear; not lda, not the ReLUs
    assert log == [EditLog("LOG", "Set learning rates for 7 components.")]
    for name, c in nnet.components.items():
        if isinstance(c, (AffineComponent, LinearComponent)) and not isinstance(
                c, FixedAffineComponent):
            want = 0.1 * c.learning_rate_factor
            assert c.learning_rate == pytest.approx(want), name
    # (Kaldi's FixedAffineComponent is no UpdatableComponent; its file has no rate)
    assert b"LearningRate" not in _lda_bytes(nnet)


def _lda_bytes(nnet) -> bytes:
    text = nnet.to_bytes(binary=False)
    start = text.index(b"<ComponentName> lda ")
    return text[start:text.index(b"</FixedAffineComponent>", start)]


def test_learning_rate_factor_then_rate_in_order():
    nnet = _net()
    apply_edits(nnet, "set-learning-rate-factor name=output* learning-rate-factor=0.2\n"
                      "set-learning-rate learning-rate=0.5\n")
    assert nnet.components["output.affine"].learning_rate_factor == pytest.approx(0.2)
    assert nnet.components["output.affine"].learning_rate == pytest.approx(0.1)
    assert nnet.components["output-xent.affine"].learning_rate == pytest.approx(0.1)
    assert nnet.components["tdnn2.affine"].learning_rate == pytest.approx(0.5)
    assert nnet.components["tdnn2.affine"].learning_rate_factor == 1.0
    # the other order: the factor set afterwards leaves the rate as it was
    nnet = _net()
    apply_edits(nnet, "set-learning-rate learning-rate=0.5; "
                      "set-learning-rate-factor name=output* learning-rate-factor=0.2"
                .replace(";", "\n"))
    assert nnet.components["output.affine"].learning_rate == pytest.approx(0.5)
    assert nnet.components["output.affine"].learning_rate_factor == pytest.approx(0.2)


def test_no_match_changes_nothing_and_says_zero():
    nnet = _net()
    before = nnet.to_bytes()
    log = apply_edits(nnet, "set-learning-rate name=nothing* learning-rate=3")
    assert nnet.to_bytes() == before
    assert log[0].message == "Set learning rates for 0 components."


# -- dropout ------------------------------------------------------------------------------

def test_set_dropout_proportion_on_the_three_dropout_types():
    extra = ("component name=mask type=DropoutMaskComponent output-dim=2 "
             "dropout-proportion=0.5\n"
             "component name=gdrop type=GeneralDropoutComponent dim=10 "
             "dropout-proportion=0.5\n")
    nnet = pynnet3.Nnet.from_config([CONFIG.replace("\\\n", ""), extra])
    log = apply_edits(nnet, "set-dropout-proportion proportion=0.3")
    for name in ("tdnn1.dropout", "mask", "gdrop"):
        assert nnet.components[name].dropout_proportion == pytest.approx(0.3), name
    assert log[-1].message == "Set dropout proportions for 3 components."
    apply_edits(nnet, "set-dropout-proportion name=tdnn* proportion=0.1")
    assert nnet.components["tdnn1.dropout"].dropout_proportion == pytest.approx(0.1)
    assert nnet.components["mask"].dropout_proportion == pytest.approx(0.3)
    back = pynnet3.nnet.nnet_from_bytes(nnet.to_bytes())
    assert back.components["tdnn1.dropout"].dropout_proportion == pytest.approx(0.1)


# -- convert-to-fixed-affine --------------------------------------------------------------

def test_convert_to_fixed_affine_keeps_values_and_place(tmp_path):
    nnet = _net()
    ref = _outputs(nnet)["output"]
    order = list(nnet.components)
    w = nnet.components["output.affine"].linear_params.copy()
    log = apply_edits(nnet, "convert-to-fixed-affine name=*.affine")
    assert list(nnet.components) == order
    for name in ("tdnn1.affine", "tdnn2.affine", "output.affine", "output-xent.affine"):
        assert type(nnet.components[name]) is FixedAffineComponent, name
    assert type(nnet.components["tdnn2.linear"]) is LinearComponent  # (not affine)
    assert type(nnet.components["spare"]) is AffineComponent  # (name does not match)
    assert log == [EditLog("LOG", "Converted 4 components to FixedAffineComponent.")]
    np.testing.assert_array_equal(nnet.components["output.affine"].linear_params, w)
    log = apply_edits(nnet, "convert-to-fixed-affine")  # (lda is no AffineComponent)
    assert log == [EditLog("LOG", "Converted 2 components to FixedAffineComponent.")]
    back = _round_trip(nnet, tmp_path, binary=True)
    assert type(back.components["tdnn1.affine"]) is FixedAffineComponent
    assert not back.components["tdnn1.affine"].is_updatable()
    np.testing.assert_array_equal(_outputs(back)["output"], ref)


# -- orphans ------------------------------------------------------------------------------

def test_remove_orphan_nodes_keeps_inputs_and_components():
    nnet = _net()
    log = apply_edits(nnet, "remove-orphan-nodes")
    names = _node_names(nnet)
    assert "spare" not in names and "tdnn2.first" not in names
    assert "ivector" in names  # (orphan input: kept by default)
    assert "spare" in nnet.components and "never-used" in nnet.components
    assert log == [EditLog("LOG", "Removed 2 orphan nodes.")]


def test_remove_orphan_inputs_too():
    nnet = _net()
    apply_edits(nnet, "remove-orphan-nodes remove-orphan-inputs=true")
    assert "ivector" not in _node_names(nnet) and "input" in _node_names(nnet)


def test_remove_orphan_components_only_unused_ones():
    nnet = _net()
    apply_edits(nnet, "remove-orphan-components")
    assert "never-used" not in nnet.components
    assert "spare" in nnet.components  # (its node is an orphan, but it is used)
    assert "spare" in _node_names(nnet)


def test_remove_orphans_both(tmp_path):
    nnet = _net()
    ref = _outputs(nnet, ("output", "output-xent"))
    apply_edits(nnet, "remove-orphans")
    assert {"spare", "never-used"}.isdisjoint(nnet.components)
    assert {"spare", "tdnn2.first"}.isdisjoint(_node_names(nnet))
    assert "ivector" in _node_names(nnet)
    back = _round_trip(nnet, tmp_path, binary=True)
    got = _outputs(back, ("output", "output-xent"))
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])


# -- rename-node and remove-output-nodes ---------------------------------------------------

def test_rename_internal_node_consumers_follow():
    nnet = _net()
    ref = _outputs(nnet)["output"]
    apply_edits(nnet, "rename-node old-name=tdnn2.relu new-name=layer2")
    names = _node_names(nnet)
    assert "tdnn2.relu" not in names and names.index("layer2") == 7  # (same place)
    assert nnet.node("layer2").component == "tdnn2.relu"  # (components keep their names)
    assert nnet.node("tdnn2.linear").inputs() == ["layer2"]
    assert nnet.node("tdnn2.first").source == "layer2"
    np.testing.assert_array_equal(_outputs(nnet)["output"], ref)


def test_rename_node_in_a_descriptor_with_offsets():
    nnet = _net()
    apply_edits(nnet, "rename-node old-name=tdnn2.affine new-name=t2")
    assert str(nnet.node("tdnn2.relu").descriptor) == "Sum(t2, Offset(t2, -2))"


def test_rename_output_node(tmp_path):
    nnet = _net()
    apply_edits(nnet, "rename-node old-name=output new-name=output-lang1")
    back = _round_trip(nnet, tmp_path, binary=True)
    assert back.output_names() == ["output-lang1", "output-xent"]


@pytest.mark.parametrize("line, fragment", [
    ("rename-node old-name=nope new-name=x", "no node called 'nope'"),
    ("rename-node old-name=output new-name=output-xent", "'output-xent' exists"),
    ("rename-node old-name=output new-name=1bad", "'1bad' is not allowed"),
    ("rename-node old-name=output", "expect old-name=xxx new-name=xxx"),
    ("rename-node old-name=output new-name=x extra=1", "extra="),
])
def test_rename_node_errors(line, fragment):
    with pytest.raises(ConfigError, match="line 1") as e:
        apply_edits(_net(), line, source="edits.txt")
    assert fragment in str(e.value) and "edits.txt" in str(e.value)


def test_remove_output_nodes_then_orphans():
    nnet = _net()
    log = apply_edits(nnet, "remove-output-nodes name=*-xent\nremove-orphans")
    assert nnet.output_names() == ["output"]
    assert not any(n.startswith("output-xent") for n in _node_names(nnet))
    assert not any(n.startswith("output-xent") for n in nnet.components)
    assert log[0] == EditLog("LOG", "Removing 1 output nodes.")


def test_remove_output_nodes_keeps_internal_nodes_and_refuses_removing_all():
    nnet = _net()
    apply_edits(nnet, "remove-output-nodes name=tdnn*")  # (only outputs are candidates)
    assert _node_names(nnet) == _node_names(_net())
    with pytest.raises(ConfigError, match="all outputs were removed"):
        apply_edits(_net(), "remove-output-nodes name=output*")


# -- reduce-rank ---------------------------------------------------------------------------

def test_reduce_rank_keeps_the_top_singular_values():
    nnet = _net()
    w = nnet.components["tdnn1.affine"].linear_params.astype(np.float64)  # 10 x 18
    b = nnet.components["tdnn1.affine"].bias_params.copy()
    s_before = np.linalg.svd(w, compute_uv=False)
    log = apply_edits(nnet, "reduce-rank name=tdnn1.* rank=3")
    c = nnet.components["tdnn1.affine"]
    assert type(c) is NaturalGradientAffineComponent and c.linear_params.shape == (10, 18)
    assert c.linear_params.dtype == np.float32
    s_after = np.linalg.svd(c.linear_params.astype(np.float64), compute_uv=False)
    np.testing.assert_allclose(s_after[:3], s_before[:3], rtol=1e-5)
    assert np.all(s_after[3:] < 1e-5 * s_before[0])
    # Eckart-Young: the best rank-3 approximation leaves exactly the dropped energy
    err = np.linalg.norm(w - c.linear_params, "fro") ** 2
    assert err == pytest.approx(np.sum(s_before[3:] ** 2), rel=1e-4)
    np.testing.assert_array_equal(c.bias_params, b)
    # a ReLU also matched: Kaldi warns and goes on
    assert EditLog("WARNING", "Not reducing rank of component tdnn1.relu as it is not an "
                              "AffineComponent.") in log
    assert log[-1] == EditLog("LOG", "Reduced rank of parameters of 1 components.")


def test_reduce_rank_skips_components_not_larger_than_the_rank():
    nnet = _net()
    before = nnet.components["output.affine"].linear_params.copy()  # 5 x 8
    log = apply_edits(nnet, "reduce-rank name=output.affine rank=5")
    np.testing.assert_array_equal(nnet.components["output.affine"].linear_params, before)
    assert log[0].level == "WARNING"
    assert "because its dimension is 8 -> 5" in log[0].message


# -- apply-svd -----------------------------------------------------------------------------

def _low_rank_net(rank: int, seed: int = 1) -> pynnet3.Nnet:
    """The test network with tdnn1.affine's matrix (10 x 18) of exact rank ``rank``."""
    nnet = _net()
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((10, rank)) @ rng.standard_normal((rank, 18)) / 4
    nnet.components["tdnn1.affine"].linear_params = w.astype(np.float32)
    return nnet


def test_apply_svd_factors_multiply_back_and_consumers_follow(tmp_path):
    nnet = _low_rank_net(4)
    orig = nnet.components["tdnn1.affine"]
    w, b = orig.linear_params.copy(), orig.bias_params.copy()
    ref = _outputs(nnet, ("output", "output-xent"))
    log = apply_edits(nnet, "apply-svd name=tdnn1.affine bottleneck-dim=4")
    a, bb = nnet.components["tdnn1.affine_a"], nnet.components["tdnn1.affine_b"]
    assert "tdnn1.affine" not in nnet.components
    assert type(a) is LinearComponent and a.params_.shape == (4, 18)
    assert type(bb) is NaturalGradientAffineComponent and bb.linear_params.shape == (10, 4)
    np.testing.assert_allclose(bb.linear_params @ a.params_, w, atol=2e-6 * np.abs(w).max())
    np.testing.assert_array_equal(bb.bias_params, b)
    # the singular values are shared equally: A A^T = B^T B = diag(s)
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)[:4]
    np.testing.assert_allclose(a.params_ @ a.params_.T, np.diag(s), atol=1e-5 * s[0])
    np.testing.assert_allclose(bb.linear_params.T @ bb.linear_params, np.diag(s),
                               atol=1e-5 * s[0])
    # learning rate, factor, max-change, l2 copied from the original (SetUpdatableConfigs)
    for part in (a, bb):
        assert (part.learning_rate, part.learning_rate_factor, part.max_change,
                part.l2_regularize) == (orig.learning_rate, orig.learning_rate_factor,
                                        orig.max_change, orig.l2_regularize)
    # graph: x -> x_a -> x_b, consumers read x_b; the original node is gone
    names = _node_names(nnet)
    assert "tdnn1.affine" not in names
    assert names.index("tdnn1.affine_a") + 1 == names.index("tdnn1.affine_b")
    assert str(nnet.node("tdnn1.affine_a").descriptor) == "Append(Offset(lda, -1), lda, " \
                                                          "Offset(lda, 1))"
    assert nnet.node("tdnn1.affine_b").inputs() == ["tdnn1.affine_a"]
    assert nnet.node("tdnn1.relu").inputs() == ["tdnn1.affine_b"]
    # as Kaldi's, it ends with remove-orphans (its orphan node and component go too)
    assert "spare" not in names and "never-used" not in nnet.components
    assert log[-1] == EditLog("LOG", "Decomposed 1 components with SVD.")
    back = _round_trip(nnet, tmp_path, binary=True)
    got = _outputs(back, ("output", "output-xent"))
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], atol=1e-4)


def test_apply_svd_node_order_and_recurrent_reference():
    cfg = """\
input-node name=input dim=4
component name=r type=NaturalGradientAffineComponent input-dim=10 output-dim=6
component name=o type=AffineComponent input-dim=6 output-dim=2
component-node name=r component=r input=Append(input, IfDefined(Offset(r, -1)))
component-node name=o component=o input=r
output-node name=output input=o
input-node name=late dim=2
"""
    nnet = pynnet3.Nnet.from_config(cfg)
    apply_edits(nnet, "apply-svd name=r bottleneck-dim=2")
    # inputs first (Kaldi re-reads every other node), the recurrence reads r_b
    assert _node_names(nnet) == ["input", "late", "r_a", "r_b", "o", "output"]
    assert str(nnet.node("r_a").descriptor) == "Append(input, IfDefined(Offset(r_b, -1)))"


def test_apply_svd_energy_threshold_picks_the_dimension():
    nnet = _net()
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((10, 10)))
    v, _ = np.linalg.qr(rng.standard_normal((18, 18)))
    s = np.array([4.0, 2.0, 1.0, 0.5] + [0.0] * 6)
    nnet.components["tdnn1.affine"].linear_params = (u @ np.diag(s) @ v[:10]).astype(
        np.float32)
    # squares 16, 4, 1, 0.25 (total 21.25): 0.9 of it (19.125) needs the first two
    apply_edits(nnet, "apply-svd name=tdnn1.affine energy-threshold=0.9")
    assert nnet.components["tdnn1.affine_a"].params_.shape == (2, 18)
    nnet = _net()
    nnet.components["tdnn1.affine"].linear_params = (u @ np.diag(s) @ v[:10]).astype(
        np.float32)
    apply_edits(nnet, "apply-svd name=tdnn1.affine energy-threshold=0.97")  # (> 20/21.25)
    assert nnet.components["tdnn1.affine_a"].params_.shape == (3, 18)


def test_apply_svd_shrinkage_threshold_skips_and_warnings():
    nnet = _net()
    before = nnet.to_bytes()
    # 6 * (18 + 10) / (18 * 10) = 0.933 > 0.9: left as it is
    log = apply_edits(nnet, "apply-svd name=tdnn1.* bottleneck-dim=6 "
                            "shrinkage-threshold=0.9")
    assert nnet.to_bytes() == before
    assert any("Shrinkage ratio 0.933" in m.message for m in log)
    assert EditLog("WARNING", "Not decomposing component tdnn1.relu as it is not an "
                              "AffineComponent.") in log
    # too small for the bottleneck: warned and left (output.affine is 8 -> 5)
    log = apply_edits(nnet, "apply-svd name=output.affine bottleneck-dim=5")
    assert log[0].level == "WARNING" and "8 -> 5" in log[0].message
    assert "output.affine" in nnet.components


def test_apply_svd_name_clash_is_an_error():
    nnet = _net()
    nnet.read_config("component name=tdnn2.affine_a type=AffineComponent input-dim=2 "
                     "output-dim=2")
    with pytest.raises(ConfigError, match="already has a component named 'tdnn2.affine_a'"):
        apply_edits(nnet, "apply-svd name=tdnn2.affine bottleneck-dim=3")


# -- parsing and errors --------------------------------------------------------------------

def test_parse_comments_blank_lines_and_defaults():
    text = "# edits\n\nremove-orphans   # trailing comment\nset-learning-rate learning-rate=1\n"
    ds = parse_edits(text, "e.txt")
    assert [d.directive for d in ds] == ["remove-orphans", "set-learning-rate"]
    assert ds[0].options == {"remove_orphan_inputs": False}
    assert ds[1].options == {"name": "*", "learning_rate": 1.0}
    assert ds[1].line.line_number == 4
    assert edits_from_option("a; b;c") == "a\n b\nc"


@pytest.mark.parametrize("text, fragments", [
    ("remove-orphans\nfrobnicate name=x", ["e.txt, line 2", "'frobnicate'"]),
    ("set-orthonormal-constraint name=* constraint=1", ["'set-orthonormal-constraint'",
                                                         "not supported"]),
    ("set-learning-rate name=x", ["line 1", "learning-rate="]),
    ("set-learning-rate learning-rate=fast", ["learning-rate='fast'", "number"]),
    ("set-learning-rate learning-rate=nan", ["finite"]),
    ("set-learning-rate learning-rate=-1", ["must be >= 0"]),
    ("set-learning-rate learning-rate=0.1 nme=x", ["nme="]),
    ("remove-orphan-components x=1", ["x="]),
    ("remove-orphans remove-orphan-inputs=maybe", ["'maybe'", "true or false"]),
    ("set-dropout-proportion proportion=1.5", ["[0, 1]"]),
    ("remove-output-nodes", ["name="]),
    ("reduce-rank name=x rank=0", ["rank=0"]),
    ("reduce-rank name=x rank=two", ["rank='two'", "integer"]),
    ("reduce-rank rank=2", ["name="]),
    ("apply-svd name=x", ["bottleneck-dim", "energy-threshold"]),
    ("apply-svd bottleneck-dim=2", ["name="]),
    ("apply-svd name=x energy-threshold=1.5", ["energy-threshold=1.5"]),
    ("apply-svd name=x bottleneck-dim=2 shrinkage-threshold=2", ["shrinkage-threshold=2"]),
    ("set-learning-rate =3", ["'=3'"]),
])
def test_parse_errors_name_the_line_and_token(text, fragments):
    with pytest.raises(ConfigError) as e:
        parse_edits(text, "e.txt")
    msg = str(e.value)
    assert msg.startswith("e.txt, line ")
    for f in fragments:
        assert f in msg, (f, msg)


def test_a_bad_line_anywhere_changes_nothing():
    nnet = _net()
    before = nnet.to_bytes()
    with pytest.raises(ConfigError, match="line 3"):
        apply_edits(nnet, "remove-orphans\nset-learning-rate learning-rate=2\nbogus\n")
    assert nnet.to_bytes() == before


def test_edits_apply_in_order():
    # renaming first makes the removal match; the other order removes nothing
    nnet = _net()
    apply_edits(nnet, "rename-node old-name=output-xent new-name=aux\n"
                      "remove-output-nodes name=aux")
    assert nnet.output_names() == ["output"]
    nnet = _net()
    apply_edits(nnet, "remove-output-nodes name=aux\n"
                      "rename-node old-name=output-xent new-name=aux")
    assert nnet.output_names() == ["output", "aux"]
