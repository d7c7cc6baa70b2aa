"""Review: training a TDNN-F network (Kaldi's ``tdnnf-layer``) as Kaldi's NnetTrainer does.

The reference here is written from Kaldi's source, not from pynnet3's output:

* the forward and backward pass of a small TDNN-F network (NaturalGradientAffine +
  ReLU + BatchNorm, then a factorized layer: TdnnComponent without bias and with
  ``orthonormal-constraint=-1``, TdnnComponent with bias, ReLU, BatchNorm, the bypass
  ``Sum(Scale(0.66, prev), ...)`` into a NoOp; a LinearComponent with the floating
  constraint; an output NaturalGradientAffine with ``learning-rate-factor``;
  log-softmax) in float64 with torch autograd, at exactly the frames Kaldi's
  compiler computes each layer at;
* the natural-gradient update of each component type as its Kaldi Backprop/Update
  does it (nnet-tdnn-component.cc UpdateNaturalGradient: the spliced input with a
  ones column only when there is a bias; nnet-simple-component.cc LinearComponent::
  Backprop: always preconditioned, no ones column; NaturalGradientAffineComponent::
  Update: ones column), through preconditioner objects the reference owns and keeps
  from one step to the next (the preconditioner algorithm itself is checked against
  Kaldi elsewhere: tests/train/test_natural_gradient.py);
* NnetTrainer::TrainInternal (nnet-training.cc) and the nnet-utils.cc functions it
  calls, in its order: delta += lr * gradient (the delta holding momentum times the
  previous one); ApplyL2Regularization with scale ``num sequences *
  l2-regularize-factor`` and each component's learning rate; UpdateNnetWithMaxChange
  with scale ``1 - momentum`` (per component ``min(1, max-change / (||delta|| *
  (1 - momentum)))``, then the global factor over the scaled deltas); ScaleBatchnormStats;
  ConstrainOrthonormal (ConstrainOrthonormalInternal, floating scale, the slower
  update speed when the eigenvalue ratio is large; the transpose when the matrix is
  taller than wide); ScaleNnet(momentum, delta);
* BatchNorm statistics stored straight into the model during the forward pass
  (count += rows, sum += rows * mean, sumsq += rows * E[x^2]; NnetComputer built with
  the model by pointer), then scaled by ``batchnorm-stats-scale``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pynnet3 import ComputationRequest, Nnet
from pynnet3.train import OnlineNaturalGradient, Trainer, TrainerOptions
from pynnet3.train.update import constrain_orthonormal_matrix

torch = pytest.importorskip("torch")

N, T, DIM_IN, NUM_OUT = 3, 7, 5, 6
LEFT, RIGHT = 2, 2  # tdnn1 -1,0,1; tdnnf2.linear -1,0; tdnnf2.affine 0,1

TDNNF = """input-node name=input dim=5
component name=tdnn1.affine type=NaturalGradientAffineComponent input-dim=15 output-dim=8 \
max-change=0.75 l2-regularize=0.03
component-node name=tdnn1.affine component=tdnn1.affine \
input=Append(Offset(input, -1), input, Offset(input, 1))
component name=tdnn1.relu type=RectifiedLinearComponent dim=8 self-repair-scale=0
component-node name=tdnn1.relu component=tdnn1.relu input=tdnn1.affine
component name=tdnn1.batchnorm type=BatchNormComponent dim=8 target-rms=1.0
component-node name=tdnn1.batchnorm component=tdnn1.batchnorm input=tdnn1.relu
component name=tdnnf2.linear type=TdnnComponent input-dim=8 output-dim=3 l2-regularize=0.03 \
max-change=0.75 use-bias=false time-offsets=-1,0 orthonormal-constraint=-1.0
component-node name=tdnnf2.linear component=tdnnf2.linear input=tdnn1.batchnorm
component name=tdnnf2.affine type=TdnnComponent input-dim=3 output-dim=8 l2-regularize=0.03 \
max-change={affine_max_change} time-offsets=0,1
component-node name=tdnnf2.affine component=tdnnf2.affine input=tdnnf2.linear
component name=tdnnf2.relu type=RectifiedLinearComponent dim=8 self-repair-scale=0
component-node name=tdnnf2.relu component=tdnnf2.relu input=tdnnf2.affine
component name=tdnnf2.batchnorm type=BatchNormComponent dim=8
component-node name=tdnnf2.batchnorm component=tdnnf2.batchnorm input=tdnnf2.relu
component name=tdnnf2.noop type=NoOpComponent dim=8
component-node name=tdnnf2.noop component=tdnnf2.noop \
input=Sum(Scale(0.66, tdnn1.batchnorm), tdnnf2.batchnorm)
component name=prefinal-l type=LinearComponent input-dim=8 output-dim=4 l2-regularize=0.03 \
max-change=0.75 orthonormal-constraint=-1.0
component-node name=prefinal-l component=prefinal-l input=tdnnf2.noop
component name=output.affine type=NaturalGradientAffineComponent input-dim=4 output-dim=6 \
l2-regularize=0.015 max-change=1.5 learning-rate-factor=0.5
component-node name=output.affine component=output.affine input=prefinal-l
component name=output.log-softmax type=LogSoftmaxComponent dim=6
component-node name=output.log-softmax component=output.log-softmax input=output.affine
output-node name=output input=output.log-softmax objective=linear
"""

# (name, parameter keys, has bias column in the natural-gradient input)
UPDATABLE = [("tdnn1.affine", True), ("tdnnf2.linear", False), ("tdnnf2.affine", True),
             ("prefinal-l", False), ("output.affine", True)]
BATCHNORMS = ("tdnn1.batchnorm", "tdnnf2.batchnorm")
EPSILON = 0.001  # BatchNormComponent's default epsilon


def _net(affine_max_change: float = 0.75) -> Nnet:
    nnet = Nnet.from_config(TDNNF.format(affine_max_change=affine_max_change), seed=11)
    nnet.set_learning_rate(0.05)  # (the factor 0.5 of output.affine applies)
    return nnet


def _minibatch(seed: int):
    rng = np.random.default_rng(seed)
    req = ComputationRequest.from_frames(range(-LEFT, T + RIGHT), range(T), N)
    x = rng.standard_normal((N * (T + LEFT + RIGHT), DIM_IN)).astype(np.float32)
    sup = np.zeros((N * T, NUM_OUT), np.float32)
    sup[np.arange(N * T), rng.integers(0, NUM_OUT, N * T)] = 1.0
    return req, x, sup


# -- the reference ----------------------------------------------------------------------

def _weights(nnet: Nnet) -> dict:
    """{name: (W, b or None)} in float64, Kaldi's layout (W: [out, in * offsets])."""
    out = {}
    for name, _ in UPDATABLE:
        p = nnet.components[name].params()
        w = p["params"] if "params" in p else p["linear_params"]
        b = p.get("bias_params")
        out[name] = (w.astype(np.float64).copy(),
                     None if b is None else b.astype(np.float64).copy())
    return out


class Reference:
    """Kaldi's NnetTrainer on the TDNN-F network above, in float64 (see module doc)."""

    def __init__(self, nnet: Nnet, momentum: float, max_param_change: float,
                 l2_factor: float, bn_scale: float):
        self.params = _weights(nnet)
        comps = nnet.components
        # the learning rates Kaldi's SetLearningRate gives (float32 products)
        self.lr = {n: float(np.float32(0.05) * np.float32(comps[n].learning_rate_factor))
                   for n, _ in UPDATABLE}
        self.l2 = {n: float(np.float32(comps[n].l2_regularize)) for n, _ in UPDATABLE}
        self.max_change = {n: float(np.float32(comps[n].max_change)) for n, _ in UPDATABLE}
        self.momentum, self.max_param_change = momentum, max_param_change
        self.l2_factor, self.bn_scale = l2_factor, bn_scale
        self.delta = {n: (np.zeros_like(w), None if b is None else np.zeros_like(b))
                      for n, (w, b) in self.params.items()}
        self.pre = {}
        for n, _ in UPDATABLE:
            c = comps[n]
            if c.type_name == "TdnnComponent":
                # InitFromConfig: rank-in min(20, (spliced + 1) / 2), rank-out
                # min(80, (out + 1) / 2), update period 4 (fixed), alpha 4, history 2000
                spliced = c.linear_params.shape[1]
                ranks = (min(20, (spliced + 1) // 2), min(80, (c.linear_params.shape[0] + 1) // 2))
                period = 4
            else:
                # NaturalGradientAffine / Linear InitFromConfig: rank-in
                # min(20, (in + 1) / 2), rank-out min(80, (out + 1) / 2), update-period 4
                w = self.params[n][0]
                ranks = (min(20, (w.shape[1] + 1) // 2), min(80, (w.shape[0] + 1) // 2))
                period = 4
            self.pre[n] = (OnlineNaturalGradient(ranks[0], period, 2000.0, 4.0),
                           OnlineNaturalGradient(ranks[1], period, 2000.0, 4.0))
        self.bn = {n: [0.0, np.zeros(8), np.zeros(8)] for n in BATCHNORMS}  # zeroed stats

    # forward / backward -----------------------------------------------------------
    def _forward(self, x: np.ndarray, sup: np.ndarray):
        # (parameters need gradients so that each layer output's can be retained)
        tt = {n: (torch.tensor(w, requires_grad=True),
                  None if b is None else torch.tensor(b, requires_grad=True))
              for n, (w, b) in self.params.items()}
        X = torch.tensor(x.astype(np.float64)).reshape(N, T + LEFT + RIGHT, DIM_IN)
        rows, outs, bn_rows = {}, {}, {}

        def at(a, a_start, lo, hi, off):
            """Frames lo..hi (+ off) of ``a`` (frames from ``a_start``)."""
            return a[:, lo + off - a_start: hi + off - a_start + 1, :]

        def affine(name, inp):
            w, b = tt[name]
            z = inp @ w.T + (b if b is not None else 0.0)
            z.retain_grad()
            rows[name], outs[name] = inp.reshape(-1, inp.shape[-1]), z
            return z

        def batchnorm(name, a):
            flat = a.reshape(-1, a.shape[-1])
            mean = flat.mean(0)
            uvar = (flat * flat).mean(0)
            bn_rows[name] = (flat.shape[0], mean.detach().numpy(), uvar.detach().numpy())
            var = torch.clamp(uvar - mean * mean, min=0.0)
            return (a - mean) / torch.sqrt(var + EPSILON)  # target-rms 1

        # the frames each layer is computed at (what the outputs 0..T-1 need)
        z1 = affine("tdnn1.affine", torch.cat([at(X, -LEFT, -1, T, o) for o in (-1, 0, 1)], -1))
        b1 = batchnorm("tdnn1.batchnorm", torch.relu(z1))                    # t = -1..T
        z2 = affine("tdnnf2.linear", torch.cat([at(b1, -1, 0, T, o) for o in (-1, 0)], -1))
        z3 = affine("tdnnf2.affine", torch.cat([at(z2, 0, 0, T - 1, o) for o in (0, 1)], -1))
        b3 = batchnorm("tdnnf2.batchnorm", torch.relu(z3))                   # t = 0..T-1
        noop = 0.66 * at(b1, -1, 0, T - 1, 0) + b3
        z4 = affine("prefinal-l", noop)
        z5 = affine("output.affine", z4)
        out = torch.log_softmax(z5, -1).reshape(N * T, NUM_OUT)
        objective = (torch.tensor(sup.astype(np.float64)) * out).sum()
        objective.backward()
        return {n: (rows[n].detach().numpy(),
                    outs[n].grad.reshape(-1, outs[n].shape[-1]).numpy()) for n in rows}, \
            bn_rows, float(objective.detach())

    def step(self, x: np.ndarray, sup: np.ndarray, constrained: list[str]) -> dict:
        """One NnetTrainer::Train (TrainInternal); returns what it decided."""
        rows, bn_rows, objective = self._forward(x, sup)
        # BatchNormComponent::StoreStats, into the model during the forward
        for n, (count, mean, uvar) in bn_rows.items():
            s = self.bn[n]
            s[0] += count
            s[1] = s[1] + count * mean
            s[2] = s[2] + count * uvar
        # Backprop: each component's natural-gradient Update adds lr * its update
        for n, bias in UPDATABLE:
            xin, dy = rows[n]
            if bias:  # the input with a column of ones (the bias's direction)
                xin = np.hstack([xin, np.ones((len(xin), 1))])
            x_hat, s_in = self.pre[n][0].precondition(xin.astype(np.float32))
            dy_hat, s_out = self.pre[n][1].precondition(dy.astype(np.float32))
            g = s_in * s_out * (dy_hat.astype(np.float64).T @ x_hat.astype(np.float64))
            dw, db = self.delta[n]
            cols = dw.shape[1]
            dw += self.lr[n] * g[:, :cols]
            if db is not None:
                db += self.lr[n] * g[:, cols]
        # ApplyL2Regularization(nnet, num-n-values * l2-regularize-factor, delta)
        l2_scale = N * self.l2_factor
        for n, _ in UPDATABLE:
            scale = -2.0 * l2_scale * self.lr[n] * self.l2[n]
            for d, p in zip(self.delta[n], self.params[n], strict=True):
                if d is not None:
                    d += scale * p
        # UpdateNnetWithMaxChange(delta, max-param-change, 1.0, 1 - momentum, nnet)
        scale = 1.0 - self.momentum
        sq = {n: sum(float(np.sum(d * d)) for d in self.delta[n] if d is not None)
              for n, _ in UPDATABLE}
        factors = {}
        for n, _ in UPDATABLE:
            mc = self.max_change[n]
            norm = math.sqrt(sq[n])
            factors[n] = mc / (norm * abs(scale)) if mc != 0 and norm * abs(scale) > mc else 1.0
        total = math.sqrt(sum(factors[n] ** 2 * sq[n] for n in sq)) * abs(scale)
        global_factor = 1.0
        if self.max_param_change != 0.0 and total > self.max_param_change:
            global_factor = self.max_param_change / total
        for n, _ in UPDATABLE:
            for d, p in zip(self.delta[n], self.params[n], strict=True):
                if d is not None:
                    p += scale * global_factor * factors[n] * d
        # ScaleBatchnormStats(batchnorm-stats-scale, nnet)
        for s in self.bn.values():
            s[0] *= self.bn_scale
            s[1] = s[1] * self.bn_scale
            s[2] = s[2] * self.bn_scale
        # ConstrainOrthonormal (the components the coin picked)
        for n in constrained:
            w = self.params[n][0]
            w[...] = kaldi_constrain_orthonormal(w, -1.0)
        # ScaleNnet(momentum, delta)
        for n in self.delta:
            for d in self.delta[n]:
                if d is not None:
                    d *= self.momentum
        return {"factors": factors, "global": global_factor, "objective": objective}


def kaldi_constrain_orthonormal(m: np.ndarray, scale: float) -> np.ndarray:
    """ConstrainOrthonormal's treatment of one matrix, written from nnet-utils.cc:
    the transpose when rows > cols, then ConstrainOrthonormalInternal."""
    transpose = m.shape[0] > m.shape[1]
    x = (m.T if transpose else m).astype(np.float64)
    p = x @ x.T
    speed = 0.125
    if scale < 0.0:
        tr_p, tr_pp = np.trace(p), np.trace(p @ p.T)
        if tr_p < 1e-15:
            return m.copy()
        scale = math.sqrt(tr_pp / tr_p)
        ratio = tr_pp * p.shape[0] / (tr_p * tr_p)
        if ratio > 1.02:
            speed *= 0.5
            if ratio > 1.1:
                speed *= 0.5
    q = p - scale * scale * np.eye(p.shape[0])
    alpha = speed / (scale * scale)
    x = x + (-4.0 * alpha) * (q @ x)
    return x.T if transpose else x


# -- the tests ----------------------------------------------------------------------

@pytest.mark.parametrize("momentum,max_param_change,affine_max_change", [
    (0.0, 2.0, 0.75),      # nnet3-train's defaults (tdnn1.affine's max-change binds)
    (0.3, 0.0, 0.75),      # momentum, no global max-change
    (0.5, 0.05, 0.02),     # momentum, per-component and global max-change binding
])
def test_two_tdnnf_steps_match_kaldis_trainer(momentum, max_param_change, affine_max_change):
    nnet = _net(affine_max_change)
    opts = TrainerOptions(momentum=momentum, max_param_change=max_param_change,
                          l2_regularize_factor=0.5, batchnorm_stats_scale=0.8)
    ref = Reference(nnet, momentum, max_param_change, 0.5, 0.8)
    trainer = Trainer(nnet, opts)
    schedule = [["tdnnf2.linear", "prefinal-l"], ["tdnnf2.linear"]]
    binding = []
    for step, constrained in enumerate(schedule):
        req, x, sup = _minibatch(step)
        before = _weights(nnet)
        stats = trainer.train_step(req, {"input": x}, {"output": sup},
                                   orthonormal_constraint_applied_to=constrained)
        want = ref.step(x, sup, constrained)
        assert stats.orthonormal_constrained == constrained
        assert stats.objective == pytest.approx(want["objective"], rel=1e-5)
        assert stats.global_scale == pytest.approx(want["global"], rel=1e-4)
        for n, _ in UPDATABLE:
            assert stats.max_change_scales[n] == pytest.approx(want["factors"][n], rel=1e-4), n
        binding.append((want["global"] < 1.0, want["factors"]["tdnnf2.affine"] < 1.0))
        got = _weights(nnet)
        for n, _ in UPDATABLE:
            for k, (g, w, b) in enumerate(zip(got[n], ref.params[n], before[n],
                                                  strict=True)):
                if g is None:
                    continue
                # the change of the step against the reference's, up to the float32
                # rounding of the parameters the trainer keeps
                err = np.linalg.norm(g - w)
                tol = 2e-4 * np.linalg.norm(w - b) + 3e-7 * np.linalg.norm(b)
                assert err < tol, (step, n, k, err, np.linalg.norm(w - b))
        for n in BATCHNORMS:
            bn = nnet.components[n]
            count, s, sq = ref.bn[n]
            assert float(bn.count) == pytest.approx(count, rel=1e-6)
            np.testing.assert_allclose(bn.stats_sum, s, rtol=1e-4, atol=1e-4 * count)
            np.testing.assert_allclose(bn.stats_sumsq, sq, rtol=1e-4, atol=1e-4 * count)
    # the last parametrization has both max-changes binding in both steps
    assert binding == [(0.0 < max_param_change < 1.0, affine_max_change < 0.1)] * 2


def test_batchnorm_counts_after_two_steps_by_hand():
    """tdnn1 runs at t = -1..T (T + 2 frames per sequence), tdnnf2 at t = 0..T-1: the
    counts stored straight into the model, each step then scaled by 0.8."""
    nnet = _net()
    trainer = Trainer(nnet, TrainerOptions(momentum=0.5))  # momentum: no effect on stats
    for step in range(2):
        req, x, sup = _minibatch(step)
        trainer.train_step(req, {"input": x}, {"output": sup})
    for name, frames in (("tdnn1.batchnorm", T + 2), ("tdnnf2.batchnorm", T)):
        rows = N * frames
        assert nnet.components[name].count == pytest.approx(0.8 * (0.8 * rows + rows))


def test_floating_orthonormal_constraint_matches_kaldis_formula():
    """ConstrainOrthonormalInternal with a floating scale, in the three update-speed
    regimes (ratio <= 1.02, <= 1.1, above), wide and tall (transposed)."""
    rng = np.random.default_rng(5)
    regimes = set()
    for shape in ((4, 12), (12, 4)):
        k = min(shape)
        for spread in (0.005, 0.1, 0.6):  # how far the singular values are apart
            u, _ = np.linalg.qr(rng.standard_normal((shape[0], k)))
            v, _ = np.linalg.qr(rng.standard_normal((shape[1], k)))
            sv = 0.7 * (1.0 + spread * np.linspace(-1.0, 1.0, k))
            m = (u * sv) @ v.T
            p = m @ m.T if shape[0] <= shape[1] else m.T @ m
            ratio = np.trace(p @ p) * k / np.trace(p) ** 2
            regimes.add(int(ratio > 1.02) + int(ratio > 1.1))
            got = m.astype(np.float32)
            constrain_orthonormal_matrix(got, -1.0)
            want = kaldi_constrain_orthonormal(m.astype(np.float32), -1.0)
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6,
                                       err_msg=f"{shape} spread {spread} ratio {ratio}")
    assert regimes == {0, 1, 2}
    # a fixed scale: the rows' (columns', when tall) norms move towards it
    for shape in ((3, 9), (9, 3)):
        m = (0.3 * rng.standard_normal(shape)).astype(np.float32)
        got = m.copy()
        constrain_orthonormal_matrix(got, 2.0)
        np.testing.assert_allclose(got, kaldi_constrain_orthonormal(m, 2.0), rtol=0, atol=2e-6)


def test_dropout_at_proportion_zero_changes_nothing_in_training():
    """tdnnf-layer with dropout puts a GeneralDropoutComponent (continuous) after the
    BatchNorm, into the bypass sum. Kaldi's Propagate/Backprop copy and return
    before drawing a mask when dropout-proportion is 0 (and no SpecAugment), which is
    what a dropout schedule gives at its ends: two steps equal the network without it."""
    with_dropout = TDNNF.replace(
        "input=Sum(Scale(0.66, tdnn1.batchnorm), tdnnf2.batchnorm)",
        "input=Sum(Scale(0.66, tdnn1.batchnorm), tdnnf2.dropout)").replace(
        "component name=tdnnf2.noop ",
        "component name=tdnnf2.dropout type=GeneralDropoutComponent dim=8 "
        "dropout-proportion=0.0 continuous=true\n"
        "component-node name=tdnnf2.dropout component=tdnnf2.dropout input=tdnnf2.batchnorm\n"
        "component name=tdnnf2.noop ")
    nets = [_net(), Nnet.from_config(with_dropout.format(affine_max_change=0.75), seed=11)]
    nets[1].set_learning_rate(0.05)
    for name, _ in UPDATABLE:  # (the same initial parameters)
        for key, p in nets[1].components[name].params().items():
            p[...] = nets[0].components[name].params()[key]
    trainers = [Trainer(n, TrainerOptions(momentum=0.5)) for n in nets]
    for step in range(2):
        req, x, sup = _minibatch(step)
        for tr in trainers:
            tr.train_step(req, {"input": x}, {"output": sup},
                          orthonormal_constraint_applied_to=["tdnnf2.linear"])
    for name, _ in UPDATABLE:
        for key, p in nets[0].components[name].params().items():
            np.testing.assert_allclose(nets[1].components[name].params()[key], p,
                                       rtol=1e-6, atol=1e-7)
