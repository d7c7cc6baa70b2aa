"""Each natural-gradient component type's update in a training step, against the
update written out by hand: the rows Kaldi's Update preconditions (the input with a
ones column, the output derivative, per-frame derivatives, ...) are built here from
the inputs and the supervision, passed through fresh preconditioners configured as
Kaldi configures that type, and combined with the learning rate and scales. Types
that precondition a whole parameter-shaped derivative are checked by the
invariant that natural gradient keeps its Frobenius norm."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3 import ComputationRequest, Nnet
from pynnet3.train import OnlineNaturalGradient, Trainer, TrainerOptions

LR = 0.01
# no max-change, no BatchNorm, the objective's derivative is the supervision itself
OPTIONS = {"max-param-change": 0.0, "momentum": 0.0, "zero-component-stats": False,
           "store-component-stats": False}


def _net(component_line: str, dim_in: int, extra: str = "") -> Nnet:
    text = (f"input-node name=input dim={dim_in}\n"
            f"component name=comp {component_line} learning-rate={LR}\n"
            f"component-node name=comp component=comp input={extra or 'input'}\n"
            "output-node name=output input=comp objective=linear\n")
    return Nnet.from_config(text, seed=3)


def _minibatch(nnet: Nnet, seqs: int = 4, frames: int = 16, seed: int = 0):
    lc, rc = nnet.left_context, nnet.right_context
    req = ComputationRequest.from_frames(range(-lc, frames + rc), range(frames), seqs)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((seqs * (frames + lc + rc), nnet.input_dim("input")))
    y = rng.standard_normal((seqs * frames, nnet.output_dim("output")))
    return req, x.astype(np.float32), y.astype(np.float32)


def _step(nnet: Nnet, req, x, y, natural_gradient: bool = True, trainer=None):
    trainer = trainer or Trainer(nnet, TrainerOptions.from_flags(OPTIONS))
    if not natural_gradient:
        trainer.preconditioners["comp"] = None  # plain SGD for this component
    before = {k: v.copy() for k, v in nnet.components["comp"].params().items()}
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    after = nnet.components["comp"].params()
    return {k: after[k].astype(np.float64) - before[k] for k in before}, trainer


def _rows(x, frames, seqs, lc, rc, offset):
    """Input rows at output time t + offset, output rows in (n, t) order."""
    per = frames + lc + rc
    idx = np.array([n * per + lc + t + offset for n in range(seqs) for t in range(frames)])
    return x[idx]


def _product_update(x_rows, dy, rank_in, rank_out, bias=True, period=4):
    x = x_rows.astype(np.float32)
    if bias:
        x = np.hstack([x, np.ones((len(x), 1), np.float32)])
    x_hat, s_in = OnlineNaturalGradient(rank_in, period).precondition(x)
    dy_hat, s_out = OnlineNaturalGradient(rank_out, period).precondition(dy)
    return LR * s_in * s_out * (dy_hat.T.astype(np.float64) @ x_hat)


@pytest.mark.parametrize("line,bias", [
    ("type=NaturalGradientAffineComponent input-dim=12 output-dim=10", True),
    ("type=LinearComponent input-dim=12 output-dim=10", False),
    # Kaldi's LinearComponent::Backprop preconditions whatever use-natural-gradient says
    ("type=LinearComponent input-dim=12 output-dim=10 use-natural-gradient=false", False),
])
def test_affine_and_linear(line, bias):
    nnet = _net(line, 12)
    req, x, y = _minibatch(nnet)
    delta, _ = _step(nnet, req, x, y)
    comp = nnet.components["comp"]
    expected = _product_update(x, y, comp.rank_in, comp.rank_out, bias)
    got = delta["linear_params"] if bias else delta["params"]
    np.testing.assert_allclose(got, expected[:, :12], rtol=0, atol=1e-5 * np.abs(expected).max())
    if bias:
        np.testing.assert_allclose(delta["bias_params"], expected[:, 12], rtol=0,
                                   atol=1e-5 * np.abs(expected).max())


def test_tdnn_preconditions_the_spliced_input():
    nnet = _net("type=TdnnComponent input-dim=6 output-dim=5 time-offsets=-1,0,2", 6)
    req, x, y = _minibatch(nnet)
    delta, _ = _step(nnet, req, x, y)
    spliced = np.hstack([_rows(x, 16, 4, 1, 2, o) for o in (-1, 0, 2)])
    comp = nnet.components["comp"]
    expected = _product_update(spliced, y, comp.rank_in, comp.rank_out)
    np.testing.assert_allclose(delta["linear_params"], expected[:, :18], rtol=0,
                               atol=1e-5 * np.abs(expected).max())
    np.testing.assert_allclose(delta["bias_params"], expected[:, 18], rtol=0,
                               atol=1e-5 * np.abs(expected).max())
    # use-natural-gradient=false: the plain update
    nnet = _net("type=TdnnComponent input-dim=6 output-dim=5 time-offsets=-1,0,2 "
                "use-natural-gradient=false", 6)
    delta, _ = _step(nnet, req, x, y)
    np.testing.assert_allclose(delta["linear_params"], LR * y.T.astype(np.float64) @ spliced,
                               rtol=1e-4, atol=1e-7)


def _row_sum_update(rows, pre):
    rows_hat, s = pre.precondition(rows.astype(np.float32))
    return LR * s * rows_hat.astype(np.float64).sum(axis=0)


def test_per_element_scale_offset_and_constant():
    # NaturalGradientPerElementScale: per-frame derivatives x * dy
    nnet = _net("type=NaturalGradientPerElementScaleComponent dim=8 rank=3 update-period=2", 8)
    req, x, y = _minibatch(nnet)
    delta, _ = _step(nnet, req, x, y)
    np.testing.assert_allclose(delta["scales"], _row_sum_update(
        x * y, OnlineNaturalGradient(3, 2)), rtol=1e-4, atol=1e-7)
    # PerElementOffset with block-dim: the derivative's blocks are the rows (rank 20 -> 3)
    nnet = _net("type=PerElementOffsetComponent dim=8 block-dim=4", 8)
    delta, _ = _step(nnet, req, x, y)
    np.testing.assert_allclose(delta["offsets"], _row_sum_update(
        y.reshape(-1, 4), OnlineNaturalGradient(20, 4)), rtol=1e-4, atol=1e-7)
    # ScaleAndOffset: offsets from dy, scales from x * dy (x rebuilt from the output)
    nnet = _net("type=ScaleAndOffsetComponent dim=8 rank=5", 8)
    delta, _ = _step(nnet, req, x, y)
    np.testing.assert_allclose(delta["offsets"], _row_sum_update(
        y, OnlineNaturalGradient(5, 4)), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(delta["scales"], _row_sum_update(
        x * y, OnlineNaturalGradient(5, 4)), rtol=1e-3, atol=1e-6)
    # ConstantFunction: the output derivative's rows, Kaldi's default preconditioner
    nnet = _net("type=ConstantFunctionComponent input-dim=8 output-dim=6 is-updatable=true", 8)
    req, x, y = _minibatch(nnet)
    delta, _ = _step(nnet, req, x, y)
    np.testing.assert_allclose(delta["output"], _row_sum_update(
        y, OnlineNaturalGradient()), rtol=1e-4, atol=1e-7)
    # use-natural-gradient=false: plain sums
    nnet = _net("type=PerElementOffsetComponent dim=8 use-natural-gradient=false", 8)
    delta, _ = _step(nnet, req, x[:, :8], y[:, :6].repeat(2, axis=1)[:, :8])
    np.testing.assert_allclose(delta["offsets"], LR * y[:, :6].repeat(2, axis=1)[:, :8].sum(0),
                               rtol=1e-4)


@pytest.mark.parametrize("line,dim_in", [
    ("type=NaturalGradientRepeatedAffineComponent input-dim=12 output-dim=8 num-repeats=4", 12),
    ("type=LstmNonlinearityComponent cell-dim=6 self-repair-scale=0", 30),
    ("type=TimeHeightConvolutionComponent num-filters-in=2 height-in=6 num-filters-out=3 "
     "height-out=6 height-offsets=-1,0,1 time-offsets=-1,0,1", 12),
])
def test_whole_derivative_types_keep_the_norm(line, dim_in):
    """Types that precondition the parameter derivative itself: the natural-gradient
    step has exactly the plain step's size, and a different direction."""
    nnet = _net(line, dim_in)
    req, x, y = _minibatch(nnet)
    y = y / 10  # keep the LSTM's gates away from saturation
    plain, _ = _step(nnet.copy(), req, x, y, natural_gradient=False)
    ng, trainer = _step(nnet, req, x, y)
    flat_plain = np.concatenate([v.ravel() for v in plain.values()])
    flat_ng = np.concatenate([v.ravel() for v in ng.values()])
    assert np.linalg.norm(flat_ng) == pytest.approx(np.linalg.norm(flat_plain), rel=1e-4)
    assert np.linalg.norm(flat_ng - flat_plain) > 1e-3 * np.linalg.norm(flat_plain)
    assert all(p.t >= 1 for p in trainer.preconditioners["comp"].values())


def test_state_persists_across_steps():
    """The preconditioners live on the trainer: the second step continues them
    (equal to one pair of preconditioners fed both minibatches in order)."""
    nnet = _net("type=NaturalGradientAffineComponent input-dim=12 output-dim=10", 12)
    comp = nnet.components["comp"]
    pre_in = OnlineNaturalGradient(comp.rank_in, 4)
    pre_out = OnlineNaturalGradient(comp.rank_out, 4)
    trainer = None
    for seed in range(3):
        req, x, y = _minibatch(nnet, seed=seed)
        delta, trainer = _step(nnet, req, x, y, trainer=trainer)
        xh, s_in = pre_in.precondition(np.hstack([x, np.ones((len(x), 1), np.float32)]))
        yh, s_out = pre_out.precondition(y)
        expected = LR * s_in * s_out * (yh.T.astype(np.float64) @ xh)
        np.testing.assert_allclose(delta["linear_params"], expected[:, :12], rtol=0,
                                   atol=1e-5 * np.abs(expected).max())
    assert trainer.preconditioners["comp"]["in"].t == 3


def test_composite_sub_components_have_their_own_preconditioners():
    """A CompositeComponent [NaturalGradientAffine, ReLU, Linear] trains exactly as the
    same three layers as separate nodes (max-rows-process large: one chunk)."""
    sub1 = "type=NaturalGradientAffineComponent input-dim=6 output-dim=8 learning-rate=0.01"
    sub3 = "type=LinearComponent input-dim=8 output-dim=4 learning-rate=0.02"
    composite = Nnet.from_config(
        "input-node name=input dim=6\n"
        f"component name=comp type=CompositeComponent num-components=3 "
        f"max-rows-process=4096 component1='{sub1}' "
        f"component2='type=RectifiedLinearComponent dim=8' component3='{sub3}'\n"
        "component-node name=comp component=comp input=input\n"
        "output-node name=output input=comp\n", seed=1)
    inner = composite.components["comp"].components
    separate = Nnet.from_config(
        "input-node name=input dim=6\n"
        f"component name=a {sub1}\ncomponent name=r type=RectifiedLinearComponent dim=8\n"
        f"component name=l {sub3}\n"
        "component-node name=a component=a input=input\n"
        "component-node name=r component=r input=a\n"
        "component-node name=l component=l input=r\n"
        "output-node name=output input=l\n", seed=1)
    separate.components["a"].linear_params[...] = inner[0].linear_params
    separate.components["a"].bias_params[...] = inner[0].bias_params
    separate.components["l"].params_[...] = inner[2].params_
    t1 = Trainer(composite, TrainerOptions.from_flags(OPTIONS))
    t2 = Trainer(separate, TrainerOptions.from_flags(OPTIONS))
    for seed in range(3):
        req, x, y = _minibatch(composite, seed=seed)
        for t in (t1, t2):
            t.train_step(req, inputs={"input": x}, supervision={"output": y})
    np.testing.assert_allclose(inner[0].linear_params, separate.components["a"].linear_params,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inner[2].params_, separate.components["l"].params_,
                               rtol=1e-5, atol=1e-6)
    assert set(t1.preconditioners["comp"]) == {0, 2}
    assert t1.preconditioners["comp"][0]["in"].t == 3


def test_gru_nonlinearities():
    """GruNonlinearity: w_h's update from (s_{t-1} * r_t) through "in" and h_t's
    pre-tanh derivative through "out"; OutputGruNonlinearity: the per-frame
    c_{t-1} * derivative rows through its one preconditioner."""
    c = 6
    nnet = _net(f"type=GruNonlinearityComponent cell-dim={c} self-repair-scale=0", 4 * c)
    comp = nnet.components["comp"]
    req, x, y = _minibatch(nnet)
    x, y = x / 2, y / 10
    w_h = comp.w_h.astype(np.float64).copy()
    delta, _ = _step(nnet, req, x, y)
    z, r, hpart, c1 = (x[:, i * c:(i + 1) * c].astype(np.float64) for i in range(4))
    h = np.tanh(hpart + (c1 * r) @ w_h.T)
    dh = (y[:, :c] + y[:, c:] - y[:, c:] * z) * (1 - h * h)
    sr = (c1 * r).astype(np.float32)
    xh, s_in = OnlineNaturalGradient(comp.rank_in, comp.update_period,
                                     alpha=comp.alpha).precondition(sr)
    yh, s_out = OnlineNaturalGradient(comp.rank_out, comp.update_period,
                                      alpha=comp.alpha).precondition(dh.astype(np.float32))
    expected = LR * s_in * s_out * (yh.T.astype(np.float64) @ xh)
    np.testing.assert_allclose(delta["w_h"], expected, rtol=0, atol=1e-4 * np.abs(expected).max())

    nnet = _net(f"type=OutputGruNonlinearityComponent cell-dim={c} self-repair-scale=0", 3 * c)
    comp = nnet.components["comp"]
    req, x, y = _minibatch(nnet)
    x, y = x / 2, y / 10
    w_h = comp.w_h.astype(np.float64).copy()
    delta, _ = _step(nnet, req, x, y)
    z, hpart, c1 = (x[:, i * c:(i + 1) * c].astype(np.float64) for i in range(3))
    h = np.tanh(hpart + w_h * c1)
    dh = (y[:, :c] + y[:, c:] - y[:, c:] * z) * (1 - h * h)
    expected = _row_sum_update(dh * c1, OnlineNaturalGradient(comp.rank, comp.update_period,
                                                              alpha=comp.alpha))
    np.testing.assert_allclose(delta["w_h"], expected, rtol=0, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("line,dim_in", [
    ("type=NaturalGradientAffineComponent input-dim=12 output-dim=10", 12),
    ("type=TdnnComponent input-dim=6 output-dim=5 time-offsets=-1,0,2", 6),
    ("type=NaturalGradientRepeatedAffineComponent input-dim=12 output-dim=8 num-repeats=4", 12),
    ("type=LstmNonlinearityComponent cell-dim=6 self-repair-scale=0", 30),
    ("type=TimeHeightConvolutionComponent num-filters-in=2 height-in=6 num-filters-out=3 "
     "height-out=6 height-offsets=-1,0,1 time-offsets=-1,0,1", 12),
    ("type=ScaleAndOffsetComponent dim=8 rank=5", 8),
    ("type=NaturalGradientPerElementScaleComponent dim=8 rank=3", 8),
    ("type=GruNonlinearityComponent cell-dim=6 self-repair-scale=0", 24),
])
def test_torch_backend_gives_the_numpy_update(line, dim_in):
    pytest.importorskip("torch")
    nnet = _net(line, dim_in)
    req, x, y = _minibatch(nnet)
    x, y = x / 2, y / 10
    expected, _ = _step(nnet.copy(), req, x, y)
    trainer = Trainer(nnet, TrainerOptions.from_flags(OPTIONS), backend="torch")
    got, _ = _step(nnet, req, x, y, trainer=trainer)
    for key, value in expected.items():
        # (deltas are differences of float32 parameters: a few ulps of |param| apart)
        ulps = 4 * np.finfo(np.float32).eps * np.abs(nnet.components["comp"].params()[key]).max()
        np.testing.assert_allclose(got[key], value, rtol=0,
                                   atol=1e-4 * np.abs(value).max() + ulps)


def test_tdnn_at_learning_rate_zero_skips_its_preconditioners():
    """Kaldi's TdnnComponent::Backprop returns before Update at learning rate 0 (so
    its natural-gradient state does not move); NaturalGradientAffine still updates."""
    nnet = _net("type=TdnnComponent input-dim=6 output-dim=5 time-offsets=-1,0", 6)
    nnet.components["comp"].learning_rate = 0.0
    req, x, y = _minibatch(nnet)
    delta, trainer = _step(nnet, req, x, y)
    assert not np.any(delta["linear_params"])
    assert all(p.t == 0 for p in trainer.preconditioners.get("comp", {}).values())
    nnet = _net("type=NaturalGradientAffineComponent input-dim=12 output-dim=10", 12)
    nnet.components["comp"].learning_rate = 0.0
    req, x, y = _minibatch(nnet)
    delta, trainer = _step(nnet, req, x, y)
    assert not np.any(delta["linear_params"])
    assert trainer.preconditioners["comp"]["in"].t == 1


def test_lstm_statistics_reach_the_model_as_kaldi_adds_them():
    """Kaldi's LstmNonlinearity Backprop adds value/derivative sums and a row count
    to the component being updated (the delta network); they reach the model with
    the factor the parameter delta gets (here 1 - momentum), and the delta keeps
    momentum times them. They switch self-repair off in later steps."""
    c = 4
    nnet = _net(f"type=LstmNonlinearityComponent cell-dim={c}", 5 * c)
    comp = nnet.components["comp"]
    req, x, y = _minibatch(nnet)
    x = x / 2
    w = comp.params_.astype(np.float64).copy()
    trainer = Trainer(nnet, TrainerOptions.from_flags({**OPTIONS, "momentum": 0.5}))
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    rows = len(x)

    def sigmoid(v):
        return 1 / (1 + np.exp(-v))

    xi, xf, xc, xo, c_prev = (x[:, k * c:(k + 1) * c].astype(np.float64) for k in range(5))
    i_t, f_t = sigmoid(xi + w[0] * c_prev), sigmoid(xf + w[1] * c_prev)
    c_t = f_t * c_prev + i_t * np.tanh(xc)
    o_t = sigmoid(xo + w[2] * c_t)
    values = np.stack([v.sum(0) for v in (i_t, f_t, np.tanh(xc), o_t, np.tanh(c_t))])
    derivs = np.stack([(i_t * (1 - i_t)).sum(0), (f_t * (1 - f_t)).sum(0),
                       (1 - np.tanh(xc) ** 2).sum(0), (o_t * (1 - o_t)).sum(0),
                       (1 - np.tanh(c_t) ** 2).sum(0)])
    assert comp.count == pytest.approx(0.5 * rows)
    np.testing.assert_allclose(comp.value_avg, values / rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(comp.deriv_avg, derivs / rows, rtol=1e-5, atol=1e-6)
    # self-repair was active everywhere (zero stats before): a probability of 1
    np.testing.assert_allclose(comp.self_repair_prob, 1.0, rtol=1e-6)
    assert trainer.delta_stats["comp"]["count"] == pytest.approx(0.5 * rows)
    trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
    # second step: the delta held 0.5 * rows and gained rows; half of it is added
    assert comp.count == pytest.approx(0.5 * rows + 0.5 * (0.5 * rows + rows))
    # with these statistics the gates' average derivatives pass Kaldi's thresholds
    # (0.05 for the sigmoids), so the second step repaired no sigmoid
    assert comp.self_repair_prob[[0, 1, 3]].max() < 1.0
