"""Review: UpdateNnetWithMaxChange and the updatable components' config values, where
pynnet3 differed from Kaldi's sources (nnet-utils.cc, nnet-component-itf.cc):

* the log line: Kaldi writes its "Global max-change factor was ..." part whenever
  ``param_delta > max-param-change * max-change-scale``, also with
  ``--max-param-change=0`` (global max-change off) when a per-component max-change
  was active: the factor printed is then 0;
* the squared norms are BaseFloat sums: a delta whose sum of squares overflows
  float32 has an infinite norm, its per-component factor is ``max-change / inf = 0``
  and the global norm ``0 * inf`` is NaN (no global max-change): that component does
  not move while the others take their step; with no per-component max-change the
  global norm is infinite and "Infinite parameter change, will not apply." (a
  warning) leaves the network as it was;
* InitLearningRatesFromConfig, which every updatable type's InitFromConfig calls
  (TdnnComponent, TimeHeightConvolution, the LSTM and GRU nonlinearities included),
  refuses a negative learning-rate, learning-rate-factor, max-change or
  l2-regularize ("Bad initializer") and keeps them as float32; UpdateNnetWithMaxChange
  asserts ``max-change >= 0`` (a model file can hold a negative one), and
  ApplyL2Regularization asserts a non-negative learning rate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pynnet3 import ComputationRequest, Nnet
from pynnet3.errors import ConfigError, TrainingError
from pynnet3.train import Trainer, TrainerOptions
from pynnet3.train.update import update_with_max_change

TWO = """input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=4 max-change={mc_a} \
learning-rate=0.5
component-node name=a component=a input=input
component name=b type=AffineComponent input-dim=4 output-dim=2 learning-rate=0.0
component-node name=b component=b input=a
output-node name=output input=b objective=quadratic
"""


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    req = ComputationRequest.from_frames(range(5), range(5), 2)
    x = rng.standard_normal((10, 3)).astype(np.float32)
    y = (5.0 * rng.standard_normal((10, 2))).astype(np.float32)
    return req, x, y


def test_log_line_with_global_max_change_off_ends_as_kaldis():
    nnet = Nnet.from_config(TWO.format(mc_a=0.01), seed=1)
    req, x, y = _batch()
    a, b = nnet.components["a"], nnet.components["b"]
    wa, ba = a.linear_params.astype(np.float64), a.bias_params.astype(np.float64)
    wb, bb = b.linear_params.astype(np.float64), b.bias_params.astype(np.float64)
    # the delta of 'a' by hand: quadratic objective, plain SGD (AffineComponent)
    h = x @ wa.T + ba
    dh = (y - (h @ wb.T + bb)) @ wb
    norm = 0.5 * math.sqrt(float(np.sum((dh.T @ x) ** 2) + np.sum(dh.sum(0) ** 2)))
    factor = 0.01 / norm
    trainer = Trainer(nnet, TrainerOptions(max_param_change=0.0))
    stats = trainer.train_step(req, {"input": x}, {"output": y})
    want = (f"Per-component max-change active on 1 / 2 Updatable Components. "
            f"(Smallest factor={factor:.6g} on a with max-change=0.01). "
            f"Global max-change factor was 0 with max-change=0.")
    assert stats.log_lines == [want]
    assert stats.global_scale == 1.0  # (off: nothing scaled globally, nothing counted)
    assert trainer.max_change_counts.num_global == 0


def test_no_log_line_when_no_max_change_was_active():
    nnet = Nnet.from_config(TWO.format(mc_a=0.0), seed=1)
    req, x, y = _batch()
    stats = Trainer(nnet, TrainerOptions(max_param_change=0.0)).train_step(
        req, {"input": x}, {"output": y})
    assert stats.log_lines == [] and stats.message == ""


def _overflowing(mc_a: float):
    """A network and a delta whose 'a' part has a float32-overflowing sum of squares
    (each element 1e19 is finite; 16 of their squares sum beyond 3.4e38)."""
    nnet = Nnet.from_config(TWO.format(mc_a=mc_a), seed=1)
    nnet.components["b"].max_change = 0.5
    big = {"linear_params": np.full((4, 3), 1e19, np.float32),
           "bias_params": np.full(4, 1e19, np.float32)}
    small = {"linear_params": np.full((2, 4), 0.01, np.float32),
             "bias_params": np.full(2, 0.01, np.float32)}
    return nnet, {"a": big, "b": small}


def test_overflowing_norm_with_per_component_max_change_leaves_that_component():
    nnet, delta = _overflowing(0.75)
    before = {n: {k: v.copy() for k, v in c.params().items()}
              for n, c in nnet.components.items()}
    result = update_with_max_change(nnet, delta, max_param_change=2.0)
    assert result.applied
    assert result.scales == {"a": 0.0, "b": 1.0} and result.global_scale == 1.0
    for key, p in nnet.components["a"].params().items():
        np.testing.assert_array_equal(p, before["a"][key])
    for key, p in nnet.components["b"].params().items():
        np.testing.assert_allclose(p, before["b"][key] + delta["b"][key], rtol=1e-6)
    assert result.message == ("Per-component max-change active on 1 / 2 Updatable "
                              "Components. (Smallest factor=0 on a with max-change=0.75). ")


def test_overflowing_norm_without_per_component_max_change_applies_nothing():
    nnet, delta = _overflowing(0.0)
    before = {n: {k: v.copy() for k, v in c.params().items()}
              for n, c in nnet.components.items()}
    result = update_with_max_change(nnet, delta, max_param_change=2.0)
    assert not result.applied
    assert result.message == "Infinite parameter change, will not apply."
    for name, comp in nnet.components.items():
        for key, p in comp.params().items():
            np.testing.assert_array_equal(p, before[name][key])


def test_infinite_change_is_a_warning_of_the_step():
    nnet = Nnet.from_config(TWO.format(mc_a=0.0), seed=1)
    nnet.components["a"].learning_rate = 1e36  # (a step that cannot be taken)
    req, x, y = _batch()
    before = nnet.components["a"].linear_params.copy()
    stats = Trainer(nnet, TrainerOptions()).train_step(req, {"input": x}, {"output": y})
    assert not stats.applied
    assert stats.warnings == ["Infinite parameter change, will not apply."]
    assert stats.log_lines == []
    np.testing.assert_array_equal(nnet.components["a"].linear_params, before)


@pytest.mark.parametrize("line", [
    "type=TdnnComponent input-dim=4 output-dim=3 time-offsets=0 max-change=-0.5",
    "type=TdnnComponent input-dim=4 output-dim=3 time-offsets=0 l2-regularize=-0.01",
    "type=TdnnComponent input-dim=4 output-dim=3 time-offsets=0 learning-rate=-1",
    "type=TdnnComponent input-dim=4 output-dim=3 time-offsets=0 learning-rate-factor=-1",
    "type=TimeHeightConvolutionComponent num-filters-in=2 num-filters-out=1 height-in=2 "
    "height-out=2 time-offsets=0 height-offsets=0 max-change=-1",
])
def test_negative_learning_rate_values_are_bad_initializers(line):
    config = (f"input-node name=input dim=4\ncomponent name=c {line}\n"
              f"component-node name=c component=c input=input\n"
              f"output-node name=output input=c\n")
    with pytest.raises(ConfigError, match="must be >= 0"):
        Nnet.from_config(config, seed=1)


def test_tdnn_config_values_are_float32_as_kaldis():
    config = ("input-node name=input dim=4\ncomponent name=c type=TdnnComponent "
              "input-dim=4 output-dim=3 time-offsets=0 orthonormal-constraint=0.1 "
              "l2-regularize=0.03 max-change=0.7 learning-rate=0.003 alpha-in=3.3\n"
              "component-node name=c component=c input=input\n"
              "output-node name=output input=c\n")
    c = Nnet.from_config(config, seed=1).components["c"]
    for attr, value in (("orthonormal_constraint", 0.1), ("l2_regularize", 0.03),
                        ("max_change", 0.7), ("learning_rate", 0.003), ("alpha_in", 3.3)):
        assert getattr(c, attr) == float(np.float32(value)) != value, attr


def test_negative_max_change_in_a_model_stops_training():
    nnet = Nnet.from_config(TWO.format(mc_a=0.5), seed=1)
    nnet.components["a"].max_change = -0.5  # (as a model file can say)
    req, x, y = _batch()
    with pytest.raises(TrainingError, match="'a' has max-change -0.5"):
        Trainer(nnet, TrainerOptions()).train_step(req, {"input": x}, {"output": y})


def test_negative_learning_rate_stops_l2_regularization():
    nnet = Nnet.from_config(TWO.format(mc_a=0.5), seed=1)
    nnet.components["a"].learning_rate = -0.1
    req, x, y = _batch()
    with pytest.raises(TrainingError, match="'a' has learning rate -0.1"):
        Trainer(nnet, TrainerOptions()).train_step(req, {"input": x}, {"output": y})
    # (Kaldi's assertion is inside ApplyL2Regularization, which returns at once when
    # l2-regularize-factor is 0)
    Trainer(nnet, TrainerOptions(l2_regularize_factor=0.0)).train_step(
        req, {"input": x}, {"output": y})
