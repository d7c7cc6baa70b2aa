"""Review of the trainer (issues 18 and the LSTM-training review): where component
statistics go in a training step.

Kaldi's NnetTrainer::TrainInternal makes its NnetComputer with the model as a
pointer (``NnetComputer(opts, computation, nnet_, delta_nnet_)``), and that
constructor stores statistics in ``nnet`` itself, not in ``nnet_to_update``
(nnet-compute.h: "this version will, for storing statistics ... use 'nnet'
instead of 'nnet_to_update'"; nnet-compute.cc: kPropagate stores into
``nnet_to_store_stats_``, and a non-updatable component's backprop gets it as
``to_update``). So the stats of non-updatable components (nonlinearity value /
derivative sums and counts, BatchNorm count and sums, self-repair counters) reach the
model at full weight whatever the momentum, max-change or backstitch scales, and a
backward's self-repair sees its own forward's stats. (An earlier review routed them
through the delta network; Kaldi's train-cli/xvector run, momentum 0.5, ends with
log-softmax ``<OderivCount>`` 24 = 3 x 8 rows at full weight, which that routing
cannot give.) Expected values follow from that arithmetic: 4 sequences x 8 frames =
32 rows reach the ReLU and the BatchNorm; BatchNorm's count is then scaled by
batchnorm-stats-scale 0.8 (ScaleBatchnormStats runs after the update)."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3 import Nnet
from pynnet3.io.egs import NnetExample, NnetIo
from pynnet3.io.egs_merge import merge_examples
from pynnet3.train import Trainer, TrainerOptions
from pynnet3.train.examples import example_minibatch

_CONFIG = """input-node name=input dim=4
component name=affine type=AffineComponent input-dim=12 output-dim=6
component-node name=affine component=affine input=Append(Offset(input,-1), input, Offset(input,1))
component name=relu type=RectifiedLinearComponent dim=6 self-repair-scale=0
component-node name=relu component=relu input=affine
component name=bn type=BatchNormComponent dim=6
component-node name=bn component=bn input=relu
component name=out type=AffineComponent input-dim=6 output-dim=3
component-node name=out component=out input=bn
component name=sm type=LogSoftmaxComponent dim=3
component-node name=sm component=sm input=out
output-node name=output input=sm"""

def _steps(num_steps: int, **options):
    rng = np.random.default_rng(0)
    egs = [NnetExample([NnetIo.from_matrix("input", -1, rng.standard_normal((10, 4), np.float32)),
                        NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 8))])
           for _ in range(4)]
    nnet = Nnet.from_config(_CONFIG, seed=0)
    nnet.set_learning_rate(0.01)
    mb = example_minibatch(nnet, merge_examples(egs))
    # (random_stats=False: every step stores and repairs, so the counts are exact)
    trainer = Trainer(nnet, TrainerOptions(**{"random_stats": False, **options}))
    for _ in range(num_steps):
        stats = trainer.train_step(mb.request, mb.inputs, mb.supervision)
    return nnet, stats


def _step(**options):
    return _steps(1, **options)


def test_plain_step_stores_the_minibatch_stats():
    nnet, stats = _step()
    assert stats.global_scale == 1.0
    assert nnet.components["relu"].count == 32.0
    assert nnet.components["bn"].count == pytest.approx(0.8 * 32.0)



def test_momentum_does_not_scale_the_stats_reaching_the_model():
    nnet, _ = _step(momentum=0.5)
    assert nnet.components["relu"].count == 32.0
    assert nnet.components["bn"].count == pytest.approx(0.8 * 32.0)


def test_global_max_change_does_not_scale_the_stats_reaching_the_model():
    nnet, stats = _step(max_param_change=1e-4)
    assert stats.global_scale < 0.01
    assert nnet.components["relu"].count == 32.0
    assert nnet.components["bn"].count == pytest.approx(0.8 * 32.0)


def test_momentum_carries_no_stats_to_the_next_step():
    # each step stores its 32 rows once; BatchNorm's count is scaled after each step
    nnet, _ = _steps(2, momentum=0.5)
    assert nnet.components["relu"].count == 64.0
    assert nnet.components["bn"].count == pytest.approx(0.8 * (0.8 * 32.0 + 32.0))


def test_backstitch_passes_each_store_their_stats():
    # both passes store the minibatch; ScaleBatchnormStats runs once, after the second
    nnet, stats = _step(backstitch_training_scale=0.3, backstitch_training_interval=1)
    assert stats.backstitch_outputs
    assert nnet.components["relu"].count == 64.0
    assert nnet.components["bn"].count == pytest.approx(0.8 * 64.0)


def test_no_stats_stored_leaves_them_alone():
    nnet, _ = _step(momentum=0.5, store_component_stats=False)
    assert nnet.components["relu"].count == 0.0
    assert nnet.components["bn"].count == 0.0


def _affine_after(num_steps: int, self_repair_scale: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    egs = [NnetExample([NnetIo.from_matrix("input", -1, rng.standard_normal((10, 4), np.float32)),
                        NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 8))])
           for _ in range(4)]
    nnet = Nnet.from_config(_CONFIG.replace("self-repair-scale=0",
                                            f"self-repair-scale={self_repair_scale}"), seed=0)
    nnet.set_learning_rate(0.01)
    mb = example_minibatch(nnet, merge_examples(egs))
    trainer = Trainer(nnet, TrainerOptions(random_stats=False))
    for _ in range(num_steps):
        trainer.train_step(mb.request, mb.inputs, mb.supervision)
    return nnet.components["affine"].params()["linear_params"].copy()


def test_first_minibatch_backprop_sees_its_own_forward_stats():
    """Kaldi's self-repair reads the stats of the model that runs the backprop, which
    already hold the minibatch's own forward (stored into nnet_ itself), so with
    stats zeroed at the start the first step can repair already: RepairGradients
    returns early only at count 0, and the count it sees is the 32 rows just stored."""
    np.testing.assert_raises(AssertionError, np.testing.assert_array_equal,
                             _affine_after(1, 0.5), _affine_after(1, 0.0))
    rng = np.random.default_rng(0)
    egs = [NnetExample([NnetIo.from_matrix("input", -1, rng.standard_normal((10, 4), np.float32)),
                        NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 8))])
           for _ in range(4)]
    nnet = Nnet.from_config(_CONFIG, seed=0)
    relu = nnet.components["relu"]
    seen = []
    plain_backprop = relu.backprop

    def recording(*args, **kwargs):
        seen.append(relu.count)
        return plain_backprop(*args, **kwargs)

    relu.backprop = recording
    mb = example_minibatch(nnet, merge_examples(egs))
    trainer = Trainer(nnet, TrainerOptions(momentum=0.5, random_stats=False))
    trainer.train_step(mb.request, mb.inputs, mb.supervision)
    trainer.train_step(mb.request, mb.inputs, mb.supervision)
    assert seen == [32.0, 64.0]


def test_a_failed_step_leaves_no_statistics_behind():
    """A step that fails after its forward (supervision of the wrong shape) leaves the
    model's statistics and the next step's result as if it had never been called."""
    from pynnet3.errors import RuntimeInputError

    def run(with_failure: bool):
        rng = np.random.default_rng(0)
        egs = [NnetExample([
            NnetIo.from_matrix("input", -1, rng.standard_normal((10, 4), np.float32)),
            NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 8))]) for _ in range(4)]
        nnet = Nnet.from_config(_CONFIG, seed=0)
        nnet.set_learning_rate(0.01)
        mb = example_minibatch(nnet, merge_examples(egs))
        trainer = Trainer(nnet, TrainerOptions(momentum=0.5))
        trainer.train_step(mb.request, mb.inputs, mb.supervision)
        if with_failure:
            with pytest.raises(RuntimeInputError, match="supervision"):
                trainer.train_step(mb.request, mb.inputs,
                                   {"output": mb.supervision["output"][:, :2]})
            assert nnet.components["relu"].count == 32.0
        trainer.train_step(mb.request, mb.inputs, mb.supervision)
        return nnet

    a, b = run(False), run(True)
    for name in ("relu", "bn"):
        assert a.components[name].count == b.components[name].count
    np.testing.assert_array_equal(a.components["bn"].stats_sum, b.components["bn"].stats_sum)
    np.testing.assert_array_equal(a.components["affine"].params()["linear_params"],
                                  b.components["affine"].params()["linear_params"])


def test_random_stats_draw_as_kaldi():
    """By default the trainer makes Kaldi's draws (from a generator of its own):
    forward statistics stored on about every other minibatch but always the first,
    backprop statistics on about three in four but always the first; outside a
    step the components draw nothing (rng None)."""
    assert TrainerOptions().random_stats
    nnet, _ = _steps(1, random_stats=True)
    relu = nnet.components["relu"]
    assert relu.count == 32.0 and relu.oderiv_count == 32.0 and relu.rng is None
    nnet, _ = _steps(200, random_stats=True)
    relu = nnet.components["relu"]
    stored, stored_back = relu.count / 32.0, relu.oderiv_count / 32.0
    # binomial(199, 1/2) + 1 and binomial(199, 3/4) + 1: far outside these is a bug
    assert 70 < stored < 131 and 130 < stored_back < 181, (stored, stored_back)
    assert relu.rng is None
    nnet, _ = _steps(40, random_stats=False)
    assert nnet.components["relu"].count == 40 * 32.0
