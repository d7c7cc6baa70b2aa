"""Review: a network from ``optimize_network`` holding a fused kernel (an Affine with
an orthonormal constraint, fused with its ReLU and test-mode BatchNorm) trains with
the constraint on the kernel's linear layer; it used to be skipped (the kernel is no
AffineComponent), so the constrained layer drifted freely."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3 import ComputationRequest, Nnet
from pynnet3.components.fused import AffineReluComponent, linear_part
from pynnet3.train import Trainer, TrainerOptions
from pynnet3.train.update import constrain_orthonormal_matrix, orthonormal_constrained

NET = """input-node name=input dim=10
component name=a type=AffineComponent input-dim=10 output-dim=6 \
orthonormal-constraint=-1 learning-rate=0
component name=r type=RectifiedLinearComponent dim=6
component name=bn type=BatchNormComponent dim=6 test-mode=true
component name=o type=AffineComponent input-dim=6 output-dim=3 learning-rate=0
component-node name=a component=a input=input
component-node name=r component=r input=a
component-node name=bn component=bn input=r
component-node name=o component=o input=bn
output-node name=output input=o
"""


def _optimized():
    nnet = Nnet.from_config(NET, seed=3)
    bn = nnet.components["bn"]
    rng = np.random.default_rng(1)  # statistics, so the folded scale is not 1
    bn.count = 10.0
    bn.stats_sum = rng.uniform(1, 3, 6) * 10.0
    bn.stats_sumsq = bn.stats_sum ** 2 / 10.0 + rng.uniform(0.5, 4, 6) * 10.0
    opt = pynnet3.optimize_network(nnet)
    fused = [n for n, c in opt.components.items() if isinstance(c, AffineReluComponent)]
    assert len(fused) == 1
    return opt, fused[0]


def test_fused_kernel_is_constrained_as_its_linear_layer():
    opt, name = _optimized()
    assert [n for n, _, _ in orthonormal_constrained(opt)] == [name]
    req = ComputationRequest.from_frames(range(4), range(4), 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 10)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)
    trainer = Trainer(opt, TrainerOptions.from_flags(
        {"max-param-change": 0.0, "zero-component-stats": False,
         "store-component-stats": False}))
    lin = linear_part(opt.components[name])
    expected = lin.params()["linear_params"].copy()
    assert not np.allclose(expected @ expected.T / np.trace(expected @ expected.T) * 6,
                           np.eye(6), atol=1e-2)
    stats = trainer.train_step(req, inputs={"input": x}, supervision={"output": y},
                               orthonormal_constraint_applied_to=[name])
    assert stats.orthonormal_constrained == [name]
    constrain_orthonormal_matrix(expected, -1.0)  # (learning rate 0: only this moves)
    np.testing.assert_allclose(lin.params()["linear_params"], expected, rtol=1e-6)
    # Kaldi's random choice reaches it too (about one step in four)
    picks = sum(len(trainer.train_step(req, inputs={"input": x},
                                       supervision={"output": y}).orthonormal_constrained)
                for _ in range(40))
    assert 3 <= picks <= 20
