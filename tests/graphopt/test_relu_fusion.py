"""fuse-affine-relu(-map): a linear layer, its ReLU and a positive per-column map as
one runtime kernel (components/fused.py) -- where it fires, where it must not
(and the reason given), equivalence, the Kaldi form written, export and torch."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3 import NetworkOptions
from pynnet3.graphopt.relu_fusion import MAP_PATTERN, RELU_PATTERN, check_chain
from pynnet3.rewrite.graph import NetworkGraph
from pynnet3.rewrite.pattern import Match, match_pattern
from pynnet3.rewrite.rules import RewriteContext
from tests.graphopt.common import (
    assert_equivalent,
    assert_roundtrip,
    build,
    data_for,
    optimize,
    request_for,
    types_of,
)

# TDNN-F's shape: affine -> ReLU -> BatchNorm read by the next layer and by a Sum
# (the NoOp is pruned: th reads the Sum).
TDNNF = """
input-node name=input dim=5
component name=a1 type=AffineComponent input-dim=5 output-dim=8
component-node name=a1 component=a1 input=input
component name=relu1 type=RectifiedLinearComponent dim=8
component-node name=relu1 component=relu1 input=a1
component name=bn1 type=BatchNormComponent dim=8 test-mode=true
component-node name=bn1 component=bn1 input=relu1
component name=lin2 type=TdnnComponent input-dim=8 output-dim=3 time-offsets=-1,0 use-bias=false
component-node name=lin2 component=lin2 input=bn1
component name=a2 type=TdnnComponent input-dim=3 output-dim=8 time-offsets=0,1
component-node name=a2 component=a2 input=lin2
component name=relu2 type=RectifiedLinearComponent dim=8
component-node name=relu2 component=relu2 input=a2
component name=bn2 type=BatchNormComponent dim=8 test-mode=true
component-node name=bn2 component=bn2 input=relu2
component name=noop2 type=NoOpComponent dim=8
component-node name=noop2 component=noop2 input=Sum(Scale(0.66, bn1), bn2)
component name=th type=TanhComponent dim=8
component-node name=th component=th input=noop2
component name=out type=AffineComponent input-dim=8 output-dim=4
component-node name=out component=out input=th
output-node name=output input=out
"""


def _with_bn_stats(nnet, seed: int = 3):
    """Non-trivial test-mode BatchNorm statistics (the config's are the identity)."""
    rng = np.random.default_rng(seed)
    for comp in nnet.components.values():
        if comp.type_name == "BatchNormComponent":
            comp.count = 100.0
            comp.stats_sum = (rng.standard_normal(comp.dim) * 100).astype(np.float64)
            comp.stats_sumsq = ((rng.uniform(0.5, 2.0, comp.dim) + (comp.stats_sum / 100) ** 2)
                                * 100).astype(np.float64)
            comp.set_test_mode(True)
    return nnet


@pytest.fixture(scope="module")
def tdnnf():
    return _with_bn_stats(build(TDNNF))


def test_tdnnf_layers_become_kernels(tdnnf, tmp_path):
    opt, report = optimize(tdnnf)
    rules = report.rules_applied()
    assert rules.get("fuse-affine-relu-map") == 2, rules
    types = types_of(opt)
    # each chain is one node under the map's name; a2 became part of bn2
    assert types["bn1"] == types["bn2"] == "AffineReluComponent"
    for gone in ("a1", "relu1", "a2", "relu2"):
        assert gone not in types
    # bn1 stays for the Sum: folding it into lin2 would save nothing, so it is left
    # to the fusion (and the report says so)
    declined = [d for p in report.passes for d in p.declined]
    assert any("'bn1' stays for 'th'" in d for d in declined), declined
    assert_equivalent(tdnnf, opt, frames=6)
    back = assert_roundtrip(tdnnf, opt, tmp_path)
    assert {"a1", "relu1", "bn1", "a2", "relu2", "bn2"} <= set(types_of(back))
    assert_roundtrip(tdnnf, opt, tmp_path, binary=True)


def test_keep_derivatives_gives_input_derivatives(tdnnf):
    opt, report = optimize(tdnnf, NetworkOptions(keep_derivatives=True))
    assert report.rules_applied().get("fuse-affine-relu-map") == 2
    assert_equivalent(tdnnf, opt, derivatives=True)


def test_relu_alone_is_bit_exact():
    nnet = build("""
input-node name=input dim=4
component name=a type=NaturalGradientAffineComponent input-dim=4 output-dim=6
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=a
component name=t type=TanhComponent dim=6
component-node name=t component=t input=r
output-node name=output input=t
""")
    opt, report = optimize(nnet)
    assert report.rules_applied() == {"fuse-affine-relu": 1}
    assert types_of(opt)["r"] == "AffineReluComponent"
    req = request_for(nnet, deriv=True)
    inputs, derivs = data_for(nnet, req)
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    want = pynnet3.run(nnet, req, dict(inputs), dict(derivs))
    got = pynnet3.run(opt, req, dict(inputs), dict(derivs))
    # scale 1 and floor 0: the same product, bias and max, so the same bits
    np.testing.assert_array_equal(got.outputs["output"], want.outputs["output"])
    np.testing.assert_array_equal(got.input_derivs["input"], want.input_derivs["input"])


def _match(nnet, root, pattern):
    return match_pattern(NetworkGraph(nnet), root, pattern)


def test_not_when_the_relu_has_another_reader():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=6
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=a
component name=s type=FixedScaleComponent dim=6
component-node name=s component=s input=r
output-node name=output input=Append(s, r)
""")
    failure = _match(nnet, "s", MAP_PATTERN)
    assert not failure and "an inner node needs exactly one" in str(failure), failure
    opt, report = optimize(nnet, NetworkOptions(constant_folding=False))
    # the ReLU itself still fuses with its layer (its value is what both read)
    assert report.rules_applied() == {"fuse-affine-relu": 1}
    assert types_of(opt)["s"] == "FixedScaleComponent"
    assert_equivalent(nnet, opt)


def test_not_with_a_negative_scale():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=6
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=a
component name=s type=FixedScaleComponent dim=6
component-node name=s component=s input=r
component name=t type=TanhComponent dim=6
component-node name=t component=t input=s
output-node name=output input=t
""", randomize=False)
    nnet.components["s"].scales = np.array([1, 2, -1, 3, 1, 1], np.float32)
    m = _match(nnet, "s", MAP_PATTERN)
    assert isinstance(m, Match)
    reason = check_chain(m, RewriteContext(nnet))
    assert reason is not None and "scales <= 0" in reason
    opt, report = optimize(nnet)
    assert "AffineReluComponent" in types_of(opt).values()  # layer + ReLU only
    assert types_of(opt)["s"] == "FixedScaleComponent"
    assert_equivalent(nnet, opt)


def test_not_with_batchnorm_in_training_mode():
    nnet = _with_bn_stats(build(TDNNF))
    nnet.components["bn2"].set_test_mode(False)
    m = _match(nnet, "bn2", MAP_PATTERN)
    assert isinstance(m, Match)
    reason = check_chain(m, RewriteContext(nnet))
    assert reason is not None and "not a fixed elementwise map" in reason


def test_spliced_affine_becomes_tdnn_first():
    nnet = build("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=12 output-dim=6
component-node name=a component=a input=Append(Offset(input, -1), input, Offset(input, 1))
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=a
output-node name=output input=r
""")
    m = _match(nnet, "r", RELU_PATTERN)
    assert isinstance(m, Match)
    reason = check_chain(m, RewriteContext(nnet))
    assert reason is not None and "fuse-spliced-affine-as-tdnn goes first" in reason
    opt, report = optimize(nnet)
    assert report.rules_applied() == {"fuse-spliced-affine-as-tdnn": 1, "fuse-affine-relu": 1}
    assert opt.components[opt.node("r").component].linear.type_name == "TdnnComponent"
    assert_equivalent(nnet, opt)


def test_fusion_off_leaves_the_chain(tdnnf):
    opt, report = optimize(tdnnf, NetworkOptions(fusion=False))
    assert "AffineReluComponent" not in types_of(opt).values()
    assert_equivalent(tdnnf, opt)


def test_fused_network_on_torch_equals_numpy(tdnnf):
    pytest.importorskip("torch")
    opt, _ = optimize(tdnnf)
    req = request_for(tdnnf, deriv=True)
    inputs, derivs = data_for(tdnnf, req)
    want = pynnet3.run(opt, req, dict(inputs), dict(derivs), dtype=np.float64)
    got = pynnet3.run(opt, req, dict(inputs), dict(derivs), dtype=np.float64, backend="torch")
    for name, v in want.outputs.items():
        np.testing.assert_allclose(got.outputs[name].numpy(), v, rtol=1e-10, atol=1e-12)
    for name, v in want.input_derivs.items():
        np.testing.assert_allclose(got.input_derivs[name].numpy(), v, rtol=1e-10, atol=1e-12)


def test_fused_network_exports(tdnnf):
    torch = pytest.importorskip("torch")
    from pynnet3.export import to_torch
    from tests.export.common import max_rel, random_inputs, reference_outputs

    opt, _ = optimize(tdnnf)
    module = to_torch(opt, frames=4)
    inputs = random_inputs(module, 2)
    with torch.no_grad():
        got = module(*[torch.from_numpy(inputs[n]) for n in module.input_names])
    want = reference_outputs(tdnnf, module, inputs)  # the unoptimized network's
    assert max_rel(got["output"].numpy(), want["output"]) < 1e-5


def test_fused_kernel_trains_as_its_linear_layer(tdnnf, tmp_path):
    """A network-optimized copy can be trained: the kernel's gradient is that of its
    (scaled) linear layer, its settings are the layer's, and once its parameters
    change the file holds layer (bias b' - o) + ReLU + FixedBias o, which computes
    the same and gives the same gradient."""
    opt, _ = optimize(tdnnf)
    fused_name = opt.node("bn2").component
    fused = opt.components[fused_name]
    assert fused.is_updatable() and fused.params()["linear_params"] is \
        fused.linear.linear_params
    fused.learning_rate = 0.25  # (written through to the layer)
    assert fused.linear.learning_rate == 0.25
    req = request_for(tdnnf, deriv=True)
    req.need_model_derivative = True
    inputs, derivs = data_for(tdnnf, req)
    got = pynnet3.run(opt, req, dict(inputs), dict(derivs), dtype=np.float64)
    g = got.gradients[fused_name]["linear_params"]
    assert np.abs(g).max() > 0
    # unchanged parameters: the original chain is written
    opt.write(tmp_path / "same.txt")
    assert "BatchNormComponent" in types_of(pynnet3.read_nnet(tmp_path / "same.txt")).values()
    # "train": the file then holds the standard form of the new parameters
    for p in (fused.linear.linear_params, fused.linear.bias_params):
        p += np.float32(0.05)
    opt.write(tmp_path / "trained.txt")
    back = pynnet3.read_nnet(tmp_path / "trained.txt")
    types = types_of(back)
    assert types["bn2"] == "FixedBiasComponent" and types["relu2"] == "RectifiedLinearComponent"
    assert_equivalent(opt, back, derivatives=True)
    want = pynnet3.run(back, req, dict(inputs), dict(derivs), dtype=np.float64)
    a2 = back.node("a2").component
    after = pynnet3.run(opt, req, dict(inputs), dict(derivs), dtype=np.float64)
    # (the file's bias b' - o is rounded to float32: differences of that order)
    np.testing.assert_allclose(after.gradients[fused_name]["linear_params"],
                               want.gradients[a2]["linear_params"], rtol=1e-4, atol=1e-9)
