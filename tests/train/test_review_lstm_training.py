"""Review: training a network with a Kaldi ``fast-lstmp``-style LSTM layer, against an
independent re-derivation of what Kaldi's NnetTrainer does (two consecutive steps,
momentum, per-component and global max-change, an iVector input).

The layer is the one steps/libs/nnet3/xconfig/lstm.py writes (fast-lstm-layer): a
NaturalGradientAffineComponent ``W_all`` on ``Append(input, ivector, IfDefined(
Offset(m_trunc, -1)))``, a LstmNonlinearityComponent on ``Append(W_all,
IfDefined(Offset(c_trunc, -1)))``, and a BackpropTruncationComponent on the
nonlinearity's (c_t, m_t) whose ``scale`` is the decay-time factor of the recurrence.

The reference below is written from Kaldi's sources, not from pynnet3's code:

* forward and backward through time in float64, the LSTM per
  cu-math.cc (ComputeLstmNonlinearity, CpuBackpropLstmNonlinearity: self-repair ON
  where the MODEL's ``deriv_sum / (1 + count)`` is below the threshold),
  BackpropTruncationComponent::Backprop (nnet-general-component.cc: derivative
  times scale, each row clipped to norm ``clipping-threshold``, rows at a zeroing
  boundary ``floor((t-n)/zi) != floor((t-1-n)/zi)`` zeroed when their norm exceeds
  ``zeroing-threshold``);
* ConsolidateModelUpdate (Kaldi's default optimization): each updatable component
  of the recurrence updates ONCE per minibatch, on all its time steps' rows, so each
  preconditioner sees one call per minibatch: ``W_all`` and the output layer
  precondition ``[x | 1]`` and the output derivative (NaturalGradientAffineComponent::
  Update), the LSTM its 3 x C peephole derivative with rank 20, update period 2,
  1000 samples history (LstmNonlinearityComponent::InitNaturalGradient). The
  preconditioning itself is ``pynnet3.train.OnlineNaturalGradient``, checked against
  Kaldi on its own in test_natural_gradient.py / test_reference_step.py;
* NnetTrainer::TrainInternal / UpdateNnetWithMaxChange (nnet-training.cc,
  nnet-utils.cc): ``delta`` gains ``lr * scale * gradient``; per-component factor
  ``min(1, max-change / (||delta|| (1 - momentum)))``, global factor from the
  scaled norms against max-param-change; ``params += (1 - momentum) * global *
  factor * delta``; the LSTM's backprop statistics (accumulated in the delta
  network's component, LstmNonlinearityComponent::Backprop) are added to the model
  with that same factor (LstmNonlinearityComponent::Add); then ScaleNnet(momentum)
  keeps ``momentum`` times the delta, statistics included;
* the BackpropTruncation counters go to the model at full weight (the trainer's
  NnetComputer stores statistics in the model, nnet-compute.h).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pynnet3 import Nnet
from pynnet3.compiler.request import ComputationRequest, IoSpecification
from pynnet3.train import OnlineNaturalGradient, Trainer, TrainerOptions

N, T, X, IV, C, OUT = 3, 7, 3, 2, 4, 2
SCALE = 0.9          # decay-time: recurrence_scale = 1 - |delay| / decay_time
CLIP, ZTHR, ZINT = 0.35, 0.3, 3
LR = {"lstm.W_all": 0.2, "lstm.lstm_nonlin": 0.3, "out": 0.1}
MAX_CHANGE = {"lstm.W_all": 0.4, "lstm.lstm_nonlin": 0.01, "out": 1.5}
MOMENTUM, MAX_PARAM_CHANGE = 0.5, 0.6
SR_SCALE, SIG_THR, TANH_THR = 0.05, 0.2, 0.8

CONFIG = f"""input-node name=input dim={X}
input-node name=ivector dim={IV}
component name=lstm.W_all type=NaturalGradientAffineComponent input-dim={X + IV + C} \
output-dim={4 * C} max-change={MAX_CHANGE['lstm.W_all']} learning-rate={LR['lstm.W_all']}
component name=lstm.lstm_nonlin type=LstmNonlinearityComponent cell-dim={C} \
max-change={MAX_CHANGE['lstm.lstm_nonlin']} learning-rate={LR['lstm.lstm_nonlin']} \
self-repair-scale={SR_SCALE} sigmoid-self-repair-threshold={SIG_THR} \
tanh-self-repair-threshold={TANH_THR} param-stddev=0.5
component name=lstm.cm_trunc type=BackpropTruncationComponent dim={2 * C} \
clipping-threshold={CLIP} zeroing-threshold={ZTHR} zeroing-interval={ZINT} \
recurrence-interval=1 scale={SCALE}
component-node name=lstm.W_all component=lstm.W_all \
input=Append(input, ReplaceIndex(ivector, t, 0), IfDefined(Offset(lstm.m_trunc, -1)))
component-node name=lstm.lstm_nonlin component=lstm.lstm_nonlin \
input=Append(lstm.W_all, IfDefined(Offset(lstm.c_trunc, -1)))
dim-range-node name=lstm.m input-node=lstm.lstm_nonlin dim-offset={C} dim={C}
component-node name=lstm.cm_trunc component=lstm.cm_trunc input=lstm.lstm_nonlin
dim-range-node name=lstm.c_trunc input-node=lstm.cm_trunc dim-offset=0 dim={C}
dim-range-node name=lstm.m_trunc input-node=lstm.cm_trunc dim-offset={C} dim={C}
component name=out type=NaturalGradientAffineComponent input-dim={C} output-dim={OUT} \
max-change={MAX_CHANGE['out']} learning-rate={LR['out']}
component-node name=out component=out input=lstm.m
output-node name=output input=out objective=quadratic
"""


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _request():
    frames = [(n, t, 0) for n in range(N) for t in range(T)]
    return ComputationRequest(
        inputs=[IoSpecification("input", np.array(frames)),
                IoSpecification("ivector", np.array([(n, 0, 0) for n in range(N)]))],
        outputs=[IoSpecification("output", np.array(frames), has_deriv=True)])


def _data(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, T, X)).astype(np.float32)
    iv = rng.standard_normal((N, IV)).astype(np.float32)
    y = rng.standard_normal((N, T, OUT)).astype(np.float32)
    return x, iv, y


class KaldiLstmTrainer:
    """What Kaldi's NnetTrainer does to this network, step by step (module doc).
    ``l2``: the components' l2-regularize values (none by default)."""

    def __init__(self, nnet: Nnet, l2: dict | None = None):
        self.l2 = l2 or {}
        comps = nnet.components
        f64 = np.float64
        self.W = comps["lstm.W_all"].linear_params.astype(f64)
        self.b = comps["lstm.W_all"].bias_params.astype(f64)
        self.P = comps["lstm.lstm_nonlin"].params_.astype(f64)
        self.Wo = comps["out"].linear_params.astype(f64)
        self.bo = comps["out"].bias_params.astype(f64)
        self.sr_config = comps["lstm.lstm_nonlin"].self_repair_config.astype(f64)
        # model stats of the LSTM (zero-component-stats: zeroed), as sums
        self.value_sum = np.zeros((5, C))
        self.deriv_sum = np.zeros((5, C))
        self.self_repair_total = np.zeros(5)
        self.count = 0.0
        # the truncation component's counters in the model
        self.trunc = dict(num_clipped=0.0, count=0.0, num_zeroed=0.0, boundaries=0.0)
        # NaturalGradientAffineComponent::InitFromConfig's defaults: rank-in
        # min(20, (input-dim + 1) / 2), rank-out min(80, (output-dim + 1) / 2),
        # update-period 4, num-samples-history 2000, alpha 4
        na = dict(update_period=4, num_samples_history=2000.0, alpha=4.0)
        self.pre = {"W_in": OnlineNaturalGradient(min(20, (X + IV + C + 1) // 2), **na),
                    "W_out": OnlineNaturalGradient(min(80, (4 * C + 1) // 2), **na),
                    "o_in": OnlineNaturalGradient(min(20, (C + 1) // 2), **na),
                    "o_out": OnlineNaturalGradient(min(80, (OUT + 1) // 2), **na),
                    "lstm": OnlineNaturalGradient(20, 2, 1000.0)}
        self.delta = {"lstm.W_all": [np.zeros_like(self.W), np.zeros_like(self.b)],
                      "lstm.lstm_nonlin": [np.zeros_like(self.P)],
                      "out": [np.zeros_like(self.Wo), np.zeros_like(self.bo)]}
        self.delta_stats = None
        self.factors = []     # (per-component factors, global factor) per step
        self.repair_on = []   # the LSTM's self-repair switches per step
        self.repair_margin = []  # ... and their distance to the thresholds

    def step(self, x, iv, y):
        x, iv, y = (a.astype(np.float64) for a in (x, iv, y))
        W, b, P, Wo, bo = self.W, self.b, self.P, self.Wo, self.bo
        ratio = self.deriv_sum / (1.0 + self.count)
        on = ratio < self.sr_config[:5, None]
        self.repair_on.append(on)
        self.repair_margin.append(np.abs(ratio - self.sr_config[:5, None]).min())
        sr = np.where(on, self.sr_config[5:, None], 0.0)
        # -- forward --
        c_tr, m_tr = np.zeros((N, C)), np.zeros((N, C))   # IfDefined at t = -1: zero
        saved = []
        for t in range(T):
            w_in = np.hstack([x[:, t], iv, m_tr])
            a = w_in @ W.T + b
            c_prev = c_tr
            i_t = _sigmoid(a[:, :C] + P[0] * c_prev)
            f_t = _sigmoid(a[:, C:2 * C] + P[1] * c_prev)
            tc = np.tanh(a[:, 2 * C:3 * C])
            c_t = f_t * c_prev + i_t * tc
            o_t = _sigmoid(a[:, 3 * C:] + P[2] * c_t)
            tct = np.tanh(c_t)
            m_t = o_t * tct
            out = m_t @ Wo.T + bo
            saved.append((w_in, c_prev, i_t, f_t, tc, c_t, o_t, tct, m_t, out))
            c_tr, m_tr = SCALE * c_t, SCALE * m_t
        # -- backward --
        rows_w_in, rows_da, rows_m, rows_dy = [], [], [], []
        p_deriv = np.zeros((3, C))
        vsum, dsum = np.zeros((5, C)), np.zeros((5, C))
        d_ctr, d_mtr = np.zeros((N, C)), np.zeros((N, C))   # d/d (c_trunc, m_trunc)(t)
        for t in reversed(range(T)):
            w_in, c_prev, i_t, f_t, tc, c_t, o_t, tct, m_t, out = saved[t]
            dy = y[:, t] - out                               # quadratic objective
            dm = dy @ Wo
            dc_out = np.zeros((N, C))
            if t < T - 1:   # cm_trunc(t) feeds step t + 1 (none is computed at T - 1)
                d = SCALE * np.hstack([d_ctr, d_mtr])
                sq = (d * d).sum(1)
                clip = np.minimum(1.0, CLIP / np.sqrt(sq))
                boundary = np.array([(t - n) // ZINT != (t - 1 - n) // ZINT for n in range(N)])
                zero = boundary & (sq > ZTHR * ZTHR)
                d = d * (clip * ~zero)[:, None]
                self.trunc["num_clipped"] += np.count_nonzero(sq >= CLIP * CLIP)
                self.trunc["count"] += N
                self.trunc["num_zeroed"] += np.count_nonzero(zero)
                self.trunc["boundaries"] += np.count_nonzero(boundary)
                dc_out, dm = d[:, :C], dm + d[:, C:]
            dtct = o_t * dm
            do_in = o_t * (1 - o_t) * tct * dm - (2 * o_t - 1) * sr[3]
            dc = (1 - tct ** 2) * dtct + dc_out + do_in * P[2] - tct * sr[4]
            df_in = dc * c_prev * f_t * (1 - f_t) - (2 * f_t - 1) * sr[1]
            di_in = dc * tc * i_t * (1 - i_t) - (2 * i_t - 1) * sr[0]
            dcp = (1 - tc ** 2) * i_t * dc - tc * sr[2]
            da = np.hstack([di_in, df_in, dcp, do_in])
            d_ctr = P[0] * di_in + P[1] * df_in + f_t * dc
            d_mtr = (da @ W)[:, X + IV:]
            p_deriv += np.stack([(c_prev * di_in).sum(0), (c_prev * df_in).sum(0),
                                 (c_t * do_in).sum(0)])
            vsum += np.stack([v.sum(0) for v in (i_t, f_t, tc, o_t, tct)])
            dsum += np.stack([(i_t * (1 - i_t)).sum(0), (f_t * (1 - f_t)).sum(0),
                              (1 - tc ** 2).sum(0), (o_t * (1 - o_t)).sum(0),
                              (1 - tct ** 2).sum(0)])
            rows_w_in.append(w_in), rows_da.append(da), rows_m.append(m_t), rows_dy.append(dy)
        stats = dict(value_sum=vsum, deriv_sum=dsum,
                     self_repair_total=(on * (N * T)).sum(1), count=float(N * T))

        def affine(pin, pout, xs, dys):
            xa = np.hstack([np.vstack(xs), np.ones((N * T, 1))]).astype(np.float32)
            xh, s_in = self.pre[pin].precondition(xa)
            dh, s_out = self.pre[pout].precondition(np.vstack(dys).astype(np.float32))
            g = s_in * s_out * (dh.astype(np.float64).T @ xh.astype(np.float64))
            return [g[:, :-1], g[:, -1]]

        grads = {"lstm.W_all": affine("W_in", "W_out", rows_w_in, rows_da),
                 "out": affine("o_in", "o_out", rows_m, rows_dy)}
        ph, s = self.pre["lstm"].precondition(p_deriv.astype(np.float32))
        grads["lstm.lstm_nonlin"] = [s * ph.astype(np.float64)]
        # -- the update --
        for name, gs in grads.items():
            for dlt, g in zip(self.delta[name], gs, strict=True):
                dlt += LR[name] * g
        if self.delta_stats is None:
            self.delta_stats = stats
        else:
            self.delta_stats = {k: self.delta_stats[k] + stats[k] for k in stats}
        # ApplyL2Regularization: delta_component->Add(-2 * num_n * lr * l2, model
        # component); LstmNonlinearityComponent::Add adds the statistics too
        model = {"lstm.W_all": (self.W, self.b), "lstm.lstm_nonlin": (self.P,),
                 "out": (self.Wo, self.bo)}
        for name, l2 in self.l2.items():
            l2_scale = -2.0 * N * LR[name] * l2
            for dlt, p in zip(self.delta[name], model[name], strict=True):
                dlt += l2_scale * p
            if name == "lstm.lstm_nonlin":
                mine = dict(value_sum=self.value_sum, deriv_sum=self.deriv_sum,
                            self_repair_total=self.self_repair_total, count=self.count)
                self.delta_stats = {k: v + l2_scale * mine[k]
                                    for k, v in self.delta_stats.items()}
        scale = 1.0 - MOMENTUM
        norms = {k: math.sqrt(sum(float((d * d).sum()) for d in v)) for k, v in self.delta.items()}
        factors = {k: min(1.0, MAX_CHANGE[k] / (norms[k] * scale)) for k in norms}
        total = math.sqrt(sum((factors[k] * norms[k]) ** 2 for k in norms)) * scale
        glob = min(1.0, MAX_PARAM_CHANGE / total)
        self.factors.append((factors, glob))
        alpha = {k: scale * glob * factors[k] for k in norms}
        for name, params in (("lstm.W_all", (self.W, self.b)), ("lstm.lstm_nonlin", (self.P,)),
                             ("out", (self.Wo, self.bo))):
            for p, dlt in zip(params, self.delta[name], strict=True):
                p += alpha[name] * dlt
        a = alpha["lstm.lstm_nonlin"]
        self.value_sum += a * self.delta_stats["value_sum"]
        self.deriv_sum += a * self.delta_stats["deriv_sum"]
        self.self_repair_total += a * self.delta_stats["self_repair_total"]
        self.count += a * self.delta_stats["count"]
        for v in self.delta.values():
            for dlt in v:
                dlt *= MOMENTUM
        self.delta_stats = {k: MOMENTUM * v for k, v in self.delta_stats.items()}
        return on


def _train(steps=2, config=CONFIG, l2=None):
    nnet = Nnet.from_config(config, seed=7)
    ref = KaldiLstmTrainer(nnet, l2)
    trainer = Trainer(nnet, TrainerOptions(momentum=MOMENTUM, max_param_change=MAX_PARAM_CHANGE))
    req = _request()
    results = []
    for k in range(steps):
        x, iv, y = _data(100 + k)
        stats = trainer.train_step(req, {"input": x.reshape(N * T, X), "ivector": iv},
                                   {"output": y.reshape(N * T, OUT)})
        ref.step(x, iv, y)
        results.append(stats)
    return nnet, ref, results


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_two_lstm_steps_match_kaldis_trainer():
    nnet, ref, results = _train()
    comps = nnet.components
    # the cases this is meant to exercise did happen (in the reference's own figures)
    (f1, g1), (f2, g2) = ref.factors
    # per-component max-change on W_all and the LSTM nonlinearity, global max-change
    assert max(f1["lstm.W_all"], f2["lstm.W_all"]) < 1.0
    assert max(f1["lstm.lstm_nonlin"], f2["lstm.lstm_nonlin"]) < 1.0
    assert g1 < 1.0 and g2 < 1.0
    assert ref.repair_on[0].all()                                # zero stats: all ON
    assert ref.repair_on[1].any() and not ref.repair_on[1].all() # from step 1's stats
    assert ref.trunc["num_clipped"] > 0 and ref.trunc["num_zeroed"] > 0
    assert ref.trunc["num_clipped"] < ref.trunc["count"]
    # the self-repair switches of step 2 are not on a knife edge
    assert ref.repair_margin[1] > 5e-4
    # the factors, then the parameters after two steps
    for k, stats in enumerate(results):
        factors, glob = ref.factors[k]
        assert stats.global_scale == pytest.approx(glob, rel=1e-4)
        for name, f in factors.items():
            assert stats.max_change_scales[name] == pytest.approx(f, rel=1e-4)
    assert _rel(comps["lstm.W_all"].linear_params, ref.W) < 1e-5
    assert _rel(comps["lstm.W_all"].bias_params, ref.b) < 1e-5
    assert _rel(comps["lstm.lstm_nonlin"].params_, ref.P) < 1e-5
    assert _rel(comps["out"].linear_params, ref.Wo) < 1e-5
    assert _rel(comps["out"].bias_params, ref.bo) < 1e-5
    # the LSTM's statistics in the model (file form: count-normalized averages)
    lstm = comps["lstm.lstm_nonlin"]
    assert lstm.count == pytest.approx(ref.count, rel=1e-6)
    np.testing.assert_allclose(lstm.value_avg, ref.value_sum / ref.count, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lstm.deriv_avg, ref.deriv_sum / ref.count, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lstm.self_repair_prob, ref.self_repair_total / (ref.count * C),
                               rtol=1e-5)
    # the truncation counters: full weight, whatever momentum and max-change did
    trunc = comps["lstm.cm_trunc"]
    assert trunc.num_clipped == ref.trunc["num_clipped"]
    assert trunc.count == ref.trunc["count"] == 2 * N * (T - 1)
    assert trunc.num_zeroed == ref.trunc["num_zeroed"]
    assert trunc.count_zeroing_boundaries == ref.trunc["boundaries"]


def test_a_changed_parameter_change_would_be_seen():
    """The comparison above is sharp enough to see a missing piece: the step's
    parameter change without the LSTM's self-repair differs from Kaldi's by far more
    than the tolerance."""
    nnet, ref, _ = _train(1)
    before = Nnet.from_config(CONFIG, seed=7).components["lstm.lstm_nonlin"].params_
    change = ref.P - before
    plain = Nnet.from_config(CONFIG.replace(f"self-repair-scale={SR_SCALE}",
                                            "self-repair-scale=0"), seed=7)
    trainer = Trainer(plain, TrainerOptions(momentum=MOMENTUM,
                                            max_param_change=MAX_PARAM_CHANGE))
    x, iv, y = _data(100)
    trainer.train_step(_request(), {"input": x.reshape(N * T, X), "ivector": iv},
                       {"output": y.reshape(N * T, OUT)})
    other = plain.components["lstm.lstm_nonlin"].params_ - before
    got = nnet.components["lstm.lstm_nonlin"].params_ - before
    assert _rel(other, change) > 100 * max(_rel(got, change), 1e-6)


def test_l2_regularization_also_adds_the_lstm_statistics():
    """Kaldi's ApplyL2Regularization adds ``-2 * num_n * lr * l2`` times the model's
    component to the delta's with Component::Add, and LstmNonlinearityComponent::Add
    adds value/derivative sums, self-repair totals and count as well as the
    parameters (nnet-utils.cc, nnet-combined-component.cc): with l2-regularize on the
    nonlinearity (xconfig's lstm layers pass l2-regularize to it), the model's
    statistics after a second step hold that (negative) share of its statistics."""
    l2 = {"lstm.lstm_nonlin": 0.5, "lstm.W_all": 0.01}
    config = (CONFIG.replace("param-stddev=0.5",
                             f"param-stddev=0.5 l2-regularize={l2['lstm.lstm_nonlin']}")
              .replace(f"learning-rate={LR['lstm.W_all']}",
                       f"learning-rate={LR['lstm.W_all']} l2-regularize={l2['lstm.W_all']}"))
    nnet, ref, _ = _train(config=config, l2=l2)
    _, plain, _ = _train()
    lstm = nnet.components["lstm.lstm_nonlin"]
    # the L2 share is visible: the count is off the plain run's by far more than rounding
    assert abs(ref.count - plain.count) > 1e-3 * plain.count
    assert lstm.count == pytest.approx(ref.count, rel=1e-6)
    np.testing.assert_allclose(lstm.value_avg, ref.value_sum / ref.count, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lstm.deriv_avg, ref.deriv_sum / ref.count, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lstm.self_repair_prob, ref.self_repair_total / (ref.count * C),
                               rtol=1e-5)
    assert _rel(lstm.params_, ref.P) < 1e-5
    assert _rel(nnet.components["lstm.W_all"].linear_params, ref.W) < 1e-5
