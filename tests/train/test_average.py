"""nnet3-average (pynnet3.train.average and pynnet3 average) checked with independent
math: weighted sums of parameters and of sum-statistics, BatchNorm mean/variance as
count-weighted averages (read back from the written file), averages stored as
averages weighted by count, Kaldi's int32 truncation of clipping counters, and
Kaldi's weight normalization."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.cli.files import read_model
from pynnet3.cli.main import main
from pynnet3.errors import ConfigError, DimensionError
from pynnet3.train.average import average_nnets, kaldi_weights
from tests.reference import REF, require_reference

_FILES = ("model_in.txt.gz", "model_after.txt.gz", "model_after_unmerged.txt.gz")


def _models():
    folder = require_reference() / "train-cli" / "tdnn_relu_bn"
    return [read_model(str(folder / f)) for f in _FILES]


def _file_stats(text: str, name: str) -> tuple[float, np.ndarray, np.ndarray]:
    """(count, mean, var) of BatchNorm component ``name`` in a text model."""
    part = text[text.index(f"<ComponentName> {name} "):]
    part = part[:part.index("</BatchNormComponent>")]

    def vec(tag):
        body = part[part.index(tag) + len(tag):]
        return np.array(body[body.index("[") + 1:body.index("]")].split(), dtype=np.float64)

    count = float(part.split("<Count>")[1].split()[0])
    return count, vec("<StatsMean>"), vec("<StatsVar>")


def test_weights_as_kaldi():
    w, total = kaldi_weights("1:2:1", 3)
    assert w.dtype == np.float32 and total == 4.0
    np.testing.assert_array_equal(w, np.float32([0.25, 0.5, 0.25]))
    w, total = kaldi_weights(None, 4)
    assert total is None and (w == np.float32(0.25)).all()
    for bad in ("1:2", "1:x:3", "0:0:0"):
        with pytest.raises(ConfigError):
            kaldi_weights(bad, 3)


def test_average_of_kaldi_models_is_the_weighted_sum():
    nnets = _models()
    w = np.float32([0.25, 0.5, 0.25])
    before = [n.copy() for n in nnets]
    avg = average_nnets(nnets, "1:2:1")
    for n, b in zip(nnets, before, strict=True):  # inputs untouched
        for name, comp in n.components.items():
            for key, p in comp.params().items():
                np.testing.assert_array_equal(p, b.components[name].params()[key])
    checked = stats_checked = 0
    for name, comp in avg.components.items():
        for key, p in comp.params().items():
            expected = sum(np.float64(wi) * n.components[name].params()[key].astype(np.float64)
                           for wi, n in zip(w, nnets, strict=True))
            scale = np.abs(expected).max()
            np.testing.assert_allclose(p, expected, rtol=0, atol=3e-7 * scale)
            checked += 1
        if comp.type_name == "RectifiedLinearComponent":
            for attr in ("value_sum", "deriv_sum", "count", "oderiv_count"):
                expected = sum(np.float64(wi) * np.asarray(getattr(n.components[name], attr))
                               for wi, n in zip(w, nnets, strict=True))
                np.testing.assert_allclose(getattr(comp, attr), expected, rtol=1e-12)
            stats_checked += 1
    assert checked == 14 and stats_checked == 6


def test_average_command_batchnorm_stats_by_count(tmp_path, capsys):
    folder = require_reference() / "train-cli" / "tdnn_relu_bn"
    out = tmp_path / "avg.txt"
    # Training-mode minibatches leave BatchNorm means alone, so give the second model
    # other means and variances (the average then depends on the counts).
    shifted = read_model(str(folder / _FILES[1]))
    rng = np.random.default_rng(0)
    for comp in shifted.components.values():
        if comp.type_name == "BatchNormComponent":
            mean = comp.stats_sum / comp.count + rng.standard_normal(comp.stats_sum.shape)
            var = rng.random(comp.stats_sum.shape) + 0.5
            comp.stats_sum, comp.stats_sumsq = mean * comp.count, (var + mean**2) * comp.count
    shifted.write(tmp_path / "shifted.txt", binary=False)
    paths = [str(folder / _FILES[0]), str(tmp_path / "shifted.txt"), str(folder / _FILES[2])]
    assert main(["average", "--binary=false", "--weights=1:2:1", *paths, str(out)]) == 0
    err = capsys.readouterr().err
    assert "Normalizing weights to sum to one, sum was 4" in err
    assert f"Averaged parameters of 3 neural nets, and wrote to {out}" in err
    import gzip

    texts = [gzip.open(p, "rt").read() if p.endswith(".gz") else open(p).read()
             for p in paths]
    ours = out.read_text()
    w = [0.25, 0.5, 0.25]
    for layer in range(1, 7):
        name = f"tdnn{layer}.batchnorm"
        stats = [_file_stats(t, name) for t in texts]
        counts = np.array([wi * c for wi, (c, _, _) in zip(w, stats, strict=True)])
        mean = sum(ci * m for ci, (_, m, _) in zip(counts, stats, strict=True)) / counts.sum()
        second = sum(ci * (v + m * m) for ci, (_, m, v) in zip(counts, stats, strict=True))
        var = second / counts.sum() - mean * mean
        count, m, v = _file_stats(ours, name)
        assert count == pytest.approx(counts.sum(), rel=1e-6)
        np.testing.assert_allclose(m, mean, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(v, var, rtol=2e-5, atol=1e-6)


def test_single_model_average_is_a_copy(tmp_path, capsys):
    folder = require_reference() / "train-cli" / "xvector"
    out = tmp_path / "one.txt"
    assert main(["average", "--binary=false", str(folder / "model_in.txt.gz"), str(out)]) == 0
    import gzip

    from tests.components.common import same_but_batchnorm_stats

    # (a copy as Kaldi writes one: BatchNorm statistics written from sums)
    same_but_batchnorm_stats(gzip.decompress((folder / "model_in.txt.gz").read_bytes()),
                             out.read_bytes())
    assert "Normalizing" not in capsys.readouterr().err


def test_incompatible_models_are_refused(tmp_path, capsys):
    require_reference()
    a = read_model(str(REF / "train-cli" / "tdnn_relu_bn" / "model_in.txt.gz"))
    b = read_model(str(REF / "train-cli" / "xvector" / "model_in.txt.gz"))
    with pytest.raises(DimensionError):
        average_nnets([a, b])
    assert main(["average", str(tmp_path / "only-out")]) == 1
    assert "at least one model" in capsys.readouterr().err


def _lstm_and_clip_net(seed: int):
    from pynnet3 import Nnet

    config = "\n".join([
        "input-node name=input dim=10",
        "component name=lstm type=LstmNonlinearityComponent cell-dim=2",
        "component-node name=lstm component=lstm input=input",
        "component name=clip type=ClipGradientComponent dim=4",
        "component-node name=clip component=clip input=lstm",
        "output-node name=output input=clip"])
    return Nnet.from_config(config, seed=seed)


def test_averages_weighted_by_count_and_int_counters_truncated():
    nets = [_lstm_and_clip_net(s) for s in (1, 2)]
    rng = np.random.default_rng(0)
    for n, count in zip(nets, (3.0, 1.0), strict=True):
        lstm = n.components["lstm"]
        lstm.value_avg = rng.random(lstm.value_avg.shape).astype(np.float32)
        lstm.deriv_avg = rng.random(lstm.deriv_avg.shape).astype(np.float32)
        lstm.count = count
        clip = n.components["clip"]
        clip.count, clip.num_clipped = 7, 3
    avg = average_nnets(nets, "1:1")
    a, b = nets[0].components["lstm"], nets[1].components["lstm"]
    out = avg.components["lstm"]
    # Kaldi keeps sums: 0.5*3*avg_a + 0.5*1*avg_b over the count 0.5*3 + 0.5*1.
    np.testing.assert_allclose(out.value_avg, (1.5 * a.value_avg + 0.5 * b.value_avg) / 2.0,
                               rtol=1e-6)
    np.testing.assert_allclose(out.deriv_avg, (1.5 * a.deriv_avg + 0.5 * b.deriv_avg) / 2.0,
                               rtol=1e-6)
    assert out.count == pytest.approx(2.0)
    np.testing.assert_allclose(out.params_, 0.5 * a.params_ + 0.5 * b.params_, rtol=1e-6)
    clip = avg.components["clip"]
    # int32 fields: int(7 * 0.5) = 3, then int(3 + 0.5 * 7) = 6; int(1.5) = 1, int(1 + 1.5) = 2.
    assert (clip.count, clip.num_clipped) == (6, 2)


def test_independent_jobs_then_average_equal_one_step_at_half_the_rate():
    """Kaldi's data parallelism: two jobs each take one plain-SGD step (no max-change,
    no momentum) from the same model on their own minibatch; the average of their
    models is theta + lr * (g_a + g_b) / 2, one step on both minibatches merged at
    half the learning rate."""
    from pynnet3 import Nnet
    from pynnet3.io.egs import NnetExample, NnetIo
    from pynnet3.io.egs_merge import merge_examples
    from pynnet3.train import Trainer, TrainerOptions
    from pynnet3.train.examples import example_minibatch

    config = "\n".join([
        "input-node name=input dim=3",
        "component name=a type=AffineComponent input-dim=6 output-dim=5 learning-rate=0.2",
        "component-node name=a component=a input=Append(Offset(input, -1), input)",
        "component name=r type=RectifiedLinearComponent dim=5",
        "component-node name=r component=r input=a",
        "component name=b type=AffineComponent input-dim=5 output-dim=3 learning-rate=0.2",
        "component-node name=b component=b input=r",
        "component name=sm type=LogSoftmaxComponent dim=3",
        "component-node name=sm component=sm input=b",
        "output-node name=output input=sm"])
    rng = np.random.default_rng(3)
    egs = [NnetExample([NnetIo.from_matrix("input", -1, rng.standard_normal((4, 3))
                                           .astype(np.float32)),
                        NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 3))])
           for _ in range(8)]
    flags = {"max-param-change": 0.0, "store-component-stats": False}

    def step(egs_part, half_rate=False):
        nnet = Nnet.from_config(config, seed=4)
        if half_rate:
            nnet.set_learning_rate(0.1)
        mb = example_minibatch(nnet, merge_examples(egs_part))
        Trainer(nnet, TrainerOptions.from_flags(flags)).train_step(
            mb.request, inputs=mb.inputs, supervision=mb.supervision)
        return nnet

    averaged = average_nnets([step(egs[:4]), step(egs[4:])])
    together = step(egs, half_rate=True)
    start = Nnet.from_config(config, seed=4)
    for name in ("a", "b"):
        for key, p in together.components[name].params().items():
            moved = np.abs(p - start.components[name].params()[key]).max()
            assert moved > 1e-3
            np.testing.assert_allclose(averaged.components[name].params()[key], p,
                                       rtol=1e-5, atol=1e-6 * moved)
