"""From an example to a training step (Kaldi's GetComputationRequest): inputs and
outputs by node kind in the example's order, derivatives only with the model
derivative, inputs decompressed and supervision densified, unknown names refused."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3 import Nnet
from pynnet3.errors import ComputeError
from pynnet3.io.egs import NnetExample, NnetIo
from pynnet3.io.egs_merge import merge_examples
from pynnet3.io.general_matrix import CompressedMatrix
from pynnet3.train.examples import example_minibatch, example_request

_CONFIG = "\n".join([
    "input-node name=input dim=3",
    "input-node name=ivector dim=2",
    "component name=a type=AffineComponent input-dim=5 output-dim=4",
    "component-node name=a component=a input=Append(input, ReplaceIndex(ivector, t, 0))",
    "output-node name=output input=a objective=quadratic",
    "output-node name=output-xent input=a"])


def _eg(rng, compressed=False):
    feats = rng.standard_normal((12, 3)).astype(np.float32)
    return NnetExample([
        NnetIo.from_labels("output-xent", 4, 0, rng.integers(0, 4, 2)),
        NnetIo.from_matrix("input", -5, CompressedMatrix.compress(feats) if compressed
                           else feats),
        NnetIo.from_matrix("ivector", 0, rng.standard_normal((1, 2)).astype(np.float32)),
        NnetIo.from_matrix("output", 0, rng.standard_normal((2, 4)).astype(np.float32))])


def test_request_follows_kaldi():
    nnet = Nnet.from_config(_CONFIG, seed=0)
    rng = np.random.default_rng(0)
    eg = merge_examples([_eg(rng), _eg(rng, compressed=True)])
    req = example_request(nnet, eg)
    assert [s.name for s in req.inputs] == ["input", "ivector"]
    assert [s.name for s in req.outputs] == ["output", "output-xent"]  # merged: sorted
    assert req.need_model_derivative and not req.store_component_stats
    assert all(s.has_deriv for s in req.outputs) and not any(s.has_deriv for s in req.inputs)
    np.testing.assert_array_equal(req.inputs[0].indexes, eg["input"].indexes)
    plain = example_request(nnet, eg, need_model_derivative=False, store_component_stats=True)
    assert not any(s.has_deriv for s in plain.outputs) and plain.store_component_stats


def test_minibatch_inputs_and_dense_supervision():
    nnet = Nnet.from_config(_CONFIG, seed=0)
    rng = np.random.default_rng(1)
    egs = [_eg(rng), _eg(rng, compressed=True)]
    mb = example_minibatch(nnet, merge_examples(egs))
    assert mb.num_sequences == 2
    np.testing.assert_array_equal(mb.inputs["input"][12:], egs[1]["input"].features.to_array())
    xent = mb.supervision["output-xent"]
    assert xent.dtype == np.float32 and xent.shape == (4, 4)
    labels = np.concatenate([e["output-xent"].features.cols for e in egs])
    np.testing.assert_array_equal(xent, np.eye(4, dtype=np.float32)[labels])
    np.testing.assert_array_equal(mb.supervision["output"],
                                  np.concatenate([e["output"].features for e in egs]))
    from pynnet3.train import Trainer, TrainerOptions

    stats = Trainer(nnet, TrainerOptions.from_flags({"store-component-stats": False})
                    ).train_step(mb.request, inputs=mb.inputs, supervision=mb.supervision)
    assert stats.weight == pytest.approx(4.0 + 4.0)  # 4 one-hot rows + 4 quadratic rows


@pytest.mark.parametrize("ios, message", [
    (["input", "nope"], "'nope'"),
    (["output"], "no inputs"),
    (["input"], "no outputs"),
])
def test_bad_examples(ios, message):
    nnet = Nnet.from_config(_CONFIG, seed=0)
    eg = NnetExample([NnetIo.from_matrix(n, 0, np.zeros((1, 3 if n != "output" else 4),
                                                        np.float32)) for n in ios])
    with pytest.raises(ComputeError, match=message):
        example_request(nnet, eg)
