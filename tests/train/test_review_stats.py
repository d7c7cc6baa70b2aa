"""Where component statistics go in a training step.

Kaldi's NnetTrainer builds ``NnetComputer(opts, computation, nnet_, delta_nnet_)``,
the constructor taking the model by pointer, which stores statistics (kStoreStats:
nonlinearity value/derivative sums and counts, BatchNorm count and sums; and the
non-updatable components' backprop statistics and self-repair counters) into
``nnet_`` itself (nnet-compute.h/.cc: ``nnet_to_store_stats_(nnet)``; the comment in
nnet-training.cc TrainInternal). The delta network's statistics stay zero, so
neither momentum nor the max-change factors touch them. (An earlier review routed
them through the delta, reading the other constructor; that was not Kaldi's.)
Expected values follow from that: 4 sequences x 8 frames = 32 rows reach the ReLU
and the BatchNorm per pass; BatchNorm's count is then scaled by
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
    trainer = Trainer(nnet, TrainerOptions(**options))
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



def test_momentum_leaves_the_stats_reaching_the_model_alone():
    nnet, _ = _step(momentum=0.5)
    assert nnet.components["relu"].count == pytest.approx(32.0)
    assert nnet.components["bn"].count == pytest.approx(0.8 * 32.0)



def test_global_max_change_leaves_the_stats_reaching_the_model_alone():
    nnet, stats = _step(max_param_change=1e-4)
    assert stats.global_scale < 0.01
    assert nnet.components["relu"].count == pytest.approx(32.0)
    assert nnet.components["bn"].count == pytest.approx(0.8 * 32.0)


def test_momentum_carries_no_stats_to_the_next_step():
    # each step stores its 32 rows in the model; BatchNorm's are scaled after each
    nnet, _ = _steps(2, momentum=0.5)
    assert nnet.components["relu"].count == pytest.approx(64.0)
    assert nnet.components["bn"].count == pytest.approx(0.8 * (0.8 * 32.0 + 32.0))


def test_backstitch_passes_each_store_their_stats():
    # both passes store the minibatch in the model; the BatchNorm scaling follows pass 2
    nnet, stats = _step(backstitch_training_scale=0.3, backstitch_training_interval=1)
    assert stats.backstitch_outputs
    assert nnet.components["relu"].count == pytest.approx(64.0)
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
    trainer = Trainer(nnet)
    for _ in range(num_steps):
        trainer.train_step(mb.request, mb.inputs, mb.supervision)
    return nnet.components["affine"].params()["linear_params"].copy()


def test_first_minibatch_backprop_sees_its_own_stats():
    """Kaldi's self-repair (RectifiedLinearComponent::RepairGradients) reads the
    model's stats, which hold the minibatch being trained (its forward stored them
    into nnet_), so even with stats zeroed at the start the first step can repair."""
    assert not np.array_equal(_affine_after(1, 0.5), _affine_after(1, 0.0))


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
            assert nnet.components["relu"].count == pytest.approx(32.0)
        trainer.train_step(mb.request, mb.inputs, mb.supervision)
        return nnet

    a, b = run(False), run(True)
    for name in ("relu", "bn"):
        assert a.components[name].count == b.components[name].count
    np.testing.assert_array_equal(a.components["bn"].stats_sum, b.components["bn"].stats_sum)
    np.testing.assert_array_equal(a.components["affine"].params()["linear_params"],
                                  b.components["affine"].params()["linear_params"])
