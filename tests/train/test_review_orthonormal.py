"""Review: Kaldi's orthonormal constraint in training (ConstrainOrthonormal), on a
small TDNN-F-like network with an iVector input, two consecutive steps, plain and
backstitch, against a float64 transcription of Kaldi's sources.

Written from Kaldi's code (nnet-utils.cc, nnet-training.cc), not from pynnet3's:

* ConstrainOrthonormal visits every component of the network in order; a
  LinearComponent (its ``params_``), an AffineComponent or any subclass
  (NaturalGradientAffineComponent; its ``linear_params_``) or a TdnnComponent (its
  ``linear_params_``) whose OrthonormalConstraint() is nonzero draws ``RandInt(0, 3)``
  and is constrained when it is 0 (the draw is fixed here by
  ``orthonormal_constraint_applied_to``); the matrix is transposed first when it has
  more rows than columns, and copied back transposed;
* ConstrainOrthonormalInternal(scale, M): ``P = M M^T``; a positive scale is used as
  it is; a negative one floats: ``scale = sqrt(tr(P P^T) / tr(P))`` (nothing done when
  ``tr(P) < 1e-15``), and the update speed 1/8 is halved when
  ``ratio = tr(P P^T) * rows / tr(P)^2 > 1.02``, halved again when above 1.1;
  ``M += -4 (speed / scale^2) (P - scale^2 I) M``;
* NnetTrainer::TrainInternal: delta += lr * gradient (the delta holding momentum
  times the previous one); ApplyL2Regularization; UpdateNnetWithMaxChange (scale
  ``1 - momentum``); ScaleBatchnormStats; ConstrainOrthonormal (on the model, after
  the update: the delta, carried by momentum, never sees the constraint); ScaleNnet
  (momentum, delta);
* NnetTrainer::TrainInternalBackstitch, when ``minibatches % interval == srand_seed %
  interval`` (srand_seed: the trainer's RandInt(0, 100000), read from the trainer):
  natural gradient frozen in the first pass; first pass: no L2, update with
  max-change scale ``s`` and scale ``-s``, ConstrainOrthonormal, delta zeroed; second
  pass (natural gradient unfrozen, on the moved parameters): L2 with
  ``1 / (1 + s)`` of the usual scale, update with max-change scale and scale ``1 + s``,
  ScaleBatchnormStats, delta zeroed. (The BatchNorm statistics are stored by both
  passes' forward.)

The natural-gradient preconditioning is pynnet3's OnlineNaturalGradient (checked
against Kaldi on its own in test_natural_gradient.py); the forward and backward pass
is float64 torch autograd at the frames Kaldi's compiler computes each layer at.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pynnet3 import Nnet
from pynnet3.compiler.request import ComputationRequest, IoSpecification
from pynnet3.train import OnlineNaturalGradient, Trainer, TrainerOptions

torch = pytest.importorskip("torch")

N, T, DIM_IN, DIM_IV, NUM_OUT = 3, 6, 4, 3, 5
LEFT = RIGHT = 2  # tdnn1 -1,0,1; tdnnf2.linear -1,0; tdnnf2.affine 0,1
EPSILON = 0.001   # BatchNormComponent's default
LR = 0.05

CONFIG = """input-node name=input dim=4
input-node name=ivector dim=3
component name=tdnn1.affine type=NaturalGradientAffineComponent input-dim=15 \
output-dim=8 max-change=0.75 l2-regularize=0.02 orthonormal-constraint=0.7
component-node name=tdnn1.affine component=tdnn1.affine \
input=Append(Offset(input, -1), input, Offset(input, 1), ReplaceIndex(ivector, t, 0))
component name=tdnn1.relu type=RectifiedLinearComponent dim=8 self-repair-scale=0
component-node name=tdnn1.relu component=tdnn1.relu input=tdnn1.affine
component name=tdnn1.batchnorm type=BatchNormComponent dim=8
component-node name=tdnn1.batchnorm component=tdnn1.batchnorm input=tdnn1.relu
component name=tdnnf2.linear type=TdnnComponent input-dim=8 output-dim=3 \
l2-regularize=0.02 max-change=0.75 use-bias=false time-offsets=-1,0 learning-rate-factor=0.1 \
orthonormal-constraint=-1.0
component-node name=tdnnf2.linear component=tdnnf2.linear input=tdnn1.batchnorm
component name=tdnnf2.affine type=TdnnComponent input-dim=3 output-dim=8 \
l2-regularize=0.02 max-change=0.75 time-offsets=0,1 orthonormal-constraint=-1.0
component-node name=tdnnf2.affine component=tdnnf2.affine input=tdnnf2.linear
component name=tdnnf2.relu type=RectifiedLinearComponent dim=8 self-repair-scale=0
component-node name=tdnnf2.relu component=tdnnf2.relu input=tdnnf2.affine
component name=tdnnf2.batchnorm type=BatchNormComponent dim=8
component-node name=tdnnf2.batchnorm component=tdnnf2.batchnorm input=tdnnf2.relu
component name=tdnnf2.noop type=NoOpComponent dim=8
component-node name=tdnnf2.noop component=tdnnf2.noop \
input=Sum(Scale(0.66, tdnn1.batchnorm), tdnnf2.batchnorm)
component name=prefinal-l type=LinearComponent input-dim=8 output-dim=10 \
l2-regularize=0.02 max-change=0.75 orthonormal-constraint=1.0
component-node name=prefinal-l component=prefinal-l input=tdnnf2.noop
component name=prefinal.affine type=AffineComponent input-dim=10 output-dim=6 \
max-change=0.75 orthonormal-constraint=-1
component-node name=prefinal.affine component=prefinal.affine input=prefinal-l
component name=prefinal.relu type=RectifiedLinearComponent dim=6 self-repair-scale=0
component-node name=prefinal.relu component=prefinal.relu input=prefinal.affine
component name=output.affine type=NaturalGradientAffineComponent input-dim=6 \
output-dim=5 l2-regularize=0.01 max-change=1.5 learning-rate-factor=0.5
component-node name=output.affine component=output.affine input=prefinal.relu
component name=output.log-softmax type=LogSoftmaxComponent dim=5
component-node name=output.log-softmax component=output.log-softmax input=output.affine
output-node name=output input=output.log-softmax objective=linear
"""

# name -> (has a bias, natural gradient, orthonormal-constraint)
LAYERS = {
    "tdnn1.affine": (True, True, 0.7),       # 8 x 15 wide, fixed scale 0.7
    "tdnnf2.linear": (False, True, -1.0),    # 3 x 16 wide, floating
    "tdnnf2.affine": (True, True, -1.0),     # 8 x 6 tall (transposed), floating
    "prefinal-l": (False, True, 1.0),        # 10 x 8 tall (transposed), fixed scale 1
    "prefinal.affine": (True, False, -1.0),  # 6 x 10 wide, plain AffineComponent
    "output.affine": (True, True, 0.0),      # no constraint
}
CONSTRAINED = [n for n, (_, _, c) in LAYERS.items() if c != 0.0]
BATCHNORMS = ("tdnn1.batchnorm", "tdnnf2.batchnorm")
# singular-value spreads of the constrained matrices at the start: near the
# constraint (so that the fixed scales do not blow up) and in each of the floating
# constraint's update-speed regimes (ratio <= 1.02, in (1.02, 1.1], above 1.1)
SPREAD = {"tdnn1.affine": (0.7, 0.05), "tdnnf2.linear": (0.6, 0.004),
          "tdnnf2.affine": (0.9, 0.12), "prefinal-l": (1.0, 0.08),
          "prefinal.affine": (0.8, 0.3)}


def _net() -> Nnet:
    nnet = Nnet.from_config(CONFIG, seed=5)
    nnet.set_learning_rate(LR)
    rng = np.random.default_rng(17)
    for name, (center, spread) in SPREAD.items():
        p = nnet.components[name].params()
        w = p["params"] if "params" in p else p["linear_params"]
        k = min(w.shape)
        u, _ = np.linalg.qr(rng.standard_normal((w.shape[0], k)))
        v, _ = np.linalg.qr(rng.standard_normal((w.shape[1], k)))
        sv = center * (1.0 + spread * np.linspace(-1.0, 1.0, k))
        w[...] = (u * sv) @ v.T
    return nnet


def _request() -> ComputationRequest:
    frames = [(n, t, 0) for n in range(N) for t in range(-LEFT, T + RIGHT)]
    out = [(n, t, 0) for n in range(N) for t in range(T)]
    return ComputationRequest(
        inputs=[IoSpecification("input", np.array(frames)),
                IoSpecification("ivector", np.array([(n, 0, 0) for n in range(N)]))],
        outputs=[IoSpecification("output", np.array(out), has_deriv=True)])


def _minibatch(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, T + LEFT + RIGHT, DIM_IN)).astype(np.float32)
    iv = rng.standard_normal((N, DIM_IV)).astype(np.float32)
    sup = np.zeros((N * T, NUM_OUT), np.float32)
    sup[np.arange(N * T), rng.integers(0, NUM_OUT, N * T)] = 1.0
    return x, iv, sup


def _weights(nnet: Nnet) -> dict:
    """{name: [W, b or None]} in float64 (W as Kaldi stores it: [out, in * offsets])."""
    out = {}
    for name in LAYERS:
        p = nnet.components[name].params()
        w = p["params"] if "params" in p else p["linear_params"]
        b = p.get("bias_params")
        out[name] = [w.astype(np.float64).copy(),
                     None if b is None else b.astype(np.float64).copy()]
    return out


# -- Kaldi's ConstrainOrthonormal, transcribed ---------------------------------------------

def kaldi_constrain(m: np.ndarray, constraint: float) -> tuple[np.ndarray, float | None]:
    """One matrix through ConstrainOrthonormal / ConstrainOrthonormalInternal; returns
    the new matrix and (floating scale only) the eigenvalue ratio it judged by."""
    tall = m.shape[0] > m.shape[1]
    a = (m.T if tall else m).astype(np.float64)
    p = a @ a.T
    scale, speed, ratio = constraint, 0.125, None
    if scale < 0.0:
        trace_p, trace_p_p = float(np.trace(p)), float(np.trace(p @ p.T))
        if trace_p < 1.0e-15:
            return m.copy(), None
        scale = math.sqrt(trace_p_p / trace_p)
        ratio = trace_p_p * p.shape[0] / (trace_p * trace_p)
        assert ratio > 0.9  # (Kaldi's KALDI_ASSERT)
        if ratio > 1.02:
            speed *= 0.5
            if ratio > 1.1:
                speed *= 0.5
    q = p - scale * scale * np.eye(p.shape[0])
    alpha = speed / (scale * scale)
    a = a + (-4.0 * alpha) * (q @ a)
    return (a.T if tall else a), ratio


# -- Kaldi's NnetTrainer on this network, in float64 ---------------------------------------

class KaldiTrainer:
    def __init__(self, nnet: Nnet, opts: TrainerOptions, srand_seed: int):
        comps = nnet.components
        self.params = _weights(nnet)
        self.opts, self.srand_seed = opts, srand_seed
        # SetLearningRate: learning_rate * learning-rate-factor, float32 product
        self.lr = {n: float(np.float32(LR) * np.float32(comps[n].learning_rate_factor))
                   for n in LAYERS}
        self.l2 = {n: float(np.float32(comps[n].l2_regularize)) for n in LAYERS}
        self.max_change = {n: float(np.float32(comps[n].max_change)) for n in LAYERS}
        self.delta = {n: [np.zeros_like(w), None if b is None else np.zeros_like(b)]
                      for n, (w, b) in self.params.items()}
        self.pre = {}
        for n, (_, ng, _) in LAYERS.items():
            if not ng:
                continue
            w = self.params[n][0]
            # InitFromConfig (NaturalGradientAffine, Linear, Tdnn): rank-in
            # min(20, (spliced in + 1) / 2), rank-out min(80, (out + 1) / 2), update
            # period 4, num-samples-history 2000, alpha 4
            self.pre[n] = (OnlineNaturalGradient(min(20, (w.shape[1] + 1) // 2), 4, 2000.0, 4.0),
                           OnlineNaturalGradient(min(80, (w.shape[0] + 1) // 2), 4, 2000.0, 4.0))
        self.bn = {n: [0.0, np.zeros(8), np.zeros(8)] for n in BATCHNORMS}  # zeroed
        self.minibatches = 0
        self.ratios: dict[str, list] = {n: [] for n in CONSTRAINED}
        self.factors: list = []
        self.too_big: list = []  # (name, norm, scale, max-change, max-change scale, factor)

    # forward and backward ---------------------------------------------------------------
    def _gradients(self, x, iv, sup):
        """Rows and output derivatives of each layer, the BatchNorm minibatch stats and
        the objective, at the current parameters."""
        tt = {n: [torch.tensor(w, requires_grad=True),
                  None if b is None else torch.tensor(b, requires_grad=True)]
              for n, (w, b) in self.params.items()}
        xx = torch.tensor(x.astype(np.float64))
        ivv = torch.tensor(iv.astype(np.float64))
        rows, outs, bn = {}, {}, {}

        def at(a, start, lo, hi, off):  # frames lo..hi (+ off) of a (frames from start)
            return a[:, lo + off - start: hi + off - start + 1, :]

        def affine(name, inp):
            w, b = tt[name]
            z = inp @ w.T + (b if b is not None else 0.0)
            z.retain_grad()
            rows[name], outs[name] = inp.reshape(-1, inp.shape[-1]), z
            return z

        def batchnorm(name, a):
            flat = a.reshape(-1, a.shape[-1])
            mean, uvar = flat.mean(0), (flat * flat).mean(0)
            bn[name] = (flat.shape[0], mean.detach().numpy(), uvar.detach().numpy())
            var = torch.clamp(uvar - mean * mean, min=0.0)
            return (a - mean) / torch.sqrt(var + EPSILON)

        # tdnn1 at t = -1..T (tdnnf2.linear needs -1..T, the bypass 0..T-1)
        frames1 = T + 2
        ivec = ivv[:, None, :].expand(N, frames1, DIM_IV)   # ReplaceIndex(ivector, t, 0)
        spliced = torch.cat([at(xx, -LEFT, -1, T, o) for o in (-1, 0, 1)] + [ivec], -1)
        b1 = batchnorm("tdnn1.batchnorm", torch.relu(affine("tdnn1.affine", spliced)))
        z2 = affine("tdnnf2.linear", torch.cat([at(b1, -1, 0, T, o) for o in (-1, 0)], -1))
        z3 = affine("tdnnf2.affine", torch.cat([at(z2, 0, 0, T - 1, o) for o in (0, 1)], -1))
        b3 = batchnorm("tdnnf2.batchnorm", torch.relu(z3))
        noop = 0.66 * at(b1, -1, 0, T - 1, 0) + b3
        z5 = torch.relu(affine("prefinal.affine", affine("prefinal-l", noop)))
        out = torch.log_softmax(affine("output.affine", z5), -1).reshape(N * T, NUM_OUT)
        objective = (torch.tensor(sup.astype(np.float64)) * out).sum()
        objective.backward()
        grads = {n: (rows[n].detach().numpy(),
                     outs[n].grad.reshape(-1, outs[n].shape[-1]).numpy()) for n in rows}
        return grads, bn, float(objective.detach())

    def _pass(self, x, iv, sup, frozen: bool) -> float:
        """Forward (BatchNorm stats into the model) and backward (lr times the
        preconditioned gradient into the delta)."""
        grads, bn, objective = self._gradients(x, iv, sup)
        for n, (count, mean, uvar) in bn.items():   # StoreStats
            s = self.bn[n]
            s[0] += count
            s[1] = s[1] + count * mean
            s[2] = s[2] + count * uvar
        for n, (bias, ng, _) in LAYERS.items():
            xin, dy = grads[n]
            if bias:
                xin = np.hstack([xin, np.ones((len(xin), 1))])
            if ng:
                for p in self.pre[n]:
                    p.freeze(frozen)
                x_hat, s_in = self.pre[n][0].precondition(xin.astype(np.float32))
                dy_hat, s_out = self.pre[n][1].precondition(dy.astype(np.float32))
                g = s_in * s_out * (dy_hat.astype(np.float64).T @ x_hat.astype(np.float64))
            else:
                g = dy.T @ xin
            dw, db = self.delta[n]
            dw += self.lr[n] * g[:, :dw.shape[1]]
            if db is not None:
                db += self.lr[n] * g[:, dw.shape[1]]
        return objective

    # the nnet-utils.cc pieces ---------------------------------------------------------------
    def _l2(self, scale: float) -> None:
        for n in LAYERS:
            s = -2.0 * scale * self.lr[n] * self.l2[n]
            for d, p in zip(self.delta[n], self.params[n], strict=True):
                if d is not None:
                    d += s * p

    def _update(self, max_change_scale: float, scale: float) -> None:
        sq = {n: sum(float(np.sum(d * d)) for d in self.delta[n] if d is not None)
              for n in LAYERS}
        factors = {}
        for n in LAYERS:
            mc, norm = self.max_change[n], math.sqrt(sq[n])
            factors[n] = (mc * max_change_scale / (norm * abs(scale))
                          if mc != 0.0 and norm * abs(scale) > mc * max_change_scale else 1.0)
            if factors[n] < 1.0:
                self.too_big.append((n, norm, scale, mc, max_change_scale, factors[n]))
        total = math.sqrt(sum(factors[n] ** 2 * sq[n] for n in LAYERS)) * abs(scale)
        limit = self.opts.max_param_change * max_change_scale
        glob = limit / total if self.opts.max_param_change != 0.0 and total > limit else 1.0
        self.factors.append((factors, glob))
        for n in LAYERS:
            for d, p in zip(self.delta[n], self.params[n], strict=True):
                if d is not None:
                    p += scale * glob * factors[n] * d

    def _scale_batchnorm(self) -> None:
        s = self.opts.batchnorm_stats_scale
        for st in self.bn.values():
            st[0] *= s
            st[1] = st[1] * s
            st[2] = st[2] * s

    def _constrain(self, names) -> None:
        for n in LAYERS:   # (the network's component order)
            if n in names and LAYERS[n][2] != 0.0:
                self.params[n][0], ratio = kaldi_constrain(self.params[n][0], LAYERS[n][2])
                if ratio is not None:
                    self.ratios[n].append(ratio)

    def _scale_delta(self, factor: float) -> None:
        for ds in self.delta.values():
            for d in ds:
                if d is not None:
                    d *= factor

    # NnetTrainer::Train -----------------------------------------------------------------
    def train(self, x, iv, sup, constrained) -> tuple[float, bool]:
        o = self.opts
        s = o.backstitch_training_scale
        backstitch = (s > 0.0 and self.minibatches % o.backstitch_training_interval
                      == self.srand_seed % o.backstitch_training_interval)
        num_n = N
        if backstitch:
            objective = self._pass(x, iv, sup, frozen=True)
            self._update(s, -s)
            self._constrain(constrained)
            self._scale_delta(0.0)
            self._pass(x, iv, sup, frozen=False)
            self._l2(1.0 / (1.0 + s) * num_n * o.l2_regularize_factor)
            self._update(1.0 + s, 1.0 + s)
            self._scale_batchnorm()
            self._scale_delta(0.0)
        else:
            objective = self._pass(x, iv, sup, frozen=False)
            self._l2(num_n * o.l2_regularize_factor)
            self._update(1.0, 1.0 - o.momentum)
            self._scale_batchnorm()
            self._constrain(constrained)
            self._scale_delta(o.momentum)
        self.minibatches += 1
        return objective, backstitch


# -- the tests ------------------------------------------------------------------------------

SCHEDULE = [CONSTRAINED, ["tdnnf2.affine", "prefinal-l", "prefinal.affine", "output.affine"]]


def _run(opts: TrainerOptions, schedule=SCHEDULE, max_change: dict | None = None):
    """Train the network two steps with the trainer and the reference side by side,
    checking each step; ``max_change``: per-component max-change values to set first.
    Returns the network, the trainer, the reference, whether each step backstitched
    and the trainer's TrainStats."""
    nnet = _net()
    for name, value in (max_change or {}).items():
        nnet.components[name].max_change = value
    trainer = Trainer(nnet, opts)
    ref = KaldiTrainer(nnet, opts, trainer.srand_seed)
    req = _request()
    log, all_stats = [], []
    for step, constrained in enumerate(schedule):
        x, iv, sup = _minibatch(30 + step)
        before = _weights(nnet)
        stats = trainer.train_step(req, {"input": x.reshape(-1, DIM_IN), "ivector": iv},
                                   {"output": sup}, orthonormal_constraint_applied_to=constrained)
        objective, backstitch = ref.train(x, iv, sup, constrained)
        assert stats.objective == pytest.approx(objective, rel=1e-5)
        assert stats.orthonormal_constrained == [n for n in constrained if n in CONSTRAINED]
        assert bool(stats.backstitch_outputs) == backstitch
        got = _weights(nnet)
        for n in LAYERS:
            for k, (g, w, b) in enumerate(zip(got[n], ref.params[n], before[n], strict=True)):
                if g is None:
                    continue
                err = float(np.linalg.norm(g - w))
                change = float(np.linalg.norm(w - b))
                # the float32 trainer against float64: 1e-6 of the parameters, and the
                # gradient's float32 noise on the step's change
                assert err <= 1e-6 * np.linalg.norm(w) + 1e-4 * change, (step, n, k, err, change)
        for n in BATCHNORMS:
            count, s, sq = ref.bn[n]
            bn = nnet.components[n]
            assert float(bn.count) == pytest.approx(count, rel=1e-6)
            np.testing.assert_allclose(bn.stats_sum, s, rtol=1e-5, atol=1e-5 * count)
            np.testing.assert_allclose(bn.stats_sumsq, sq, rtol=1e-5, atol=1e-5 * count)
        log.append(backstitch)
        all_stats.append(stats)
    return nnet, trainer, ref, log, all_stats


def _regimes(ref: KaldiTrainer) -> set:
    return {int(r > 1.02) + int(r > 1.1) for rs in ref.ratios.values() for r in rs}


@pytest.mark.parametrize("momentum,max_param_change,bn_scale", [
    (0.0, 2.0, 0.8),
    (0.4, 0.3, 0.6),    # momentum; the global max-change binds
])
def test_two_steps_with_the_orthonormal_constraint_match_kaldi(momentum, max_param_change,
                                                                bn_scale):
    opts = TrainerOptions(momentum=momentum, max_param_change=max_param_change,
                          l2_regularize_factor=0.5, batchnorm_stats_scale=bn_scale)
    _, _, ref, log, _ = _run(opts)
    assert log == [False, False]
    # all three update-speed regimes of the floating constraint were exercised
    assert _regimes(ref) == {0, 1, 2}
    if max_param_change < 1.0:
        assert all(glob < 1.0 for _, glob in ref.factors)


@pytest.mark.parametrize("interval", [1, 2])
def test_two_backstitch_steps_with_the_orthonormal_constraint_match_kaldi(interval):
    opts = TrainerOptions(backstitch_training_scale=0.3, backstitch_training_interval=interval,
                          max_param_change=0.6, l2_regularize_factor=0.5,
                          batchnorm_stats_scale=0.7)
    _, _, ref, log, _ = _run(opts)
    assert log == ([True, True] if interval == 1 else
                   [ref.srand_seed % 2 == 0, ref.srand_seed % 2 == 1])


# -- what Kaldi says and where it stops ------------------------------------------------------

@pytest.mark.parametrize("backstitch", [0.0, 0.3])
def test_max_change_verbose_lines_as_kaldis(backstitch):
    """UpdateNnetWithMaxChange's VLOG(2) line for each component it scales down, in
    both backstitch passes too: the delta's norm, the scale it is added with (``1 -
    momentum``; ``-s`` then ``1 + s``), max-change and its scale (1; ``s`` then
    ``1 + s``), the factor."""
    import re

    opts = TrainerOptions(backstitch_training_scale=backstitch, max_param_change=0.0,
                          momentum=0.0 if backstitch else 0.5)
    _, _, ref, _, all_stats = _run(opts, max_change={"tdnn1.affine": 0.05,
                                                     "output.affine": 0.02})
    pattern = (r"Parameters in (\S+) change too big: (\S+) \* (\S+) > max-change \* "
               r"max-change-scale=(\S+) \* (\S+), scaling by (\S+)")
    got = [re.fullmatch(pattern, line).groups() for st in all_stats for line in st.verbose_lines]
    assert len(got) == len(ref.too_big) >= (8 if backstitch else 4)
    for g, (name, norm, scale, mc, mcs, factor) in zip(got, ref.too_big, strict=True):
        assert g[0] == name
        np.testing.assert_allclose([float(v) for v in g[1:]], [norm, scale, mc, mcs, factor],
                                   rtol=2e-5)

def test_floating_constraint_warns_as_kaldi_when_it_slows_down():
    """ConstrainOrthonormalInternal warns (once, with the speed before halving) for
    each matrix whose eigenvalue ratio is above 1.02, naming the component; the fixed
    scales and a ratio below 1.02 say nothing."""
    import re

    opts = TrainerOptions(max_param_change=2.0)
    nnet = _net()
    trainer = Trainer(nnet, opts)
    ref = KaldiTrainer(nnet, opts, trainer.srand_seed)
    x, iv, sup = _minibatch(30)
    stats = trainer.train_step(_request(), {"input": x.reshape(-1, DIM_IN), "ivector": iv},
                               {"output": sup}, orthonormal_constraint_applied_to=CONSTRAINED)
    ref.train(x, iv, sup, CONSTRAINED)
    want = [(n, rs[0]) for n, rs in ref.ratios.items() if rs and rs[0] > 1.02]
    assert {n for n, _ in want} == {"tdnnf2.affine", "prefinal.affine"}  # (not tdnnf2.linear)
    pattern = (r"Ratio is (\S+), multiplying update speed \(currently 0\.125\) by 0\.5; "
               r"component is (\S+)")
    got = [re.fullmatch(pattern, w).groups() for w in stats.warnings]
    assert [n for _, n in got] == [n for n, _ in want]
    for (ratio, _), (_, r) in zip(got, want, strict=True):
        assert float(ratio) == pytest.approx(r, rel=2e-5)


def test_cli_prints_the_constraint_warnings(tmp_path, capsys):
    from pynnet3.cli.main import main
    from pynnet3.io.egs import ExampleWriter, NnetExample, NnetIo
    from pynnet3.io.egs_merge import merge_examples

    nnet = _net()
    nnet.write(tmp_path / "in.mdl", binary=True)
    with ExampleWriter(f"ark:{tmp_path / 'egs.ark'}") as writer:
        for b in range(12):  # (each constrained matrix is drawn about one step in four)
            x, iv, sup = _minibatch(b)
            egs = [NnetExample([NnetIo.from_matrix("input", -LEFT, x[n]),
                                NnetIo.from_matrix("ivector", 0, iv[n:n + 1]),
                                NnetIo.from_labels("output", NUM_OUT, 0,
                                                   sup[n * T:(n + 1) * T].argmax(1))])
                   for n in range(N)]
            writer.write(f"mb{b}", merge_examples(egs))
    assert main(["train", "--use-gpu=no", str(tmp_path / "in.mdl"),
                 f"ark:{tmp_path / 'egs.ark'}", str(tmp_path / "out.mdl")]) == 0
    err = capsys.readouterr().err
    assert "WARNING (pynnet3 train) Ratio is " in err
    assert "by 0.5; component is prefinal.affine" in err


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_floating_constraint_on_a_matrix_not_finite_stops_training(bad):
    """Kaldi's KALDI_ASSERT(ratio > 0.9): a floating-scale matrix holding a NaN or an
    infinity has a NaN ratio, and nnet3-train stops there (a fixed scale has no such
    check: its NaNs stay)."""
    from pynnet3.errors import TrainingError
    from pynnet3.train.update import constrain_orthonormal

    nnet = _net()
    nnet.components["prefinal.affine"].linear_params[0, 0] = bad
    nnet.components["prefinal-l"].params_[0, 0] = bad
    rng = np.random.default_rng(0)
    with np.errstate(invalid="ignore"):
        assert constrain_orthonormal(nnet, rng, ["prefinal-l"]) == ["prefinal-l"]
    with pytest.raises(TrainingError, match="'prefinal.affine'"):
        constrain_orthonormal(nnet, rng, ["prefinal.affine"])
