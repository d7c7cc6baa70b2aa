"""Trainer / TrainerOptions: options, Nnet's mode and learning-rate setters, the
update rules (momentum, L2, max-change, orthonormal constraint, BatchNorm stats,
backstitch) against the formulas written out here, objectives, errors, and a small
end-to-end training whose objective must improve."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3 import ComputationRequest, Nnet
from pynnet3.errors import ConfigError, RuntimeInputError
from pynnet3.train import Trainer, TrainerOptions
from pynnet3.train.update import constrain_orthonormal_matrix

PLAIN = {"max-param-change": 0.0, "zero-component-stats": False,
         "store-component-stats": False}


def _net(text: str, seed: int = 1) -> Nnet:
    return Nnet.from_config(text, seed=seed)


AFFINE = """input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=4 learning-rate=0.1
component-node name=a component=a input=input
output-node name=output input=a objective={obj}
"""


def _batch(nnet, seqs=3, frames=5, seed=0, out_dim=None):
    req = ComputationRequest.from_frames(range(frames), range(frames), seqs)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((seqs * frames, nnet.input_dim("input"))).astype(np.float32)
    y = rng.standard_normal((seqs * frames, out_dim or nnet.output_dim("output")))
    return req, x, y.astype(np.float32)


# -- options ---------------------------------------------------------------------------

def test_from_flags_takes_nnet3_train_names():
    o = TrainerOptions.from_flags({"max-param-change": "1.5", "momentum": 0.5,
                                   "l2-regularize-factor": 0.25, "batchnorm-stats-scale": 0.9,
                                   "store-component-stats": "false", "--zero-component-stats":
                                   "true", "print-interval": "10", "srand": 3,
                                   "backstitch-training-interval": 2,
                                   "optimization.max-deriv-time": 5, "read-cache": "x"})
    assert (o.max_param_change, o.momentum, o.l2_regularize_factor) == (1.5, 0.5, 0.25)
    assert (o.batchnorm_stats_scale, o.store_component_stats, o.zero_component_stats) == (
        0.9, False, True)
    assert (o.print_interval, o.srand, o.backstitch_training_interval) == (10, 3, 2)
    # nnet3-train's program flags that do not change a step are accepted and ignored
    TrainerOptions.from_flags({"binary": "false", "verbose": 2, "use-gpu": "no"})
    d = TrainerOptions()  # Kaldi's defaults
    assert (d.max_param_change, d.momentum, d.batchnorm_stats_scale, d.zero_component_stats,
            d.store_component_stats, d.print_interval) == (2.0, 0.0, 0.8, True, True, 100)


@pytest.mark.parametrize("flags,match", [
    ({"max-param-chnage": 2.0}, "unknown trainer option --max-param-chnage"),
    ({"momentum": "fast"}, "--momentum: bad float"),
    ({"store-component-stats": "maybe"}, "--store-component-stats"),
    ({"momentum": -0.1}, "momentum must be >= 0"),
    ({"batchnorm-stats-scale": 1.5}, "batchnorm-stats-scale"),
    ({"backstitch-training-scale": 0.3, "momentum": 0.5}, "backstitch"),
    ({"print-interval": 2.5}, "--print-interval"),
])
def test_from_flags_refuses_bad_values(flags, match):
    with pytest.raises(ConfigError, match=match):
        TrainerOptions.from_flags(flags)


# -- Nnet setters ------------------------------------------------------------------------

def test_set_learning_rate_and_test_modes():
    nnet = _net("""input-node name=input dim=4
component name=a type=NaturalGradientAffineComponent input-dim=4 output-dim=4 \
learning-rate-factor=0.5
component name=b type=LinearComponent input-dim=4 output-dim=4
component name=bn type=BatchNormComponent dim=4
component name=d type=DropoutComponent dim=4 dropout-proportion=0.5
component-node name=a component=a input=input
component-node name=b component=b input=a
component-node name=bn component=bn input=b
component-node name=d component=d input=bn
output-node name=output input=d
""")
    nnet.set_learning_rate(0.01)
    assert nnet.components["a"].learning_rate == pytest.approx(0.005)
    assert nnet.components["a"].learning_rate == float(np.float32(0.01) * np.float32(0.5))
    assert nnet.components["b"].learning_rate == pytest.approx(0.01)
    nnet.set_batchnorm_test_mode(True)
    assert nnet.components["bn"].test_mode and not nnet.components["d"].test_mode
    nnet.set_dropout_test_mode(True)
    assert nnet.components["d"].test_mode
    nnet.set_batchnorm_test_mode(False)
    assert not nnet.components["bn"].test_mode and nnet.components["d"].test_mode


def test_learning_rate_option_sets_the_network_rate():
    """``learning-rate`` (as the kaldi-reference options files give it) is
    SetLearningRate on the network when the trainer starts."""
    nnet = _net(AFFINE.format(obj="linear").replace(
        "learning-rate=0.1", "learning-rate=0.1 learning-rate-factor=0.5"))
    Trainer(nnet, TrainerOptions.from_flags({**PLAIN, "learning-rate": "0.01"}))
    assert nnet.components["a"].learning_rate == pytest.approx(0.005)
    with pytest.raises(ConfigError, match="learning-rate"):
        TrainerOptions.from_flags({"learning-rate": -1})


# -- update rules ----------------------------------------------------------------------

def test_plain_sgd_step_and_objectives():
    for obj in ("linear", "quadratic"):
        nnet = _net(AFFINE.format(obj=obj))
        req, x, y = _batch(nnet)
        w0 = nnet.components["a"].linear_params.astype(np.float64).copy()
        b0 = nnet.components["a"].bias_params.astype(np.float64).copy()
        stats = Trainer(nnet, TrainerOptions.from_flags(PLAIN)).train_step(
            req, inputs={"input": x}, supervision={"output": y})
        out = x.astype(np.float64) @ w0.T + b0
        if obj == "linear":
            deriv, objf, weight = y, np.sum(y * out), y.sum(dtype=np.float64)
        else:
            deriv, objf, weight = y - out, -0.5 * np.sum((y - out) ** 2), len(y)
        # (float32 outputs; the linear objective's sum cancels, so bound by sum |terms|)
        assert abs(stats.objective - objf) <= 1e-5 * np.sum(np.abs(deriv * out)) + 1e-5 * abs(
            objf)
        assert stats.weight == pytest.approx(weight, rel=1e-6)
        np.testing.assert_allclose(nnet.components["a"].linear_params,
                                   w0 + 0.1 * deriv.T @ x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(nnet.components["a"].bias_params,
                                   b0 + 0.1 * deriv.sum(0), rtol=1e-5, atol=1e-6)


def test_momentum_carries_the_delta():
    """delta_t = momentum * delta_{t-1} + lr * g_t; params += (1 - momentum) * delta_t."""
    m = 0.75
    nnet = _net(AFFINE.format(obj="linear"))
    trainer = Trainer(nnet, TrainerOptions.from_flags({**PLAIN, "momentum": m}))
    delta = np.zeros((4, 6))
    for seed in range(3):
        req, x, y = _batch(nnet, seed=seed)
        w0 = nnet.components["a"].linear_params.astype(np.float64).copy()
        trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
        delta = m * delta + 0.1 * y.T.astype(np.float64) @ x
        np.testing.assert_allclose(nnet.components["a"].linear_params, w0 + (1 - m) * delta,
                                   rtol=1e-5, atol=1e-6)


def test_l2_regularization():
    """delta += -2 * (num sequences * l2-regularize-factor) * lr * l2 * params."""
    nnet = _net(AFFINE.format(obj="linear").replace("learning-rate=0.1",
                                                    "learning-rate=0.1 l2-regularize=0.2"))
    req, x, y = _batch(nnet, seqs=3)
    w0 = nnet.components["a"].linear_params.astype(np.float64).copy()
    Trainer(nnet, TrainerOptions.from_flags({**PLAIN, "l2-regularize-factor": 0.5})).train_step(
        req, inputs={"input": x}, supervision={"output": y})
    expected = w0 + 0.1 * y.T @ x - 2 * (3 * 0.5) * 0.1 * 0.2 * w0
    np.testing.assert_allclose(nnet.components["a"].linear_params, expected, rtol=1e-5,
                               atol=1e-6)


def test_max_change_per_component_then_global():
    text = """input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=6 learning-rate=1 max-change=0.5
component name=b type=AffineComponent input-dim=6 output-dim=4 learning-rate=1 max-change=0
component-node name=a component=a input=input
component-node name=b component=b input=a
output-node name=output input=b
"""
    nnet = _net(text)
    req, x, y = _batch(nnet)
    ref = nnet.copy()
    ref.components["a"].max_change = 0.0
    # the plain deltas, from a step without any max-change
    Trainer(ref, TrainerOptions.from_flags(PLAIN)).train_step(
        req, inputs={"input": x}, supervision={"output": y})
    before = {n: {k: v.astype(np.float64).copy() for k, v in c.params().items()}
              for n, c in nnet.components.items()}
    delta = {n: {k: ref.components[n].params()[k] - v for k, v in p.items()}
             for n, p in before.items()}
    norms = {n: np.sqrt(sum(np.sum(v ** 2) for v in d.values())) for n, d in delta.items()}
    assert norms["a"] > 0.5  # the per-component limit bites
    fa = 0.5 / norms["a"]
    total = np.sqrt((fa * norms["a"]) ** 2 + norms["b"] ** 2)
    limit = 0.4 * total  # and the global one too
    stats = Trainer(nnet, TrainerOptions.from_flags({**PLAIN, "max-param-change": limit})
                    ).train_step(req, inputs={"input": x}, supervision={"output": y})
    assert stats.max_change_scales["a"] == pytest.approx(fa, rel=1e-5)
    assert stats.max_change_scales["b"] == 1.0
    assert stats.global_scale == pytest.approx(limit / total, rel=1e-5)
    for n, f in (("a", fa * limit / total), ("b", limit / total)):
        for k, v in before[n].items():
            np.testing.assert_allclose(nnet.components[n].params()[k], v + f * delta[n][k],
                                       rtol=1e-4, atol=1e-6)
    assert stats.message.startswith("Per-component max-change active on 1 / 2 Updatable "
                                    "Components. (Smallest factor=")
    assert "Global max-change factor was" in stats.message


def test_constrain_orthonormal_matrix_converges():
    rng = np.random.default_rng(0)
    for scale in (1.0, 2.0, -1.0):
        m = (rng.standard_normal((8, 20)) / np.sqrt(20) * 0.9 + np.eye(8, 20)).astype(np.float32)
        for _ in range(30):
            constrain_orthonormal_matrix(m, scale)
        p = m.astype(np.float64) @ m.T
        s2 = scale ** 2 if scale > 0 else np.trace(p) / 8
        np.testing.assert_allclose(p, s2 * np.eye(8), atol=1e-4 * s2)
    # a tall matrix is constrained through its transpose (orthonormal columns)
    m = (0.1 * rng.standard_normal((20, 8)) / np.sqrt(8)).astype(np.float32) + np.eye(
        20, 8, dtype=np.float32)
    one = m.copy()
    constrain_orthonormal_matrix(one, 1.0)
    p = m.T.astype(np.float64) @ m
    expected = m.T - 4 * 0.125 * (p - np.eye(8)) @ m.T
    np.testing.assert_allclose(one, expected.T, rtol=1e-5, atol=1e-6)
    for _ in range(30):
        constrain_orthonormal_matrix(m, 1.0)
    np.testing.assert_allclose(m.T.astype(np.float64) @ m, np.eye(8), atol=1e-4)


ORTHO = """input-node name=input dim=10
component name=l1 type=LinearComponent input-dim=10 output-dim=5 \
orthonormal-constraint=1.0 learning-rate=0
component name=l2 type=TdnnComponent input-dim=5 output-dim=4 time-offsets=0 \
orthonormal-constraint=-1 learning-rate=0
component name=l3 type=NaturalGradientAffineComponent input-dim=4 output-dim=3 learning-rate=0
component-node name=l1 component=l1 input=input
component-node name=l2 component=l2 input=l1
component-node name=l3 component=l3 input=l2
output-node name=output input=l3
"""


def test_orthonormal_constraint_random_and_fixed():
    nnet = _net(ORTHO)
    req, x, y = _batch(nnet)
    trainer = Trainer(nnet, TrainerOptions.from_flags({**PLAIN, "srand": 5}))
    # fixed: exactly the named components, nothing else (lr 0: only the constraint moves)
    before = {n: c.params() and {k: v.copy() for k, v in c.params().items()}
              for n, c in nnet.components.items()}
    stats = trainer.train_step(req, inputs={"input": x}, supervision={"output": y},
                               orthonormal_constraint_applied_to=["l2"])
    assert stats.orthonormal_constrained == ["l2"]
    assert np.array_equal(nnet.components["l1"].params_, before["l1"]["params"])
    expected = before["l2"]["linear_params"].copy()
    constrain_orthonormal_matrix(expected, -1.0)
    np.testing.assert_allclose(nnet.components["l2"].linear_params, expected, rtol=1e-6)
    # random: about one step in four per constrained component, from the trainer's seed
    picks = []
    for _ in range(200):
        picks += trainer.train_step(req, inputs={"input": x},
                                    supervision={"output": y}).orthonormal_constrained
    assert set(picks) == {"l1", "l2"}
    assert 0.15 < picks.count("l1") / 200 < 0.35 and 0.15 < picks.count("l2") / 200 < 0.35
    # the same seed replays the same choices
    again = Trainer(_net(ORTHO), TrainerOptions.from_flags({**PLAIN, "srand": 5}))
    again.train_step(req, inputs={"input": x}, supervision={"output": y},
                     orthonormal_constraint_applied_to=["l2"])
    replay = []
    for _ in range(200):
        replay += again.train_step(req, inputs={"input": x},
                                   supervision={"output": y}).orthonormal_constrained
    assert replay == picks
    with pytest.raises(RuntimeInputError, match="unknown components"):
        trainer.train_step(req, inputs={"input": x}, supervision={"output": y},
                           orthonormal_constraint_applied_to=["nope"])


def test_batchnorm_stats_scaled_and_component_stats():
    text = """input-node name=input dim=6
component name=a type=AffineComponent input-dim=6 output-dim=6
component name=r type=RectifiedLinearComponent dim=6
component name=bn type=BatchNormComponent dim=6
component-node name=a component=a input=input
component-node name=r component=r input=a
component-node name=bn component=bn input=r
output-node name=output input=bn
"""
    nnet = _net(text)
    req, x, y = _batch(nnet, seqs=2, frames=4)
    trainer = Trainer(nnet, TrainerOptions.from_flags({"batchnorm-stats-scale": 0.5}))
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    # store-component-stats (default true): 8 frames stored, then scaled by 0.5
    assert nnet.components["bn"].count == pytest.approx(4.0)
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    assert nnet.components["bn"].count == pytest.approx((4.0 + 8.0) * 0.5)
    assert nnet.components["r"].count == 16  # nonlinearity stats are not scaled
    Trainer(nnet, TrainerOptions())  # zero-component-stats (default true)
    assert nnet.components["bn"].count == 0.0 and nnet.components["r"].count == 0


def test_backstitch_two_passes():
    """With backstitch the step is: params -= s * lr g(params) (max-change scaled by s),
    then params += (1 + s) * lr g(params') on the moved parameters."""
    s = 0.3
    nnet = _net(AFFINE.format(obj="quadratic"))
    req, x, y = _batch(nnet)
    w0 = nnet.components["a"].linear_params.astype(np.float64).copy()
    b0 = nnet.components["a"].bias_params.astype(np.float64).copy()
    opts = TrainerOptions.from_flags({**PLAIN, "backstitch-training-scale": s})
    stats = Trainer(nnet, opts).train_step(req, inputs={"input": x}, supervision={"output": y})

    def grad(w, b):
        d = y - (x @ w.T + b)
        return 0.1 * d.T @ x, 0.1 * d.sum(0)

    gw, gb = grad(w0, b0)
    w1, b1 = w0 - s * gw, b0 - s * gb
    gw, gb = grad(w1, b1)
    np.testing.assert_allclose(nnet.components["a"].linear_params, w1 + (1 + s) * gw,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nnet.components["a"].bias_params, b1 + (1 + s) * gb,
                               rtol=1e-4, atol=1e-5)
    assert set(stats.backstitch_outputs) == {"output"}
    assert stats.objective == pytest.approx(-0.5 * np.sum((y - x @ w0.T - b0) ** 2), rel=1e-5)


# -- errors ------------------------------------------------------------------------------

def test_bad_supervision_is_named():
    nnet = _net(AFFINE.format(obj="linear"))
    req, x, y = _batch(nnet)
    trainer = Trainer(nnet, TrainerOptions.from_flags(PLAIN))
    with pytest.raises(RuntimeInputError, match="no supervision given for output"):
        trainer.train_step(req, inputs={"input": x}, supervision={})
    with pytest.raises(RuntimeInputError, match="supervision for output 'output': expected"):
        trainer.train_step(req, inputs={"input": x}, supervision={"output": y[:, :3]})
    with pytest.raises(RuntimeInputError, match="not outputs of the request"):
        trainer.train_step(req, inputs={"input": x}, supervision={"output": y, "other": y})
    with pytest.raises(RuntimeInputError, match="input"):
        trainer.train_step(req, inputs={}, supervision={"output": y})
    bad = y.copy()
    bad[0, 0] = np.nan
    with pytest.raises(RuntimeInputError, match="non-finite"):
        trainer.train_step(req, inputs={"input": x}, supervision={"output": bad})


# -- end to end ----------------------------------------------------------------------------

def test_training_improves_a_synthetic_task():
    """A small TDNN with natural gradient, BatchNorm, max-change and momentum learns to
    classify frames by which of 5 random means their context window came from."""
    text = """input-node name=input dim=8
component name=t1 type=TdnnComponent input-dim=8 output-dim=32 time-offsets=-1,0,1 \
learning-rate=0.002 max-change=0.75
component name=r1 type=RectifiedLinearComponent dim=32
component name=bn1 type=BatchNormComponent dim=32
component name=l2 type=LinearComponent input-dim=32 output-dim=16 \
orthonormal-constraint=-1 learning-rate=0.002 max-change=0.75
component name=a3 type=NaturalGradientAffineComponent input-dim=16 output-dim=5 \
learning-rate=0.002 max-change=1.5
component name=sm type=LogSoftmaxComponent dim=5
component-node name=t1 component=t1 input=input
component-node name=r1 component=r1 input=t1
component-node name=bn1 component=bn1 input=r1
component-node name=l2 component=l2 input=bn1
component-node name=a3 component=a3 input=l2
component-node name=sm component=sm input=a3
output-node name=output input=sm objective=linear
"""
    nnet = _net(text, seed=2)
    rng = np.random.default_rng(0)
    means = rng.standard_normal((5, 8)) * 1.5
    seqs, frames = 8, 10
    req = ComputationRequest.from_frames(range(-1, frames + 1), range(frames), seqs)

    def batch():
        labels = rng.integers(0, 5, seqs)
        x = means[labels].repeat(frames + 2, axis=0) + rng.standard_normal(
            (seqs * (frames + 2), 8))
        y = np.zeros((seqs * frames, 5), np.float32)
        y[np.arange(seqs * frames), labels.repeat(frames)] = 1.0
        return x.astype(np.float32), y

    trainer = Trainer(nnet, TrainerOptions.from_flags({"momentum": 0.5, "srand": 1}))
    per_frame = []
    for _ in range(60):
        x, y = batch()
        stats = trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
        per_frame.append(stats.objective_per_frame)
    first, last = np.mean(per_frame[:5]), np.mean(per_frame[-5:])
    assert first < -1.0  # about log(1/5) at the start
    assert last > -0.3, (first, last)
    assert trainer.num_minibatches_processed == 60
    info = trainer.compiler.info()  # one shape: compiled once, then served from the cache
    assert info["hits"] >= 59
    lines = trainer.total_stats_lines()
    assert lines[0].startswith("Overall average objective function for 'output' is ")
    assert lines[1].startswith("[this line is to be parsed by a script:] log-prob-per-frame=")


def test_backstitch_freezes_natural_gradient_in_its_first_pass():
    """Kaldi freezes natural gradient for backstitch's first pass (from the very first
    minibatch): only the second pass updates the Fisher estimates, so after one step
    each preconditioner has seen two calls and updated once after initializing."""
    text = """input-node name=input dim=6
component name=a type=NaturalGradientAffineComponent input-dim=6 output-dim=4
component-node name=a component=a input=input
output-node name=output input=a objective=quadratic
"""
    nnet = _net(text)
    req, x, y = _batch(nnet, seqs=4, frames=10)
    trainer = Trainer(nnet, TrainerOptions.from_flags(
        {**PLAIN, "backstitch-training-scale": 0.3}))
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    pre = trainer.preconditioners["a"]["in"]
    assert pre.t == 2 and not pre.frozen
    # the same calls by hand: first frozen (initializes, no update), then updating
    by_hand = type(pre)(pre.rank, 4)
    x1 = np.hstack([x, np.ones((len(x), 1), np.float32)])
    by_hand.freeze(True)
    by_hand.precondition(x1)
    w_after_init = by_hand.W.copy()
    by_hand.freeze(False)
    by_hand.precondition(x1)  # (the input of the second pass is the same)
    assert not np.array_equal(w_after_init, by_hand.W)
    np.testing.assert_allclose(pre.W, by_hand.W, rtol=1e-5, atol=1e-7)


def test_a_given_compiler_is_used_even_when_still_empty():
    """An empty CachingCompiler has len 0 (falsy): the trainer must still use it,
    not silently make its own."""
    from pynnet3.cache import CachingCompiler

    nnet = _net(AFFINE.format(obj="quadratic"))
    cc = CachingCompiler(nnet, optimize=True)
    assert len(cc) == 0
    trainer = Trainer(nnet, TrainerOptions.from_flags(PLAIN), compiler=cc)
    assert trainer.compiler is cc
    req, x, y = _batch(nnet)
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    assert len(cc) >= 1
