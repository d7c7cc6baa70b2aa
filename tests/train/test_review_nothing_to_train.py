"""Review of the trainer (issue 18): a network with no updatable component compiles
without a backward pass, and a training step on it failed with 'the computation does
not expect output derivative'. Kaldi's nnet3-train runs such a step (the objective is
computed, nothing changes); so does the trainer now. Expected objective: the
quadratic objective by hand. (Learning rate 0 everywhere: checked alongside.)"""

from __future__ import annotations

import numpy as np

from pynnet3 import Nnet
from pynnet3.io.egs import NnetExample, NnetIo
from pynnet3.train import Trainer
from pynnet3.train.examples import example_minibatch

_FIXED = """input-node name=input dim=4
component name=fa type=FixedAffineComponent input-dim=4 output-dim=3
component-node name=fa component=fa input=input
output-node name=output input=fa objective=quadratic"""


def _minibatch(nnet):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)
    eg = NnetExample([NnetIo.from_matrix("input", 0, x), NnetIo.from_matrix("output", 0, y)])
    return example_minibatch(nnet, eg), x.astype(np.float64), y.astype(np.float64)


def test_fixed_network_step_computes_the_objective_and_changes_nothing():
    nnet = Nnet.from_config(_FIXED, seed=0)
    before = nnet.to_bytes(True)
    mb, x, y = _minibatch(nnet)
    comp = nnet.components["fa"]
    w = np.asarray(comp.linear_params, np.float64)
    b = np.asarray(comp.bias_params, np.float64)
    stats = Trainer(nnet).train_step(mb.request, mb.inputs, mb.supervision)
    expected = -0.5 * float(np.sum((x @ w.T + b - y) ** 2))
    assert abs(stats.objective - expected) <= 1e-5 * abs(expected)
    assert stats.weight == 5.0
    assert nnet.to_bytes(True) == before


def test_learning_rate_zero_network_step_changes_nothing():
    nnet = Nnet.from_config(_FIXED.replace(
        "type=FixedAffineComponent input-dim=4 output-dim=3",
        "type=AffineComponent input-dim=4 output-dim=3"), seed=0)
    nnet.set_learning_rate(0.0)
    params = {k: v.copy() for k, v in nnet.components["fa"].params().items()}
    mb, _, _ = _minibatch(nnet)
    Trainer(nnet).train_step(mb.request, mb.inputs, mb.supervision)
    for k, v in nnet.components["fa"].params().items():
        np.testing.assert_array_equal(v, params[k])
