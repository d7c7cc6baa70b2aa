"""Review: LstmNonlinearityComponent's training backprop against Kaldi's formulas.

The reference below is a float64 NumPy transcription of what Kaldi's
``CpuBackpropLstmNonlinearity`` (src/cudamatrix/cu-math.cc) computes, written from
reading it: per cell, self-repair is ON for nonlinearity k when
``deriv_sum_in[k] / (1 + count_in) < threshold[k]`` (the stats of the model that
runs the backprop, not of the component being updated), and then adds
``-scale[k] * (2 sigmoid - 1)`` (gates) or ``-scale[k] * tanh`` (the two tanh's)
to the derivative of that nonlinearity's input; the peephole derivatives are
``sum_rows(c_prev * di_t_input)``, ``sum_rows(c_prev * df_t_input)``,
``sum_rows(c_t * do_t_input)``; the component being updated gains the value and
derivative sums, ``num_rows`` per (nonlinearity, cell) where repair was ON, and
``num_rows`` in its count (LstmNonlinearityComponent::Backprop, nnet-combined-component.cc).
"""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.preconditioning import PreconditionedGrad
from tests.components.common import from_config


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def kaldi_backprop(x, params, out_deriv, deriv_sum_in, count_in, sr_config):
    """float64 transcription of Kaldi's CpuBackpropLstmNonlinearity."""
    x = x.astype(np.float64)
    w = params.astype(np.float64)
    od = out_deriv.astype(np.float64)
    rows, cols = x.shape
    c = cols // 5
    ones = np.ones((rows, 1))
    i_s, f_s, o_s = ((ones, ones, ones) if cols == 5 * c else
                     (x[:, 5 * c:5 * c + 1], x[:, 5 * c + 1:5 * c + 2], x[:, 5 * c + 2:5 * c + 3]))
    i_part, f_part, c_part, o_part, c_prev = (x[:, k * c:(k + 1) * c] for k in range(5))
    count = 1.0 + count_in
    on = deriv_sum_in / count < sr_config[:5, None]          # [5, C]
    sr = np.where(on, sr_config[5:, None], 0.0)
    i_t = _sigmoid(i_part + w[0] * c_prev)
    f_t = _sigmoid(f_part + w[1] * c_prev)
    tanh_c_part = np.tanh(c_part)
    c_t = f_t * f_s * c_prev + i_t * i_s * tanh_c_part
    o_t = _sigmoid(o_part + w[2] * c_t)
    tanh_c_t = np.tanh(c_t)
    dc_t_out, dm_t = od[:, :c], od[:, c:]
    dtanh_c_t = o_t * o_s * dm_t
    do_t = o_s * tanh_c_t * dm_t
    do_t_input = o_t * (1 - o_t) * do_t - (2 * o_t - 1) * sr[3]
    dc_t = (1 - tanh_c_t ** 2) * dtanh_c_t + dc_t_out + do_t_input * w[2] - tanh_c_t * sr[4]
    dtanh_c_part = i_t * i_s * dc_t
    df_t = dc_t * f_s * c_prev
    df_t_input = df_t * f_t * (1 - f_t) - (2 * f_t - 1) * sr[1]
    di_t = dc_t * i_s * tanh_c_part
    di_t_input = di_t * i_t * (1 - i_t) - (2 * i_t - 1) * sr[0]
    in_deriv = np.zeros_like(x)
    in_deriv[:, :c] = di_t_input
    in_deriv[:, c:2 * c] = df_t_input
    in_deriv[:, 2 * c:3 * c] = (1 - tanh_c_part ** 2) * dtanh_c_part - tanh_c_part * sr[2]
    in_deriv[:, 3 * c:4 * c] = do_t_input
    in_deriv[:, 4 * c:5 * c] = w[0] * di_t_input + w[1] * df_t_input + f_t * f_s * dc_t
    params_deriv = np.stack([(c_prev * di_t_input).sum(0), (c_prev * df_t_input).sum(0),
                             (c_t * do_t_input).sum(0)])
    value_sum = np.stack([v.sum(0) for v in (i_t, f_t, tanh_c_part, o_t, tanh_c_t)])
    deriv_sum = np.stack([(i_t * (1 - i_t)).sum(0), (f_t * (1 - f_t)).sum(0),
                          (1 - tanh_c_part ** 2).sum(0), (o_t * (1 - o_t)).sum(0),
                          (1 - tanh_c_t ** 2).sum(0)])
    self_repair_total = (on * rows).sum(axis=1)              # AddColSumMat over cells
    return in_deriv, params_deriv, value_sum, deriv_sum, self_repair_total


def _component(use_dropout: bool, cells: int = 4):
    comp = from_config("component name=c type=LstmNonlinearityComponent "
                       f"cell-dim={cells} self-repair-scale=0.01 param-stddev=0.7 "
                       f"use-dropout={str(use_dropout).lower()}", seed=5)
    # model statistics with self-repair ON for some (nonlinearity, cell) and OFF for
    # others, well away from the thresholds: average derivative d_avg * count / (1 +
    # count) against 0.05 (sigmoids) and 0.2 (tanh's).
    comp.count = 9.0
    avg = np.array([[0.01, 0.20, 0.01, 0.20],      # i_t: on, off, on, off
                    [0.20, 0.01, 0.20, 0.01],      # f_t
                    [0.05, 0.90, 0.90, 0.05],      # tanh(c_part)
                    [0.01, 0.01, 0.20, 0.20],      # o_t
                    [0.90, 0.05, 0.05, 0.90]],     # tanh(c_t)
                   np.float32)[:, :cells]
    comp.deriv_avg = avg.copy()
    comp.value_avg = np.full_like(avg, 0.3)
    comp.self_repair_prob = np.full(5, 0.25, np.float32)
    return comp


@pytest.mark.parametrize("use_dropout", [False, True])
def test_training_backprop_matches_kaldis_formulas(use_dropout):
    comp = _component(use_dropout)
    c = comp.cell_dim
    rng = np.random.default_rng(11)
    rows = 7
    x = rng.standard_normal((rows, comp.input_dim)).astype(np.float32)
    if use_dropout:
        x[:, 5 * c:] = rng.choice([0.0, 2.0], (rows, 3)).astype(np.float32)
    out = np.zeros((rows, 2 * c), np.float32)
    comp.propagate(None, x, out)
    od = rng.standard_normal(out.shape).astype(np.float32)
    stats: dict = {}
    grad = PreconditionedGrad([("params", np.zeros((3, c), np.float32))], None, stats)
    in_deriv = np.full_like(x, np.nan)
    comp.backprop(None, x, out, od, None, grad, in_deriv)

    ref = kaldi_backprop(x, comp.params_, od,
                         comp.deriv_avg.astype(np.float64) * comp.count, comp.count,
                         comp.self_repair_config.astype(np.float64))
    ref_in, ref_params, ref_values, ref_derivs, ref_repair = ref
    # some units repaired, some not: the reference's switch is exercised both ways
    on = comp.deriv_avg * comp.count / (1 + comp.count) < comp.self_repair_config[:5, None]
    assert on.any() and not on.all()
    np.testing.assert_allclose(in_deriv[:, :5 * c], ref_in[:, :5 * c], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(grad["params"], ref_params, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(stats["value_sum"], ref_values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["deriv_sum"], ref_derivs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(stats["self_repair_total"], ref_repair)
    assert stats["count"] == rows
    # a second backprop call (another time step) adds to the same statistics
    comp.backprop(None, x, out, od, None, grad, in_deriv)
    assert stats["count"] == 2 * rows
    np.testing.assert_array_equal(stats["self_repair_total"], 2 * ref_repair)
    np.testing.assert_allclose(grad["params"], 2 * ref_params, rtol=2e-5, atol=4e-6)


def test_backprop_without_update_repairs_but_collects_nothing():
    """Kaldi's Backprop with to_update == NULL (kBackpropNoModelUpdate, e.g. the
    per-time-step derivative commands left by ConsolidateModelUpdate) still applies
    self-repair to the input derivative (from the model's stats) but stores no stats."""
    comp = _component(False)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, comp.input_dim)).astype(np.float32)
    out = np.zeros((5, comp.output_dim), np.float32)
    comp.propagate(None, x, out)
    od = rng.standard_normal(out.shape).astype(np.float32)
    in_deriv = np.zeros_like(x)
    before = (comp.count, comp.deriv_avg.copy(), comp.value_avg.copy())
    comp.backprop(None, x, out, od, None, None, in_deriv)
    ref_in = kaldi_backprop(x, comp.params_, od, comp.deriv_avg.astype(np.float64) * 9.0, 9.0,
                            comp.self_repair_config.astype(np.float64))[0]
    np.testing.assert_allclose(in_deriv, ref_in, rtol=2e-5, atol=2e-6)
    assert comp.count == before[0]
    np.testing.assert_array_equal(comp.deriv_avg, before[1])
    np.testing.assert_array_equal(comp.value_avg, before[2])
