"""Review of ``pynnet3 train`` / ``merge-egs`` / ``average`` command lines against
Kaldi's nnet3-train, nnet3-merge-egs and nnet3-average (src/nnet3bin/*.cc,
NnetTrainerOptions::Register, ExampleMergingConfig::Register, util/parse-options.cc):
every option those programs register is accepted (an unknown option stops a Kaldi
script), and Kaldi's ParseOptions conventions hold: ``--config=FILE`` (read first,
the command line overrides it), ``--x_y`` is ``--x-y``, a bare boolean ``--binary``
is ``--binary=true``. nnet3-average warns about the weights only when their sum is
more than 0.01 away from 1 (GetWeights)."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3 import Nnet
from pynnet3.cli.main import main
from pynnet3.io.egs import ExampleWriter, NnetExample, NnetIo
from pynnet3.io.egs_merge import merge_examples
from tests.reference import require_reference

_CONFIG = "\n".join([
    "input-node name=input dim=4",
    "input-node name=ivector dim=2",
    "component name=affine type=NaturalGradientAffineComponent input-dim=14 output-dim=3 "
    "max-change=0.1",
    "component-node name=affine component=affine input=Append(Offset(input,-1), input, "
    "Offset(input,1), ReplaceIndex(ivector, t, 0))",
    "component name=sm type=LogSoftmaxComponent dim=3",
    "component-node name=sm component=sm input=affine",
    "output-node name=output input=sm"])


@pytest.fixture
def files(tmp_path):
    """A model with an iVector input and 3 minibatches of 4 examples (the odd ones
    compressed, as Kaldi's egs are), each with a 1-row iVector at t=0."""
    rng = np.random.default_rng(0)
    model = tmp_path / "0.raw"
    Nnet.from_config(_CONFIG, seed=0).write(str(model), binary=True)
    egs = tmp_path / "egs.ark"
    with ExampleWriter(f"ark:{egs}") as w:
        for b in range(3):
            batch = []
            for i in range(4):
                eg = NnetExample([
                    NnetIo.from_matrix("input", -1, rng.standard_normal((10, 4), np.float32)),
                    NnetIo.from_matrix("ivector", 0, rng.standard_normal((1, 2), np.float32)),
                    NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 8))])
                batch.append(eg.compress() if i % 2 else eg)
            w.write(f"mb{b}", merge_examples(batch))
    return tmp_path, model, egs


def _train(files, *flags) -> tuple[int, bytes]:
    folder, model, egs = files
    out = folder / "out.raw"
    if out.exists():
        out.unlink()
    status = main(["train", "--use-gpu=no", *flags, str(model), f"ark:{egs}", str(out)])
    return status, out.read_bytes() if out.exists() else b""


@pytest.mark.parametrize("flag", [
    # NnetTrainerOptions::Register, with the defaults
    "--store-component-stats=true", "--zero-component-stats=true", "--print-interval=100",
    "--max-param-change=2", "--momentum=0", "--l2-regularize-factor=1",
    "--batchnorm-stats-scale=0.8", "--backstitch-training-scale=0",
    "--backstitch-training-interval=1", "--read-cache=", "--write-cache=",
    "--binary-write-cache=true",
    # its sub-option groups: optimization., compiler. (CachingOptimizingCompilerOptions),
    # computation. (NnetComputeOptions)
    "--optimization.optimize=true", "--compiler.use-shortcut=true",
    "--compiler.cache-capacity=64", "--computation.debug=false",
    # nnet3-train.cc itself, RegisterCuAllocatorOptions, ParseOptions' standard options
    "--srand=0", "--binary=true", "--use-gpu=no", "--cuda-memory-proportion=0.5",
    "--cuda-cache-memory=true", "--verbose=0", "--print-args=true",
])
def test_train_accepts_every_nnet3_train_option(files, flag):
    """Each option nnet3-train registers, at its default, trains as without it."""
    status, model = _train(files, flag)
    assert status == 0
    assert model == _train(files)[1]


def test_train_kaldi_parse_options_conventions(files, capsys):
    """--config lines are read before the command line (which overrides them),
    comments and blank lines are skipped, names are normalized (ParseOptions::
    NormalizeArgName: '_' -> '-', lower case) and a bare bool is true."""
    folder = files[0]
    plain = _train(files, "--momentum=0.5", "--print-interval=1", "--binary=false")
    assert plain[0] == 0 and plain[1].startswith(b"<Nnet3>")
    conf = folder / "train.conf"
    conf.write_text("# nnet3-train options\n--momentum=0.9   # overridden below\n\n"
                    "--print_interval=1\n--binary=false\n")
    assert _train(files, f"--config={conf}", "--momentum=0.5") == plain
    assert _train(files, "--Momentum=0.5", "--print_interval=1", "--binary=false") == plain
    binary = _train(files, "--momentum=0.5", "--print-interval=1", "--binary=true")
    assert _train(files, "--momentum=0.5", "--print-interval=1", "--binary") == binary
    capsys.readouterr()
    conf.write_text("momentum=0.5\n")  # (a shell-style config: Kaldi refuses it)
    assert _train(files, f"--config={conf}")[0] == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 1" in err[0] and "--x=y" in err[0]


def test_train_logs_each_output_and_exit_status(files, capsys):
    """The iVector egs train (n-major merged rows, iVector at t=0 per sequence);
    the log has Kaldi's phase and overall lines; 3 minibatches at --print-interval=2:
    one phase line (minibatches 0-1), the last phase only in the overall figure."""
    status, _ = _train(files, "--print-interval=2")
    assert status == 0
    err = capsys.readouterr().err
    assert err.count("Average objective function for 'output' for minibatches 0-1 is ") == 1
    assert "minibatches 2-" not in err
    assert "Overall average objective function for 'output' is " in err
    assert " over 96 frames." in err  # 3 minibatches x 4 sequences x 8 frames


def test_merge_egs_accepts_its_options_and_merges_merged_egs(tmp_path, capsys):
    """nnet3-merge-egs registers --compress, --minibatch-size, --measure-output-frames,
    --discard-partial-minibatches, --multilingual-eg (and the standard options);
    Kaldi's merged.ark merges again (4 minibatches of 8 -> 2 of 16, equal to
    --minibatch-size=16 on egs.ark)."""
    folder = require_reference() / "train-cli" / "tdnn_relu_bn"
    out = tmp_path / "m.ark"
    assert main(["merge-egs", "--multilingual-eg=false", "--verbose=1", "--print-args=false",
                 "--compress=false", "--minibatch-size=8", f"ark:{folder / 'egs.ark'}",
                 f"ark:{out}"]) == 0
    assert out.read_bytes() == (folder / "merged.ark").read_bytes()
    again, direct = tmp_path / "again.ark", tmp_path / "direct.ark"
    assert main(["merge-egs", "--minibatch-size=2", f"ark:{folder / 'merged.ark'}",
                 f"ark:{again}"]) == 0
    assert main(["merge-egs", "--minibatch-size=16", f"ark:{folder / 'egs.ark'}",
                 f"ark:{direct}"]) == 0
    assert again.read_bytes() == direct.read_bytes().replace(b"-16 ", b"-2 ")
    # (GetNnetExampleSize: the most rows of any NnetIo, 8 x 46 input rows here)
    assert "368={2->2,d=0}" in capsys.readouterr().err


def test_average_options_and_weight_warning(files, tmp_path, capsys):
    """nnet3-average registers --binary, --weights, --num-threads; GetWeights warns
    only when |sum - 1| > 0.01: not for ten models' default weights 1/10 (their float
    sum is not exactly 1), not for 0.5:0.505, yes for 1:1."""
    model = str(files[1])
    w = np.float32(1.0) / np.float32(10.0)
    total = np.float32(0.0)
    for _ in range(10):
        total = np.float32(total + w)
    assert total != 1.0  # (what made the warning appear before)
    out = str(tmp_path / "avg.raw")
    capsys.readouterr()
    assert main(["average", "--num-threads=3", "--verbose=1", *[model] * 10, out]) == 0
    assert "Normalizing" not in capsys.readouterr().err
    assert main(["average", "--weights=0.5:0.505", model, model, out]) == 0
    assert "Normalizing" not in capsys.readouterr().err
    assert main(["average", "--weights=1:1", model, model, out]) == 0
    assert "Normalizing weights to sum to one, sum was 2" in capsys.readouterr().err
