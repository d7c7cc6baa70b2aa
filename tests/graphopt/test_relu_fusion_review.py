"""Review of the fused AffineRelu kernel (components/fused.py, graphopt/relu_fusion.py):
cases the first tests did not cover -- a layer shared by two nodes, a Linear or a
bias-free Tdnn inner layer, block-dim maps, copies, the persistent compile cache and
training a network-optimized copy. Expected values come from the unoptimized network
or from the standard chain read back from a file."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler
from tests.graphopt.common import (
    assert_equivalent,
    assert_roundtrip,
    build,
    data_for,
    optimize,
    request_for,
    types_of,
)
from tests.graphopt.test_relu_fusion import TDNNF

# One affine layer and one ReLU component used by two nodes each (weight tying), each
# chain then through one shared test-mode BatchNorm.
SHARED = """
input-node name=input dim=5
component name=a type=AffineComponent input-dim=5 output-dim=6
component-node name=a1 component=a input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r1 component=r input=a1
component name=bn type=BatchNormComponent dim=6 test-mode=true
component-node name=bn1 component=bn input=r1
component-node name=a2 component=a input=Offset(input, 1)
component-node name=r2 component=r input=a2
component-node name=bn2 component=bn input=r2
component name=t type=TanhComponent dim=12
component-node name=t component=t input=Append(bn1, bn2)
output-node name=output input=t
"""

LINEAR_BLOCK_BN = """
input-node name=input dim=5
component name=l type=LinearComponent input-dim=5 output-dim=6
component-node name=l component=l input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=l
component name=bn type=BatchNormComponent dim=6 block-dim=3 test-mode=true
component-node name=bn component=bn input=r
component name=t type=TanhComponent dim=6
component-node name=t component=t input=bn
output-node name=output input=t
"""

TDNN_NO_BIAS = """
input-node name=input dim=5
component name=l type=TdnnComponent input-dim=5 output-dim=6 time-offsets=-1,0,1 use-bias=false
component-node name=l component=l input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=l
component name=s type=ScaleAndOffsetComponent dim=6 block-dim=2
component-node name=s component=s input=r
component name=t type=TanhComponent dim=6
component-node name=t component=t input=s
output-node name=output input=t
"""


def _prepared(config: str, seed: int = 3) -> pynnet3.Nnet:
    """``config`` with non-trivial test-mode BatchNorm statistics (block-dim sized)
    and positive per-element scales (so every map fuses)."""
    nnet = build(config)
    rng = np.random.default_rng(seed)
    for comp in nnet.components.values():
        if comp.type_name == "BatchNormComponent":
            d = comp.block_dim
            comp.count = 100.0
            comp.stats_sum = rng.standard_normal(d) * 100
            comp.stats_sumsq = (rng.uniform(0.5, 2.0, d) + (comp.stats_sum / 100) ** 2) * 100
            comp.set_test_mode(True)
        if comp.type_name == "ScaleAndOffsetComponent":
            comp.scales = np.abs(comp.scales)
    return nnet


def _fused(nnet) -> dict:
    return {name: c for name, c in nnet.components.items()
            if c.type_name == "AffineReluComponent"}


def _train_a_little(opt) -> None:
    """A parameter change as a trainer makes it (in place)."""
    for comp in _fused(opt).values():
        comp.linear.linear_params += np.float32(0.02)
        comp.linear.bias_params -= np.float32(0.01)


@pytest.mark.parametrize("binary", [False, True])
def test_trained_shared_kernel_is_written_as_one_layer(tmp_path, binary):
    """Two nodes sharing a fused kernel (a tied layer): once its parameters change,
    the file holds one layer and one offset for both, not a copy per node (which
    untied the weights and doubled the layer)."""
    nnet = _prepared(SHARED)
    opt, report = optimize(nnet)
    assert report.rules_applied().get("fuse-affine-relu-map") == 2
    assert len(_fused(opt)) == 1  # one kernel, used by bn1 and bn2
    assert_roundtrip(nnet, opt, tmp_path, binary=binary)
    _train_a_little(opt)
    path = tmp_path / "trained.mdl"
    opt.write(path, binary=binary)
    back = pynnet3.read_nnet(path)
    assert sorted(back.components) == ["a", "bn.offset", "r", "t"], sorted(back.components)
    types = types_of(back)
    assert types["bn1"] == types["bn2"] == "FixedBiasComponent"
    assert_equivalent(opt, back, derivatives=True)


def test_written_trained_form_does_not_follow_later_training(tmp_path):
    """The standard form handed out for a file is a snapshot: training the kernel
    further changes the next file, not the parts already handed out."""
    opt, _ = optimize(_prepared(TDNNF))
    _train_a_little(opt)
    first = {name: c for name, c in opt.to_model_parts().components}
    before = first["a1"].linear_params.copy()
    _train_a_little(opt)
    np.testing.assert_array_equal(first["a1"].linear_params, before)
    second = {name: c for name, c in opt.to_model_parts().components}
    assert not np.array_equal(second["a1"].linear_params, before)


@pytest.mark.parametrize("config", [LINEAR_BLOCK_BN, TDNN_NO_BIAS], ids=["linear", "tdnn"])
def test_linear_and_bias_free_tdnn_inner_layers(tmp_path, config):
    """A Linear (which becomes an Affine when it gains the bias) and a bias-free Tdnn
    under a block-dim map: equivalent, with input derivatives, read back from text and
    binary files untrained and trained."""
    nnet = _prepared(config)
    opt, report = optimize(nnet)
    assert report.rules_applied().get("fuse-affine-relu-map") == 1
    assert_equivalent(nnet, opt)
    kd, _ = optimize(nnet, pynnet3.NetworkOptions(keep_derivatives=True))
    assert_equivalent(nnet, kd, derivatives=True)
    for binary in (False, True):
        assert_roundtrip(nnet, opt, tmp_path, binary=binary)
    _train_a_little(opt)
    for binary in (False, True):
        path = tmp_path / f"trained{int(binary)}.mdl"
        opt.write(path, binary=binary)
        assert_equivalent(opt, pynnet3.read_nnet(path), derivatives=True)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_of_a_fused_network_are_independent(how):
    nnet = _prepared(TDNNF)
    opt, _ = optimize(nnet)
    dup = copy.deepcopy(opt) if how == "deepcopy" else pickle.loads(pickle.dumps(opt))
    assert_equivalent(nnet, dup)
    name = next(iter(_fused(opt)))
    dup.components[name].learning_rate = 0.125  # (written through to its layer)
    assert dup.components[name].linear.learning_rate == 0.125
    assert opt.components[name].linear.learning_rate != 0.125
    dup.components[name].linear.linear_params += np.float32(1.0)
    assert_equivalent(nnet, opt)


def test_persistent_cache_of_a_network_optimized_compiler(tmp_path):
    nnet = _prepared(TDNNF)
    req = request_for(nnet, deriv=True)
    inputs, derivs = data_for(nnet, req)
    cc = CachingCompiler(nnet, network_optimize=True)
    want = pynnet3.run(cc.compiled_nnet, cc.compile(req), dict(inputs), dict(derivs))
    cc.save(tmp_path / "cache")
    again = CachingCompiler(nnet.copy(), network_optimize=True)
    assert again.load(tmp_path / "cache") == len(cc)
    got = pynnet3.run(again.compiled_nnet, again.compile(req), dict(inputs), dict(derivs))
    np.testing.assert_array_equal(got.outputs["output"], want.outputs["output"])


def _train_setup(nnet):
    req = request_for(nnet)
    inputs, _ = data_for(nnet, req)
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    rows = len(req.outputs[0].indexes)
    sup = {"output": np.random.default_rng(5).standard_normal((rows, 4)).astype(np.float32)}
    return req, inputs, sup


def test_trainer_with_a_network_optimized_compiler():
    from pynnet3.train.options import TrainerOptions
    from pynnet3.train.trainer import Trainer

    nnet = _prepared(TDNNF)
    req, inputs, sup = _train_setup(nnet)
    # (it used to run the optimized computation on the original components and crash
    # deep inside; now it is refused up front, saying what to do instead)
    cc = CachingCompiler(nnet, network_optimize=True)
    with pytest.raises(pynnet3.errors.RuntimeInputError, match="network-optimized"):
        Trainer(nnet, TrainerOptions(learning_rate=0.01), compiler=cc)
    opt = cc.compiled_nnet  # the optimized copy trains with a compiler of its own
    Trainer(opt, TrainerOptions(learning_rate=0.01)).train_step(req, inputs, sup)


def test_fused_natural_gradient_layer_keeps_its_preconditioners():
    from pynnet3.train.preconditioners import make_preconditioners

    nnet = _prepared(TDNNF.replace("name=a1 type=AffineComponent",
                                   "name=a1 type=NaturalGradientAffineComponent"))
    opt, _ = optimize(nnet)
    for name, comp in _fused(opt).items():
        assert make_preconditioners(comp.linear) is not None, name
        assert make_preconditioners(comp) is not None, name


SELF_REPAIR = """
input-node name=input dim=5
component name=a type=AffineComponent input-dim=5 output-dim=6
component-node name=a component=a input=input
component name=r type=RectifiedLinearComponent dim=6 self-repair-scale=0.1
component-node name=r component=r input=a
component name=bn type=BatchNormComponent dim=6 block-dim=3 test-mode=true
component-node name=bn component=bn input=r
component name=o type=TanhComponent dim=6
component-node name=o component=o input=bn
output-node name=output input=o
"""


@pytest.mark.parametrize("with_map", [False, True], ids=["relu", "relu+batchnorm"])
def test_training_backprop_keeps_the_relus_self_repair_and_stats(with_map):
    """A training backprop (model derivative, stats stored) through the kernel does
    what the ReLU does in the unfused network: its self-repair term (here on the
    dimensions whose derivative average is below 0.05 or above 0.95) and its value,
    derivative and output-derivative statistics, stored in the ReLU the file holds.
    (The kernel dropped both: input derivatives and gradients differed by ~0.06.)"""
    config = SELF_REPAIR if with_map else SELF_REPAIR.replace(
        "component-node name=bn component=bn input=r", "").replace("input=bn", "input=r")
    nnet = _prepared(config)
    relu = nnet.components["r"]
    relu.count = 100.0
    relu.value_sum = np.full(6, 10.0)
    relu.deriv_sum = np.array([1.0, 99.0, 50.0, 2.0, 98.0, 50.0])
    opt, report = optimize(nnet)
    assert report.rules_applied() == ({"fuse-affine-relu-map": 1} if with_map
                                      else {"fuse-affine-relu": 1})
    name = opt.node("bn" if with_map else "r").component
    req = request_for(nnet, deriv=True)
    req.need_model_derivative = True
    req.store_component_stats = True
    inputs, derivs = data_for(nnet, req)
    want = pynnet3.run(nnet, req, dict(inputs), dict(derivs), dtype=np.float64)
    got = pynnet3.run(opt, req, dict(inputs), dict(derivs), dtype=np.float64)
    # the gradient of the scaled weights W' = s W is dL/dW / s (rows)
    s = np.tile(nnet.components["bn"].test_transform()[0].astype(np.float64), 2) \
        if with_map else np.ones(6)
    g_want = want.gradients["a"]["linear_params"] / s[:, None]
    g_got = got.gradients[name]["linear_params"]
    tol = 1e-6 if with_map else 0.0  # (the map's scale folded in float32)
    np.testing.assert_allclose(got.input_derivs["input"], want.input_derivs["input"],
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(g_got, g_want, rtol=tol, atol=tol)
    mine = opt.components[name].unfused[1].component
    assert mine.type_name == "RectifiedLinearComponent"
    assert mine.count == relu.count == 100.0 + len(req.outputs[0].indexes)
    for stat in ("value_sum", "deriv_sum", "oderiv_sumsq"):
        np.testing.assert_allclose(getattr(mine, stat), getattr(relu, stat), rtol=1e-6,
                                   err_msg=stat)
    assert mine.num_dims_self_repaired == relu.num_dims_self_repaired > 0


@pytest.mark.parametrize("binary", [False, True])
def test_settings_changed_through_the_kernel_are_written(tmp_path, binary):
    """Nnet.set_learning_rate (and any setting written through the kernel) on a
    network-optimized copy reaches the file also while the parameters are as fused
    (the original chain was written with the layer's old learning rate)."""
    opt, _ = optimize(_prepared(TDNNF))
    opt.set_learning_rate(0.5)
    name = opt.node("bn1").component
    opt.components[name].max_change = 0.75
    path = tmp_path / "lr.mdl"
    opt.write(path, binary=binary)
    back = pynnet3.read_nnet(path)
    assert types_of(back)["bn1"] == "BatchNormComponent"  # (still the original chain)
    for layer in ("a1", "a2", "lin2", "out"):
        assert back.components[layer].learning_rate == pytest.approx(0.5), layer
    assert back.components["a1"].max_change == pytest.approx(0.75)
    assert back.components["a2"].max_change != pytest.approx(0.75)
    # the file's chain is the original one otherwise: the same parameters
    np.testing.assert_allclose(back.components["a1"].linear_params,
                               opt.components[name].unfused[0].component.linear_params,
                               rtol=1e-6)  # (text: Kaldi's printed precision)
    assert opt.components[name].unfused[0].component is not \
        opt.components[name].linear  # (the unscaled layer, not the kernel's)


def test_fold_not_declined_when_the_fusion_is_off():
    nnet = _prepared(TDNNF)
    opt, report = optimize(nnet, pynnet3.NetworkOptions(fusion=False))
    assert report.rules_applied().get("fold-batchnorm-into-next-linear") == 1
    assert_equivalent(nnet, opt)


def test_training_backprop_on_torch_equals_numpy():
    """The ReLU's self-repair and statistics through the kernel on the torch backend
    (a map's scale as a tensor of the run's dtype) as on NumPy."""
    pytest.importorskip("torch")
    results = []
    for backend in ("numpy", "torch"):
        nnet = _prepared(SELF_REPAIR)
        relu = nnet.components["r"]
        relu.count = 100.0
        relu.value_sum = np.full(6, 10.0)
        relu.deriv_sum = np.array([1.0, 99.0, 50.0, 2.0, 98.0, 50.0])
        opt, _ = optimize(nnet)
        req = request_for(nnet, deriv=True)
        req.need_model_derivative = True
        req.store_component_stats = True
        inputs, derivs = data_for(nnet, req)
        got = pynnet3.run(opt, req, dict(inputs), dict(derivs), dtype=np.float64,
                          backend=backend)
        name = opt.node("bn").component
        mine = opt.components[name].unfused[1].component
        results.append((np.asarray(got.input_derivs["input"]),
                        np.asarray(got.gradients[name]["linear_params"]),
                        mine.count, np.array(mine.value_sum), np.array(mine.oderiv_sumsq)))
    (d0, g0, c0, v0, o0), (d1, g1, c1, v1, o1) = results
    np.testing.assert_allclose(d1, d0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g1, g0, rtol=1e-10, atol=1e-12)
    assert c0 == c1
    np.testing.assert_allclose(v1, v0, rtol=1e-10)
    np.testing.assert_allclose(o1, o0, rtol=1e-10)


STRUCTURE_FROM_VALUES = """
input-node name=input dim=5
component name=a type=AffineComponent input-dim=5 output-dim=6
component-node name=a component=a input=input
component name=t type=TanhComponent dim=6
component-node name=t component=t input=a
component name=s type=FixedScaleComponent dim=6
component-node name=s component=s input=t
output-node name=output input=s
"""


def test_persistent_cache_of_another_optimized_structure_is_not_used(tmp_path):
    unit = build(STRUCTURE_FROM_VALUES, randomize=False)
    unit.components["s"].scales = np.ones(6, np.float32)
    double = build(STRUCTURE_FROM_VALUES, randomize=False)
    double.components["s"].scales = np.full(6, 2.0, np.float32)
    req = request_for(unit)
    inputs, _ = data_for(unit, req)
    saved = CachingCompiler(unit, network_optimize=True)
    saved.compile(req)
    saved.save(tmp_path / "cache")
    cc = CachingCompiler(double, network_optimize=True)
    with pytest.warns(UserWarning):  # (skipped: made for another network)
        cc.load(tmp_path / "cache")
    got = pynnet3.run(cc.compiled_nnet, cc.compile(req), dict(inputs))
    want = pynnet3.run(double, req, dict(inputs))
    np.testing.assert_allclose(got.outputs["output"], want.outputs["output"], rtol=1e-5)


def _trained_pair(store: bool, steps: int = 2):
    """(unfused network, its fused copy), each after ``steps`` trainer steps on the
    same minibatch, the ReLU self-repairing from its stats."""
    from pynnet3.train.options import TrainerOptions
    from pynnet3.train.trainer import Trainer

    config = SELF_REPAIR.replace("component-node name=bn component=bn input=r", "") \
        .replace("component name=o type=TanhComponent dim=6",
                 "component name=o type=AffineComponent input-dim=6 output-dim=4") \
        .replace("input=bn", "input=r")
    nnet = _prepared(config)
    relu = nnet.components["r"]
    relu.count = 100.0
    relu.value_sum = np.full(6, 10.0)
    relu.deriv_sum = np.array([1.0, 99.0, 50.0, 2.0, 98.0, 50.0])
    opt, _ = optimize(nnet)
    req, inputs, sup = _train_setup(nnet)
    opts = dict(learning_rate=0.01, store_component_stats=store, zero_component_stats=False)
    plain = Trainer(nnet, TrainerOptions(**opts))
    fused = Trainer(opt, TrainerOptions(**opts))
    for _ in range(steps):
        plain.train_step(req, inputs, sup)
        fused.train_step(req, inputs, sup)
    return nnet, opt


def test_trainer_on_a_fused_copy_equals_the_unfused_network():
    """No statistics stored: the ReLU self-repairs from the model's stats in both,
    and the fused copy's layer (ReLU alone: unscaled) trains exactly as the
    unfused layer (it did not self-repair before the review's fix)."""
    nnet, opt = _trained_pair(store=False)
    layer = opt.components[opt.node("r").component].linear
    np.testing.assert_array_equal(layer.linear_params, nnet.components["a"].linear_params)
    np.testing.assert_array_equal(layer.bias_params, nnet.components["a"].bias_params)


def test_trainer_on_a_fused_copy_equals_the_unfused_network_with_stored_stats():
    nnet, opt = _trained_pair(store=True)
    name = opt.node("r").component
    np.testing.assert_allclose(opt.components[name].linear.linear_params,
                               nnet.components["a"].linear_params, rtol=1e-6, atol=1e-7)


def test_network_optimized_run_sees_parameters_changed_in_place():
    nnet = _prepared(TDNNF)
    req = request_for(nnet)
    inputs, _ = data_for(nnet, req)
    pynnet3.run(nnet, req, dict(inputs), network_optimize=True)
    nnet.components["out"].bias_params += np.float32(5.0)  # in place, as a trainer does
    from pynnet3.cache import cache_for

    cache_for(nnet, True).clear()
    want = pynnet3.run(nnet, req, dict(inputs)).outputs["output"]
    got = pynnet3.run(nnet, req, dict(inputs), network_optimize=True).outputs["output"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_settings_of_a_layer_also_used_unfused_stay_one_layer(tmp_path):
    """A layer the kernel fused and another node still uses as it is: after
    set_learning_rate the file holds it once (with the new rate), not a retuned copy
    beside it."""
    nnet = _prepared("""
input-node name=input dim=5
component name=a type=AffineComponent input-dim=5 output-dim=6
component-node name=a1 component=a input=input
component name=r type=RectifiedLinearComponent dim=6
component-node name=r1 component=r input=a1
component-node name=a2 component=a input=Offset(input, 1)
component name=t type=TanhComponent dim=12
component-node name=t component=t input=Append(r1, a2)
output-node name=output input=t
""")
    opt, report = optimize(nnet)
    assert report.rules_applied() == {"fuse-affine-relu": 1}
    assert types_of(opt)["a2"] == "AffineComponent"
    opt.set_learning_rate(0.5)
    opt.write(tmp_path / "lr.txt")
    back = pynnet3.read_nnet(tmp_path / "lr.txt")
    assert sorted(back.components) == ["a", "r", "t"]
    assert back.components["a"].learning_rate == pytest.approx(0.5)
    assert_equivalent(nnet, back)


def test_a_fixed_layer_stays_fixed_in_a_network_optimized_copy():
    nnet = build("""
input-node name=input dim=4
component name=lda type=FixedAffineComponent input-dim=12 output-dim=6
component-node name=lda component=lda input=Append(Offset(input, -1), input, Offset(input, 1))
component name=r type=RectifiedLinearComponent dim=6
component-node name=r component=r input=lda
component name=t type=TanhComponent dim=6
component-node name=t component=t input=r
output-node name=output input=t
""")
    assert not any(c.is_updatable() for c in nnet.components.values())
    opt, _ = optimize(nnet)
    opt.set_learning_rate(0.01)
    for name, comp in opt.components.items():
        assert not comp.is_updatable() or comp.learning_rate == 0.0, name
