"""One NnetTrainer step made by Kaldi (kaldi-reference/training/), reproduced.

For both folders (learning rate 0.001 as in the model, and 0.01 where both
max-changes are active) and both variants (natural gradient on: "ng"; every
NaturalGradientAffineComponent replaced by a plain AffineComponent: "plain"):
the change of every updatable component's parameters is within 1e-3 relative
(Frobenius) of Kaldi's, and the max-change factors are those Kaldi logged.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

import pynnet3
from pynnet3.components.affine import AffineComponent, NaturalGradientAffineComponent
from pynnet3.nnet import nnet_from_bytes
from pynnet3.train import Trainer, TrainerOptions
from tests.reference import REF, ref_params


def _cases():
    """Every (folder, variant) of training/ with Kaldi's model after the step: found,
    not listed, so that an added case is tested as it is."""
    if not (REF / "training").is_dir():
        return []
    return [(p.parent.name, kind) for p in sorted((REF / "training").glob("*/options.json"))
            for kind in ("ng", "plain") if (p.parent / f"model_after_{kind}.txt.gz").is_file()]


def _example_folder(case: Path) -> Path:
    """The folder with the step's request.json and arrays.npz: the case's own, or the
    one its run_info.json's ``example`` names (``"../tdnn_relu_bn/ (...)"``)."""
    if (case / "request.json").is_file():
        return case
    info = json.loads((case / "run_info.json").read_text())
    return (case / info["example"].split()[0]).resolve()


def _plain_copy(c: NaturalGradientAffineComponent) -> AffineComponent:
    """Kaldi's AffineComponent(const AffineComponent&): same parameters, learning
    rate and max-change, plain SGD update."""
    a = AffineComponent(c.linear_params.copy(), c.bias_params.copy())
    a.learning_rate, a.learning_rate_factor = c.learning_rate, c.learning_rate_factor
    a.max_change, a.l2_regularize = c.max_change, c.l2_regularize
    return a


def _setup(folder: str, kind: str):
    case = REF / "training" / folder
    options = json.loads((case / "options.json").read_text())
    learning_rate = options.pop("learning-rate", None)
    example = _example_folder(case)
    info = json.loads((case / "run_info.json").read_text())
    nnet = pynnet3.read_nnet((case / info["model"]).resolve())
    nnet.set_batchnorm_test_mode(False)
    nnet.set_dropout_test_mode(False)
    if learning_rate is not None:
        nnet.set_learning_rate(learning_rate)
    if kind == "plain":
        for name, c in list(nnet.components.items()):
            if isinstance(c, NaturalGradientAffineComponent):
                nnet.components[name] = _plain_copy(c)
    request = pynnet3.ComputationRequest.from_json(
        json.loads((example / "request.json").read_text()))
    with np.load(example / "arrays.npz") as z:
        x = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("input:")}
        y = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("supervision:")}
    return case, options, nnet, request, x, y


@pytest.mark.parametrize("folder,kind", ref_params(_cases(), "training steps", nargs=2))
def test_kaldi_training_step(folder, kind):
    case, options, nnet, request, x, y = _setup(folder, kind)
    run_info = json.loads((case / "run_info.json").read_text())
    before = {n: {k: v.copy() for k, v in c.params().items()}
              for n, c in nnet.components.items() if c.is_updatable()}
    assert before
    bn_before = {n: c.count for n, c in nnet.components.items()
                 if c.type_name == "BatchNormComponent"}

    trainer = Trainer(nnet, TrainerOptions.from_flags(options))
    stats = trainer.train_step(request, inputs=x, supervision=y)

    example_info = json.loads((_example_folder(case) / "run_info.json").read_text())
    assert stats.weight == example_info["objective_weight"]
    assert stats.objective == pytest.approx(example_info["objective_total"], rel=1e-5)

    after = nnet_from_bytes(gzip.decompress((case / f"model_after_{kind}.txt.gz").read_bytes()))
    for name, old in before.items():
        ours = np.concatenate([(nnet.components[name].params()[k] - old[k]).ravel()
                               for k in old]).astype(np.float64)
        kaldi = np.concatenate([(after.components[name].params()[k] - old[k]).ravel()
                                for k in old]).astype(np.float64)
        rel = np.linalg.norm(ours - kaldi) / np.linalg.norm(kaldi)
        assert rel < 1e-3, f"{name}: change differs from Kaldi's by {rel:.2e} relative"
        # the norms the README lists (from the text models)
        expected = run_info["param_change_from_text_models"][kind][name]
        assert np.linalg.norm(ours) == pytest.approx(expected["frobenius_norm_of_change"],
                                                     rel=1e-3)

    # max-change as Kaldi logged it
    logged = [line for line in run_info["kaldi_log_lines"][kind] if "max-change" in line
              and line.startswith("Per-component")]
    if logged:
        assert stats.message == logged[0]
        smallest = float(re.search(r"Smallest factor=([0-9.e-]+)", logged[0]).group(1))
        assert min(stats.max_change_scales.values()) == pytest.approx(smallest, rel=1e-4)
        glob = float(re.search(r"Global max-change factor was ([0-9.e-]+)", logged[0]).group(1))
        assert stats.global_scale == pytest.approx(glob, rel=1e-5)
        assert all(s < 1.0 for s in stats.max_change_scales.values())
        assert trainer.total_stats_lines()[2:] == [
            line for line in run_info["kaldi_log_lines"][kind]
            if line.startswith(("For ", "The global"))]
    else:
        assert stats.message == ""
        assert stats.global_scale == 1.0
        assert set(stats.max_change_scales.values()) == {1.0}

    # ScaleBatchnormStats(0.8): counts scaled, mean/variance kept (as in Kaldi's file)
    for name, count in bn_before.items():
        assert nnet.components[name].count == pytest.approx(0.8 * count)
        assert after.components[name].count == pytest.approx(0.8 * count)
        ours_mv = nnet.components[name]._mean_var_from_sums()
        kaldi_mv = after.components[name]._mean_var_from_sums()
        for a, b in zip(ours_mv, kaldi_mv, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("folder,kind", ref_params(
    [c for c in _cases() if c == ("tdnn_relu_bn", "ng")], "training steps", nargs=2))
def test_natural_gradient_changes_the_step(folder, kind):
    """The ng step is not the plain one (README: 22-29% apart): natural gradient is
    really applied, and our plain/ng difference matches Kaldi's."""
    _, options, nnet, request, x, y = _setup(folder, "ng")
    _, _, plain, _, _, _ = _setup(folder, "plain")
    def flat(c):
        return np.concatenate([c.params()[k].ravel() for k in ("linear_params", "bias_params")])

    before = {n: flat(c) for n, c in nnet.components.items() if c.is_updatable()}
    for net in (nnet, plain):
        Trainer(net, TrainerOptions.from_flags(options)).train_step(
            request, inputs=x, supervision=y)
    info = json.loads((REF / "training" / folder / "run_info.json").read_text())
    for name, old in before.items():
        d_ng = flat(nnet.components[name]) - old
        d_plain = flat(plain.components[name]) - old
        rel = np.linalg.norm(d_ng - d_plain) / np.linalg.norm(d_plain)
        kaldi = info["ng_vs_plain_change_from_text_models"][name][
            "norm_of_difference_over_norm_plain"]
        assert rel == pytest.approx(kaldi, rel=0.02)


@pytest.mark.parametrize("folder,kind", ref_params(
    [c for c in _cases() if c == ("tdnn_relu_bn_lr0.01", "ng")], "training steps", nargs=2))
def test_kaldi_training_step_on_the_torch_backend(folder, kind):
    """The same step with the forward/backward on the torch backend (CPU here): the
    hooks fetch the rows to precondition from the tensors."""
    pytest.importorskip("torch")
    case, options, nnet, request, x, y = _setup(folder, kind)
    before = {n: {k: v.copy() for k, v in c.params().items()}
              for n, c in nnet.components.items() if c.is_updatable()}
    stats = Trainer(nnet, TrainerOptions.from_flags(options), backend="torch").train_step(
        request, inputs=x, supervision=y)
    after = nnet_from_bytes(gzip.decompress((case / f"model_after_{kind}.txt.gz").read_bytes()))
    for name, old in before.items():
        ours = np.concatenate([(nnet.components[name].params()[k] - old[k]).ravel()
                               for k in old]).astype(np.float64)
        kaldi = np.concatenate([(after.components[name].params()[k] - old[k]).ravel()
                                for k in old]).astype(np.float64)
        assert np.linalg.norm(ours - kaldi) / np.linalg.norm(kaldi) < 1e-3, name
    assert stats.global_scale == pytest.approx(0.843274, rel=1e-5)
