"""Review of the trainer (issue 18): where component statistics go in a training step
(the trainer used to store them straight into the model).

Kaldi's NnetComputer stores statistics (kStoreStats: nonlinearity value/derivative sums
and counts, BatchNorm count and sums, self-repair counters) into ``nnet_to_update``,
i.e. the trainer's delta network; UpdateNnetWithMaxChange's AddNnetComponents then adds
each non-updatable component's stats to the model times ``scale`` (``1 - momentum``
times the global max-param-change factor), and ScaleNnet(momentum) keeps ``momentum``
times them in the delta (nnet-compute.cc, nnet-utils.cc AddNnetComponents). With
``store-component-stats=true`` (Kaldi's default) and momentum > 0 or the global
max-change active, the model's stats after a step are those scaled counts, not the
minibatch's. Expected values below follow from that arithmetic: 4 sequences x 8
frames = 32 rows reach the ReLU and the BatchNorm; BatchNorm's count is then scaled by
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



def test_momentum_scales_the_stats_reaching_the_model():
    nnet, _ = _step(momentum=0.5)
    assert nnet.components["relu"].count == pytest.approx(0.5 * 32.0)
    assert nnet.components["bn"].count == pytest.approx(0.8 * 0.5 * 32.0)



def test_global_max_change_scales_the_stats_reaching_the_model():
    nnet, stats = _step(max_param_change=1e-4)
    assert stats.global_scale < 0.01
    assert nnet.components["relu"].count == pytest.approx(stats.global_scale * 32.0, rel=1e-5)


def test_momentum_carries_the_stats_in_the_delta():
    # step 1: model 0.5 * 32, delta keeps 0.5 * 32; step 2: delta 16 + 32, model + 0.5 * 48
    nnet, _ = _steps(2, momentum=0.5)
    assert nnet.components["relu"].count == pytest.approx(16.0 + 0.5 * 48.0)
    assert nnet.components["bn"].count == pytest.approx(0.8 * (0.8 * 16.0 + 0.5 * 48.0))


def test_backstitch_passes_add_minus_s_then_one_plus_s_times_their_stats():
    # both passes see the same minibatch: -0.3 * 32 + 1.3 * 32 rows
    nnet, stats = _step(backstitch_training_scale=0.3, backstitch_training_interval=1)
    assert stats.backstitch_outputs
    assert nnet.components["relu"].count == pytest.approx(32.0)
    assert nnet.components["bn"].count == pytest.approx(0.8 * 32.0)


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


def test_first_minibatch_backprop_sees_no_stats_of_its_own():
    """Kaldi's self-repair reads the model's stats, which do not hold the minibatch
    being trained (it went to the delta), so with stats zeroed at the start the first
    step repairs nothing (RepairGradients returns at count 0); the trainer used to
    repair there from the stats its own forward had just stored."""
    np.testing.assert_array_equal(_affine_after(1, 0.5), _affine_after(1, 0.0))
    assert not np.array_equal(_affine_after(2, 0.5), _affine_after(2, 0.0))


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
            assert nnet.components["relu"].count == pytest.approx(16.0)
        trainer.train_step(mb.request, mb.inputs, mb.supervision)
        return nnet

    a, b = run(False), run(True)
    for name in ("relu", "bn"):
        assert a.components[name].count == b.components[name].count
    np.testing.assert_array_equal(a.components["bn"].stats_sum, b.components["bn"].stats_sum)
    np.testing.assert_array_equal(a.components["affine"].params()["linear_params"],
                                  b.components["affine"].params()["linear_params"])
